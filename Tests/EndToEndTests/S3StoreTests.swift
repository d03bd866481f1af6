import Foundation
import ObjectStore
import ObjectStoreHTTP
import Testing

#if canImport(Glibc)
import Glibc
#endif
import Logging

extension Environment {
    /// A client of bucket `bucket` through the server's S3 API (s3api), or through its COS
    /// front (`dialect` .cos), with the peer key scripts/cssp-server made (`secret`: another,
    /// to see it refused).
    func s3Store(bucket: String, secret: String? = nil, dialect: HTTPDialect = .s3) throws -> S3ObjectStore {
        let env = ProcessInfo.processInfo.environment
        guard let key = env["CSSP_PEER_USER"], let peerSecret = env["CSSP_PEER_KEY"], let cosURL = env["CSSP_COS_URL"] else {
            throw HarnessError("CSSP_PEER_USER, CSSP_PEER_KEY and CSSP_COS_URL are not set: run through scripts/test")
        }
        Curl.globalInit()
        let signer: any RequestSigning =
            dialect == .cos
            ? COSSigner(accessKey: key, secret: secret ?? peerSecret)
            : SigV4Signer(accessKey: key, secret: secret ?? peerSecret, region: "us-east-1")
        var configuration = HTTPStoreConfiguration(baseURL: dialect == .cos ? cosURL : serverURL, container: bucket, signer: signer)
        configuration.dialect = dialect
        configuration.maxAttempts = 3
        let host = String(configuration.baseURL.dropFirst("http://".count))
        return S3ObjectStore(
            configuration: configuration, logger: Logger(label: "e2e-s3"), copySourceHost: dialect == .cos ? host + "/" + bucket : nil)
    }

    /// The URL of the COS front (scripts/cssp-server).
    func cosURL() throws -> String {
        guard let url = ProcessInfo.processInfo.environment["CSSP_COS_URL"] else {
            throw HarnessError("CSSP_COS_URL is not set: run through scripts/test")
        }
        return url
    }
}

/// `S3ObjectStore` against Swift's s3api on the test server, directly (S3) and through the COS
/// front, which checks every COS signature (COS): every call of the store interface, as the
/// filesystem makes it.
@Suite(.serialized)
struct S3StoreTests {
    let environment: Environment
    let bucket: String

    init() throws {
        environment = try Environment.load()
        // (A name COS takes too: BUCKET-APPID.)
        bucket = "s3-" + UUID().uuidString.prefix(6).lowercased() + "-1250000000"
        try environment.store(container: bucket).createContainer()
    }

    @Test(arguments: [HTTPDialect.s3, .cos])
    func readsWhatItWritesWithMetadata(dialect: HTTPDialect) throws {
        let s3 = try environment.s3Store(bucket: bucket, dialect: dialect)
        #expect(try s3.headContainer() == ContainerInfo(objectCount: 0, bytesUsed: 0))
        let body = Array("hello, s3api".utf8)
        let etag = try s3.put(
            key: "dir/a b+c.txt", body: .bytes(body), contentType: "text/plain", metadata: ["mode": "33188", "mtime": "1700000000.5"],
            onlyIfAbsent: false)
        #expect(etag == MD5.hex(of: body))
        let info = try s3.head(key: "dir/a b+c.txt")
        #expect(info.size == Int64(body.count) && info.etag == etag && info.contentType == "text/plain")
        #expect(info.metadata == ["mode": "33188", "mtime": "1700000000.5"])
        #expect(info.lastModified > 1_700_000_000)
        #expect(try s3.getBytes(key: "dir/a b+c.txt", range: ByteRange(offset: 7, length: 2)) == Array("s3".utf8))
        #expect(try s3.getBytes(key: "dir/a b+c.txt", range: nil) == body)
        #expect(throws: ObjectStoreError.self) { try s3.head(key: "missing") }
        do {
            _ = try s3.head(key: "missing")
        } catch {
            #expect(error.code == .notFound)
        }
    }

