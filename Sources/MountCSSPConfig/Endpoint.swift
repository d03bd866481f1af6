/// A container endpoint URL: `http(s)://HOST[:PORT]/CONTAINER[/PREFIX]`.
public struct Endpoint: Sendable, Equatable {
    /// `scheme://host[:port]`.
    public var baseURL: String
    public var container: String
    /// Key prefix mounted as the root: "" or ending in "/".
    public var prefix: String

    /// The URL as given, normalised (no trailing slash), for messages and passwd-file matching.
    public var url: String { baseURL + "/" + container + (prefix.isEmpty ? "" : "/" + prefix.dropLast()) }

    public init(parsing text: String) throws(ConfigurationError) {
        let invalid = ConfigurationError(
            "invalid URL '\(text)': expected http(s)://HOST[:PORT]/CONTAINER, the container's endpoint URL")
        let schemes = ["https://", "http://"]
        guard let scheme = schemes.first(where: { text.lowercased().hasPrefix($0) }) else { throw invalid }
        let rest = text.dropFirst(scheme.count)
        guard let slash = rest.firstIndex(of: "/") else {
            throw ConfigurationError("URL '\(text)' names no container: append /CONTAINER to it")
        }
        let authority = rest[..<slash]
        guard !authority.isEmpty, !authority.contains("@"), !authority.contains("?"), !authority.contains("#") else {
            throw invalid
        }
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
            guard let port = Int(authority[authority.index(after: colon)...]), (1...65535).contains(port) else {
                throw ConfigurationError("invalid port in URL '\(text)'")
            }
        }
        var path = rest[rest.index(after: slash)...]
        guard !path.contains("?"), !path.contains("#") else { throw invalid }
        while path.hasSuffix("/") { path = path.dropLast() }
        let parts = path.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let first = parts.first, !first.isEmpty else {
            throw ConfigurationError("URL '\(text)' names no container: append /CONTAINER to it")
        }
        guard let container = Self.percentDecode(first) else { throw invalid }
        var prefix = ""
        if parts.count == 2 {
            guard let decoded = Self.percentDecode(parts[1]), !decoded.isEmpty, !decoded.contains("//") else {
                throw invalid
            }
            prefix = decoded + "/"
        }
        baseURL = scheme + authority.lowercased()
        self.container = container
        self.prefix = prefix
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
