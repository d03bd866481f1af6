/// The API a store speaks (`mount.cssp`'s URL scheme says which).
public enum StoreDialect: String, Sendable, Equatable {
    /// CSSP, the OpenStack Swift API with CSSP signatures: `http(s)://HOST[:PORT]/CONTAINER`.
    case cssp
    /// Any S3-compatible API, AWS Signature V4: `s3://BUCKET`.
    case s3
    /// Tencent COS's XML API with its own signature (q-sign-algorithm=sha1): `cos://BUCKET-APPID`.
    case cos
}

/// Where a mount's objects are: `http(s)://HOST[:PORT]/CONTAINER[/PREFIX]` (CSSP),
/// `s3://BUCKET[/PREFIX]` or `cos://BUCKET-APPID[/PREFIX]`. An s3:// or cos:// URL names no
/// server: `resolve` finds it from `-o endpoint=`, `-o region=` and `-o path_style`.
public struct Endpoint: Sendable, Equatable {
    public var dialect: StoreDialect
    /// `scheme://host[:port]` of the server: for s3:// and cos://, known once resolved.
    public var baseURL: String
    /// The container, or the bucket.
    public var container: String
    /// Key prefix mounted as the root: "" or ending in "/".
    public var prefix: String
    /// S3 and COS: the bucket is the first segment of the path (`endpoint/BUCKET/KEY`) rather
    /// than part of the host name (`BUCKET.host/KEY`).
    public var pathStyle = true
    /// S3 and COS: the region requests are signed for (S3) and whose host serves the bucket.
    public var region = ""

    /// The URL as given, normalised (no trailing slash), for messages and passwd-file matching.
    public var url: String {
        let tail = container + (prefix.isEmpty ? "" : "/" + prefix.dropLast())
        switch dialect {
        case .cssp: return baseURL + "/" + tail
        case .s3, .cos: return dialect.rawValue + "://" + tail
        }
    }

    /// The default region of s3:// (AWS's first, and what most S3-compatible servers accept).
    public static let defaultS3Region = "us-east-1"

    public init(parsing text: String) throws(ConfigurationError) {
        let invalid = ConfigurationError(
            "invalid URL '\(text)': expected http(s)://HOST[:PORT]/CONTAINER (CSSP), s3://BUCKET or "
                + "cos://BUCKET-APPID, each with an optional /PREFIX")
        let lowered = text.lowercased()
        if let dialect = [StoreDialect.s3, .cos].first(where: { lowered.hasPrefix($0.rawValue + "://") }) {
            try self.init(bucketURL: text, dialect: dialect, invalid: invalid)
        } else {
            try self.init(containerURL: text, invalid: invalid)
        }
    }

