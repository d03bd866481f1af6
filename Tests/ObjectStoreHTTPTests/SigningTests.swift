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
