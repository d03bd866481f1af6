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
//      (which wait for the file's uploads counted in `State.uploading`, `postHoldingUploads`;
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
//   3. `state` (Locked<State>): the inode table, directory cache, handles and spools. Never held
//      across I/O (network, SQLite, spool files) or a FUSE reply.
//   4. `SpoolFile.state` (Locked): one spool's counters; taken inside `state` (attach, retire) or alone.
//   5. `SpoolFile.descriptor` (Locked): the spool's descriptor and its users; taken inside 4
//      (closing a waiting spool's descriptor) or alone (a read or write gets the descriptor; the
//      I/O itself runs outside the lock).
//   6. `prefetch` (Locked): the background HEAD table. Never taken together with `state`.
//   7. Leaf locks, taken alone and never across I/O: `DirectoryReader.state`, `FileReader.state`
//      and its blocks, `EarlyParts.state`, `KernelCache`, the block cache's own.
// No lock of this module is held while calling into the FUSE layer.

/// The filesystem semantics of a container: inodes, directories from listings, reads, writes
/// through spool files, and the namespace operations. It knows nothing of FUSE; every method is
/// synchronous, thread-safe and may block on the network.
///
/// Subtleties:
/// 1. Nodes, names and lookup counts belong to `InodeTable`; listings to `DirectoryCache`; open
///    handles to `HandleTable`; each spool's life to `SpoolState`. The tables
///    are value types in `State`, and no other code writes them.
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
public final class Filesystem: Sendable, ListingResolver {
    public static let rootInode: InodeNumber = 1
    /// The longest object key the store takes (Swift's default `max_object_name_length`).
    public static let maximumKeyLength = 1024
    /// Where multipart parts live, relative to the container (see `Uploader`).
    public static let partsPrefix = manifestPartsPrefix

    /// The store as this mount sees it: the container, less the keys whose delete is owed
    /// (`JournaledStore`).
    let store: any ObjectStore
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

    /// An open directory: the listing its readdir reads, taken at offset 0 (the first readdir,
    /// or after `rewinddir`, which must show the directory as it is then); nil before.
    struct OpenDirectory {
        var reader: DirectoryReader? = nil
    }

    enum Handle {
        /// A read-only handle on an object that nobody was writing through this mount at open.
        case remote(FileReader, InodeNumber, localVersion: UInt64)
        /// A handle on the spool of a file open for writing (or not yet stored).
        case spool(SpoolFile, writable: Bool)
    }

    struct State {
        var inodes: InodeTable
        var directories: DirectoryCache
        var handles = HandleTable()
        /// Spools by inode: files open for writing, and closed files whose upload is pending.
        var openFiles: [InodeNumber: SpoolFile] = [:]
        var statistics: (value: FilesystemStatistics, at: Double)?
        /// Uploads under way per inode, with a group left when the last ends (`commit`; an
        /// attribute POST waits for them, `postHoldingUploads`).
        var uploading: [InodeNumber: (count: Int, done: DispatchGroup)] = [:]
        /// Passes asking the kernel to forget names (`Filesystem+Bound`).
        var bound = BoundState()
        /// The listing a readdir reads from the server, by directory, and when a readdir or a
        /// lookup last used it, until its handle is closed or another readdir replaces it: a
        /// lookup of a name it showed takes the entry from it while it is in use, up to
        /// `dir_timeout` after the last use, when no remembered listing is fresh. `ls -l` of
        /// 200 000 names stats each as it reads, 6 000 names a getdents, and stats the last
        /// 6 000 after the listing is complete and remembered: longer than `dir_timeout` when
        /// each needs a HEAD.
        var readers: [InodeNumber: (reader: DirectoryReader, at: Double)] = [:]

        /// Drops the listings of directories the inode table no longer holds, and keeps the
        /// numbers of names whose nodes the kernel forgot for their next nodes (readdir may have
        /// shown them: d_ino = st_ino).
        mutating func sweep() {
            for directory in inodes.takeRemovedDirectories() { directories.remove(directory) }
            for (parent, name, inode) in inodes.takeForgottenNames() { directories.reserveForgotten(parent, name, inode) }
        }
    }

    /// Protects every table above (lock 3 of the LOCKING block at the top of this file).
    let state: Locked<State>
    /// Stores fetched bytes in the kernel's page cache (installed by the FUSE layer).
    public let kernelCache = KernelCache()
    /// The threads of all background work (see `BackgroundPool`).
    package let pool: BackgroundPool
    /// Background cache seeding under way (`waitForCacheWrites`).
    let seeding = DispatchGroup()
    /// Background HEADs after listings (Filesystem+Prefetch), and the workers running them (lock 6).
    let prefetch = Locked(PrefetchState())
    let prefetching = DispatchGroup()
    /// Listings of subdirectories fetched ahead of a walk (`Filesystem+ListAhead`), and the
    /// workers fetching them.
    let listingsAhead = Locked(AheadState())
    let listingAhead = DispatchGroup()
    /// Object versions being pulled whole by random readers (`FileReader`, subtlety 7).
    let pulls = PullRegistry()
    /// Serialise attribute updates per node (striped by inode); held during their HEAD and POST (lock 1).
    let attributeLocks: [SerialLock] = (0..<64).map { _ in SerialLock() }
    /// Orders answers of the store against this mount's acknowledged changes (the attribute rule).
    let storeClock = StoreClock()
    /// Change notification (`Filesystem+Poll`).
    let poll = Locked(PollState())

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
        let spool = try Spool(directory: configuration.spoolDirectory, journalFile: makeFile)
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
        state = Locked(
            State(
                inodes: InodeTable(rootKey: configuration.rootPrefix, rootTime: configuration.directoryTime),
                directories: DirectoryCache(
                    journalSeconds: Self.journalSeconds(directoryTimeout: configuration.directoryCacheSeconds),
                    nameLimit: configuration.maximumEntries)))
        let registry = configuration.metrics.registry
        let deletes = self.deletes
        registry.gauge("cssp_pending_deletes", help: "Deletes journaled by write-back and not yet sent.") {
            Double(deletes.backlog().count)
        }
        let state = self.state
        registry.gauge("cssp_cached_entries", help: "Names whose attributes the mount keeps (the kernel holds them, or a spool).") {
            Double(state.withLock { $0.inodes.nodes.count })
        }
        registry.gauge("cssp_remembered_names", help: "Names in the directory listings the mount remembers.") {
            Double(state.withLock { $0.directories.rememberedNames })
        }
        let listingsAhead = self.listingsAhead
        registry.gauge(
            "cssp_names_listed_ahead", help: "Names in the listings fetched ahead of the readers and not read yet.")
        {
            Double(listingsAhead.withLock { $0.heldEntries })
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
    }

