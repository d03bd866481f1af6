// The vocabulary (FSError, Attributes, FilesystemConfiguration, ...) and the public parts of the
// files room (KernelCache, Transfers) are part of this module's interface.
@_exported import FSCore
@_exported import FSFiles
import Dispatch
import FSJournal
import FSNamespace
import Locking
import Logging
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// LOCKING (the one list; other files point here)
//
// Every lock of the FileSystem module, in the order they may be taken (a lock may be taken while
// holding only locks above it):
//   1. `attributeLocks[inode % 64]` (SerialLock): serialises one node's attribute HEAD + POST
//      (which wait for the file's uploads counted in `FileTables.uploading`, `postHoldingUploads`;
//      `commit` counts itself under this lock), the store of its owed attributes and its
//      attribute note. HELD ACROSS NETWORK I/O on
//      purpose. Several are held at once only by `withAttributesHeld` (a file rename), in stripe
//      order, before it takes upload locks.
//   2. `SpoolFile.uploadLock` (SerialLock, one per spool): serialises the uploads of one file and
//      keeps a namespace operation's change of that file from racing its upload. HELD ACROSS
//      NETWORK I/O on purpose. Several are held at once only by `withUploadsHeld` (rename,
//      unlink), always in inode order. No attribute lock is taken while one is held.
//   2b. `SpoolFile.noteLock` (Locked, one per spool): a spool's journal note and what it says
//      (node, state) written or removed together. HELD ACROSS LOCAL DISK I/O (the note's write
//      and fsync), never network I/O; takes 3 and 4 inside, never 1 or 2.
//   3. `names` (Locked<NamespaceTables>, the namespace room's tables, `Namespace.names`): the
//      inode table, directory cache, readers, directory handles, the bound and the spools it knows
//      of. Never held across I/O (network, SQLite, spool files) or a FUSE reply.
//   3b. `files` (Locked<FileTables>, the files room's tables): file handles, spools by inode,
//      uploads under way. Taken alone, or inside `names` by `withTables` only (one look at a node
//      and its spool: the facade is the only code that takes both). Never held across I/O.
//   4. `SpoolFile.state` (Locked): one spool's counters; taken inside 3 or 3b (attach, retire,
//      a spool's size) or alone.
//   5. `SpoolFile.descriptor` (Locked): the spool's descriptor and its users; taken inside 4
//      (closing a waiting spool's descriptor) or alone (a read or write gets the descriptor; the
//      I/O itself runs outside the lock).
//   6. `backgroundHeads.heads` (Locked, FSNamespace's `BackgroundHeads`): the background HEAD table. Never taken together with 3 or 3b.
//   6b. `listingsAhead.ahead` (Locked, FSNamespace's `ListingsAhead`): listings ahead and walk
//      listings; a walk listing's `scan` is taken inside it, or alone. Never taken together with
//      3, 3b or 6 (what it needs of them, `ListingsAheadHost`, is asked outside it).
//   7. Leaf locks, taken alone and never across I/O: `DirectoryReader.state`, `FileReader.state`
//      and its blocks, `EarlyParts.state`, `KernelCache`, `Poller`'s table, the block cache's own.
// No lock of this module is held while calling into the FUSE layer.

/// The filesystem semantics of a container: inodes, directories from listings, reads, writes
/// through spool files, and the namespace operations. It knows nothing of FUSE; every method is
/// synchronous, thread-safe and may block on the network.
///
/// Subtleties:
/// 1. Nodes, names and lookup counts belong to `InodeTable`; listings to `DirectoryCache`; open
///    file and directory handles to `Handles`; each spool's life to `SpoolState`. The tables are
///    value types in the rooms' `NamespaceTables` and `FileTables`, and no other code writes them.
/// 2. A complete directory listing is remembered for `directoryCacheSeconds` and answers lookups
///    in that directory, which is what makes `ls -l` cost one listing instead of a HEAD per entry.
///    Zero-byte files (possible DLO manifests) and directories (whose attributes live on a
///    `dir/` marker) are HEADed. Our own changes update the remembered listing in place, and are
///    applied again to listings that complete after them (DirectoryCache rule 2).
/// 3. Outside a remembered listing, a lookup asks the server twice, at once: HEAD `key` and a
///    one-entry listing of `key/`, then applies the same collision rule as readdir (DirectoryBuilder).
/// 4. The prefix `.cssp-parts/` at the container root holds multipart parts; it is never shown.
/// 5. A file with a spool is described by its spool (size, attributes not stored yet): listings
///    and HEADs never overwrite it. Every handle of one file reads what was written through this
///    mount (see `read`). Locks: the LOCKING block above.
public final class Filesystem: Sendable, PollHost {
    public static let rootInode: InodeNumber = Namespace.rootInode
    /// The longest object key the store takes (Swift's default `max_object_name_length`).
    public static let maximumKeyLength = Namespace.maximumKeyLength
    /// Where multipart parts live, relative to the container (see `Uploader`).
    public static let partsPrefix = manifestPartsPrefix

