import Logging
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The filesystem semantics of a container: inodes, directories from listings, reads.
/// It knows nothing of FUSE; every method is synchronous, thread-safe and may block on the network.
///
/// Subtleties:
/// 1. Inodes are numbered per (parent, name) while the kernel holds a lookup on them; numbers are
///    never reused, so the generation is always 0. A name whose kind changes (file -> directory)
///    gets a new inode; the old one lives until the kernel forgets it.
/// 2. A complete directory listing is remembered for `directoryCacheSeconds` and answers lookups
///    in that directory, which is what makes `ls -l` cost one listing instead of a HEAD per entry.
///    Only zero-byte files need a HEAD, because a DLO manifest lists as 0 bytes.
/// 3. Outside a remembered listing, a lookup asks the server twice: HEAD `key` and a one-entry
///    listing of `key/`, then applies the same collision rule as readdir (DirectoryBuilder).
/// 4. Lock order: `state`, then a `FileReader`'s or `DirectoryReader`'s own lock. No lock is
///    held during network I/O.
public final class Filesystem: Sendable {
    public static let rootInode: InodeNumber = 1
    /// The inode number readdir reports for names the kernel has not looked up yet.
    public static let unknownInode: InodeNumber = 0xFFFF_FFFF

    let store: any ObjectStore
    public let configuration: FilesystemConfiguration
    let logger: Logger

    struct Node {
        var inode: InodeNumber
        var parent: InodeNumber
        var name: String
        var kind: NodeKind
        /// The object key of a file; the key prefix ("…/" or "") of a directory.
        var key: String
        var size: Int64
        var etag: String
        var modified: Double
        var isManifest: Bool
        /// When size/etag were last confirmed (monotonic seconds); 0 = only from a listing of a 0-byte object.
        var confirmedAt: Double
        var lookups: UInt64
        /// The ETag of the content the kernel's page cache may hold for this inode.
        var cachedEtag: String?
    }

    struct Listing {
        var entries: [String: DirectoryEntry]
        var completedAt: Double
    }

    struct State {
        var nodes: [InodeNumber: Node] = [:]
        var children: [InodeNumber: [String: InodeNumber]] = [:]
        var nextInode: InodeNumber = 2
        var listings: [InodeNumber: Listing] = [:]
        var directoryHandles: [UInt64: DirectoryReader] = [:]
        var fileHandles: [UInt64: FileReader] = [:]
        var nextHandle: UInt64 = 1
        var statistics: (value: FilesystemStatistics, at: Double)?
    }

    /// Protects every table above.
    let state: Mutex<State>

    public init(store: any ObjectStore, configuration: FilesystemConfiguration, logger: Logger) {
        self.store = store
        self.configuration = configuration
        self.logger = logger
        var initial = State()
        initial.nodes[Self.rootInode] = Node(
            inode: Self.rootInode, parent: Self.rootInode, name: "", kind: .directory, key: configuration.rootPrefix,
            size: 0, etag: "", modified: configuration.directoryTime, isManifest: false, confirmedAt: 0, lookups: 1)
        state = Mutex(initial)
    }

    static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    // MARK: Attributes

    func attributes(of node: Node) -> Attributes {
        let full: UInt16 = node.kind == .directory ? 0o777 : 0o666
        return Attributes(
            inode: node.inode, kind: node.kind, size: node.kind == .directory ? 0 : node.size,
            modified: node.modified, permissions: full & ~configuration.umask, uid: configuration.uid,
            gid: configuration.gid)
    }

    private func node(_ inode: InodeNumber) throws(FSError) -> Node {
        guard let node = state.withLock({ $0.nodes[inode] }) else {
            throw FSError(.stale, "inode \(inode) is not known (forgotten by the kernel)")
        }
        return node
    }

    public func getattr(_ inode: InodeNumber) throws(FSError) -> Attributes {
        var node = try node(inode)
        if node.kind == .file && Self.now() - node.confirmedAt > configuration.attributeCacheSeconds {
            node = try refresh(node)
        }
        return attributes(of: node)
    }