    /// Seconds on the configuration's clock (monotonic by default): every cache age is measured here.
    func now() -> Double { configuration.clock?() ?? monotonicNow() }


    // MARK: Attributes

    func attributes(of node: Node) -> Attributes {
        let defaultMode: UInt16
        switch node.kind {
        case .directory: defaultMode = 0o777 & ~configuration.umask
        case .file, .fifo, .socket: defaultMode = 0o666 & ~configuration.umask
        case .symlink: defaultMode = 0o777
        }
        let size: Int64
        switch node.kind {
        case .directory, .fifo, .socket: size = 0
        case .file: size = node.size
        case .symlink: size = Int64(node.symlinkTarget?.utf8.count ?? Int(node.size))
        }
        // An object without a stored mtime shows its last-modified time to the second: a HEAD
        // says no more (a listing has microseconds), and a time must not change with the answer
        // that happened to describe the object first (issue 38).
        let fallbackTime = node.kind == .directory ? configuration.directoryTime : node.lastModified.roundedUpToSecond
        let modified = node.stored.mtime ?? fallbackTime
        return Attributes(
            inode: node.inode, kind: node.kind, size: size, modified: modified,
            changed: max(node.changedAt ?? modified, modified), accessed: node.accessedAt ?? modified,
            links: node.linked ? (node.kind == .directory ? 2 : 1) : 0,
            permissions: node.kind == .symlink ? 0o777 : (node.stored.mode ?? defaultMode),
            uid: configuration.forcedUID ?? node.stored.uid ?? configuration.uid,
            gid: configuration.forcedGID ?? node.stored.gid ?? configuration.gid)
    }

    func node(_ inode: InodeNumber) throws(FSError) -> Node {
        guard let node = state.withLock({ $0.inodes[inode] }) else {
            throw FSError(.stale, "inode \(inode) is not known (forgotten by the kernel)")
        }
        return node
    }

    public func getattr(_ inode: InodeNumber) throws(FSError) -> Attributes {
        // The node and its spool in one look: a spool retired in between (its upload just stored
        // the file) would leave a node read before the upload updated it.
        let (known, open) = state.withLock { s in (s.inodes[inode], s.openFiles[inode]) }
        guard var node = known else { throw FSError(.stale, "inode \(inode) is not known (forgotten by the kernel)") }
        if let open {
            node.size = open.size
            return attributes(of: node)
        }
        // A node no name leads to (unlinked or replaced here, held open) keeps what it knew:
        // its old key may hold another object now, which is not this file.
        if node.kind != .directory && node.linked
            && (now() - node.confirmedAt > configuration.attributeCacheSeconds || awaitsHead(node))
        {
            node = try refresh(node)
        }
        return attributes(of: node)
    }

    /// Whether `node` is another tool's file whose metadata headers no answer has shown for its
    /// version yet (a listing showed a new version of it), with `foreign_attrs=head`: its
    /// attributes are not reported before a HEAD.
    func awaitsHead(_ node: Node) -> Bool {
        configuration.foreignAttributes == .head && (node.kind == .file && node.size > 0 || node.kind == .symlink)
            && node.metadataKnownAt == 0 && node.stored.mtime == nil && !node.hasUnacknowledgedChange
    }

    /// HEADs a file's object and stores what it says.
    func refresh(_ node: Node) throws(FSError) -> Node {
        let askedAt = storeClock.tick()
        let info: ObjectInfo
        do {
            info = try store.head(key: node.key)
        } catch {
            throw FSError(storeError: error, operation: "stat", path: node.key)
        }
        return state.withLock { s in
            s.inodes.update(node.inode) { apply(info, askedAt: askedAt, to: &$0) } ?? node
        }
    }

    /// Takes what a HEAD asked at `askedAt` said, if the rule admits it (see `Node.apply`), at
    /// this filesystem's time.
    func apply(_ info: ObjectInfo, askedAt: UInt64, to node: inout Node) {
        node.apply(info, askedAt: askedAt, now: now(), foreign: configuration.foreignAttributes)
    }

    // MARK: Lookup

    /// Resolves `name` in directory `parent`; on success the kernel holds one more lookup on it.
    public func lookup(parent: InodeNumber, name: String) throws(FSError) -> Attributes {
        defer { boundNodes() }
        // An answer from before a change made here that no node remembers is asked again
        // (DirectoryCache rule 4); the last try takes what it gets, unless this mount removed the
        // name after the answer (see `link`).
        do {
            for attempt in 1...Self.lookupAttempts {
                if let attributes = try lookupOnce(parent: parent, name: name, lastTry: attempt == Self.lookupAttempts) {
                    if attributes.kind != .directory { state.withLock { $0.directories.noteNamesUsed(parent, now: now()) } }
                    return attributes
                }
            }
        } catch where error.code == .notFound {
            // A directory the store no longer shows is there while a file below it is being
            // written (`directoriesHoldingFilesBeingWritten`).
            let kept: Attributes? = state.withLock { s in
                guard let node = s.inodes.child(parent, name), node.kind == .directory,
                    directoriesHoldingFilesBeingWritten(in: s).contains(node.inode)
                else { return nil }
                s.inodes.countLookup(node.inode)
                return attributes(of: node)
            }
            if let kept { return kept }
            throw error
        }
        preconditionFailure("INTERNAL ERROR: the last lookup attempt returns or throws")
    }

