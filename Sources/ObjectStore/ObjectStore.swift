#if canImport(Glibc)
import Glibc
#endif

// ObjectStore: what the filesystem needs from a CSSP container, with no I/O and no C.
//
// Subtleties this module pins down for everyone above it:
// 1. Keys are UTF-8 strings relative to the container; `/` is only a convention.
// 2. A listing's `size` of a DLO manifest is 0; only HEAD/GET report the real length.
// 3. ETags are stored unquoted, lower-case hex; a DLO's ETag is the MD5 of its parts' ETags.
// 4. Every call is synchronous and may block: callers run them on FUSE worker threads or on a
//    pool they own, never on Swift's cooperative pool.
import Dispatch
import Synchronization

/// The part of a container listing below one prefix, one page long.
public struct ListPage: Sendable, Equatable {
    public var entries: [ListEntry]
    /// The marker for the next page, or nil when the listing is complete.
    public var nextMarker: String?

    public init(entries: [ListEntry], nextMarker: String?) {
        self.entries = entries
        self.nextMarker = nextMarker
    }

    /// The page without the names from `endMarker` on (byte order); complete if it lost any.
    public func ending(before endMarker: String?) -> ListPage {
        guard let endMarker else { return self }
        let before = entries.prefix { $0.name.utf8.lexicographicallyPrecedes(endMarker.utf8) }
        return before.count == entries.count ? self : ListPage(entries: Array(before), nextMarker: nil)
    }
}

/// One entry of a delimiter listing.
public enum ListEntry: Sendable, Equatable {
    case object(ObjectSummary)
    /// A common prefix rolled up by the delimiter, including its trailing delimiter.
    case commonPrefix(String)

    /// The listing name: the key of an object or the common prefix.
    public var name: String {
        switch self {
        case .object(let summary): return summary.key
        case .commonPrefix(let prefix): return prefix
        }
    }
}

/// What a listing says about an object.
public struct ObjectSummary: Sendable, Equatable {
    public var key: String
    public var size: Int64
    public var etag: String
    public var contentType: String
    /// Seconds since the Unix epoch.
    public var lastModified: Double

    public init(key: String, size: Int64, etag: String, contentType: String, lastModified: Double) {
        self.key = key
        self.size = size
        self.etag = etag
        self.contentType = contentType
        self.lastModified = lastModified
    }
}

/// What HEAD or GET says about an object.
public struct ObjectInfo: Sendable, Equatable {
    public var key: String
    public var size: Int64
    public var etag: String
    public var contentType: String
    public var lastModified: Double
    /// `X-Object-Meta-*` headers, names lower-cased without the prefix.
    public var metadata: [String: String]
    /// Where the object's parts are when the store keeps them apart from it: Swift's DLO
    /// manifest, its `X-Object-Manifest` value (`container/prefix`). nil for a whole object, and
    /// in a store whose multipart objects hold their own parts.
    public var manifest: String?

    public init(
        key: String, size: Int64, etag: String, contentType: String, lastModified: Double,
        metadata: [String: String] = [:], manifest: String? = nil
    ) {
        self.key = key
        self.size = size
        self.etag = etag
        self.contentType = contentType
        self.lastModified = lastModified
        self.metadata = metadata
        self.manifest = manifest
    }
}

/// What HEAD of the container says.
public struct ContainerInfo: Sendable, Equatable {
    public var objectCount: Int64
    public var bytesUsed: Int64

    public init(objectCount: Int64, bytesUsed: Int64) {
        self.objectCount = objectCount
        self.bytesUsed = bytesUsed
    }
}

/// An inclusive byte range, as in `Range: bytes=lower-upper`.
public struct ByteRange: Sendable, Equatable {
    public var lower: Int64
    public var upper: Int64

    public init(lower: Int64, upper: Int64) {
        precondition(lower >= 0 && upper >= lower, "invalid byte range \(lower)-\(upper)")
        self.lower = lower
        self.upper = upper
    }

