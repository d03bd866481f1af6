import Locking
import ObjectStore
import Synchronization

/// Wraps any store and fails the calls a test chooses, before they reach it (the store never saw
/// the request) or after it (the store did the work and the answer was lost), or half-way through
/// a GET's body. Modelled on mountpoint-s3's failure client: one decision per call, so a test can
/// fail "the 3rd PUT", "every DELETE of keys below x/", or one call in ten at random. It wraps a
/// store of the Swift dialect and is one itself: an upload session runs as its part PUTs,
/// listing, manifest PUT and HEAD, each of which a test may fail.
public final class FaultInjectingStore: ManifestStore {
    /// One call, as the decision sees it.
    public struct Call: Sendable, CustomStringConvertible {
        public enum Operation: String, Sendable, CaseIterable {
            case headContainer, list, head, get, put, putPart, putManifest, copy, delete, post, bulkDelete
        }
        public var operation: Operation
        /// The key (the destination of a copy, the prefix of a list, the first key of a bulk delete).
        public var key: String
        /// How many calls of this operation came before this one (0 for the first).
        public var index: Int
        /// The range a GET asks for (nil: the whole object, or not a GET).
        public var range: ByteRange? = nil

        public var description: String { "\(operation.rawValue)#\(index) '\(key)'" }
    }

    /// What happens to one call.
    public enum Fault: Sendable, Equatable {
        /// Passed to the wrapped store.
        case none
        /// Fails with this code without reaching the store.
        case before(ObjectStoreError.Code)
        /// Reaches the store, then fails with this code (the answer was lost).
        case after(ObjectStoreError.Code)
        /// A GET delivers half of its body, then fails (a connection cut); other calls: `.before`.
        case halfway(ObjectStoreError.Code)
    }

    public let wrapped: any ManifestStore
    /// Protects the decision, the call counts and the failed calls (not the decision's own run).
    private let state: Locked<(decide: @Sendable (Call) -> Fault, counts: [Call.Operation: Int], injected: [Call])>
    /// Runs after the wrapped store answered a call the decision passed, before the caller gets
    /// the answer: what happens there happened after the store answered (a stale answer).
    private let answered = Locked<(@Sendable (Call) -> Void)?>(nil)

    public init(_ wrapped: any ManifestStore, decide: @escaping @Sendable (Call) -> Fault = { _ in .none }) {
        self.wrapped = wrapped
        state = Locked((decide, [:], []))
    }

    /// Runs `body` after each answer of the store, before the caller gets it (nil: nothing).
    /// Not for GETs, whose answer is delivered while it arrives.
    public func afterEachAnswer(_ body: (@Sendable (Call) -> Void)?) { answered.withLock { $0 = body } }

    /// Replaces the decision (from now on; counts keep running).
    public func inject(_ decide: @escaping @Sendable (Call) -> Fault) { state.withLock { $0.decide = decide } }

    /// Fails the next `count` calls of `operation` with `fault`, then passes everything.
    public func failNext(_ operation: Call.Operation, count: Int = 1, with fault: Fault = .before(.transient)) {
        let remaining = Locked(count)
        inject { call in
            guard call.operation == operation else { return .none }
            return remaining.withLock { n in
                guard n > 0 else { return .none }
                n -= 1
                return fault
            }
        }
    }

    /// Passes every call again.
    public func heal() { inject { _ in .none } }

    /// Every call that was failed, in order (for messages).
    public var injected: [Call] { state.withLock { $0.injected } }

    /// The decision runs outside the lock: a decision that waits (a slow server) must not make
    /// every other call wait too, which would turn parallel requests into serial ones.
    private func decide(_ operation: Call.Operation, _ key: String, range: ByteRange? = nil) -> Fault {
        decideCall(operation, key, range: range).fault
    }

    private func decideCall(_ operation: Call.Operation, _ key: String, range: ByteRange? = nil) -> (fault: Fault, call: Call) {
        let (decide, call): (@Sendable (Call) -> Fault, Call) = state.withLock { s in
            let index = s.counts[operation, default: 0]
            s.counts[operation] = index + 1
            return (s.decide, Call(operation: operation, key: key, index: index, range: range))
        }
        let fault = decide(call)
        if fault != .none { state.withLock { $0.injected.append(call) } }
        return (fault, call)
    }

    private static func error(_ code: ObjectStoreError.Code, _ operation: Call.Operation, _ key: String, lost: Bool)
        -> ObjectStoreError
    {
        let status: Int
        switch code {
        case .notFound: status = 404
        case .preconditionFailed: status = 412
        case .accessDenied: status = 403
        case .throttled: status = 429
        default: status = 503
        }
        return ObjectStoreError(
            code, "injected \(lost ? "lost answer" : "failure") of \(operation.rawValue) '\(key)'", httpStatus: status)
    }