    /// The directories a file being written (open, or its upload pending) lies below, under
    /// names that lead to it. Such a directory is there whatever a listing says (another client
    /// removed every other key below it): a listing that lacks it keeps it, lookups find it and
    /// readdir shows it, as it does the file (its upload makes the directory again).
    func directoriesHoldingFilesBeingWritten(in s: State) -> Set<InodeNumber> {
        var holding = Set<InodeNumber>()
        for open in s.openFiles.keys {
            var current = s.inodes[open]
            while let node = current, node.linked, node.inode != Self.rootInode, holding.insert(node.parent).inserted {
                current = s.inodes[node.parent]
            }
        }
        return holding
    }

    static let lookupAttempts = 3

    /// `lookup`; nil when the answer predates a change made here (DirectoryCache rule 4) and
    /// this is not the `lastTry`.
    private func lookupOnce(parent: InodeNumber, name: String, lastTry: Bool) throws(FSError) -> Attributes? {
        let directory = try node(parent)
        guard directory.kind == .directory else { throw FSError(.notADirectory, "lookup in a file") }
        guard DirectoryBuilder.isValidName(name) else {
            throw FSError(name.utf8.count > 255 ? .nameTooLong : .notFound, "no such name '\(name)'")
        }
        if isHidden(name, in: directory) { throw FSError(.notFound, "'\(name)' is reserved for multipart parts") }
        try Self.requireStorable(directory.key + name)
        // A file created here and not yet stored exists only in our tables.
        let local: Attributes? = state.withLock { s in
            s.directories.touch(parent)
            guard let node = s.inodes.child(parent, name) else { return nil }
            return lookUpSpooled(node.inode, in: &s)
        }
        if let local { return local }

        // Where the entry comes from: a remembered listing, or a readdir's listing under way.
        enum Source {
            case table(EntryTable, askedAt: UInt64, since: UInt64)
            case reader(DirectoryReader)
        }
        let source: Source? = state.withLock { s in
            // A reader in use stays in use while lookups go on, whichever source serves them:
            // `ls -l` reads 6 000 names with one getdents (1 MiB), then stats each.
            var reader: DirectoryReader? = nil
            if let (inUse, at) = s.readers[parent], now() - at <= configuration.directoryCacheSeconds {
                reader = inUse
                s.readers[parent]?.at = now()
            }
            if let listing = s.directories.listing(parent, now: now(), maximumAge: configuration.directoryCacheSeconds) {
                return .table(listing.entries, askedAt: listing.askedAt, since: s.directories.changeCount(parent))
            }
            return reader.map { .reader($0) }
        }
        var listed: (entry: DirectoryEntry?, askedAt: UInt64, since: UInt64)? = nil
        // The entries after the name's, for the HEADs ahead of the program (`prefetchAhead`).
        var following: (Int) -> [DirectoryEntry] = { _ in [] }
        switch source {
        case .table(let table, let askedAt, let since)?:
            listed = (table[name.exact], askedAt, since)
            following = { table.following(name.exact, count: $0) }
        case .reader(let reader)?:
            // Only a name the reader showed: one it has not read yet may come on a later page.
            if let found = reader.listedEntry(named: name) {
                listed = (found, reader.askedAt, reader.startedAt)
                following = { reader.entries(following: name, count: $0) }
            }
        case nil: break
        }
        var entry: DirectoryEntry
        // When the entry was asked for (the attribute rule), and the directory's change count
        // then (DirectoryCache rule 4).
        var listedAt: UInt64
        var since: UInt64
        // A HEAD's answer: the file's full description (a DLO's real size and manifest, metadata
        // headers), or a directory's marker (none: no marker).
        var head: HeadAnswer? = nil
        switch listed {
        case (let found?, let askedAt, let count)?: (entry, listedAt, since) = (found, askedAt, count)
        case (nil, _, _)?: throw FSError(.notFound, "no '\(name)' in '\(directory.key)'")
        case nil:
            if let (listing, askedAt, count) = try listForLookups(directory) {
                guard let found = listing[name.exact] else { throw FSError(.notFound, "no '\(name)' in '\(directory.key)'") }
                (entry, listedAt, since) = (found, askedAt, count)
                following = { listing.following(name.exact, count: $0) }
            } else {
                since = state.withLock { $0.directories.changeCount(parent) }
                listedAt = storeClock.tick()
                let (found, headed) = try resolve(name: name, prefix: directory.key)
                entry = found
                head = headed.map { HeadAnswer(info: $0, askedAt: listedAt) }
            }
        }
        // Zero-byte files may be DLO manifests; directories keep their attributes on a marker.
        var fresh = false
        let needsHead = (entry.kind == .file && entry.size == 0) || entry.kind == .directory
        if head != nil {
            // Described by the HEAD already.
        } else if needsHead {
            let known = state.withLock { s in s.inodes.child(parent, name) }
            if let known, known.kind == entry.kind, now() - known.confirmedAt <= configuration.attributeCacheSeconds {
                // A zero-byte listing entry may be a DLO whose size and ETag the node has from a HEAD.
                fresh = true
            } else if case .known(let answer) = prefetchedMetadataForLookup(entry) {
                guard answer.info != nil || entry.kind == .directory else {
                    throw FSError(.notFound, "'\(entry.key)' is gone from the server")
                }
                head = answer
            } else {
                let askedAt = storeClock.tick()
                var info: ObjectInfo? = nil
                do {
                    info = try store.head(key: entry.key)
                } catch where error.code == .notFound && entry.kind == .directory {
                    // No marker: the directory's attributes are the defaults.
                } catch {
                    throw FSError(storeError: error, operation: "lookup", path: entry.key)
                }
                head = HeadAnswer(info: info, askedAt: askedAt)
                recordPrefetched(entry, answer: .some(info), askedAt: askedAt)
            }
        } else if awaitsHead(entry) {
            // Another tool's object (`foreign_attrs=head`): its metadata headers before its
            // first report, from the node (this version, described by a HEAD already), a HEAD
            // ahead of the program, the index, or a HEAD now. The next ones go out meanwhile.
            prefetchAhead(of: entry.key, in: parent, listedAt: listedAt, following: following)
            let known = state.withLock { s in s.inodes.child(parent, name) }
            if let known, known.kind == entry.kind, known.etag == entry.etag, known.metadataKnownAt > 0,
                known.lastModified.agrees(with: entry.lastModified)
            {
                // (merge keeps what the node's HEAD said of the version it lists.)
            } else if case .known(let answer) = prefetchedMetadata(entry, wait: true, listedAt: listedAt) {
                head = answer
            } else {
                let askedAt = storeClock.tick()
                do {
                    let info = try store.head(key: entry.key)
                    head = HeadAnswer(info: info, askedAt: askedAt)
                    recordPrefetched(entry, answer: .some(info), askedAt: askedAt)
                } catch where error.code == .notFound {
                    recordPrefetched(entry, answer: .some(nil), askedAt: askedAt)
                    throw FSError(.notFound, "'\(entry.key)' is gone from the server")
                } catch {
                    // Not the listing's attributes instead: they would change once a HEAD
                    // answers (the rule of `ForeignAttributes`).
                    recordPrefetched(entry, answer: nil, askedAt: askedAt)
                    throw FSError(storeError: error, operation: "lookup", path: entry.key)
                }
            }
        }
        return try state.withLock { s throws(FSError) in
            try self.link(entry, parent: parent, listedAt: listedAt, since: since, lastTry: lastTry, head: head, fresh: fresh, in: &s)
        }
    }