    public init(offset: Int64, length: Int64) {
        self.init(lower: offset, upper: offset + length - 1)
    }

    public var length: Int64 { upper - lower + 1 }
}

/// The body of a PUT.
public enum PutBody: Sendable {
    case bytes([UInt8])
    /// `length` bytes of the file at `path` starting at `offset`; `progress` counts what is sent.
    case file(path: String, offset: Int64, length: Int64, progress: TransferProgress? = nil)
}

/// Bytes of an upload sent so far, shared by its parts (`mount.cssp --status`). An attempt that
/// fails takes back what it had sent: a retry sends it again.
public final class TransferProgress: Sendable {
    private let done = Atomic<Int64>(0)
    private let total: Atomic<Int64>

    public init(total: Int64 = 0) { self.total = Atomic(total) }

    public var bytesDone: Int64 { done.load(ordering: .relaxed) }
    /// The bytes the upload will send in all (known so far, for a file still being written).
    public var bytesTotal: Int64 { total.load(ordering: .relaxed) }

    public func setTotal(_ bytes: Int64) {
        total.store(bytes, ordering: .relaxed)
    }

    public func add(_ bytes: Int64) {
        done.add(bytes, ordering: .relaxed)
    }
}

/// A container of a CSSP store. Implementations are thread-safe.
public protocol ObjectStore: Sendable {
    /// The container's name, as used in `X-Object-Manifest` and `X-Copy-From`.
    var containerName: String { get }

    func headContainer() throws(ObjectStoreError) -> ContainerInfo

    /// One page of the listing of keys starting with `prefix`, after `marker`.
    func list(prefix: String, delimiter: String?, marker: String?, limit: Int) throws(ObjectStoreError) -> ListPage

    /// As `list`, of the names before `endMarker` only (the protocol's `end_marker`; nil: no end).
    func list(prefix: String, delimiter: String?, marker: String?, endMarker: String?, limit: Int) throws(ObjectStoreError)
        -> ListPage

    func head(key: String) throws(ObjectStoreError) -> ObjectInfo

    /// GETs `range` (or the whole object) and hands the body to `sink` in order, piece by piece.
    /// Returns what the response said about the object.
    func get(
        key: String, range: ByteRange?, sink: (UnsafeRawBufferPointer) -> Void
    ) throws(ObjectStoreError) -> ObjectInfo

    /// Stores `body` under `key`; the server verifies it against its MD5. Returns the ETag.
    /// `onlyIfAbsent` sends `If-None-Match: *`: the server refuses (`preconditionFailed`) when an
    /// object is at `key` already. Only a server that `honoursIfNoneMatch` refuses; another
    /// stores anyway. A retry of a PUT whose answer was lost is refused too (its own first try
    /// stored it): callers tell that from another client's object by its ETag.
    @discardableResult
    func put(
        key: String, body: PutBody, contentType: String?, metadata: [String: String], onlyIfAbsent: Bool
    ) throws(ObjectStoreError) -> String

    /// Whether the server refuses a PUT with `If-None-Match: *` over an existing object (Swift
    /// does; its `/info` says it is Swift). Asked once, on first use.
    var honoursIfNoneMatch: Bool { get }

    /// Writes `key` as one more object over the parts of an object whose `ObjectInfo.manifest`
    /// is `manifest` (a rename of it moves no bytes). Only stores that keep parts apart show
    /// manifests; on Swift it is a zero-byte DLO manifest, `manifest` its `X-Object-Manifest`
    /// value (`container/prefix`: the parts may live in another container, as the swift CLI puts them).
    func putManifest(key: String, manifest: String, contentType: String?, metadata: [String: String])
        throws(ObjectStoreError)

    /// Server-side copy of `source` to `destination`. The copy keeps the source's metadata and
    /// content type, unless `metadata` (the complete set, replacing all of it) or `contentType`
    /// is given.
    func copy(from source: String, to destination: String, contentType: String?, metadata: [String: String]?)
        throws(ObjectStoreError)

    func delete(key: String) throws(ObjectStoreError)