    /// Runs `body` under the decision for one call.
    private func run<T>(_ operation: Call.Operation, _ key: String, _ body: () throws(ObjectStoreError) -> T)
        throws(ObjectStoreError) -> T
    {
        let (fault, call) = decideCall(operation, key)
        switch fault {
        case .none:
            let answer = try body()
            answered.withLock { $0 }?(call)
            return answer
        case .before(let code), .halfway(let code): throw Self.error(code, operation, key, lost: false)
        case .after(let code):
            _ = try body()
            throw Self.error(code, operation, key, lost: true)
        }
    }

    public var containerName: String { wrapped.containerName }

    public func headContainer() throws(ObjectStoreError) -> ContainerInfo {
        try run(.headContainer, "") { () throws(ObjectStoreError) in try wrapped.headContainer() }
    }

    public func list(prefix: String, delimiter: String?, marker: String?, limit: Int) throws(ObjectStoreError) -> ListPage {
        try list(prefix: prefix, delimiter: delimiter, marker: marker, endMarker: nil, limit: limit)
    }

    public func list(prefix: String, delimiter: String?, marker: String?, endMarker: String?, limit: Int)
        throws(ObjectStoreError) -> ListPage
    {
        try run(.list, prefix) { () throws(ObjectStoreError) in
            try wrapped.list(prefix: prefix, delimiter: delimiter, marker: marker, endMarker: endMarker, limit: limit)
        }
    }

    public func head(key: String) throws(ObjectStoreError) -> ObjectInfo {
        try run(.head, key) { () throws(ObjectStoreError) in try wrapped.head(key: key) }
    }

    public func get(key: String, range: ByteRange?, sink: (UnsafeRawBufferPointer) -> Void) throws(ObjectStoreError)
        -> ObjectInfo
    {
        let fault = decide(.get, key, range: range)
        switch fault {
        case .none: return try wrapped.get(key: key, range: range, sink: sink)
        case .before(let code): throw Self.error(code, .get, key, lost: false)
        case .after(let code):
            _ = try wrapped.get(key: key, range: range, sink: sink)
            throw Self.error(code, .get, key, lost: true)
        case .halfway(let code):
            var bytes: [UInt8] = []
            _ = try wrapped.get(key: key, range: range) { bytes.append(contentsOf: $0) }
            bytes.prefix(bytes.count / 2).withUnsafeBytes { sink($0) }
            throw Self.error(code, .get, key, lost: false)
        }
    }

    public func put(key: String, body: PutBody, contentType: String?, metadata: [String: String], onlyIfAbsent: Bool)
        throws(ObjectStoreError) -> String
    {
        try run(.put, key) { () throws(ObjectStoreError) in
            try wrapped.put(key: key, body: body, contentType: contentType, metadata: metadata, onlyIfAbsent: onlyIfAbsent)
        }
    }

    public func putPart(key: String, body: PutBody) throws(ObjectStoreError) -> String {
        try run(.putPart, key) { () throws(ObjectStoreError) in try wrapped.putPart(key: key, body: body) }
    }

    public func putManifest(key: String, manifest: String, contentType: String?, metadata: [String: String])
        throws(ObjectStoreError)
    {
        try run(.putManifest, key) { () throws(ObjectStoreError) in
            try wrapped.putManifest(key: key, manifest: manifest, contentType: contentType, metadata: metadata)
        }
    }

    public func copy(from source: String, to destination: String, contentType: String?, metadata: [String: String]?)
        throws(ObjectStoreError)
    {
        try run(.copy, destination) { () throws(ObjectStoreError) in
            try wrapped.copy(from: source, to: destination, contentType: contentType, metadata: metadata)
        }
    }

    public func delete(key: String) throws(ObjectStoreError) {
        try run(.delete, key) { () throws(ObjectStoreError) in try wrapped.delete(key: key) }
    }

    public var bulkDeleteLimit: Int? { wrapped.bulkDeleteLimit }
    public var honoursIfNoneMatch: Bool { wrapped.honoursIfNoneMatch }

    public func bulkDelete(keys: [String]) throws(ObjectStoreError) -> [String] {
        try run(.bulkDelete, keys.first ?? "") { () throws(ObjectStoreError) in try wrapped.bulkDelete(keys: keys) }
    }

    public func post(key: String, contentType: String, metadata: [String: String], manifest: String?)
        throws(ObjectStoreError)
    {
        try run(.post, key) { () throws(ObjectStoreError) in
            try wrapped.post(key: key, contentType: contentType, metadata: metadata, manifest: manifest)
        }
    }

    public func manifestETag(partETags: [String]) -> String { wrapped.manifestETag(partETags: partETags) }

    public func etag(ofFile path: String, offset: Int64, length: Int64) -> String? {
        wrapped.etag(ofFile: path, offset: offset, length: length)
    }
}