    /// The second name looked up in a directory within `lookupListingWindow` seconds lists the
    /// whole directory (up to `lookupListingLimit` entries) and remembers it, so that a walk over
    /// many names (rsync, `stat` of each file, a build) costs one listing instead of two requests
    /// per name. A first lookup, or one in a directory too large to list, asks about its name only.
    /// A lookup while such a listing runs waits for it (creates from several processes in one
    /// directory share one listing).
    /// A listing fetched ahead of a walk serves at once (rsync looks up every name of a tree
    /// without reading its directories), and a listing made here sends the subdirectories'
    /// listings ahead, as a readdir's does.
    /// Returns the listing, when it was asked and the change count it is current as of.
    func listForLookups(_ directory: Node) throws(FSError) -> (EntryTable, askedAt: UInt64, since: UInt64)? {
        let inode = directory.inode
        if let reader = readerFromListingAhead(directory, dropQueued: false), let entries = reader.completeEntries() {
            let table = remember(reader, entries, for: inode)
            listAhead(subdirectoriesOf: entries, in: inode)
            return (table, reader.askedAt, reader.startedAt)
        }
        let now = self.now()
        enum Start {
            case list(UInt64, DispatchGroup)
            case wait(DispatchGroup)
            case no
        }
        let start: Start = state.withLock { s in
            defer { s.directories.lastResolved[inode] = now }
            if let running = s.directories.listingForLookup[inode] { return .wait(running) }
            guard let last = s.directories.lastResolved[inode], now - last <= Self.lookupListingWindow else { return .no }
            let group = DispatchGroup()
            group.enter()
            s.directories.listingForLookup[inode] = group
            return .list(s.directories.changeCount(inode), group)
        }
        switch start {
        case .no: return nil
        case .wait(let running):
            // Bounded: a listing of a huge directory must not hold every FUSE thread; a lookup
            // that waited long enough asks about its name instead.
            guard running.wait(timeout: .now() + Self.lookupListingWait) == .success else { return nil }
            return state.withLock { s in
                s.directories.listing(inode, now: self.now(), maximumAge: configuration.directoryCacheSeconds)
                    .map { ($0.entries, $0.askedAt, s.directories.changeCount(inode)) }
            }
        case .list(let startedAt, let group):
            defer {
                state.withLock { _ = $0.directories.listingForLookup.removeValue(forKey: inode) }
                group.leave()
            }
            let reader = makeDirectoryReader(directory, startedAt: startedAt)
            guard let entries = try readWhole(reader, limit: Self.lookupListingLimit) else { return nil }
            // Changes made since the reader started are in the table (DirectoryCache rule 2).
            let table = remember(reader, entries, for: inode)
            listAhead(subdirectoriesOf: entries, in: inode)
            return (table, reader.askedAt, reader.startedAt)
        }
    }

    /// Reads `reader`'s listing to its end: its entries, or nil once `limit` entries came with
    /// more to come (a full page of `limit` decides, not the page after it).
    func readWhole(_ reader: DirectoryReader, limit: Int) throws(FSError) -> PackedEntries? {
        var index = 0
        while true {
            let (batch, complete) = try reader.entries(from: index, resolvingWith: self)
            index += batch.count
            if complete { break }
            if reader.listedCount >= limit { return nil }
        }
        return reader.completeEntries()
    }

    static let lookupListingWindow: Double = 30
    static let lookupListingWait: DispatchTimeInterval = .seconds(2)
    static let lookupListingLimit = 100_000
    /// Changes made here are applied to the listings that follow for `dir_timeout`, but at least
    /// 2 s (container listings lag behind writes) and at most 30 (memory; DirectoryCache rule 2).
    static func journalSeconds(directoryTimeout: Double) -> Double { min(max(directoryTimeout, 2), 30) }

    /// Stores the complete listing `entries` of directory `inode` that `reader` read, with this
    /// mount's recent changes applied (DirectoryCache rule 2); returns it as a table.
    @discardableResult
    func remember(_ reader: DirectoryReader, _ entries: PackedEntries, for inode: InodeNumber) -> EntryTable {
        let listed = EntryTable(entries)
        let table = state.withLock { s in rememberLocked(reader, listed, for: inode, in: &s) }
        prefetchMetadata(of: entries, in: inode)
        return table
    }

