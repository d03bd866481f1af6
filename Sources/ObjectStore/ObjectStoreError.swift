/// An error from the object store, shaped like swift-nio's FileSystemError: a code to switch on,
/// a message that says what to do, the HTTP status and request id when there was a response.
public struct ObjectStoreError: Error, Sendable, CustomStringConvertible {
    public enum Code: Sendable, Equatable {
        /// 404: the key or container does not exist.
        case notFound
        /// 412, or a changed ETag during a read.
        case preconditionFailed
        /// 401/403: the signature, access key or permissions were refused.
        case accessDenied
        /// 403 RequestTimeTooSkewed / RequestExpired: this machine's clock is off.
        case clockSkew
        /// 429 or 498: the service asks us to slow down.
        case throttled
        /// 5xx, 408, timeouts and connection failures: worth retrying later.
        case transient
        /// 422: the server computed a different MD5 than we sent.
        case checksumMismatch
        /// 416: the range lies beyond the end of the object.
        case rangeNotSatisfiable
        /// Any other 4xx: the request itself was wrong.
        case invalidRequest
        /// The response could not be understood.
        case invalidResponse
        /// A local file (a PUT body) could not be read.
        case localIO
    }

    public var code: Code
    public var message: String
    public var httpStatus: Int?
    public var requestID: String?

    public init(_ code: Code, _ message: String, httpStatus: Int? = nil, requestID: String? = nil) {
        self.code = code
        self.message = message
        self.httpStatus = httpStatus
        self.requestID = requestID
    }

    public var description: String {
        var text = message
        if let httpStatus { text += " (HTTP \(httpStatus)" + (requestID.map { ", request \($0)" } ?? "") + ")" }
        return text
    }

    /// Whether repeating the same request later may succeed.
    public var isRetryable: Bool {
        switch code {
        case .throttled, .transient: return true
        case .notFound, .preconditionFailed, .accessDenied, .clockSkew, .checksumMismatch, .rangeNotSatisfiable,
            .invalidRequest, .invalidResponse, .localIO:
            return false
        }
    }
}
