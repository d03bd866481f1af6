#if canImport(Glibc)
import Glibc
#endif

/// A request as a signature covers it. The transport fills it in for each attempt (a retry is
/// signed again, with its own time and headers).
public struct SigningInput: Sendable {
    public var method: String
    /// The path as sent, percent-encoded: `/container/key` (path-style) or `/key`.
    public var encodedPath: String
    /// The same path decoded.
    public var path: String
    /// Query items as sent, decoded, in order.
    public var query: [(name: String, value: String)]
    /// The headers to sign: every header the request sends (names as given), `Host` included.
    public var headers: [(name: String, value: String)]
    /// CSSP: the decoded `/container[/key]` the signature names.
    public var resource: String
    /// S3: the body's SHA-256 in hex, or `UNSIGNED-PAYLOAD`.
    public var payloadHash: String
    /// The request's time, seconds since the epoch.
    public var time: Int

    public init(
        method: String, encodedPath: String, path: String, query: [(name: String, value: String)] = [],
        headers: [(name: String, value: String)], resource: String = "", payloadHash: String = SigV4Signer.emptyPayloadHash,
        time: Int
    ) {
        self.method = method
        self.encodedPath = encodedPath
        self.path = path
        self.query = query
        self.headers = headers
        self.resource = resource
        self.payloadHash = payloadHash
        self.time = time
    }

    /// The value of header `name` (any case), if sent.
    func header(_ name: String) -> String? {
        headers.first { $0.name.lowercased() == name }?.value
    }
}

/// A signature scheme: the headers it adds to a request (`Authorization` and what it needs).
public protocol RequestSigning: Sendable {
    /// The key named in errors ("access denied for access key …"); never the secret.
    var accessKey: String { get }
    func signingHeaders(for request: SigningInput) -> [(name: String, value: String)]
}

extension RequestSigner: RequestSigning {
    public func signingHeaders(for request: SigningInput) -> [(name: String, value: String)] {
        let date = request.header("date") ?? Self.httpDate(secondsSinceEpoch: request.time)
        let value = authorization(
            method: request.method, contentMD5: request.header("content-md5"), contentType: request.header("content-type"),
            date: date, headers: request.headers, resource: request.resource)
        return [("Authorization", value)]
    }
}

/// AWS Signature Version 4 for S3 (`AWS4-HMAC-SHA256`), signed in the header. Every header of
/// `SigningInput.headers` is signed.
public struct SigV4Signer: RequestSigning, Sendable {
    public let accessKey: String
    private let secret: String
    public let region: String
    public let sessionToken: String?
    public let service = "s3"

    /// SHA-256 of nothing: the payload hash of a request without a body.
    public static let emptyPayloadHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    /// Sent instead of a hash for a body streamed from a file (hashing it would read it twice).
    public static let unsignedPayload = "UNSIGNED-PAYLOAD"

    public init(accessKey: String, secret: String, region: String, sessionToken: String? = nil) {
        self.accessKey = accessKey
        self.secret = secret
        self.region = region
        self.sessionToken = sessionToken
    }

    public static func payloadHash(of bytes: [UInt8]) -> String { Digest.hex(Digest.sha256(bytes)) }