    /// `remember`, under the state lock, of a table made before it (the caller prefetches
    /// metadata after).
    func rememberLocked(
        _ reader: DirectoryReader, _ listed: EntryTable, for inode: InodeNumber, confirmed: Set<ExactString> = [],
        in s: inout State
    ) -> EntryTable {
        guard s.inodes[inode] != nil else { return listed }
        let (table, remembered) = s.directories.remember(
            listed, for: inode, now: now(), startedAt: reader.startedAt, askedAt: reader.askedAt,
            stillListed: reader.stillListed, confirmed: confirmed
        ) { name in
            // A name made here, which the listing lacks: its node as it is now, if any.
            guard let node = s.inodes.child(inode, name.string), node.kind != .directory else { return nil }
            return self.entry(for: node)
        }
        guard remembered else { return table }
        // Names the server no longer lists are gone (another client removed them), unless
        // they hold bytes not stored yet (a directory: below it).
        let holding = directoriesHoldingFilesBeingWritten(in: s)
        for (name, child) in s.inodes.children(of: inode)
        where table[name] == nil && s.openFiles[child] == nil && !holding.contains(child) {
            s.inodes.unhook(parent: inode, name: name.string)
        }
        s.sweep()
        return table
    }

    /// A reader of the server's listing of `directory`, which starts at change count `startedAt`
    /// (now, when nil); `pagesAhead`: see `DirectoryReader`.
    func makeDirectoryReader(_ directory: Node, startedAt: UInt64? = nil, pagesAhead: Bool = true) -> DirectoryReader {
        let (count, removed) = state.withLock { s in
            (s.directories.changeCount(directory.inode), s.directories.removedHere(directory.inode, now: now()))
        }
        return DirectoryReader(
            store: store, prefix: directory.key, pageSize: configuration.listPageSize, hidden: hiddenName(in: directory),
            removedHere: removed, startedAt: startedAt ?? count, askedAt: storeClock.tick(), pagesAhead: pagesAhead)
    }

    /// The name a listing of `directory` never shows: the multipart parts prefix at the root.
    func hiddenName(in directory: Node) -> String? {
        directory.key.isEmpty ? String(Self.partsPrefix.dropLast()) : nil
    }

    /// Creates or updates the node for `entry` and counts one kernel lookup.
    /// `fresh`: the node's attributes were confirmed within `attr_timeout`; only count the lookup.
    /// `since`: the directory's change count when the entry was asked: a new node takes what
    /// this mount made of the name after it instead, and none is made (nil) when that was a
    /// removal or is no longer known (DirectoryCache rule 4). nil: take the entry as it is.
    /// `lastTry` (a lookup that asked `lookupAttempts` times, each answer older than a change
    /// here): a removal here after the answer is final (notFound), the answer is taken when the
    /// journal forgot what came after it or when only a HEAD would describe this mount's entry.
    private func link(
        _ answer: DirectoryEntry, parent: InodeNumber, listedAt answerAskedAt: UInt64, since: UInt64?,
        lastTry: Bool = false, head answerHead: HeadAnswer?, fresh: Bool = false, in s: inout State
    ) throws(FSError) -> Attributes? {
        var (entry, listedAt, head) = (answer, answerAskedAt, answerHead)
        if let since, s.inodes.child(parent, entry.name)?.kind != entry.kind {
            switch s.directories.changeSince(parent, entry.name, count: since) {
            case .nothing: break
            case .changed(let mine?) where mine.kind == entry.kind && !mine.etag.isEmpty && mine.etag == entry.etag:
                // The answer shows the version this mount made (a HEAD after the upload).
                break
            case .changed(let mine?) where !Self.describesWhole(mine):
                // A directory or a DLO (its entry says size 0): only a HEAD describes it.
                if !lastTry { return nil }
            case .changed(let mine?):
                // Recorded after the store acknowledged it: as of now.
                (entry, listedAt, head) = (mine, storeClock.tick(), nil)
            case .changed(nil):
                if lastTry { throw FSError(.notFound, "'\(entry.name)' was removed here after the store answered") }
                return nil
            case .unknown:
                if !lastTry { return nil }
            }
        }
        let parentKey = s.inodes[parent]?.key ?? configuration.rootPrefix
        let linked = s.inodes.link(
            parent: parent, name: entry.name, kind: entry.kind, key: Self.key(of: entry, below: parentKey), lookups: 1,
            reserved: s.directories.takeReservation(parent, entry.name))
        if let open = s.openFiles[linked.inode] {
            // The spool describes the file (changes not stored yet): the server's view must not win.
            var node = linked
            node.size = open.size
            return attributes(of: node)
        }
        let node = s.inodes.update(linked.inode) { node in
            node.merge(entry, listedAt: listedAt, head: head, fresh: fresh, now: now(), foreign: configuration.foreignAttributes)
        }
        return attributes(of: node ?? linked)
    }

    /// Whether a listing entry alone describes its object (no HEAD needed): not a directory
    /// (attributes on its marker), not a zero-byte file (maybe a DLO manifest).
    static func describesWhole(_ entry: DirectoryEntry) -> Bool {
        entry.kind != .directory && !(entry.kind == .file && entry.size == 0)
    }

    /// The key of a listed entry below the parent's current key: a listing that started before
    /// the parent was renamed names the old place (DirectoryCache rule 3).
    static func key(of entry: DirectoryEntry, below parentKey: String) -> String {
        var component = Substring(entry.key)
        if entry.kind == .directory { component = component.dropLast() }
        if let slash = component.lastIndex(of: "/") { component = component[component.index(after: slash)...] }
        return parentKey + component + (entry.kind == .directory ? "/" : "")
    }

    /// Whether `name` in `directory` is the reserved parts prefix (only at the container root).
    func isHidden(_ name: String, in directory: Node) -> Bool {
        directory.kind == .directory && directory.key.isEmpty && (name + "/").isSameKey(as: Self.partsPrefix)
    }