    private init(containerURL text: String, invalid: ConfigurationError) throws(ConfigurationError) {
        let lowered = text.lowercased()
        let schemes = ["https://", "http://"]
        guard let scheme = schemes.first(where: { lowered.hasPrefix($0) }) else { throw invalid }
        let rest = text.dropFirst(scheme.count)
        guard let slash = rest.firstIndex(of: "/") else {
            throw ConfigurationError("URL '\(text)' names no container: append /CONTAINER to it")
        }
        let authority = rest[..<slash]
        guard Self.isAuthority(authority) else { throw invalid }
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
            guard let port = Int(authority[authority.index(after: colon)...]), (1...65535).contains(port) else {
                throw ConfigurationError("invalid port in URL '\(text)'")
            }
        }
        guard let (container, prefix) = try Self.containerAndPrefix(rest[rest.index(after: slash)...], invalid: invalid) else {
            throw ConfigurationError("URL '\(text)' names no container: append /CONTAINER to it")
        }
        dialect = .cssp
        baseURL = scheme + authority.lowercased()
        self.container = container
        self.prefix = prefix
    }

    private init(bucketURL text: String, dialect: StoreDialect, invalid: ConfigurationError) throws(ConfigurationError) {
        let rest = text.dropFirst(dialect.rawValue.count + 3)
        guard let (bucket, prefix) = try Self.containerAndPrefix(rest, invalid: invalid) else {
            throw ConfigurationError("URL '\(text)' names no bucket: write \(dialect.rawValue)://BUCKET"
                + (dialect == .cos ? "-APPID" : "") + "[/PREFIX]")
        }
        // S3's rules for bucket names (3 to 63 lower-case letters, digits, dots and hyphens) are
        // what both stores and virtual-host addressing need; COS adds the app ID after a hyphen.
        let allowed = bucket.utf8.allSatisfy { b in
            (b >= UInt8(ascii: "a") && b <= UInt8(ascii: "z")) || (b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9"))
                || b == UInt8(ascii: "-") || b == UInt8(ascii: ".")
        }
        guard allowed, (3...63).contains(bucket.utf8.count) else {
            throw ConfigurationError(
                "invalid bucket name '\(bucket)' in '\(text)': 3 to 63 lower-case letters, digits, '.' and '-'")
        }
        if dialect == .cos {
            guard let hyphen = bucket.lastIndex(of: "-"), !bucket[bucket.index(after: hyphen)...].isEmpty,
                bucket[bucket.index(after: hyphen)...].allSatisfy(\.isNumber)
            else {
                throw ConfigurationError(
                    "COS bucket '\(bucket)' lacks its APPID: write cos://BUCKET-APPID, e.g. cos://examplebucket-1250000000")
            }
        }
        self.dialect = dialect
        baseURL = ""
        container = bucket
        self.prefix = prefix
    }

    /// Finds the server of an s3:// or cos:// URL: `endpoint` (`-o endpoint=URL`: path-style
    /// unless the host already names the bucket), else AWS's or COS's own host for `region`,
    /// virtual-host style (`pathStyle` forces path-style). A CSSP URL names its server itself.
    public mutating func resolve(endpoint option: String?, region: String?, pathStyle forced: Bool)
        throws(ConfigurationError)
    {
        guard dialect != .cssp else {
            if option != nil || region != nil || forced {
                throw ConfigurationError(
                    "options endpoint=, region= and path_style are for s3:// and cos:// URLs; a CSSP URL names its server")
            }
            return
        }
        if let region {
            guard !region.isEmpty, region.utf8.allSatisfy({ b in
                (b >= UInt8(ascii: "a") && b <= UInt8(ascii: "z")) || (b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9"))
                    || b == UInt8(ascii: "-")
            }) else {
                throw ConfigurationError("invalid region '\(region)': lower-case letters, digits and '-', e.g. ap-guangzhou")
            }
        }
        if let option {
            let lowered = option.lowercased()
            guard let scheme = ["https://", "http://"].first(where: { lowered.hasPrefix($0) }) else {
                throw ConfigurationError("invalid endpoint '\(option)': expected http(s)://HOST[:PORT]")
            }
            var authority = option.dropFirst(scheme.count)
            while authority.hasSuffix("/") { authority = authority.dropLast() }
            guard Self.isAuthority(authority), !authority.contains("/") else {
                throw ConfigurationError("invalid endpoint '\(option)': expected http(s)://HOST[:PORT], no path")
            }
            baseURL = scheme + authority.lowercased()
            pathStyle = true
            self.region = region ?? (dialect == .s3 ? Self.defaultS3Region : "")
            return
        }
        switch dialect {
        case .s3:
            let region = region ?? Self.defaultS3Region
            self.region = region
            // A bucket with a dot breaks the TLS name of virtual-host style: AWS says path-style.
            pathStyle = forced || container.contains(".")
            baseURL = pathStyle ? "https://s3.\(region).amazonaws.com" : "https://\(container).s3.\(region).amazonaws.com"
        case .cos:
            guard let region else {
                throw ConfigurationError(
                    "cos:// needs the bucket's region: add -o region=REGION (e.g. ap-guangzhou), or -o endpoint=URL")
            }
            self.region = region
            pathStyle = forced
            baseURL = pathStyle ? "https://cos.\(region).myqcloud.com" : "https://\(container).cos.\(region).myqcloud.com"
        case .cssp: break
        }
    }

    /// Whether a passwd file's `URL:ACCESS:SECRET` line for `other` is meant for this endpoint.
    public func isSameContainer(as other: Endpoint) -> Bool {
        dialect == other.dialect && container == other.container && (dialect != .cssp || baseURL == other.baseURL)
    }

    private static func isAuthority(_ authority: Substring) -> Bool {
        !authority.isEmpty && !authority.contains("@") && !authority.contains("?") && !authority.contains("#")
    }

    /// The first segment of `path` (decoded) and the rest as a prefix ending in "/" ("" when
    /// none); nil when there is no first segment.
    private static func containerAndPrefix(_ text: Substring, invalid: ConfigurationError) throws(ConfigurationError)
        -> (String, String)?
    {
        var path = text
        guard !path.contains("?"), !path.contains("#") else { throw invalid }
        while path.hasSuffix("/") { path = path.dropLast() }
        let parts = path.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let first = parts.first, !first.isEmpty else { return nil }
        guard let container = Self.percentDecode(first) else { throw invalid }
        var prefix = ""
        if parts.count == 2 {
            guard let decoded = Self.percentDecode(parts[1]), !decoded.isEmpty, !decoded.contains("//") else {
                throw invalid
            }
            prefix = decoded + "/"
        }
        return (container, prefix)
    }

    static func percentDecode<S: StringProtocol>(_ text: S) -> String? {
        var out = [UInt8]()
        var iterator = Array(text.utf8).makeIterator()
        while let b = iterator.next() {
            if b != UInt8(ascii: "%") {
                out.append(b)
                continue
            }
            guard let h = iterator.next(), let l = iterator.next(), let v = UInt8(String(decoding: [h, l], as: UTF8.self), radix: 16)
            else { return nil }
            out.append(v)
        }
        return String(validating: out, as: UTF8.self)
    }
}

/// A problem with what the user gave us: one line that says what to do.
public struct ConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