    @Test(arguments: [HTTPDialect.s3, .cos])
    func listingsPageThroughObjectsAndCommonPrefixes(dialect: HTTPDialect) throws {
        let s3 = try environment.s3Store(bucket: bucket, dialect: dialect)
        for key in ["a", "b/1", "b/2", "b/3", "c", "d/x", "e", "f\u{1}g", "é"] {
            try s3.put(key: key, body: .bytes([1]), contentType: nil, metadata: [:], onlyIfAbsent: false)
        }
        let all = try s3.listAll(prefix: "", delimiter: "/", pageSize: 2).map(\.name)
        #expect(all == ["a", "b/", "c", "d/", "e", "f\u{1}g", "é"])
        let below = try s3.listAll(prefix: "b/", delimiter: "/", pageSize: 1).map(\.name)
        #expect(below == ["b/1", "b/2", "b/3"])
        let flat = try s3.listAll(prefix: "", delimiter: nil, pageSize: 10_000)
        #expect(flat.count == 9)
        guard case .object(let summary)? = flat.first else { throw HarnessError("no object listed") }
        #expect(summary.size == 1 && summary.etag == MD5.hex(of: [1]) && summary.lastModified > 1_700_000_000)
        let page = try s3.list(prefix: "", delimiter: "/", marker: "b/", limit: 2)
        #expect(page.entries.map(\.name) == ["c", "d/"] && page.nextMarker == "d/")
        // A lane of a walk: up to its end only (S3 has no end_marker: cut here).
        let lane = try s3.list(prefix: "", delimiter: "/", marker: "a", endMarker: "d/", limit: 10_000)
        #expect(lane.entries.map(\.name) == ["b/", "c"] && lane.nextMarker == nil)
    }

    @Test(arguments: [HTTPDialect.s3, .cos])
    func copiesReplaceMetadataAndBulkDeletesTakeMissingKeys(dialect: HTTPDialect) throws {
        let s3 = try environment.s3Store(bucket: bucket, dialect: dialect)
        try s3.put(key: "src", body: .bytes([1, 2, 3]), contentType: "text/x-a", metadata: ["mode": "33188"], onlyIfAbsent: false)
        try s3.copy(from: "src", to: "kept")
        #expect(try s3.head(key: "kept").metadata == ["mode": "33188"])
        #expect(try s3.head(key: "kept").contentType == "text/x-a")
        try s3.copy(from: "src", to: "new", contentType: nil, metadata: ["mode": "33261"])
        let copied = try s3.head(key: "new")
        #expect(copied.metadata == ["mode": "33261"] && copied.contentType == "text/x-a")
        try s3.setMetadata(key: "src", contentType: "text/x-b", metadata: ["uid": "7"], manifest: nil)
        let changed = try s3.head(key: "src")
        #expect(changed.metadata == ["uid": "7"] && changed.contentType == "text/x-b" && changed.size == 3)
        #expect(try s3.bulkDelete(keys: ["src", "kept", "never there", "a&b<c>"]) == [])
        #expect(try s3.listAll(prefix: "", delimiter: nil).map(\.name) == ["new"])
        do {
            try s3.copy(from: "gone", to: "x")
            Issue.record("a copy of a missing key succeeded")
        } catch {
            #expect(error.code == .notFound)
        }
    }

    @Test(arguments: [HTTPDialect.s3, .cos])
    func multipartUploadsFinishWithTheirMetadataAndAbort(dialect: HTTPDialect) throws {
        let s3 = try environment.s3Store(bucket: bucket, dialect: dialect)
        let part = [UInt8](repeating: 7, count: 5 << 20)
        let last = Array("tail".utf8)
        let session = try s3.beginUpload(key: "big", contentType: "video/mp4", metadata: ["mode": "33188"])
        let etags = [
            try s3.uploadPart(session, number: 1, body: .bytes(part)),
            try s3.uploadPart(session, number: 2, body: .bytes(last)),
        ]
        let finished = try s3.finishUpload(
            session, partETags: etags, size: Int64(part.count + last.count), partSize: Int64(part.count),
            destination: { "big" }, contentType: "video/mp4", metadata: ["mode": "33188"])
        let info = try s3.head(key: "big")
        #expect(finished.etag == s3.uploadETag(partETags: etags) && info.etag == finished.etag)
        #expect(info.size == Int64(part.count + last.count) && info.metadata == ["mode": "33188"])
        // Finished under another name with other metadata: a copy of it.
        let other = try s3.beginUpload(key: "big2")
        let one = try s3.uploadPart(other, number: 1, body: .bytes(last))
        let moved = try s3.finishUpload(
            other, partETags: [one], size: 4, partSize: 4, destination: { "big2 (conflict)" }, contentType: nil,
            metadata: ["mtime": "5"])
        #expect(moved.key == "big2 (conflict)")
        #expect(try s3.head(key: "big2 (conflict)").metadata == ["mtime": "5"])
        #expect(throws: ObjectStoreError.self) { try s3.head(key: "big2") }
        let aborted = try s3.beginUpload(key: "never")
        _ = try s3.uploadPart(aborted, number: 1, body: .bytes(last))
        s3.abortUpload(aborted)
        #expect(throws: ObjectStoreError.self) { try s3.head(key: "never") }
        #expect(s3.maximumParts == 1_000)
    }

