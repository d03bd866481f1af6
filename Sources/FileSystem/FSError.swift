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

    public init(_ code: Code, _ message: String, cause: ObjectStoreError? = nil) {
        self.code = code
        self.message = message
        self.cause = cause
    }

    /// The meaning of a store error during `operation` on `what`.
    init(storeError error: ObjectStoreError, operation: String, path: String) {
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
    }

    public var description: String { message }
}