    /// The store as this mount sees it: the container, less the keys whose delete is owed
    /// (`JournaledStore`).
    package let store: any ObjectStore
    /// The same without `recovered`: what recovery itself writes through (`RecoveredWork`).
    let recoveryStore: any ObjectStore
    /// Uploads and attribute changes earlier processes left journaled in the spool directory.
    let recovered: RecoveredWork
    /// Deletes journaled by write-back unlinks and rmdirs (and left by an earlier mount).
    let deletes: DeleteQueue
    public let configuration: FilesystemConfiguration
    package let logger: Logger
    let spool: Spool
    /// Manifests whose parts may be shared after a failed rename: never deleted.
    let sharedParts: SharedParts
    /// Uploads running and owed (`mount.cssp --status`).
    public let transfers: Transfers

    /// The namespace room: which names exist, with which attributes. Its tables are lock 3 of
    /// the LOCKING block at the top of this file (`names`).
    package let namespace: Namespace
    package var names: Locked<NamespaceTables> { namespace.names }
    /// The files room's tables (lock 3b): taken alone, or inside `names` (`withTables`).
    package let files = Locked(FileTables())
    /// Stores fetched bytes in the kernel's page cache (installed by the FUSE layer).
    public let kernelCache = KernelCache()
    /// The threads of all background work (see `BackgroundPool`).
    package let pool: BackgroundPool
    /// Background cache seeding under way (`waitForCacheWrites`).
    let seeding = DispatchGroup()
    /// Object versions being pulled whole by random readers (`FileReader`, subtlety 7).
    let pulls = PullRegistry()
    /// Serialise attribute updates per node (striped by inode); held during their HEAD and POST (lock 1).
    let attributeLocks: [SerialLock] = (0..<64).map { _ in SerialLock() }
    /// Orders answers of the store against this mount's acknowledged changes (the attribute rule).
    package let storeClock = StoreClock()
    /// Change notification (the namespace room's `Poller`; this filesystem is its host,
    /// `Filesystem+Poll`).
    let poller = Poller()

    public convenience init(store: any ObjectStore, configuration: FilesystemConfiguration, logger: Logger) throws(FSError) {
        try self.init(store: store, configuration: configuration, logger: logger, journalFile: nil)
    }

