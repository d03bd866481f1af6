import Testing

@testable import ObjectStoreHTTP

/// Expected signatures were computed independently with
/// `printf '<StringToSign>' | openssl dgst -sha1 -hmac 'secret/Key+1' -binary | base64`.
struct SigningTests {
    let signer = RequestSigner(accessKey: "AK1", secret: "secret/Key+1")
    let date = "Sun, 22 Nov 2026 01:00:00 GMT"

    @Test func simpleGet() {
        let header = signer.authorization(
            method: "GET", contentMD5: nil, contentType: nil, date: date, headers: [], resource: "/photos/a/b.jpg")
        #expect(header == "CSSP AK1:AkpHbfjQ77mM7bHugtxf6teeEV4=")
    }

    @Test func metadataHeadersAndAwkwardKey() {
        let headers: [(name: String, value: String)] = [
            ("X-Object-Meta-Zeta", "z"), ("x-object-meta-alpha", "a"), ("Content-Length", "5"),
            ("X-Object-Meta-Alpha", "b"),
        ]
        let text = RequestSigner.stringToSign(
            method: "PUT", contentMD5: nil, contentType: "image/jpeg", date: date, headers: headers,
            resource: "/photos/dir with space/a+b%c?d#e/é.txt")
        #expect(
            text
                == "PUT\n\nimage/jpeg\n\(date)\nx-object-meta-alpha:a,b\nx-object-meta-zeta:z\n"
                + "/photos/dir with space/a+b%c?d#e/é.txt")
        #expect(signer.signature(of: text) == "5q2AZ52VjY54kL6sNplChhe8nkI=")
    }

    @Test func containerRequest() {
        let header = signer.authorization(
            method: "HEAD", contentMD5: nil, contentType: nil, date: date, headers: [], resource: "/photos")
        #expect(header == "CSSP AK1:dNWQ4CWq0eHh0hABmwf9kWjq6lg=")
    }

    @Test func httpDates() {
        #expect(RequestSigner.httpDate(secondsSinceEpoch: 0) == "Thu, 01 Jan 1970 00:00:00 GMT")
        #expect(RequestSigner.httpDate(secondsSinceEpoch: 1_795_309_200) == date)
        #expect(HTTPDate.parse(date) == 1_795_309_200)
    }

    @Test func percentEncodingKeepsOnlySeparators() {
        #expect(PercentEncoding.encode("dir with space/a+b%c?d#e/é.txt", keepSlash: true)
            == "dir%20with%20space/a%2Bb%25c%3Fd%23e/%C3%A9.txt")
        #expect(PercentEncoding.encode("a/b", keepSlash: false) == "a%2Fb")
        #expect(PercentEncoding.decode("a%2Bb%25c%C3%A9") == "a+b%cé")
        #expect(PercentEncoding.decode("bad%2") == nil)
    }

    @Test func md5MatchesKnownDigests() {
        #expect(MD5.hex(of: []) == "d41d8cd98f00b204e9800998ecf8427e")
        #expect(MD5.hex(of: Array("hello".utf8)) == "5d41402abc4b2a76b9719d911017c592")
    }

    @Test func clockSkewIsRecognisedWithoutABody() {
        #expect(HTTPObjectStore.isClockSkew(detailCode: "RequestTimeTooSkewed", serverDate: nil, localOffset: 0))
        #expect(!HTTPObjectStore.isClockSkew(detailCode: "SignatureDoesNotMatch", serverDate: nil, localOffset: 0))
        // A HEAD has no body: the server's Date against the time we signed with decides.
        let serverNow = RequestSigner.httpDate(secondsSinceEpoch: Int(time(nil)))
        #expect(HTTPObjectStore.isClockSkew(detailCode: nil, serverDate: serverNow, localOffset: 3600))
        #expect(!HTTPObjectStore.isClockSkew(detailCode: nil, serverDate: serverNow, localOffset: 0))
    }
}

#if canImport(Glibc)
import Glibc
#endif