    /// HEADs a file's object and stores what it says.
    private func refresh(_ node: Node) throws(FSError) -> Node {
        let info: ObjectInfo
        do {
            info = try store.head(key: node.key)
        } catch {
            throw FSError(storeError: error, operation: "stat", path: node.key)
        }
        return state.withLock { s in
            var updated = s.nodes[node.inode] ?? node
            apply(info, to: &updated)
            s.nodes[node.inode] = updated
            return updated
        }
    }

    private func apply(_ info: ObjectInfo, to node: inout Node) {
        node.size = info.size
        node.etag = info.etag
        node.modified = info.metadata["mtime"].flatMap(Double.init) ?? info.lastModified
        node.isManifest = info.manifest != nil
        node.confirmedAt = Self.now()
    }

    // MARK: Lookup

    /// Resolves `name` in directory `parent`; on success the kernel holds one more lookup on it.
    public func lookup(parent: InodeNumber, name: String) throws(FSError) -> Attributes {
        let directory = try node(parent)
        guard directory.kind == .directory else { throw FSError(.notADirectory, "lookup in a file") }
        guard DirectoryBuilder.isValidName(name) else {
            throw FSError(name.utf8.count > 255 ? .nameTooLong : .notFound, "no such name '\(name)'")
        }
        let listed: DirectoryEntry?? = state.withLock { s in
            guard let listing = s.listings[parent],
                Self.now() - listing.completedAt <= configuration.directoryCacheSeconds
            else { return .none }
            return .some(listing.entries[name])
        }
        var entry: DirectoryEntry
        switch listed {
        case .some(.some(let found)): entry = found
        case .some(.none): throw FSError(.notFound, "no '\(name)' in '\(directory.key)'")
        case .none: entry = try resolve(name: name, prefix: directory.key)
        }
        // Zero-byte files may be DLO manifests whose size only a HEAD tells.
        var info: ObjectInfo? = nil
        if entry.kind == .file && entry.size == 0 {
            let known = state.withLock { s in s.children[parent]?[name].flatMap { s.nodes[$0] } }
            if let known, known.kind == .file, Self.now() - known.confirmedAt <= configuration.attributeCacheSeconds {
                entry.size = known.size
            } else {
                do {
                    info = try store.head(key: entry.key)
                } catch {
                    throw FSError(storeError: error, operation: "lookup", path: entry.key)
                }
            }
        }
        return state.withLock { s in
            let attributes = self.link(entry, parent: parent, info: info, in: &s)
            return attributes
        }
    }

    /// Creates or updates the node for `entry` and counts one kernel lookup.
    private func link(_ entry: DirectoryEntry, parent: InodeNumber, info: ObjectInfo?, in s: inout State) -> Attributes {
        var node: Node
        if let existing = s.children[parent]?[entry.name], let old = s.nodes[existing], old.kind == entry.kind {
            node = old
            node.lookups += 1
        } else {
            node = Node(
                inode: s.nextInode, parent: parent, name: entry.name, kind: entry.kind, key: entry.key, size: 0,
                etag: "", modified: 0, isManifest: false, confirmedAt: 0, lookups: 1)
            s.nextInode += 1
            s.children[parent, default: [:]][entry.name] = node.inode
        }
        node.key = entry.key
        if entry.kind == .file {
            if let info {
                apply(info, to: &node)
            } else if entry.size > 0 || node.etag != entry.etag {
                node.size = entry.size
                node.etag = entry.etag
                node.modified = entry.modified
                node.confirmedAt = Self.now()
            }
        } else {
            node.modified = configuration.directoryTime
        }
        s.nodes[node.inode] = node
        return attributes(of: node)
    }