    /// `journalFile`: a journal's file at a path, the delete journal's and the upload journal's
    /// (tests pass a double that loses unsynced writes in a simulated power cut).
    init(
        store raw: any ObjectStore, configuration: FilesystemConfiguration, logger: Logger,
        journalFile: ((String) -> any JournalFile)?
    ) throws(FSError) {
        self.configuration = configuration
        self.logger = logger
        let makeFile = journalFile ?? { DiskJournalFile(path: $0) }
        // The spools a dead worker's handles hold are taken over (`adoptHandles`), not recovered.
        let spool = try Spool(
            directory: configuration.spoolDirectory, journalFile: makeFile,
            keeping: Set(configuration.adoptedHandles.values.compactMap { $0.spool?.path }))
        self.spool = spool
        let sharedParts = SharedParts(directory: configuration.spoolDirectory)
        self.sharedParts = sharedParts
        let pool = BackgroundPool(width: configuration.backgroundThreads)
        self.pool = pool
        let journal = DeleteJournal(
            file: makeFile(Spool.deleteJournalPath(in: spool.directory)),
            adopting: spool.adopted.map { makeFile(Spool.deleteJournalPath(in: $0)) })
        let transfers = Transfers()
        self.transfers = transfers
        let partsRemover = Uploader(
            store: raw, pool: pool, threshold: configuration.multipartThreshold, partSize: configuration.partSize,
            concurrency: configuration.uploadConcurrency, sharedParts: sharedParts, transfers: transfers)
        deletes = DeleteQueue(
            journal: journal, store: raw, pool: pool, width: configuration.uploadConcurrency, logger: logger,
            deleteParts: { manifest, key in partsRemover.deleteParts(manifest: manifest, ofKey: key) })
        // A read-only mount stores nothing: it serves the store as it is.
        let owed = RecoveredWork.owed(
            uploads: configuration.readOnly ? [] : spool.leftovers.compactMap { path, note in note.map { (path, $0) } },
            attributes: configuration.readOnly ? [] : spool.attributeLeftovers)
        for note in owed.superseded {
            Glibc.unlink(note.path)
            logger.notice("attributes of '\(note.key)' owed by an earlier mount are stored by its upload owed too")
        }
        let recovered = RecoveredWork(owed.items)
        self.recovered = recovered
        self.store = JournaledStore(raw, deletes: deletes, recovered: recovered)
        recoveryStore = JournaledStore(raw, deletes: deletes)
        namespace = Namespace(
            store: store, storeClock: storeClock, configuration: configuration, pool: pool, logger: logger)
        let registry = configuration.metrics.registry
        let deletes = self.deletes
        registry.gauge("cssp_pending_deletes", help: "Deletes journaled by write-back and not yet sent.") {
            Double(deletes.backlog().count)
        }
        let names = self.names
        registry.gauge("cssp_cached_entries", help: "Names whose attributes the mount keeps (the kernel holds them, or a spool).") {
            Double(names.withLock { $0.inodes.nodes.count })
        }
        registry.gauge("cssp_remembered_names", help: "Names in the directory listings the mount remembers.") {
            Double(names.withLock { $0.directories.rememberedNames })
        }
        let listingsAhead = namespace.listingsAhead
        registry.gauge(
            "cssp_names_listed_ahead", help: "Names in the listings fetched ahead of the readers and not read yet.")
        {
            Double(listingsAhead.ahead.withLock { $0.heldEntries })
        }
        registry.gauge("cssp_uploads_in_progress", help: "Uploads being sent now.") { Double(transfers.running.count) }
        registry.gauge("cssp_upload_bytes_done", help: "Bytes sent of the uploads in progress.") {
            Double(transfers.running.reduce(0) { $0 + $1.done })
        }
        registry.gauge("cssp_upload_bytes_total", help: "Bytes in all of the uploads in progress.") {
            Double(transfers.running.reduce(0) { $0 + $1.total })
        }
        registry.gauge(
            "cssp_pending_uploads",
            help: "Uploads owed: failed ones waiting for their retry, write-back files queued, and what an earlier mount left.")
        {
            Double(transfers.owed.count + recovered.count)
        }
        recovered.install { [weak self] item throws(ObjectStoreError) in try self?.storeRecovered(item) }
        adoptHandles()
    }

    /// Whether a mount with `configuration` can take its spool directory, which `init` takes:
    /// checked before mounting, and let go at once (a supervisor must not hold it: issue 40).
    public static func checkSpool(_ configuration: FilesystemConfiguration) throws(FSError) {
        try Spool(directory: configuration.spoolDirectory).unlock()
    }

    /// Runs `body` with both rooms' tables, for one look at both (a file with a spool is
    /// described by its spool): `names`, then `files` inside it (locks 3 and 3b).
    func withTables<T, E: Error>(_ body: (inout NamespaceTables, inout FileTables) throws(E) -> T) throws(E) -> T {
        try names.withLock { (n) throws(E) -> T in try files.withLock { (f) throws(E) -> T in try body(&n, &f) } }
    }

    /// Nodes and handles are numbered from `first` on: a worker that replaces a dead one must
    /// never give a number the kernel may still hold from that one (issue 40).
    public func numberFrom(_ first: UInt64) {
        withTables { s, f in
            s.inodes.numberFrom(first)
            s.directoryHandles.numberFrom(first)
            f.handles.numberFrom(first)
        }
    }

    /// Seconds on the configuration's clock (`Namespace.now`, the one rule): every cache age is measured here.
    package func now() -> Double { namespace.now() }


    // MARK: Attributes

    func attributes(of node: Node) -> Attributes { node.attributes(configuration) }