    @Test(arguments: [HTTPDialect.s3, .cos])
    func staleUploadsBelowThePrefixAreAborted(dialect: HTTPDialect) throws {
        let s3 = try environment.s3Store(bucket: bucket, dialect: dialect)
        let old = try s3.beginUpload(key: "mnt/left behind")
        _ = try s3.uploadPart(old, number: 1, body: .bytes([1, 2]))
        let elsewhere = try s3.beginUpload(key: "other/upload")
        let now = Double(time(nil))
        #expect(Set(try s3.uploadsInProgress(prefix: "").map(\.session.id)) == [old.id, elsewhere.id])
        // Begun just now: not stale after a day's age.
        #expect(try s3.abortStaleUploads(prefix: "mnt/", olderThan: 86_400, now: now) == 0)
        #expect(try s3.abortStaleUploads(prefix: "mnt/", olderThan: 86_400, now: now + 2 * 86_400) == 1)
        #expect(try s3.uploadsInProgress(prefix: "").map(\.session.id) == [elsewhere.id])
        s3.abortUpload(elsewhere)
        #expect(try s3.uploadsInProgress(prefix: "").isEmpty)
    }

    /// s3api answers a PUT with `If-None-Match: *` 501 Not Implemented: the probe finds out, and
    /// a PUT meant only for an absent key goes without the condition (callers HEAD first).
    @Test(arguments: [HTTPDialect.s3, .cos])
    func conditionalPutsAreProbedBeforeTheyAreSent(dialect: HTTPDialect) throws {
        let s3 = try environment.s3Store(bucket: bucket, dialect: dialect)
        #expect(!s3.honoursIfNoneMatch)
        try s3.put(key: "once", body: .bytes([1]), contentType: nil, metadata: [:], onlyIfAbsent: true)
        try s3.put(key: "once", body: .bytes([2]), contentType: nil, metadata: [:], onlyIfAbsent: true)
        #expect(try s3.getBytes(key: "once", range: nil) == [2])
        #expect(try s3.listAll(prefix: "", delimiter: nil).map(\.name) == ["once"], "the probe's object is gone")
    }

    @Test(arguments: [HTTPDialect.s3, .cos])
    func aWrongSecretAndAMissingBucketSayWhatIsWrong(dialect: HTTPDialect) throws {
        let wrong = try environment.s3Store(bucket: bucket, secret: "not the secret", dialect: dialect)
        do {
            _ = try wrong.headContainer()
            Issue.record("a wrong secret was accepted")
        } catch {
            #expect(error.code == .accessDenied)
        }
        do {
            _ = try wrong.list(prefix: "", delimiter: nil, marker: nil, limit: 10)
            Issue.record("a wrong secret was accepted")
        } catch {
            #expect(error.code == .accessDenied && error.message.contains("signature"), "\(error.message)")
        }
        let missing = try environment.s3Store(bucket: "no-such-bucket-here", dialect: dialect)
        do {
            _ = try missing.list(prefix: "", delimiter: nil, marker: nil, limit: 10)
            Issue.record("a missing bucket was listed")
        } catch {
            #expect(error.code == .notFound && error.message.contains("bucket"), "\(error.message)")
        }
    }
}