    /// Finds `name` below `prefix` on the server: HEAD of the object, a peek below `name/`.
    func resolve(name: String, prefix: String) throws(FSError) -> (DirectoryEntry, ObjectInfo?) {
        let key = prefix + name
        var file: ObjectInfo? = nil
        var children: [ListEntry] = []
        let askedAt = storeClock.tick()
        // The HEAD and the peek go out together (issue 20, part 2: one round trip, not two).
        let failure = pool.forEach(2, width: 2) { (index) throws(ObjectStoreError) in
            if index == 0 {
                do throws(ObjectStoreError) {
                    file = try store.head(key: key)
                } catch where error.code == .notFound {
                    file = nil
                }
            } else {
                children = try store.list(prefix: key + "/", delimiter: "/", marker: nil, limit: 2).entries
            }
        }
        if let failure { throw FSError(storeError: failure, operation: "lookup", path: key) }
        let directory = DirectoryBuilder.directory(name, key: key + "/")
        switch (file, children.isEmpty) {
        case (nil, true):
            if name.hasSuffix(DirectoryBuilder.shadowSuffix) {
                return try resolveShadowed(alias: name, prefix: prefix)
            }
            throw FSError(.notFound, "no '\(name)' in '\(prefix)'")
        case (nil, false):
            return (directory, nil)
        case (let info?, let noChildren):
            if ObjectKey.isDirectoryContentType(info.contentType) { return (directory, nil) }
            let entry = Self.entry(name: name, info: info)
            // The HEAD has the metadata headers a listing lacks: the lookup uses them.
            recordPrefetched(entry, answer: .some(info), askedAt: askedAt)
            if noChildren { return (entry, info) }
            let resolution = DirectoryBuilder.resolve(
                key: key, manifest: info.manifest, container: store.containerName, childrenPreview: children)
            return resolution == .fileWins ? (entry, info) : (directory, nil)
        }
    }

    /// `x~object`: the file `x` hidden by a directory `x`.
    private func resolveShadowed(alias: String, prefix: String) throws(FSError) -> (DirectoryEntry, ObjectInfo?) {
        let name = String(alias.dropLast(DirectoryBuilder.shadowSuffix.count))
        guard DirectoryBuilder.isValidName(name) else { throw FSError(.notFound, "no '\(alias)' in '\(prefix)'") }
        let (resolved, _) = try resolve(name: name, prefix: prefix)
        guard resolved.kind == .directory else { throw FSError(.notFound, "no '\(alias)' in '\(prefix)'") }
        do {
            let info = try store.head(key: prefix + name)
            var entry = Self.entry(name: alias, info: info)
            entry.key = prefix + name
            return (entry, info)
        } catch {
            throw FSError(storeError: error, operation: "lookup", path: prefix + alias)
        }
    }

    static func entry(name: String, info: ObjectInfo) -> DirectoryEntry {
        let base = StoredAttributes.parse(contentType: info.contentType).base
        return DirectoryEntry(
            name: name, kind: NodeKind.of(baseContentType: base), key: info.key,
            size: info.size, etag: info.etag, lastModified: Timestamp(info.lastModified), contentType: info.contentType)
    }

    /// The kernel dropped `count` lookups of `inode`.
    public func forget(_ inode: InodeNumber, count: UInt64) {
        state.withLock { s in
            // The listing first, when this drops the node: the next lookup makes a node from
            // the remembered entry, which may describe a version older than the node knew
            // (another client's, a HEAD showed it).
            if let node = s.inodes[inode], node.lookups == count, node.pins == 0, node.linked, node.kind != .directory {
                correctListing(describing: node, comparingTimes: false, in: &s)
            }
            s.inodes.forget(inode, count: count)
            s.sweep()
        }
    }

    // MARK: Directories

    public func opendir(_ inode: InodeNumber) throws(FSError) -> UInt64 {
        let directory = try node(inode)
        guard directory.kind == .directory else { throw FSError(.notADirectory, "opendir of a file") }
        return state.withLock { s in
            s.handles.open(OpenDirectory())
        }
    }

    /// The listing of `directory` as it is now: a remembered one younger than dir_timeout (which
    /// our own changes keep current; `ls -l` twice in a row costs one LIST), else the server's.
    private func directoryReader(_ directory: Node) -> DirectoryReader {
        noteReaddir(of: directory)
        let remembered: (PackedEntries, askedAt: UInt64, count: UInt64)? = state.withLock { s in
            guard
                let listing = s.directories.listing(
                    directory.inode, now: now(), maximumAge: configuration.directoryCacheSeconds)
            else { return nil }
            return (listing.entries.sorted, listing.askedAt, s.directories.changeCount(directory.inode))
        }
        return remembered.map {
            DirectoryReader(prefix: directory.key, remembered: $0.0, startedAt: $0.count, askedAt: $0.askedAt)
        } ?? readerFromListingAhead(directory) ?? makeDirectoryReader(directory)
    }

    /// One thing readdir shows.
    private enum Item {
        case dot(String, InodeNumber)
        /// A name from the listing, asked for at `askedAt` (the attribute rule) when the
        /// directory's change count was `since` (DirectoryCache rule 4).
        case listed(DirectoryEntry, askedAt: UInt64, since: UInt64)
        /// A file created here that the server does not list yet (open, or waiting for its upload).
        case local(String, InodeNumber)
    }

    /// Emits entries from `offset` on; `emit(name, kind, inode, nextOffset)` returns false when full.
    public func readdir(
        _ inode: InodeNumber, handle: UInt64, offset: Int64,
        emit: (String, NodeKind, InodeNumber, Int64) -> Bool
    ) throws(FSError) {
        try walk(inode, handle: handle, offset: offset) { item, next in
            switch item {
            case .dot(let name, let target): return emit(name, .directory, target, next)
            case .listed(let entry, _, _):
                let shown = shownInode(entry.name, kind: entry.kind, in: inode)
                return emit(entry.name, shown.kind, shown.inode, next)
            case .local(let name, let child): return emit(name, .file, shownInode(name, kind: .file, in: inode, local: child).inode, next)
            }
        }
    }