    /// Finds `name` below `prefix` on the server: HEAD of the object, a peek below `name/`.
    private func resolve(name: String, prefix: String) throws(FSError) -> DirectoryEntry {
        let key = prefix + name
        var file: ObjectInfo? = nil
        var children: [ListEntry] = []
        do {
            do {
                file = try store.head(key: key)
            } catch where error.code == .notFound {
                file = nil
            }
            children = try store.list(prefix: key + "/", delimiter: "/", marker: nil, limit: 2).entries
        } catch {
            throw FSError(storeError: error, operation: "lookup", path: key)
        }
        let directory = DirectoryBuilder.directory(name, key: key + "/")
        switch (file, children.isEmpty) {
        case (nil, true):
            if name.hasSuffix(DirectoryBuilder.shadowSuffix) {
                return try resolveShadowed(alias: name, prefix: prefix)
            }
            throw FSError(.notFound, "no '\(name)' in '\(prefix)'")
        case (nil, false):
            return directory
        case (let info?, let noChildren):
            if ObjectKey.isDirectoryContentType(info.contentType) { return directory }
            let entry = Self.entry(name: name, info: info)
            if noChildren { return entry }
            let resolution = DirectoryBuilder.resolve(
                key: key, manifest: info.manifest, container: store.containerName, childrenPreview: children)
            return resolution == .fileWins ? entry : directory
        }
    }

    /// `x~object`: the file `x` hidden by a directory `x`.
    private func resolveShadowed(alias: String, prefix: String) throws(FSError) -> DirectoryEntry {
        let name = String(alias.dropLast(DirectoryBuilder.shadowSuffix.count))
        guard DirectoryBuilder.isValidName(name) else { throw FSError(.notFound, "no '\(alias)' in '\(prefix)'") }
        let resolved = try resolve(name: name, prefix: prefix)
        guard resolved.kind == .directory else { throw FSError(.notFound, "no '\(alias)' in '\(prefix)'") }
        do {
            let info = try store.head(key: prefix + name)
            var entry = Self.entry(name: alias, info: info)
            entry.key = prefix + name
            return entry
        } catch {
            throw FSError(storeError: error, operation: "lookup", path: prefix + alias)
        }
    }

    static func entry(name: String, info: ObjectInfo) -> DirectoryEntry {
        DirectoryEntry(
            name: name, kind: .file, key: info.key, size: info.size, etag: info.etag,
            modified: info.metadata["mtime"].flatMap(Double.init) ?? info.lastModified, contentType: info.contentType)
    }

    /// The kernel dropped `count` lookups of `inode`.
    public func forget(_ inode: InodeNumber, count: UInt64) {
        guard inode != Self.rootInode else { return }
        state.withLock { s in
            guard var node = s.nodes[inode] else { return }
            precondition(node.lookups >= count, "INTERNAL ERROR: forget \(count) of inode \(inode) with \(node.lookups)")
            node.lookups -= count
            if node.lookups > 0 {
                s.nodes[inode] = node
                return
            }
            s.nodes[inode] = nil
            s.listings[inode] = nil
            if s.children[node.parent]?[node.name] == inode { s.children[node.parent]?[node.name] = nil }
        }
    }

    // MARK: Directories

    public func opendir(_ inode: InodeNumber) throws(FSError) -> UInt64 {
        let directory = try node(inode)
        guard directory.kind == .directory else { throw FSError(.notADirectory, "opendir of a file") }
        let reader = DirectoryReader(store: store, prefix: directory.key, pageSize: configuration.listPageSize)
        return state.withLock { s in
            let handle = s.nextHandle
            s.nextHandle += 1
            s.directoryHandles[handle] = reader
            return handle
        }
    }

    /// Emits entries from `offset` on; `emit(name, kind, inode, nextOffset)` returns false when full.
    public func readdir(
        _ inode: InodeNumber, handle: UInt64, offset: Int64,
        emit: (String, NodeKind, InodeNumber, Int64) -> Bool
    ) throws(FSError) {
        guard let reader = state.withLock({ $0.directoryHandles[handle] }) else {
            throw FSError(.invalidArgument, "unknown directory handle \(handle)")
        }
        let parent = state.withLock { $0.nodes[inode]?.parent } ?? Self.rootInode
        if offset == 0 && !emit(".", .directory, inode, 1) { return }
        if offset <= 1 && !(emit("..", .directory, parent, 2)) { return }
        var index = Int(max(offset, 2) - 2)
        while true {
            let (batch, complete) = try reader.entries(from: index, resolvingWith: self)
            if batch.isEmpty {
                if complete { remember(reader, for: inode) }
                return
            }
            for entry in batch {
                let known = state.withLock { s in s.children[inode]?[entry.name] } ?? Self.unknownInode
                index += 1
                if !emit(entry.name, entry.kind, known, Int64(index) + 2) { return }
            }
        }
    }

