#if canImport(Glibc)
import Glibc
#endif

/// An access key and its secret. The secret never appears in descriptions or messages.
public struct Credentials: Sendable, Equatable, CustomStringConvertible {
    public var accessKey: String
    public var secret: String
    /// Where they came from, for error messages ("passwd file /etc/passwd-cssp").
    public var source: String

    public init(accessKey: String, secret: String, source: String) {
        self.accessKey = accessKey
        self.secret = secret
        self.source = source
    }

    public var description: String { "access key \(accessKey) from \(source)" }
}

/// Finds credentials the way s3fs does, first found wins:
/// `-o passwd_file=`, `$CSSP_PASSWD_FILE`, `~/.passwd-cssp`, `/etc/passwd-cssp`, then
/// `$CSSP_ACCESS_KEY_ID` + `$CSSP_SECRET_ACCESS_KEY`.
public enum CredentialLoader {
    /// Reads a file's bytes and permission bits; injectable for tests.
    public struct FileAccess: Sendable {
        public var read: @Sendable (String) -> Result<(contents: String, mode: UInt32), ConfigurationError>?
        public init(read: @escaping @Sendable (String) -> Result<(contents: String, mode: UInt32), ConfigurationError>?) {
            self.read = read
        }

        /// The real filesystem. nil = the file does not exist.
        public static let system = FileAccess { path in
            var st = stat()
            guard stat(path, &st) == 0 else {
                if errno == ENOENT { return nil }
                return .failure(ConfigurationError("cannot read passwd file \(path): \(String(cString: strerror(errno)))"))
            }
            guard (st.st_mode & S_IFMT) == S_IFREG else {
                return .failure(ConfigurationError("passwd file \(path) is not a regular file"))
            }
            guard let text = WholeFile.text(path) else {
                return .failure(ConfigurationError("cannot read passwd file \(path): \(String(cString: strerror(errno)))"))
            }
            return .success((text, UInt32(st.st_mode)))
        }
    }

    public static func load(
        endpoint: Endpoint, passwdFileOption: String?, environment: [String: String], fileAccess: FileAccess = .system
    ) throws(ConfigurationError) -> Credentials {
        var candidates: [(path: String, required: Bool)] = []
        if let path = passwdFileOption { candidates.append((path, true)) }
        if let path = environment["CSSP_PASSWD_FILE"], !path.isEmpty { candidates.append((path, true)) }
        if let home = environment["HOME"], !home.isEmpty { candidates.append((home + "/.passwd-cssp", false)) }
        candidates.append(("/etc/passwd-cssp", false))
        for candidate in candidates {
            switch fileAccess.read(candidate.path) {
            case nil:
                if candidate.required {
                    throw ConfigurationError("passwd file \(candidate.path) does not exist")
                }
            case .failure(let error)?:
                throw error
            case .success(let file)?:
                guard file.mode & 0o077 == 0 else {
                    throw ConfigurationError(
                        "passwd file \(candidate.path) is accessible by group or others: run chmod 600 \(candidate.path)")
                }
                return try parse(file.contents, path: candidate.path, endpoint: endpoint)
            }
        }
        if let key = environment["CSSP_ACCESS_KEY_ID"], let secret = environment["CSSP_SECRET_ACCESS_KEY"],
            !key.isEmpty, !secret.isEmpty
        {
            return Credentials(accessKey: key, secret: secret, source: "CSSP_ACCESS_KEY_ID/CSSP_SECRET_ACCESS_KEY")
        }
        throw ConfigurationError(
            "no credentials: create ~/.passwd-cssp (ACCESS_KEY:SECRET, chmod 600), pass -o passwd_file=PATH, "
                + "or set CSSP_ACCESS_KEY_ID and CSSP_SECRET_ACCESS_KEY")
    }

    /// Lines `ACCESS_KEY:SECRET` (the default) or `URL:ACCESS_KEY:SECRET` (for that endpoint only);
    /// `#` starts a comment line. A line for the endpoint wins over the default line.
    public static func parse(_ contents: String, path: String, endpoint: Endpoint) throws(ConfigurationError)
        -> Credentials
    {
        var fallback: Credentials? = nil
        let source = "passwd file \(path)"
        for (number, rawLine) in contents.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            var line = rawLine
            if line.hasSuffix("\r") { line = line.dropLast() }
            let trimmed = line.drop(while: { $0 == " " || $0 == "\t" })
            if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
            let fields = line.split(separator: ":", omittingEmptySubsequences: false)
            guard fields.count >= 2, !fields[fields.count - 1].isEmpty, !fields[fields.count - 2].isEmpty else {
                throw ConfigurationError(
                    "\(path) line \(number + 1) is not ACCESS_KEY:SECRET or URL:ACCESS_KEY:SECRET")
            }
            let credentials = Credentials(
                accessKey: String(fields[fields.count - 2]), secret: String(fields[fields.count - 1]), source: source)
            if fields.count == 2 {
                if fallback == nil { fallback = credentials }
                continue
            }
            let url = fields[0..<(fields.count - 2)].joined(separator: ":")
            guard let lineEndpoint = try? Endpoint(parsing: url) else {
                throw ConfigurationError("\(path) line \(number + 1): '\(url)' is not a container URL")
            }
            if lineEndpoint.baseURL == endpoint.baseURL && lineEndpoint.container == endpoint.container {
                return credentials
            }
        }
        if let fallback { return fallback }
        throw ConfigurationError("\(path) has no ACCESS_KEY:SECRET line for \(endpoint.url)")
    }
}
