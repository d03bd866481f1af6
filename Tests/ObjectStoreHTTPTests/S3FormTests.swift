import ObjectStore
import Testing

@testable import ObjectStoreHTTP

/// What `S3ObjectStore` sends and reads, without a server: attributes in the s3fs/rclone form,
/// listings (AWS's URL encoding included), the list of uploads, and the start after a name.
struct S3FormTests {
    @Test func attributesGoAsS3fsWritesThem() {
        let (type, metadata) = S3ObjectStore.wireForm(
            key: "a.txt", contentType: "text/plain; charset=utf-8;cssp-mtime=1700000000.5;cssp-mode=0644",
            metadata: ["mode": "0644", "mtime": "1700000000.5", "uid": "1000", "gid": "100", "other": "x"])
        #expect(type == "text/plain; charset=utf-8")
        #expect(metadata == ["mode": "33188", "mtime": "1700000000.5", "uid": "1000", "gid": "100", "other": "x"])
        #expect(S3ObjectStore.wireForm(key: "d/", contentType: "application/directory;cssp-mode=0755", metadata: ["mode": "0755"])
            == ("application/directory", ["mode": "16877"]))
        #expect(S3ObjectStore.wireForm(key: "l", contentType: "application/link", metadata: ["mode": "0777"]).1 == ["mode": "41471"])
        // A symlink as csspfs stores it (no mode: always 0777) gets one, which s3fs needs to see a symlink.
        #expect(S3ObjectStore.wireForm(key: "l", contentType: "application/link", metadata: ["uid": "0"]).1 == ["mode": "41471", "uid": "0"])
        // Another tool's form passes as it is.
        #expect(S3ObjectStore.wireForm(key: "f", contentType: nil, metadata: ["mode": "100600"]) == (nil, ["mode": "100600"]))
    }

    @Test func aListingMergesObjectsAndPrefixesAndDecodesNames() throws {
        let body = """
            <?xml version="1.0" encoding="UTF-8"?>
            <ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix></Prefix>
            <KeyCount>3</KeyCount><MaxKeys>3</MaxKeys><Delimiter>%2F</Delimiter><IsTruncated>true</IsTruncated>
            <EncodingType>url</EncodingType>
            <Contents><Key>a+b%2Bc</Key><LastModified>2026-12-07T04:11:04.000Z</LastModified>
            <ETag>&quot;0cc175b9c0f1b6a831c399e269772661&quot;</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>
            <Contents><Key>%C3%A9</Key><LastModified>2026-12-07T04:11:05.500Z</LastModified><ETag>"x-2"</ETag><Size>7</Size></Contents>
            <CommonPrefixes><Prefix>d%2F</Prefix></CommonPrefixes>
            </ListBucketResult>
            """
        let page = try S3Listing.parse(Array(body.utf8))
        #expect(page.isTruncated)
        #expect(page.entries.map(\.name) == ["a b+c", "d/", "é"])
        guard case .object(let first) = page.entries[0] else { throw ObjectStoreError(.invalidResponse, "not an object") }
        #expect(first.etag == "0cc175b9c0f1b6a831c399e269772661" && first.size == 1)
        #expect(first.lastModified == 1_796_616_664)
        #expect(throws: ObjectStoreError.self) { try S3Listing.parse(Array("<Error><Code>x</Code></Error>".utf8)) }
    }

    @Test func theListOfUploadsGoesOnWhereItSays() throws {
        let body = """
            <ListMultipartUploadsResult><Bucket>b</Bucket><NextKeyMarker>k2</NextKeyMarker>
            <NextUploadIdMarker>id2</NextUploadIdMarker><IsTruncated>true</IsTruncated>
            <Upload><Key>k1</Key><UploadId>id1</UploadId><Initiated>2026-12-06T00:00:00.000Z</Initiated></Upload>
            <Upload><Key>k2</Key><UploadId>id2</UploadId><Initiated>2026-12-07T00:00:00.000Z</Initiated></Upload>
            </ListMultipartUploadsResult>
            """
        let uploads = try S3Listing.uploads(Array(body.utf8))
        #expect(uploads.uploads.map(\.session) == [UploadSession(key: "k1", id: "id1"), UploadSession(key: "k2", id: "id2")])
        #expect(uploads.uploads[1].initiated - uploads.uploads[0].initiated == 86_400)
        #expect(uploads.isTruncated && uploads.nextKeyMarker == "k2" && uploads.nextUploadIDMarker == "id2")
    }

    @Test func aListingGoesOnAfterEveryKeyBelowACommonPrefix() {
        #expect(S3ObjectStore.startAfter("dir/", prefix: "", delimiter: "/") == "dir0")
        #expect(S3ObjectStore.startAfter("p/dir/", prefix: "p/", delimiter: "/") == "p/dir0")
        // The prefix's own marker object, and any name without a delimiter: as they are.
        #expect(S3ObjectStore.startAfter("p/", prefix: "p/", delimiter: "/") == "p/")
        #expect(S3ObjectStore.startAfter("dir/", prefix: "", delimiter: nil) == "dir/")
        #expect(S3ObjectStore.startAfter("file", prefix: "", delimiter: "/") == "file")
    }

    @Test func deleteObjectsFailuresAreRead() throws {
        let body = """
            <DeleteResult><Error><Key>a&amp;b</Key><Code>AccessDenied</Code><Message>no</Message></Error>
            <Error><Key>c</Key><Code>NoSuchKey</Code></Error></DeleteResult>
            """
        let failed = try S3Listing.deleteErrors(Array(body.utf8))
        #expect(failed.map(\.key) == ["a&b", "c"] && failed.map(\.code) == ["AccessDenied", "NoSuchKey"])
        #expect(S3Listing.escape("a&<b>\"'") == "a&amp;&lt;b&gt;&quot;&apos;")
        #expect(!S3Listing.isXMLSafe("a\u{1}") && S3Listing.isXMLSafe("tab\there é"))
    }
}
