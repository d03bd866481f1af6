#if canImport(Glibc)
import Glibc
#endif

/// An access key and its secret. The secret never appears in descriptions or messages.
public struct Credentials: Sendable, Equatable, CustomStringConvertible {
    public var accessKey: String
    public var secret: String
    /// A temporary key's session token (S3: `x-amz-security-token`; COS: `x-cos-security-token`).
    public var sessionToken: String?
    /// Where they came from, for error messages ("passwd file /etc/passwd-cssp").
    public var source: String

    public init(accessKey: String, secret: String, sessionToken: String? = nil, source: String) {
        self.accessKey = accessKey
        self.secret = secret
        self.sessionToken = sessionToken
        self.source = source
    }

    public var description: String { "access key \(accessKey) from \(source)" }
}

/// Finds credentials as each store's own tools do, first found wins:
/// - CSSP, the way s3fs does: `-o passwd_file=`, `$CSSP_PASSWD_FILE`, `~/.passwd-cssp`,
///   `/etc/passwd-cssp`, then `$CSSP_ACCESS_KEY_ID` + `$CSSP_SECRET_ACCESS_KEY`;
/// - s3://, as the AWS CLI does: `-o passwd_file=`, `$AWS_ACCESS_KEY_ID` +
///   `$AWS_SECRET_ACCESS_KEY` (+ `$AWS_SESSION_TOKEN`), then the profile (`-o profile=`,
///   `$AWS_PROFILE`, `default`) of `~/.aws/credentials` (`$AWS_SHARED_CREDENTIALS_FILE`);
/// - cos://, as Tencent Cloud's SDKs do: `-o passwd_file=`, `$TENCENTCLOUD_SECRET_ID` +
///   `$TENCENTCLOUD_SECRET_KEY` (+ `$TENCENTCLOUD_SESSION_TOKEN`).
/// Every file must be readable by its owner only (mode 600): one others can read is refused.
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
        endpoint: Endpoint, passwdFileOption: String?, environment: [String: String], profile: String? = nil,
        fileAccess: FileAccess = .system
    ) throws(ConfigurationError) -> Credentials {
        var candidates: [(path: String, required: Bool)] = []
        if let path = passwdFileOption { candidates.append((path, true)) }
        if endpoint.dialect == .cssp {
            if let path = environment["CSSP_PASSWD_FILE"], !path.isEmpty { candidates.append((path, true)) }
            if let home = environment["HOME"], !home.isEmpty { candidates.append((home + "/.passwd-cssp", false)) }
            candidates.append(("/etc/passwd-cssp", false))
        }
        for candidate in candidates {
            guard let contents = try readPrivate(candidate.path, required: candidate.required, what: "passwd file", fileAccess)
            else { continue }
            return try parse(contents, path: candidate.path, endpoint: endpoint)
        }
        func fromEnvironment(_ keyName: String, _ secretName: String, _ tokenName: String?) -> Credentials? {
            guard let key = environment[keyName], let secret = environment[secretName], !key.isEmpty, !secret.isEmpty
            else { return nil }
            let token = tokenName.flatMap { environment[$0] }.flatMap { $0.isEmpty ? nil : $0 }
            return Credentials(accessKey: key, secret: secret, sessionToken: token, source: "\(keyName)/\(secretName)")
        }
        switch endpoint.dialect {
        case .cssp:
            if let found = fromEnvironment("CSSP_ACCESS_KEY_ID", "CSSP_SECRET_ACCESS_KEY", nil) { return found }
            throw ConfigurationError(
                "no credentials: create ~/.passwd-cssp (ACCESS_KEY:SECRET, chmod 600), pass -o passwd_file=PATH, "
                    + "or set CSSP_ACCESS_KEY_ID and CSSP_SECRET_ACCESS_KEY")
        case .s3:
            if let found = fromEnvironment("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN") { return found }
            let explicitFile = environment["AWS_SHARED_CREDENTIALS_FILE"].flatMap { $0.isEmpty ? nil : $0 }
            let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 }
            let chosen = profile ?? environment["AWS_PROFILE"].flatMap { $0.isEmpty ? nil : $0 }
            if let path = explicitFile ?? home.map({ $0 + "/.aws/credentials" }),
                let contents = try readPrivate(path, required: explicitFile != nil || profile != nil, what: "credentials file", fileAccess)
            {
                return try awsProfile(contents, path: path, profile: chosen ?? "default")
            }
            if let profile {
                throw ConfigurationError("profile '\(profile)' given, but there is no ~/.aws/credentials to find it in")
            }
            throw ConfigurationError(
                "no credentials for \(endpoint.url): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, write them to "
                    + "~/.aws/credentials (chmod 600), or pass -o passwd_file=PATH (ACCESS_KEY:SECRET, chmod 600)")
        case .cos:
            if let found = fromEnvironment("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN") {
                return found
            }
            throw ConfigurationError(
                "no credentials for \(endpoint.url): set TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY, or pass "
                    + "-o passwd_file=PATH (SECRET_ID:SECRET_KEY, chmod 600)")
        }
    }

    /// The contents of a credentials file readable by its owner only; nil when it does not
    /// exist and need not.
    private static func readPrivate(_ path: String, required: Bool, what: String, _ fileAccess: FileAccess)
        throws(ConfigurationError) -> String?
    {
        switch fileAccess.read(path) {
        case nil:
            if required { throw ConfigurationError("\(what) \(path) does not exist") }
            return nil
        case .failure(let error)?:
            throw error
        case .success(let file)?:
            guard file.mode & 0o077 == 0 else {
                throw ConfigurationError("\(what) \(path) is accessible by group or others: run chmod 600 \(path)")
            }
            return file.contents
        }
    }

    /// The keys of `[profile]` in an AWS shared credentials file (INI: `aws_access_key_id`,
    /// `aws_secret_access_key`, `aws_session_token`; `#` and `;` start comments).
    public static func awsProfile(_ contents: String, path: String, profile: String) throws(ConfigurationError)
        -> Credentials
    {
        var section: String? = nil
        var found = false
        var values: [String: String] = [:]
        for rawLine in contents.split(separator: "\n", omittingEmptySubsequences: false) {
            let line = rawLine.trimmingSpaces
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") {
                section = String(line.dropFirst().dropLast()).trimmingSpaces
                if section == profile { found = true }
                continue
            }
            guard section == profile, let equals = line.firstIndex(of: "=") else { continue }
            values[line[..<equals].trimmingSpaces.lowercased()] = line[line.index(after: equals)...].trimmingSpaces
        }
        guard found else { throw ConfigurationError("\(path) has no [\(profile)] profile: add it, or pass -o profile=NAME") }
        guard let key = values["aws_access_key_id"], let secret = values["aws_secret_access_key"], !key.isEmpty, !secret.isEmpty
        else {
            throw ConfigurationError("profile [\(profile)] of \(path) lacks aws_access_key_id or aws_secret_access_key")
        }
        let token = values["aws_session_token"].flatMap { $0.isEmpty ? nil : $0 }
        return Credentials(accessKey: key, secret: secret, sessionToken: token, source: "profile [\(profile)] of \(path)")
    }

    /// Lines `ACCESS_KEY:SECRET` (the default) or `URL:ACCESS_KEY:SECRET` (for that endpoint only);
    /// `#` starts a comment line. A line for the endpoint wins over the default line. The secret
    /// is what follows the last colon: an access key may hold colons (`account:user`).
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
            let malformed = ConfigurationError(
                "\(path) line \(number + 1) is not ACCESS_KEY:SECRET or URL:ACCESS_KEY:SECRET")
            // A URL ends at the first colon of its path (http's port has one before); the secret
            // follows the last colon, and the access key may hold colons (s3api's account:user).
            let text = String(line)
            var rest = Substring(text)
            var url: String? = nil
            if let scheme = ["http://", "https://", "s3://", "cos://"].first(where: { text.lowercased().hasPrefix($0) }) {
                let afterScheme = text.index(text.startIndex, offsetBy: scheme.count)
                let pathStart = scheme.hasPrefix("http") ? text[afterScheme...].firstIndex(of: "/") : afterScheme
                guard let pathStart, let colon = text[pathStart...].firstIndex(of: ":") else { throw malformed }
                url = String(text[..<colon])
                rest = text[text.index(after: colon)...]
            }
            guard let last = rest.lastIndex(of: ":"), last != rest.startIndex, rest.index(after: last) != rest.endIndex else {
                throw malformed
            }
            let credentials = Credentials(
                accessKey: String(rest[..<last]), secret: String(rest[rest.index(after: last)...]), source: source)
            guard let url else {
                if fallback == nil { fallback = credentials }
                continue
            }
            guard let lineEndpoint = try? Endpoint(parsing: url) else {
                throw ConfigurationError("\(path) line \(number + 1): '\(url)' is not a container URL")
            }
            if lineEndpoint.isSameContainer(as: endpoint) { return credentials }
        }
        if let fallback { return fallback }
        throw ConfigurationError("\(path) has no ACCESS_KEY:SECRET line for \(endpoint.url)")
    }
}

extension StringProtocol {
    /// Without the spaces, tabs and carriage returns at either end.
    var trimmingSpaces: String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\r" }
        return String(drop(while: isSpace).reversed().drop(while: isSpace).reversed())
    }
}