    /// readdirplus: as `readdir`, and with the attributes of every entry the listing describes
    /// fully (each counts as a kernel lookup). Directories and zero-byte files, whose attributes
    /// need a HEAD, come without (nil): the kernel looks them up when it needs them.
    /// `emit(name, kind, inode, attributes, nextOffset)` returns false when full.
    public func readdirplus(
        _ inode: InodeNumber, handle: UInt64, offset: Int64,
        emit: (String, NodeKind, InodeNumber, Attributes?, Int64) -> Bool
    ) throws(FSError) {
        defer { boundNodes() }
        try walk(inode, handle: handle, offset: offset) { item, next in
            // Another tool's object: its metadata headers if a HEAD (or the index) has them;
            // else, with `foreign_attrs=head`, the name alone (the kernel looks it up if the
            // program wants more, and the lookup waits for the HEAD).
            var head: HeadAnswer? = nil
            var nameOnly = false
            if case .listed(let entry, let listedAt, _) = item, awaitsHead(entry) {
                if case .known(let answer) = prefetchedMetadata(entry, wait: false, listedAt: listedAt), answer.info != nil {
                    head = answer
                } else {
                    nameOnly = true
                }
            }
            let linked: (String, NodeKind, Attributes?)? = state.withLock { s in
                switch item {
                case .dot: return nil
                case .listed(let entry, let listedAt, let since):
                    // A file being written here: its spool describes it, whatever the listing
                    // (or this mount's journaled entry of the create) says, even another kind of
                    // object (a write-back rename over it, not stored yet).
                    if let local = s.inodes.child(inode, entry.name), local.kind == .file,
                        let attributes = lookUpSpooled(local.inode, in: &s)
                    {
                        return (entry.name, .file, attributes)
                    }
                    guard entry.kind == .symlink || (entry.kind == .file && entry.size > 0), !nameOnly else { return nil }
                    // nil: the listing is older than a change made here (the kernel looks it up).
                    let attributes = try? link(entry, parent: inode, listedAt: listedAt, since: since, head: head, in: &s)
                    return (entry.name, attributes?.kind ?? entry.kind, attributes)
                case .local(let name, let child):
                    return lookUpSpooled(child, in: &s).map { (name, .file, $0) }
                }
            }
            if let (name, kind, attributes) = linked, let attributes {
                if emit(name, kind, attributes.inode, attributes, next) { return true }
                forget(attributes.inode, count: 1)  // not sent: the kernel never saw this lookup
                return false
            }
            switch item {
            case .dot(let name, let target): return emit(name, .directory, target, nil, next)
            case .listed(let entry, _, _):
                let shown = shownInode(entry.name, kind: entry.kind, in: inode)
                return emit(entry.name, shown.kind, shown.inode, nil, next)
            case .local(let name, let child): return emit(name, .file, child, nil, next)
            }
        }
    }

    private func walk(_ inode: InodeNumber, handle: UInt64, offset: Int64, emit: (Item, Int64) -> Bool) throws(FSError) {
        guard var open = state.withLock({ $0.handles.directory(handle) }) else {
            throw FSError(.invalidArgument, "unknown directory handle \(handle)")
        }
        let reader: DirectoryReader
        if offset == 0 || open.reader == nil {
            // The first readdir, or rewinddir (the kernel cannot tell them apart): the directory
            // as it is now. glibc's rewinddir before any readdir must show changes made since
            // opendir too, so opendir takes no listing.
            reader = directoryReader(try node(inode))
            open.reader = reader
            state.withLock { s in
                s.handles.update(handle, open)
                if !reader.isRemembered { s.readers[inode] = (reader, now()) }
            }
        } else {
            reader = open.reader!
        }
        let parent = state.withLock { s in
            s.directories.touch(inode)
            s.directories.noteNamesUsed(inode, now: now())
            // A reader still being read serves lookups (`State.readers`): `ls -l` of 200 000
            // names reads for minutes when each needs a HEAD.
            if s.readers[inode]?.reader === reader { s.readers[inode]?.at = now() }
            return s.inodes[inode]?.parent
        } ?? Self.rootInode
        if offset == 0 && !emit(.dot(".", inode), 1) { return }
        if offset <= 1 && !emit(.dot("..", parent), 2) { return }
        var index = Int(max(offset, 2) - 2)
        while true {
            let (batch, complete) = try reader.entries(from: index, resolvingWith: self)
            if batch.isEmpty {
                if complete { finishListing(reader, for: inode, from: index, emit: emit) }
                return
            }
            for entry in batch {
                index += 1
                if !emit(.listed(entry, askedAt: reader.askedAt, since: reader.startedAt), Int64(index) + 2) { return }
            }
        }
    }

    /// The attributes of a file with a spool (its bytes not all stored: the spool describes it,
    /// not the server), counting one kernel lookup; nil without a spool.
    private func lookUpSpooled(_ inode: InodeNumber, in s: inout State) -> Attributes? {
        guard var node = s.inodes[inode], let open = s.openFiles[inode] else { return nil }
        s.inodes.countLookup(inode)
        node.size = open.size
        return attributes(of: node)
    }

    /// The kind and inode number readdir shows for `name`: its node's, else one reserved for it,
    /// which the node a later lookup makes will take (so that d_ino and st_ino agree).
    /// `local`: the node of a file being written, which the listing lacks.
    private func shownInode(
        _ name: String, kind: NodeKind, in directory: InodeNumber, local: InodeNumber? = nil
    ) -> (kind: NodeKind, inode: InodeNumber) {
        state.withLock { s in
            let child = s.inodes.child(directory, name) ?? local.flatMap { s.inodes[$0] }
            // A file being written here is what the name shows, whatever kind of object the store
            // still has there (a write-back rename over it, not stored yet). A node of another
            // kind is the name's old object: a lookup makes a new one.
            if let node = child, node.kind == kind || (node.kind == .file && s.openFiles[node.inode] != nil) {
                // One the kernel holds no lookup of may go before the lookup that follows (its
                // upload ends, the spool retires): the next node for the name takes its number.
                if node.lookups == 0 { s.directories.reserve(directory, name, node.inode) }
                return (node.kind, node.inode)
            }
            if let local { return (.file, local) }
            return (kind, s.directories.reservedInode(directory, name, isFree: { s.inodes[$0] == nil }) { s.inodes.reserveInode() })
        }
    }

