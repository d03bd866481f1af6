import Locking
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// An in-memory container with Swift's listing and DLO semantics, counting every request, so
/// tests can assert what an operation cost ("readdir of N objects makes no HEAD").
public final class FakeObjectStore: ManifestStore {
    public struct Counts: Sendable, Equatable {
        public var list = 0
        public var head = 0
        public var get = 0
        public var getBytes: Int64 = 0
        public var put = 0
        public var delete = 0
        public var copy = 0
        public var post = 0
        /// Bulk delete requests (each deletes many keys; `delete` does not count their keys).
        public var bulkDelete = 0
        public var headContainer = 0
        public init() {}
    }

    struct Object {
        /// The content; its ETag is computed once per change (tests HEAD large objects often).
        var bytes: [UInt8] { didSet { etag = FakeObjectStore.etag(bytes) } }
        private(set) var etag: String
        var contentType: String
        var metadata: [String: String]
        var manifest: String?
        var modified: Double

        init(bytes: [UInt8], contentType: String, metadata: [String: String], manifest: String?, modified: Double) {
            self.bytes = bytes
            self.etag = FakeObjectStore.etag(bytes)
            self.contentType = contentType
            self.metadata = metadata
            self.manifest = manifest
            self.modified = modified
        }
    }

    /// Between two changes: a fraction, so that listings (microseconds) and HEADs (whole seconds)
    /// disagree in the last digits as they do on Swift.
    static let tick = 1.25
    public let containerName: String
    /// Protects objects and counts.
    private let state = Locked<(objects: [ExactString: Object], counts: Counts, clock: Double, failPuts: Int)>(([:], Counts(), 1_700_000_000, 0))

    /// Keys listings leave out for now (a container listing lagging behind writes).
    private let unlisted = Locked<Set<ExactString>>([])

    /// Leaves `keys` out of listings until `listAll()`, as Swift's container listing does for a
    /// while after a write when the container update is queued.
    public func lagListings(_ keys: [String]) { unlisted.withLock { $0.formUnion(keys.map(\.exact)) } }
    /// Ends `lagListings` and `lagDeletes`.
    public func listAll() {
        unlisted.withLock { $0 = [] }
        lingering.withLock { $0 = ([], [:]) }
    }

    /// Keys whose deletes listings do not show yet, and the objects they still list for them.
    private let lingering = Locked<(keys: Set<ExactString>, listed: [ExactString: Object])>(([], [:]))

    /// Listings keep showing `keys` once deleted (as they were then) until `listAll()`, as
    /// Swift's container listing does for a while after a delete.
    public func lagDeletes(_ keys: [String]) { lingering.withLock { $0.keys.formUnion(keys.map(\.exact)) } }

    /// Whether listings show each object's content type, as Swift's do; S3's name only the key,
    /// size, ETag and time, and a HEAD tells the rest (a symlink, a mode, an mtime).
    private let contentTypesListed = Locked(true)

    public func listContentTypes(_ shown: Bool) { contentTypesListed.withLock { $0 = shown } }

    public init(containerName: String = "fake-container") {
        self.containerName = containerName
    }

    public var counts: Counts { state.withLock { $0.counts } }
    public func resetCounts() { state.withLock { $0.counts = Counts() } }

    /// Seeds an object without counting a request.
    public func seed(
        _ key: String, _ bytes: [UInt8] = [], contentType: String = "application/octet-stream", manifest: String? = nil,
        metadata: [String: String] = [:]
    ) {
        state.withLock { s in
            s.clock += Self.tick
            s.objects[key.exact] = Object(bytes: bytes, contentType: contentType, metadata: metadata, manifest: manifest, modified: s.clock)
        }
    }

    public func seed(_ key: String, text: String) { seed(key, Array(text.utf8)) }

