#if canImport(Glibc)
import Glibc
#endif

/// Signs requests as the CSSP protocol says:
///
///     Signature = base64(HMAC-SHA1(secret, METHOD\nContent-MD5\nContent-Type\nDate\n<meta><resource>))
///
/// `<meta>` is every `x-object-meta*` header as `name:value\n`, names lower-cased and sorted, values of
/// a repeated header joined by `,`; `<resource>` is the decoded path `/<container>[/<key>]`.
public struct RequestSigner: Sendable {
    public let accessKey: String
    private let secret: [UInt8]

    public init(accessKey: String, secret: String) {
        self.accessKey = accessKey
        self.secret = Array(secret.utf8)
    }

    public static func stringToSign(
        method: String, contentMD5: String?, contentType: String?, date: String,
        headers: [(name: String, value: String)], resource: String
    ) -> String {
        var meta: [String: [String]] = [:]
        for (name, value) in headers {
            let lower = name.lowercased()
            if lower.hasPrefix("x-object-meta") { meta[lower, default: []].append(value) }
        }
        var text = "\(method)\n\(contentMD5 ?? "")\n\(contentType ?? "")\n\(date)\n"
        for name in meta.keys.sorted(by: { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }) {
            text += "\(name):\(meta[name]!.joined(separator: ","))\n"
        }
        return text + resource
    }

    public func signature(of stringToSign: String) -> String {
        Digest.base64(Digest.hmacSHA1(key: secret, message: Array(stringToSign.utf8)))
    }

    /// The `Authorization` header value.
    public func authorization(
        method: String, contentMD5: String?, contentType: String?, date: String,
        headers: [(name: String, value: String)], resource: String
    ) -> String {
        let text = Self.stringToSign(
            method: method, contentMD5: contentMD5, contentType: contentType, date: date,
            headers: headers, resource: resource)
        return "CSSP \(accessKey):\(signature(of: text))"
    }

    /// An RFC 1123 date in GMT (`Sat, 21 Nov 2026 22:40:21 GMT`) for `secondsSinceEpoch`.
    public static func httpDate(secondsSinceEpoch: Int) -> String {
        var t = time_t(secondsSinceEpoch)
        var parts = tm()
        gmtime_r(&t, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) "
            + "\(parts.tm_year + 1900) \(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }
}