    /// `20130524T000000Z`.
    public static func amzDate(_ time: Int) -> String {
        var t = time_t(time)
        var parts = tm()
        gmtime_r(&t, &parts)
        func pad(_ v: Int32, _ width: Int) -> String {
            let digits = String(v)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        return pad(parts.tm_year + 1900, 4) + pad(parts.tm_mon + 1, 2) + pad(parts.tm_mday, 2) + "T"
            + pad(parts.tm_hour, 2) + pad(parts.tm_min, 2) + pad(parts.tm_sec, 2) + "Z"
    }

    /// The headers this scheme adds before signing: its time, the payload hash, the token.
    public func addedHeaders(for request: SigningInput) -> [(name: String, value: String)] {
        var added = [("x-amz-date", Self.amzDate(request.time)), ("x-amz-content-sha256", request.payloadHash)]
        if let sessionToken { added.append(("x-amz-security-token", sessionToken)) }
        return added
    }

    public func signingHeaders(for request: SigningInput) -> [(name: String, value: String)] {
        let added = addedHeaders(for: request)
        var signed = request
        signed.headers += added
        return added + [("Authorization", authorization(signed))]
    }

    /// The `Authorization` value of a request whose headers include this scheme's own.
    public func authorization(_ request: SigningInput) -> String {
        let (canonical, signedHeaders) = Self.canonicalRequest(request)
        let amzDate = Self.amzDate(request.time)
        let day = String(amzDate.prefix(8))
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let stringToSign = "AWS4-HMAC-SHA256\n\(amzDate)\n\(scope)\n" + Digest.hex(Digest.sha256(Array(canonical.utf8)))
        var key = Digest.hmacSHA256(key: Array(("AWS4" + secret).utf8), message: Array(day.utf8))
        for part in [region, service, "aws4_request"] { key = Digest.hmacSHA256(key: key, message: Array(part.utf8)) }
        let signature = Digest.hex(Digest.hmacSHA256(key: key, message: Array(stringToSign.utf8)))
        return "AWS4-HMAC-SHA256 Credential=\(accessKey)/\(scope), SignedHeaders=\(signedHeaders), Signature=\(signature)"
    }

    /// The canonical request and its signed header list.
    public static func canonicalRequest(_ request: SigningInput) -> (String, String) {
        let encoded: [(String, String)] = request.query.map { item in
            (PercentEncoding.encode(item.name, keepSlash: false), PercentEncoding.encode(item.value, keepSlash: false))
        }
        let query = encoded.sorted { $0.0 == $1.0 ? $0.1 < $1.1 : $0.0 < $1.0 }.map { "\($0.0)=\($0.1)" }.joined(separator: "&")
        var headers: [String: [String]] = [:]
        for (name, value) in request.headers {
            headers[name.lowercased(), default: []].append(collapsingSpaces(value))
        }
        let names = headers.keys.sorted()
        let canonicalHeaders = names.map { "\($0):\(headers[$0]!.joined(separator: ","))\n" }.joined()
        let signedHeaders = names.joined(separator: ";")
        let lines: [String] = [request.method, request.encodedPath, query, canonicalHeaders, signedHeaders, request.payloadHash]
        return (lines.joined(separator: "\n"), signedHeaders)
    }

    /// Trimmed, with every run of spaces inside made one space.
    static func collapsingSpaces(_ value: String) -> String {
        value.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
    }
}

/// Tencent COS's own signature (`q-sign-algorithm=sha1`), in the `Authorization` header. Every
/// header of `SigningInput.headers` is signed; a signature is valid for `validity` seconds.
public struct COSSigner: RequestSigning, Sendable {
    public let accessKey: String
    private let secret: String
    public let sessionToken: String?
    /// Seconds a signature stays valid after the request's time (and was valid before it, for
    /// a clock a little ahead of the server's).
    public var validity = 3600
    public var leeway = 60

    public init(accessKey: String, secret: String, sessionToken: String? = nil) {
        self.accessKey = accessKey
        self.secret = secret
        self.sessionToken = sessionToken
    }

    public func signingHeaders(for request: SigningInput) -> [(name: String, value: String)] {
        var signed = request
        var added: [(name: String, value: String)] = []
        if let sessionToken {
            added.append(("x-cos-security-token", sessionToken))
            signed.headers += added
        }
        let keyTime = "\(request.time - leeway);\(request.time + validity)"
        return added + [("Authorization", authorization(signed, keyTime: keyTime))]
    }

    /// SignKey: hex(HMAC-SHA1(SecretKey, KeyTime)).
    public func signKey(keyTime: String) -> String {
        Digest.hex(Digest.hmacSHA1(key: Array(secret.utf8), message: Array(keyTime.utf8)))
    }

    /// `name=value&…` of lower-cased, encoded names and encoded values, sorted, and the list of
    /// the names (`a;b`).
    static func encodedList(_ items: [(name: String, value: String)]) -> (pairs: String, names: String) {
        let pairs: [(String, String)] = items.map { item in
            (PercentEncoding.encode(item.name, keepSlash: false).lowercased(), PercentEncoding.encode(item.value, keepSlash: false))
        }
        let encoded = pairs.sorted { $0.0 == $1.0 ? $0.1 < $1.1 : $0.0 < $1.0 }
        return (encoded.map { "\($0.0)=\($0.1)" }.joined(separator: "&"), encoded.map(\.0).joined(separator: ";"))
    }

    /// HttpString: the method in lower case, the decoded path, the parameters, the headers.
    public static func httpString(_ request: SigningInput) -> String {
        let parameters = encodedList(request.query).pairs
        let headers = encodedList(request.headers).pairs
        return "\(request.method.lowercased())\n\(request.path)\n\(parameters)\n\(headers)\n"
    }

    public func authorization(_ request: SigningInput, keyTime: String) -> String {
        let stringToSign = "sha1\n\(keyTime)\n" + Digest.hex(Digest.sha1(Array(Self.httpString(request).utf8))) + "\n"
        let signature = Digest.hex(
            Digest.hmacSHA1(key: Array(signKey(keyTime: keyTime).utf8), message: Array(stringToSign.utf8)))
        return "q-sign-algorithm=sha1&q-ak=\(accessKey)&q-sign-time=\(keyTime)&q-key-time=\(keyTime)"
            + "&q-header-list=\(Self.encodedList(request.headers).names)"
            + "&q-url-param-list=\(Self.encodedList(request.query).names)&q-signature=\(signature)"
    }
}