    private func remember(_ reader: DirectoryReader, for inode: InodeNumber) {
        guard let entries = reader.completeEntries() else { return }
        state.withLock { s in
            var table: [String: DirectoryEntry] = [:]
            table.reserveCapacity(entries.count)
            for entry in entries { table[entry.name] = entry }
            s.listings[inode] = Listing(entries: table, completedAt: Self.now())
        }
    }

    public func releasedir(handle: UInt64) {
        state.withLock { _ = $0.directoryHandles.removeValue(forKey: handle) }
    }

    /// Resolves a readdir collision (see DirectoryBuilder).
    func resolve(_ collision: DirectoryBuilder.Collision, prefix: String) throws(FSError) -> DirectoryBuilder.Collision.Resolution {
        guard collision.file.size == 0 else { return .directoryWins }
        do {
            let info = try store.head(key: collision.file.key)
            let children = try store.list(prefix: collision.file.key + "/", delimiter: "/", marker: nil, limit: 2)
            return DirectoryBuilder.resolve(
                key: collision.file.key, manifest: info.manifest, container: store.containerName,
                childrenPreview: children.entries)
        } catch where error.code == .notFound {
            return .directoryWins
        } catch {
            throw FSError(storeError: error, operation: "readdir", path: collision.file.key)
        }
    }

    // MARK: Files

    public struct OpenResult: Sendable {
        public var handle: UInt64
        /// The page cache holds this object's current content: the kernel may keep it.
        public var keepCache: Bool
    }

    public func open(_ inode: InodeNumber, writable: Bool) throws(FSError) -> OpenResult {
        var node = try node(inode)
        guard node.kind == .file else { throw FSError(.isADirectory, "open of a directory") }
        if writable { throw FSError(.readOnly, "this mount is read-only") }
        // Close-to-open: a file opened after its writer closed it shows the new content.
        if Self.now() - node.confirmedAt > configuration.attributeCacheSeconds {
            node = try refresh(node)
        }
        let reader = FileReader(
            store: store, key: node.key, size: node.size, etag: node.etag, isManifest: node.isManifest,
            chunkSize: configuration.readChunkSize, readAheadChunks: configuration.readAheadChunks)
        return state.withLock { s in
            let handle = s.nextHandle
            s.nextHandle += 1
            s.fileHandles[handle] = reader
            let keep = s.nodes[inode]?.cachedEtag == node.etag
            s.nodes[inode]?.cachedEtag = node.etag
            return OpenResult(handle: handle, keepCache: keep)
        }
    }

    public func read(handle: UInt64, offset: Int64, length: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(FSError) {
        guard let reader = state.withLock({ $0.fileHandles[handle] }) else {
            throw FSError(.invalidArgument, "unknown file handle \(handle)")
        }
        try reader.read(offset: offset, length: length, reply: reply)
    }

    public func release(handle: UInt64) {
        state.withLock { _ = $0.fileHandles.removeValue(forKey: handle) }
    }

    // MARK: Filesystem

    public func statistics() -> FilesystemStatistics {
        if let cached = state.withLock({ $0.statistics }), Self.now() - cached.at < 10 { return cached.value }
        let blockSize: UInt64 = 4096
        // An object store has no fixed size: report 1 PiB, minus what the container uses.
        let total: UInt64 = (1 << 50) / blockSize
        var used: UInt64 = 0
        var objects: UInt64 = 0
        if let info = try? store.headContainer() {
            used = UInt64(max(0, info.bytesUsed)) / blockSize
            objects = UInt64(max(0, info.objectCount))
        }
        let value = FilesystemStatistics(
            blockSize: blockSize, totalBlocks: total, freeBlocks: total - min(used, total),
            totalInodes: 1 << 32, freeInodes: (1 << 32) - min(objects, 1 << 32), maximumNameLength: 255)
        state.withLock { $0.statistics = (value, Self.now()) }
        return value
    }
}