    /// The most keys one `bulkDelete` request takes when the server deletes many keys in one
    /// request (Swift's bulk middleware, as its `/info` advertises it); nil: it cannot, and
    /// `bulkDelete` sends one DELETE per key.
    var bulkDeleteLimit: Int? { get }

    /// Deletes `keys` (at most `bulkDeleteLimit`), in one request where the server can. Returns
    /// the keys it could not delete (a key already gone counts as deleted); throws when the
    /// request as a whole failed, which may have deleted some of them.
    func bulkDelete(keys: [String]) throws(ObjectStoreError) -> [String]

    /// Replaces the object's metadata and content type, in one call. `manifest` is what the
    /// caller last saw of the object's `ObjectInfo.manifest`: a store that drops it unless it is
    /// sent again (Swift) sends it. Callers pass the complete set of metadata.
    func setMetadata(key: String, contentType: String, metadata: [String: String], manifest: String?) throws(ObjectStoreError)

    // MARK: Large objects: an upload session (begin, parts, finish or abort)

    /// The most parts one upload may have.
    var maximumParts: Int { get }

    /// Begins an upload in parts of an object meant for `key`.
    func beginUpload(key: String) throws(ObjectStoreError) -> UploadSession

    /// Begins an upload whose object will have this content type and metadata. A store that
    /// fixes them when an upload begins (`fixesUploadMetadataAtBegin`, S3) stores them so; one
    /// that takes them at `finishUpload` (Swift) ignores them here.
    func beginUpload(key: String, contentType: String?, metadata: [String: String]) throws(ObjectStoreError) -> UploadSession

    /// Whether an upload's content type and metadata are fixed when it begins (S3): an upload
    /// begun before they are known (while the file is still written) would need a copy of the
    /// whole object at its end to get them, so callers begin it when they know them.
    var fixesUploadMetadataAtBegin: Bool { get }

    /// Stores part `number` (from 1) of the upload; returns its ETag (the MD5 of its bytes),
    /// checked. Parts may go up in any order, several at once; a part sent again replaces it.
    func uploadPart(_ session: UploadSession, number: Int, body: PutBody) throws(ObjectStoreError) -> String

    /// Drops part `number` if it was sent: the finished object holds the parts it is finished
    /// with and nothing else (a file that shrank after its parts went up). Best effort.
    func discardPart(_ session: UploadSession, number: Int)

    /// Makes the object from parts `1...partETags.count` (their ETags in order; `size` bytes in
    /// all, every part `partSize` long but the last). The key comes from `destination`, asked
    /// once the parts are confirmed, right before the object is made (a conflict copy's name
    /// rather than `session.key`). When it throws before the object is made the parts stay (the
    /// caller aborts or tries again), except parts the store found unfit, which it dropped.
    func finishUpload(
        _ session: UploadSession, partETags: [String], size: Int64, partSize: Int64,
        destination: () throws(ObjectStoreError) -> String, contentType: String?, metadata: [String: String]
    ) throws(ObjectStoreError) -> FinishedUpload

    /// Drops the upload and every part sent to it. Best effort.
    func abortUpload(_ session: UploadSession)

    /// The ETag a finished upload over parts with these ETags, in order, reports.
    func uploadETag(partETags: [String]) -> String

    /// The ETag a PUT of `length` bytes of the local file at `path` from `offset` gets (Swift:
    /// their MD5), nil when unknown or unreadable. Tells an upload whose answer was lost, now on
    /// the server, from another client's version.
    func etag(ofFile path: String, offset: Int64, length: Int64) -> String?
}

extension ObjectStore {
    /// `list` with an end: the page cut where the names reach `endMarker` (a store that can ask
    /// the server for it does).
    public func list(prefix: String, delimiter: String?, marker: String?, endMarker: String?, limit: Int)
        throws(ObjectStoreError) -> ListPage
    {
        try list(prefix: prefix, delimiter: delimiter, marker: marker, limit: limit).ending(before: endMarker)
    }