    public func getattr(_ inode: InodeNumber) throws(FSError) -> Attributes {
        // The node and its spool in one look: a spool retired in between (its upload just stored
        // the file) would leave a node read before the upload updated it. (And whether it is a
        // node a dead worker left, to be described first: no second lock on this hot path.)
        let (known, open, adopted) = names.withLock { s in
            (s.inodes[inode], s.spools[inode], s.inodes.undescribed.contains(inode))
        }
        if adopted {
            try describeIfAdopted(inode)
            return try getattr(inode)
        }
        guard var node = known else { throw FSError(.stale, "inode \(inode) is not known (forgotten by the kernel)") }
        if let open {
            node.size = open.size
            return attributes(of: node)
        }
        // A node no name leads to (unlinked or replaced here, held open) keeps what it knew:
        // its old key may hold another object now, which is not this file.
        if node.kind != .directory && node.linked
            && (now() - node.confirmedAt > configuration.attributeCacheSeconds || namespace.awaitsHead(node))
        {
            node = try namespace.refresh(node)
        }
        return attributes(of: node)
    }

    // MARK: Names (the namespace room answers; the facade bounds what it keeps)

    /// Resolves `name` in directory `parent`; on success the kernel holds one more lookup on it.
    public func lookup(parent: InodeNumber, name: String) throws(FSError) -> Attributes {
        defer { boundNodes() }
        return try namespace.lookup(parent: parent, name: name)
    }

    /// The kernel dropped `count` lookups of `inode`.
    public func forget(_ inode: InodeNumber, count: UInt64) { namespace.forget(inode, count: count) }

    public func opendir(_ inode: InodeNumber) throws(FSError) -> UInt64 {
        try describeIfAdopted(inode)
        return try namespace.opendir(inode)
    }

    /// A node taken over from a dead worker (`InodeTable.adopt`, issue 40) is described by a
    /// lookup of its name at its first use here: until then only its name and kind are known.
    /// ESTALE when the name leads to something else now, or to nothing.
    func describeIfAdopted(_ inode: InodeNumber) throws(FSError) {
        guard let node = names.withLock({ s in s.inodes.undescribed.contains(inode) ? s.inodes[inode] : nil }) else {
            return
        }
        let found: Attributes
        do {
            found = try namespace.lookup(parent: node.parent, name: node.name)
        } catch where error.code == .notFound || error.code == .notADirectory {
            throw FSError(.stale, "'\(node.key)' is gone since the worker that knew inode \(inode) died")
        }
        names.withLock { s in
            // The lookup counted one the kernel does not hold.
            s.inodes.forget(found.inode, count: 1)
            s.inodes.markDescribed(inode)
        }
        guard found.inode == inode else {
            throw FSError(.stale, "'\(node.key)' is another object since the worker that knew inode \(inode) died")
        }
    }

    /// Emits entries from `offset` on; `emit(name, kind, inode, nextOffset)` returns false when full.
    public func readdir(
        _ inode: InodeNumber, handle: UInt64, offset: Int64, emit: (String, NodeKind, InodeNumber, Int64) -> Bool
    ) throws(FSError) {
        try namespace.readdir(inode, handle: handle, offset: offset, emit: emit)
    }

    /// readdirplus (`Namespace.readdirplus`): `emit(name, kind, inode, attributes, nextOffset)`
    /// returns false when full.
    public func readdirplus(
        _ inode: InodeNumber, handle: UInt64, offset: Int64,
        emit: (String, NodeKind, InodeNumber, Attributes?, Int64) -> Bool
    ) throws(FSError) {
        defer { boundNodes() }
        try namespace.readdirplus(inode, handle: handle, offset: offset, emit: emit)
    }

    public func releasedir(handle: UInt64) { namespace.releasedir(handle: handle) }

    /// Returns when every background HEAD queued so far has ended (tests).
    public func waitForPrefetch() { namespace.waitForPrefetch() }

    /// Drops queued HEADs and queues no more (unmount).
    public func stopPrefetching() { namespace.stopPrefetching() }

    // MARK: Filesystem

    /// Ends the mount's background work and gives up the spool directory (unmount): queued and
    /// delayed jobs are dropped, running ones get until `deadline` seconds. Uploads still owed
    /// stay in the spool with their notes, for the next mount. Returns whether every job ended.
    @discardableResult
    public func shutdown(deadline: Double = 30) -> Bool {
        recovered.stop()
        namespace.stopPrefetching()
        namespace.listingsAhead.stop()
        let ended = pool.shutdown(deadline: deadline)
        configuration.metadataIndex?.flush()
        // Written and synced: a cache a power cut could have torn is not trusted (BlockCache).
        configuration.blockCache?.markClean()
        spool.unlock()
        return ended
    }

    public func statistics() -> FilesystemStatistics {
        if let cached = names.withLock({ $0.statistics }), now() - cached.at < 10 { return cached.value }
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
        names.withLock { $0.statistics = (value, now()) }
        return value
    }
}
