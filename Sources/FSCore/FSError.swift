import ObjectStore

/// An error of a filesystem operation. The code records the POSIX meaning, decided here because
/// only here is the context known (a 404 on lookup means "no such file"; on a read it means the
/// object vanished). FuseAdapter maps codes to errno in exactly one place.
public struct FSError: Error, Sendable, CustomStringConvertible {
    public enum Code: Sendable, Equatable, CaseIterable {
        case notFound
        case notADirectory
        case isADirectory
        case readOnly
        case notEmpty
        case permissionDenied
        case stale
        /// A handle this process never gave (a worker that replaced a dead one: issue 40).
        case badHandle
        case notSupported
        case invalidArgument
        case nameTooLong
        case notPermitted
        case noSpace
        case exists
        /// A name whose bytes are not UTF-8.
        case illegalByteSequence
        case ioError
    }

    public var code: Code
    public var message: String
    public var cause: ObjectStoreError?
    /// What was being done and to which key, when a store request failed (for log lines).
    public var operation: String?
    public var key: String?

    public init(_ code: Code, _ message: String, cause: ObjectStoreError? = nil) {
        self.code = code
        self.message = message
        self.cause = cause
    }

    /// The meaning of a store error during `operation` on `what`.
    package init(storeError error: ObjectStoreError, operation: String, path: String) {
        let code: Code
        switch error.code {
        case .notFound: code = .notFound
        case .preconditionFailed: code = .stale
        case .accessDenied, .clockSkew: code = .permissionDenied
        case .throttled, .transient, .checksumMismatch, .rangeNotSatisfiable, .invalidRequest, .invalidResponse,
            .localIO:
            code = .ioError
        }
        self.init(code, "\(operation) '\(path)': \(error)", cause: error)
        self.operation = operation
        self.key = path
    }

    /// The fields every error line carries (`op`, `path`, `key`, `errno`, `status`, `request`):
    /// `operation` is the FUSE operation or the background job; the path is the key below the
    /// mount's `rootPrefix`.
    public func logMetadata(operation: String, rootPrefix: String) -> [String: String] {
        var fields = ["op": operation, "errno": code.errnoName]
        if let key {
            fields["key"] = key
            fields["path"] = "/" + (key.hasPrefix(rootPrefix) ? String(key.dropFirst(rootPrefix.count)) : key)
        }
        if let status = cause?.httpStatus { fields["status"] = String(status) }
        if let request = cause?.requestID { fields["request"] = request }
        return fields
    }

    public var description: String { message }
}

extension FSError.Code {
    /// The symbolic name of the errno this code becomes (`FuseAdapter`'s table, man page ERRORS).
    public var errnoName: String {
        switch self {
        case .notFound: return "ENOENT"
        case .notADirectory: return "ENOTDIR"
        case .isADirectory: return "EISDIR"
        case .readOnly: return "EROFS"
        case .notEmpty: return "ENOTEMPTY"
        case .permissionDenied: return "EACCES"
        case .stale: return "ESTALE"
        case .badHandle: return "EBADF"
        case .notSupported: return "EOPNOTSUPP"
        case .invalidArgument: return "EINVAL"
        case .nameTooLong: return "ENAMETOOLONG"
        case .notPermitted: return "EPERM"
        case .noSpace: return "ENOSPC"
        case .exists: return "EEXIST"
        case .illegalByteSequence: return "EILSEQ"
        case .ioError: return "EIO"
        }
    }
}