/// AWS Signature V4, against the four examples of AWS's "Signature Calculations for the
/// Authorization Header" (S3 API reference): their access key, secret, date and signatures.
struct SigV4Tests {
    let signer = SigV4Signer(
        accessKey: "AKIAIOSFODNN7EXAMPLE", secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", region: "us-east-1")
    let time = 1_369_353_600  // 2013-05-24T00:00:00Z
    let host = ("Host", "examplebucket.s3.amazonaws.com")

    func signature(_ request: SigningInput) -> String {
        var signed = request
        signed.headers += signer.addedHeaders(for: request)
        let authorization = signer.authorization(signed)
        return String(authorization[authorization.range(of: "Signature=")!.upperBound...])
    }

    @Test func getObjectWithARange() {
        let request = SigningInput(
            method: "GET", encodedPath: "/test.txt", path: "/test.txt", headers: [host, ("Range", "bytes=0-9")], time: time)
        #expect(signature(request) == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
        let headers = signer.signingHeaders(for: request)
        #expect(headers.map(\.name) == ["x-amz-date", "x-amz-content-sha256", "Authorization"])
        #expect(headers[2].value.hasPrefix(
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                + "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb8"))
    }

    @Test func putObject() {
        let body = Array("Welcome to Amazon S3.".utf8)
        let request = SigningInput(
            method: "PUT", encodedPath: PercentEncoding.encode("/test$file.text", keepSlash: true), path: "/test$file.text",
            headers: [("Date", "Fri, 24 May 2013 00:00:00 GMT"), host, ("x-amz-storage-class", "REDUCED_REDUNDANCY")],
            payloadHash: SigV4Signer.payloadHash(of: body), time: time)
        #expect(signature(request) == "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd")
    }

    @Test func bucketSubresourceAndListing() {
        let lifecycle = SigningInput(method: "GET", encodedPath: "/", path: "/", query: [("lifecycle", "")], headers: [host], time: time)
        #expect(signature(lifecycle) == "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543")
        let listing = SigningInput(
            method: "GET", encodedPath: "/", path: "/", query: [("prefix", "J"), ("max-keys", "2")], headers: [host], time: time)
        #expect(signature(listing) == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")
    }

    @Test func aSessionTokenIsSentAndSigned() {
        let withToken = SigV4Signer(accessKey: "A", secret: "S", region: "us-east-1", sessionToken: "TOKEN")
        let headers = withToken.signingHeaders(
            for: SigningInput(method: "GET", encodedPath: "/", path: "/", headers: [host], time: time))
        #expect(headers.contains { $0.name == "x-amz-security-token" && $0.value == "TOKEN" })
        #expect(headers.last!.value.contains("SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,"))
    }
}

/// COS's signature, against the examples of its "Request Signature" document (SecretKey
/// BQYIM75p8x0iWVFSIgqEKwFprpRSVHlz): the SignKey of a KeyTime, then the upload and the
/// download of `/exampleobject(腾讯云)`.
struct COSSigningTests {
    let signer = COSSigner(accessKey: "AKIDQjz3ltompVjBni5LitkWHFlFpwkn9U5q", secret: "BQYIM75p8x0iWVFSIgqEKwFprpRSVHlz")
    let path = "/exampleobject(腾讯云)"
    let host = ("Host", "examplebucket-1250000000.cos.ap-beijing.myqcloud.com")

    @Test func signKey() {
        #expect(signer.signKey(keyTime: "1557989151;1557996351") == "eb2519b498b02ac213cb1f3d1a3d27a3b3c9bc5f")
    }

    @Test func putObject() {
        let request = SigningInput(
            method: "PUT", encodedPath: PercentEncoding.encode(path, keepSlash: true), path: path,
            headers: [
                ("Date", "Thu, 16 May 2019 06:45:51 GMT"), host, ("Content-Type", "text/plain"), ("Content-Length", "13"),
                ("Content-MD5", "mQ/fVh815F3k6TAUm8m0eg=="), ("x-cos-acl", "private"), ("x-cos-grant-read", "uin=\"100000000011\""),
            ], time: 0)
        #expect(signer.authorization(request, keyTime: "1557989151;1557996351") ==
            "q-sign-algorithm=sha1&q-ak=AKIDQjz3ltompVjBni5LitkWHFlFpwkn9U5q&q-sign-time=1557989151;1557996351"
            + "&q-key-time=1557989151;1557996351"
            + "&q-header-list=content-length;content-md5;content-type;date;host;x-cos-acl;x-cos-grant-read"
            + "&q-url-param-list=&q-signature=3b8851a11a569213c17ba8fa7dcf2abec6935172")
    }

    @Test func getObjectWithParameters() {
        let request = SigningInput(
            method: "GET", encodedPath: PercentEncoding.encode(path, keepSlash: true), path: path,
            query: [("response-content-type", "application/octet-stream"), ("response-cache-control", "max-age=600")],
            headers: [("Date", "Thu, 16 May 2019 06:55:53 GMT"), host], time: 0)
        let authorization = signer.authorization(request, keyTime: "1557989753;1557996953")
        #expect(authorization.hasSuffix(
            "&q-header-list=date;host&q-url-param-list=response-cache-control;response-content-type"
                + "&q-signature=01681b8c9d798a678e43b685a9f1bba0f6c0e012"))
    }

    @Test func theKeyTimeSpansTheRequestTime() {
        let headers = signer.signingHeaders(for: SigningInput(method: "GET", encodedPath: "/", path: "/", headers: [host], time: 1000))
        #expect(headers.count == 1 && headers[0].value.contains("&q-sign-time=940;4600&q-key-time=940;4600&"))
    }
}