    /// Best-effort delete of every key below `prefix`, 8 at a time.
    public func deleteAll(prefix: String) {
        guard let keys = try? listAll(prefix: prefix, delimiter: nil).map(\.name), !keys.isEmpty else { return }
        let width = min(8, keys.count)
        DispatchQueue.concurrentPerform(iterations: width) { lane in
            for index in stride(from: lane, to: keys.count, by: width) { try? delete(key: keys[index]) }
        }
    }

    /// Reads the whole listing below `prefix`, page after page.
    public func listAll(prefix: String, delimiter: String?, pageSize: Int = 10_000) throws(ObjectStoreError)
        -> [ListEntry]
    {
        var entries: [ListEntry] = []
        var marker: String? = nil
        repeat {
            let page = try list(prefix: prefix, delimiter: delimiter, marker: marker, limit: pageSize)
            entries.append(contentsOf: page.entries)
            marker = page.nextMarker
        } while marker != nil
        return entries
    }

    /// GETs a range into memory.
    /// A server-side copy that keeps the source's metadata and content type.
    public func copy(from source: String, to destination: String) throws(ObjectStoreError) {
        try copy(from: source, to: destination, contentType: nil, metadata: nil)
    }

    public func getBytes(key: String, range: ByteRange?) throws(ObjectStoreError) -> [UInt8] {
        var bytes: [UInt8] = []
        if let range { bytes.reserveCapacity(Int(range.length)) }
        _ = try get(key: key, range: range) { bytes.append(contentsOf: $0) }
        return bytes
    }
}

extension ObjectStore {
    /// A manifest whose parts are the keys of this container starting with `partPrefix`.
    public func putManifest(
        key: String, partPrefix: String, contentType: String?, metadata: [String: String]
    ) throws(ObjectStoreError) {
        try putManifest(key: key, manifest: containerName + "/" + partPrefix, contentType: contentType, metadata: metadata)
    }

    /// The part prefix of a manifest value when the parts are in this container (nil: they are
    /// elsewhere, or the value is not `container/prefix`).
    public func localPartPrefix(ofManifest manifest: String) -> String? {
        let container = containerName + "/"
        guard manifest.utf8.starts(with: container.utf8), manifest.utf8.count > container.utf8.count else { return nil }
        return String(manifest.utf8.dropFirst(container.utf8.count))
    }
}

extension ObjectStore {
    public var bulkDeleteLimit: Int? { nil }

    public func beginUpload(key: String, contentType: String?, metadata: [String: String]) throws(ObjectStoreError)
        -> UploadSession
    {
        try beginUpload(key: key)
    }

    public var fixesUploadMetadataAtBegin: Bool { false }

    public var honoursIfNoneMatch: Bool { false }

    /// A PUT that replaces whatever is at `key`.
    @discardableResult
    public func put(key: String, body: PutBody, contentType: String?, metadata: [String: String])
        throws(ObjectStoreError) -> String
    {
        try put(key: key, body: body, contentType: contentType, metadata: metadata, onlyIfAbsent: false)
    }

    public func etag(ofFile path: String, offset: Int64, length: Int64) -> String? { nil }

    /// Reads `length` bytes of `path` from `offset` in pieces of at most 1 MiB, handing each to
    /// `body`; false when the file cannot be read that far.
    public static func readFile(
        _ path: String, offset: Int64, length: Int64, _ body: (UnsafeRawBufferPointer) -> Void
    ) -> Bool {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var done: Int64 = 0
        while done < length {
            let want = Int(min(Int64(buffer.count), length - done))
            let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, want, off_t(offset + done)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }
            buffer.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[..<n])) }
            done += Int64(n)
        }
        return true
    }

    /// One DELETE per key, in order; stops at the first failure other than "not found".
    public func bulkDelete(keys: [String]) throws(ObjectStoreError) -> [String] {
        for key in keys {
            do {
                try delete(key: key)
            } catch where error.code == .notFound {}
        }
        return []
    }
}