    fileprivate static func etag(_ bytes: [UInt8]) -> String {
        // Not MD5: any content-derived value serves for change detection in tests.
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        bytes.withUnsafeBufferPointer { buffer in
            for b in buffer { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        }
        return String(h, radix: 16)
    }

    private static func byteOrder(_ a: String, _ b: String) -> Bool {
        Array(a.utf8).lexicographicallyPrecedes(Array(b.utf8))
    }

    /// The content of an object, resolving DLO manifests (parts in name order).
    private func content(_ key: String, in objects: [ExactString: Object]) -> [UInt8]? {
        guard let object = objects[key.exact] else { return nil }
        guard let manifest = object.manifest else { return object.bytes }
        // Parts in another container are not held here: such a manifest reads as empty.
        guard let partPrefix = localPartPrefix(ofManifest: manifest) else { return [] }
        return objects.keys.filter { $0.string.utf8.starts(with: partPrefix.utf8) }.sorted()
            .flatMap { objects[$0]!.bytes }
    }

    private func info(_ key: String, in objects: [ExactString: Object]) throws(ObjectStoreError) -> ObjectInfo {
        guard let object = objects[key.exact], let bytes = content(key, in: objects) else {
            throw ObjectStoreError(.notFound, "'\(key)' does not exist", httpStatus: 404)
        }
        var etag = object.etag
        if let manifest = object.manifest {
            // As Swift: the ETag of a DLO is derived from its parts' ETags, in name order.
            let partPrefix = localPartPrefix(ofManifest: manifest) ?? "\u{0}"
            let parts = objects.keys.filter { $0.string.utf8.starts(with: partPrefix.utf8) }.sorted()
            etag = manifestETag(partETags: parts.map { objects[$0]!.etag })
        }
        return ObjectInfo(
            key: key, size: Int64(bytes.count), etag: etag, contentType: object.contentType,
            // As Swift: a HEAD's Last-Modified is an HTTP date, the time rounded up to the second.
            lastModified: object.modified.rounded(.up), metadata: object.metadata, manifest: object.manifest)
    }

    public func headContainer() throws(ObjectStoreError) -> ContainerInfo {
        state.withLock { s in
            s.counts.headContainer += 1
            return ContainerInfo(objectCount: Int64(s.objects.count), bytesUsed: s.objects.values.reduce(0) { $0 + Int64($1.bytes.count) })
        }
    }

    public func list(prefix: String, delimiter: String?, marker: String?, limit: Int) throws(ObjectStoreError) -> ListPage {
        try list(prefix: prefix, delimiter: delimiter, marker: marker, endMarker: nil, limit: limit)
    }

    public func list(prefix: String, delimiter: String?, marker: String?, endMarker: String?, limit: Int)
        throws(ObjectStoreError) -> ListPage
    {
        // As the real client: the protocol allows at most 10 000 entries per request.
        precondition(limit > 0 && limit <= 10_000, "listing limit must be in 1...10000")
        let unlisted = self.unlisted.withLock { $0 }
        let lingering = self.lingering.withLock { $0.listed }
        let typed = contentTypesListed.withLock { $0 }
        return state.withLock { s in
            s.counts.list += 1
            var entries: [ListEntry] = []
            var lastPrefix: String? = nil
            for key in Set(s.objects.keys).union(lingering.keys).sorted().map(\.string) {
                guard key.utf8.starts(with: prefix.utf8), !unlisted.contains(key.exact) else { continue }
                if let marker, !Self.byteOrder(marker, key) { continue }
                if let endMarker, !Self.byteOrder(key, endMarker) { break }
                let rest = Substring(key.utf8.dropFirst(prefix.utf8.count))
                if let delimiter, let range = rest.firstRange(of: delimiter) {
                    let common = prefix + rest[..<range.upperBound]
                    if let last = lastPrefix, common.isSameKey(as: last) { continue }
                    if let marker, common.isSameKey(as: marker) { continue }
                    lastPrefix = common
                    entries.append(.commonPrefix(common))
                } else {
                    let o = s.objects[key.exact] ?? lingering[key.exact]!
                    entries.append(.object(ObjectSummary(
                        key: key, size: Int64(o.bytes.count), etag: o.etag, contentType: typed ? o.contentType : "",
                        lastModified: o.modified)))
                }
                if entries.count == limit { break }
            }
            return ListPage(entries: entries, nextMarker: entries.count >= limit ? entries.last?.name : nil)
        }
    }

    public func head(key: String) throws(ObjectStoreError) -> ObjectInfo {
        try state.withLock { (s) throws(ObjectStoreError) in
            s.counts.head += 1
            return try info(key, in: s.objects)
        }
    }

    public func get(key: String, range: ByteRange?, sink: (UnsafeRawBufferPointer) -> Void) throws(ObjectStoreError) -> ObjectInfo {
        let (result, bytes): (ObjectInfo, [UInt8]) = try state.withLock { (s) throws(ObjectStoreError) in
            s.counts.get += 1
            let result = try info(key, in: s.objects)
            var bytes = content(key, in: s.objects)!
            if let range {
                guard range.lower < bytes.count else {
                    throw ObjectStoreError(.rangeNotSatisfiable, "range beyond end", httpStatus: 416)
                }
                bytes = Array(bytes[Int(range.lower)...Int(min(range.upper, Int64(bytes.count) - 1))])
            }
            s.counts.getBytes += Int64(bytes.count)
            return (result, bytes)
        }
        bytes.withUnsafeBytes { sink($0) }
        return result
    }

    /// Swift's default constraints: 1024-byte names, 256-byte metadata values (400 otherwise).
    private static func check(key: String, metadata: [String: String]) throws(ObjectStoreError) {
        if key.utf8.count > 1024 {
            throw ObjectStoreError(.invalidRequest, "object name longer than 1024 bytes", httpStatus: 400)
        }
        if let long = metadata.first(where: { $0.value.utf8.count > 256 }) {
            throw ObjectStoreError(.invalidRequest, "metadata value of '\(long.key)' longer than 256 bytes", httpStatus: 400)
        }
    }

    public func put(key: String, body: PutBody, contentType: String?, metadata: [String: String], onlyIfAbsent: Bool)
        throws(ObjectStoreError) -> String
    {
        try Self.check(key: key, metadata: metadata)
        let bytes: [UInt8]
        switch body {
        case .bytes(let b): bytes = b
        case .file(let path, let offset, let length, let progress):
            bytes = try Self.readFile(path, offset: offset, length: length)
            progress?.add(length)
        }
        if let failure = state.withLock({ s -> ObjectStoreError? in
            guard s.failPuts > 0 else { return nil }
            s.failPuts -= 1
            return ObjectStoreError(.transient, "injected PUT failure", httpStatus: 503)
        }) {
            throw failure
        }
        let refuses = onlyIfAbsent && honoursIfNoneMatch
        return try state.withLock { (s) throws(ObjectStoreError) in
            s.counts.put += 1
            if refuses && s.objects[key.exact] != nil {
                throw ObjectStoreError(.preconditionFailed, "'\(key)' exists", httpStatus: 412)
            }
            s.clock += Self.tick
            s.objects[key.exact] = Object(
                bytes: bytes, contentType: contentType ?? "application/octet-stream", metadata: metadata, manifest: nil,
                modified: s.clock)
            return Self.etag(bytes)
        }
    }

    public func putManifest(key: String, manifest: String, contentType: String?, metadata: [String: String]) throws(ObjectStoreError) {
        try Self.check(key: key, metadata: metadata)
        state.withLock { s in
            s.counts.put += 1
            s.clock += Self.tick
            s.objects[key.exact] = Object(
                bytes: [], contentType: contentType ?? "application/octet-stream", metadata: metadata,
                manifest: manifest, modified: s.clock)
        }
    }

    public func copy(from source: String, to destination: String, contentType: String?, metadata: [String: String]?)
        throws(ObjectStoreError)
    {
        if let metadata { try Self.check(key: destination, metadata: metadata) }
        try state.withLock { (s) throws(ObjectStoreError) in
            s.counts.copy += 1
            guard var object = s.objects[source.exact] else {
                throw ObjectStoreError(.notFound, "'\(source)' does not exist", httpStatus: 404)
            }
            if let metadata { object.metadata = metadata }
            if let contentType { object.contentType = contentType }
            s.objects[destination.exact] = object
        }
    }

    public func post(key: String, contentType: String, metadata: [String: String], manifest: String?) throws(ObjectStoreError) {
        try Self.check(key: key, metadata: metadata)
        try state.withLock { (s) throws(ObjectStoreError) in
            s.counts.post += 1
            guard var object = s.objects[key.exact] else {
                throw ObjectStoreError(.notFound, "'\(key)' does not exist", httpStatus: 404)
            }
            object.contentType = contentType
            object.metadata = metadata
            object.manifest = manifest
            // As Swift (fast POST): the listing shows the time of the metadata change.
            s.clock += Self.tick
            object.modified = s.clock
            s.objects[key.exact] = object
        }
    }

    public func manifestETag(partETags: [String]) -> String { Self.etag(Array(partETags.joined().utf8)) }

    public func etag(ofFile path: String, offset: Int64, length: Int64) -> String? {
        var bytes: [UInt8] = []
        guard Self.readFile(path, offset: offset, length: length, { bytes.append(contentsOf: $0) }) else { return nil }
        return Self.etag(bytes)
    }

    /// Makes the next `count` PUTs fail with a transient error.
    public func failNextPuts(_ count: Int) { state.withLock { $0.failPuts = count } }

    /// Every key, sorted.
    public var keys: [String] { state.withLock { $0.objects.keys.sorted().map(\.string) } }

    /// The stored content and metadata of `key` (manifests resolved), without counting.
    public func object(_ key: String) -> (bytes: [UInt8], contentType: String, metadata: [String: String])? {
        state.withLock { s in
            guard let o = s.objects[key.exact], let bytes = content(key, in: s.objects) else { return nil }
            return (bytes, o.contentType, o.metadata)
        }
    }

    static func readFile(_ path: String, offset: Int64, length: Int64) throws(ObjectStoreError) -> [UInt8] {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { throw ObjectStoreError(.localIO, "cannot read \(path)") }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: Int(length))
        let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, Int(length), off_t(offset)) }
        guard n == Int(length) else { throw ObjectStoreError(.localIO, "short read of \(path)") }
        return bytes
    }

    public func delete(key: String) throws(ObjectStoreError) {
        try state.withLock { (s) throws(ObjectStoreError) in
            s.counts.delete += 1
            guard let removed = s.objects.removeValue(forKey: key.exact) else {
                throw ObjectStoreError(.notFound, "'\(key)' does not exist", httpStatus: 404)
            }
            lingering.withLock { l in if l.keys.contains(key.exact) { l.listed[key.exact] = removed } }
        }
    }
    /// Whether this store deletes many keys in one request (`bulkDeleteLimit`); tests turn it
    /// on, as a server whose /info advertises Swift's bulk middleware.
    private let bulkLimit = Locked<Int?>(nil)

    public func allowBulkDelete(limit: Int?) { bulkLimit.withLock { $0 = limit } }

    public var bulkDeleteLimit: Int? { bulkLimit.withLock { $0 } }

    /// Whether a PUT with `If-None-Match: *` is refused over an existing object, as Swift does;
    /// tests turn it off to play a server that ignores the header.
    private let conditionalPuts = Locked(true)

    public func honourIfNoneMatch(_ honours: Bool) { conditionalPuts.withLock { $0 = honours } }

    public var honoursIfNoneMatch: Bool { conditionalPuts.withLock { $0 } }

    public func bulkDelete(keys: [String]) throws(ObjectStoreError) -> [String] {
        guard let limit = bulkDeleteLimit else {
            for key in keys {
                do {
                    try delete(key: key)
                } catch where error.code == .notFound {}
            }
            return []
        }
        precondition(keys.count <= limit, "a bulk delete of \(keys.count) keys, more than the \(limit) allowed")
        state.withLock { s in
            s.counts.bulkDelete += 1
            for key in keys { s.objects.removeValue(forKey: key.exact) }
        }
        return []
    }
}