    /// After the listing: remember it (once per reader), then emit what this mount made that
    /// the listing lacks: names it recorded (DirectoryCache rule 2) and files open, not stored yet.
    private func finishListing(
        _ reader: DirectoryReader, for inode: InodeNumber, from index: Int, emit: (Item, Int64) -> Bool
    ) {
        guard let entries = reader.completeEntries() else { return }
        let tail = reader.tail { () -> [DirectoryReader.TailItem] in
            defer {
                if !reader.isRemembered {
                    prefetchMetadata(of: entries, in: inode)
                    listAhead(subdirectoriesOf: entries, in: inode)
                }
            }
            let listed = reader.isRemembered ? nil : EntryTable(entries)
            // One look: a file whose upload ends in between would be neither open nor in the
            // table (its journaled change may have been forgotten after a failure).
            return state.withLock { s in
                let table = listed.map { rememberLocked(reader, $0, for: inode, in: &s) }
                // What the reader's entries show, and what this mount recorded that they lack:
                // a fresh listing's table has the changes; a remembered listing's entries are
                // as the reader took them, and what was recorded since is added here (an upload
                // that ended during a walk put a file shown as open into the listing).
                let shown: EntryTable
                let recorded: [DirectoryEntry]
                if let table {
                    (shown, recorded) = (table, table.addedHere)
                } else {
                    shown = EntryTable(entries)
                    recorded = (s.directories.anyListing(inode)?.entries.addedHere ?? []).filter { shown[$0.name.exact] == nil }
                }
                let recordedNames = Set(recorded.map(\.name.exact))
                func lacks(_ name: ExactString) -> Bool {
                    shown[name] == nil && !recordedNames.contains(name) && !(table?.listed(name) ?? false)
                }
                // (Open files first: a directory of 200 000 names has as many children to look up.)
                let children = s.openFiles.isEmpty ? [] : s.inodes.children(of: inode)
                let open = children.filter { s.openFiles[$0.inode] != nil && lacks($0.name) }
                let writing = children.isEmpty ? [] : directoriesHoldingFilesBeingWritten(in: s)
                let holding = children.compactMap { child -> DirectoryEntry? in
                    guard writing.contains(child.inode), lacks(child.name), let node = s.inodes[child.inode] else { return nil }
                    return DirectoryBuilder.directory(child.name.string, key: node.key)
                }
                return recorded.map { .listed($0) } + holding.map { .listed($0) }
                    + open.sorted { $0.name < $1.name }.map { .local($0.name.string, $0.inode) }
            }
        }
        let start = index - entries.count
        for (i, item) in tail.enumerated() where i >= start {
            let next = Int64(entries.count + i + 1) + 2
            switch item {
            case .listed(let entry): if !emit(.listed(entry, askedAt: reader.askedAt, since: reader.startedAt), next) { return }
            case .local(let name, let child): if !emit(.local(name, child), next) { return }
            }
        }
    }

    public func releasedir(handle: UInt64) {
        state.withLock { s in
            if let reader = s.handles.directory(handle)?.reader {
                for (inode, current) in s.readers where current.reader === reader { s.readers[inode] = nil }
            }
            s.handles.closeDirectory(handle)
        }
    }

    /// Resolves a readdir collision (see DirectoryBuilder).
    package func resolve(_ collision: DirectoryBuilder.Collision, prefix: String) throws(FSError)
        -> DirectoryBuilder.Collision.Resolution
    {
        guard collision.file.size == 0 else { return .directoryWins }
        do {
            let askedAt = storeClock.tick()
            let info = try store.head(key: collision.file.key)
            // The lookup that follows uses this HEAD (the file is a zero-byte object, see needsMetadata).
            recordPrefetched(DirectoryBuilder.file(collision.name, collision.file), answer: .some(info), askedAt: askedAt)
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

    /// Records a change we made in the remembered listing of `parent` (nil entry = removed).
    func updateListing(_ parent: InodeNumber, name: String, entry: DirectoryEntry?, in s: inout State) {
        s.directories.record(parent, name: name, entry: entry, now: now())
    }

    /// Records `node` in its directory's remembered listing where that describes another
    /// version (ETag, size, kind) or another mode or owner (a name the listing lacks is left
    /// alone). `comparingTimes`: the modification time too, for a node this mount changed;
    /// not for one the kernel forgets, since other tools' objects carry their time in a header
    /// only a HEAD shows, and every such node would be recorded as changed here.
    func correctListing(describing node: Node, comparingTimes: Bool, in s: inout State) {
        guard let listing = s.directories.anyListing(node.parent), !listing.dropped,
            let listed = listing.entries[node.name.exact]
        else { return }
        let stored = listed.parsedContentType.attributes
        guard listed.etag != node.etag || listed.size != (node.manifest == nil ? node.size : 0) || listed.kind != node.kind
            || stored.mode != node.stored.mode || stored.uid != node.stored.uid || stored.gid != node.stored.gid
            || (comparingTimes && stored.mtime != node.stored.mtime)
        else { return }
        updateListing(describing: node, in: &s)
    }

    /// Records what we stored for `node` in its directory's listing, if a name still leads to it.
    func updateListing(describing node: Node, in s: inout State) {
        guard s.inodes.child(node.parent, node.name)?.inode == node.inode else { return }
        s.directories.record(node.parent, name: node.name, entry: entry(for: node), now: now())
    }

    // MARK: Filesystem

    /// Ends the mount's background work and gives up the spool directory (unmount): queued and
    /// delayed jobs are dropped, running ones get until `deadline` seconds. Uploads still owed
    /// stay in the spool with their notes, for the next mount. Returns whether every job ended.
    @discardableResult
    public func shutdown(deadline: Double = 30) -> Bool {
        recovered.stop()
        stopPrefetching()
        stopListingAhead()
        let ended = pool.shutdown(deadline: deadline)
        configuration.metadataIndex?.flush()
        // Written and synced: a cache a power cut could have torn is not trusted (BlockCache).
        configuration.blockCache?.markClean()
        spool.unlock()
        return ended
    }

    public func statistics() -> FilesystemStatistics {
        if let cached = state.withLock({ $0.statistics }), now() - cached.at < 10 { return cached.value }
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
        state.withLock { $0.statistics = (value, now()) }
        return value
    }
}
