import BlockCache
import Dispatch
import FSCore
import FSFiles
import FSJournal
import FSNamespace
import Locking
import Logging
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

/// Opening, reading, writing and storing files.
///
/// A file opened for writing gets a spool (see `Spool`); an existing object opened without
/// O_TRUNC is downloaded into it first, so random writes, appends and truncation all work.
/// flush (every close), fsync and the last release upload the spool if it changed; a failed
/// upload is returned to the writer as EIO and retried in the background until stored.
extension Filesystem {
    public struct OpenResult: Sendable {
        public var handle: UInt64
        /// The page cache holds this object's current content: the kernel may keep it.
        public var keepCache: Bool
    }

    var uploader: Uploader { uploader(store) }

    func uploader(_ store: any ObjectStore) -> Uploader {
        Uploader(
            store: store, pool: pool, threshold: configuration.multipartThreshold, partSize: configuration.partSize,
            concurrency: configuration.uploadConcurrency, sharedParts: sharedParts, transfers: transfers)
    }

    /// Puts bytes a random reader fetched into the kernel's page cache, unless the file has a
    /// spool (a writer). A writer that appears while the bytes are stored gets the kernel's pages
    /// of the file dropped, so it never reads older bytes than its own.
    func offerToKernel(_ inode: InodeNumber, at offset: Int64, _ bytes: UnsafeRawBufferPointer) {
        guard state.withLock({ $0.openFiles[inode] == nil }) else { return }
        kernelCache.store(inode, at: offset, bytes)
        if state.withLock({ $0.openFiles[inode] != nil }) { kernelCache.invalidate(inode) }
    }

    /// The name of `key`'s blocks in the block cache.
    func cacheName(_ key: String) -> String { configuration.cacheIdentity + "/" + key }

    private func register(_ handle: Handle) -> UInt64 {
        state.withLock { s in
            s.handles.open(handle)
        }
    }

    public func open(_ inode: InodeNumber, writable: Bool, truncate: Bool) throws(FSError) -> OpenResult {
        var node = try node(inode)
        switch node.kind {
        case .directory: throw FSError(.isADirectory, "open of a directory")
        case .symlink: throw FSError(.invalidArgument, "open of a symlink")
        // The kernel opens FIFOs and sockets itself: a FIFO shows data only between its openers.
        case .fifo, .socket: throw FSError(.invalidArgument, "open of a FIFO or socket through the filesystem")
        case .file: break
        }
        if (writable || truncate) && configuration.readOnly { throw FSError(.readOnly, "this mount is read-only") }

        if let open = attach(inode, writable: writable) {
            if truncate { try truncateAttached(open, writable: writable) }
            return OpenResult(handle: register(.spool(open, writable: writable)), keepCache: true)
        }
        // Close-to-open: a file opened after its writer closed it shows the new content.
        // (Not a node no name leads to, opened again through /proc/PID/fd: its old key may
        // hold another object now.)
        if !truncate && node.linked && now() - node.confirmedAt > configuration.attributeCacheSeconds {
            let known = node
            node = try refresh(node)
            // Another client's version: the kernel's size of the file (its attributes may be
            // younger than the node's confirmation) would cut the new version's reads short.
            if node.etag != known.etag || node.size != known.size { kernelCache.invalidate(inode, pages: false) }
        }
        guard writable || truncate else {
            let (keep, otherVersion) = state.withLock { s in
                let cached = s.inodes[inode]?.cachedEtag
                s.inodes.update(inode) { $0.cachedEtag = node.etag }
                return (cached == node.etag, cached != nil && cached != node.etag)
            }
            // The node took another version since the kernel last opened the file (a poll, a
            // listing): the kernel's size may be that version's, and would cut reads short.
            if otherVersion { kernelCache.invalidate(inode, pages: false) }
            let handle = register(.remote(makeReader(node, keptPages: keep), inode, localVersion: node.localVersion))
            return OpenResult(handle: handle, keepCache: keep)
        }
        let open = try makeSpool(for: node, download: !truncate)
        // Another thread may have opened the same file meanwhile: its spool wins. Taking the spool
        // and counting this handle on it is one step, so a retiring spool is never attached to.
        let attached: SpoolFile? = state.withLock { s in
            if let existing = s.openFiles[inode], existing.state.withLock({ $0.attach(writable: writable) }) {
                return existing
            }
            guard let current = s.inodes[inode] else { return nil }
            _ = open.state.withLock { o in
                // O_TRUNC: the version these bytes replace is the one the node names now, not when
                // this open began (a write-back upload may have stored a newer one meanwhile; an
                // older base would send the next upload to a conflict copy). A download knows its own.
                if truncate { o.baseETag = current.etag }
                return o.attach(writable: writable)
            }
            s.openFiles[inode] = open
            s.inodes.pin(inode)
            s.inodes.update(inode) { $0.localVersion += 1 }
            return open
        }
        guard let attached else {
            open.discard()
            throw FSError(.stale, "inode \(inode) was forgotten while it was being opened")
        }
        if attached !== open {
            open.discard()
            if truncate { try truncateAttached(attached, writable: writable) }
        } else if truncate {
            touch(inode)  // O_TRUNC of an existing file is a change of its data
        }
        // The kernel's pages are kept only when they are of the version the spool holds: pages
        // of an older one (another client replaced the file since) would be read, changed and
        // written back over the new version (the two-mount model's lost update).
        let base = attached.state.withLock { $0.baseETag }
        let pagesOfThisVersion = !base.isEmpty && state.withLock { $0.inodes[inode]?.cachedEtag } == base
        // The download found another version than the node knew: the kernel's size is the old
        // one's, and would cut the spool's reads short.
        if attached === open && !truncate && base != node.etag { kernelCache.invalidate(inode, pages: false) }
        return OpenResult(
            handle: register(.spool(attached, writable: writable)), keepCache: !truncate && (attached !== open || pagesOfThisVersion))
    }

    /// O_TRUNC on a spool this handle was just counted on: a failure gives the count back.
    private func truncateAttached(_ open: SpoolFile, writable: Bool) throws(FSError) {
        do {
            try open.truncate(to: 0)
            touch(open.inode)
        } catch {
            detach(open, writable: writable)
            throw error
        }
    }

    /// A reader of the object `node` describes (its key, size and ETag). `keptPages`: its handle
    /// was opened with the kernel's pages of the file kept (see `read(_:handle:...)`).
    private func makeReader(_ node: Node, keptPages: Bool = false) -> FileReader {
        var kernel: (@Sendable (Int64, UnsafeRawBufferPointer) -> Void)? = nil
        if kernelCache.isInstalled {
            let inode = node.inode
            kernel = { [weak self] (offset: Int64, bytes: UnsafeRawBufferPointer) in
                self?.offerToKernel(inode, at: offset, bytes)
            }
        }
        return FileReader(
            store: store, pool: pool, key: node.key, size: node.size, etag: node.etag, manifest: node.manifest,
            cache: configuration.blockCache, cacheName: cacheName(node.key),
            fetchSize: configuration.readFetchSize, groupSize: configuration.randomFetchSize,
            maximumWindow: configuration.readAheadWindow, budget: configuration.memoryBudget, pulling: pulls,
            metrics: configuration.metrics,
            kernel: kernel, keptPages: keptPages, openedAt: now())
    }

    /// Counts one more handle on the spool of `inode`, if it has one.
    private func attach(_ inode: InodeNumber, writable: Bool) -> SpoolFile? {
        state.withLock { s in
            guard let open = s.openFiles[inode], open.state.withLock({ $0.attach(writable: writable) }) else { return nil }
            return open
        }
    }

    /// A new spool for `node`, holding the object's current bytes when `download` is set.
    ///
    /// The object is always fetched: a size of 0 may come from a listing (a DLO manifest lists as
    /// 0 bytes) or from a version already replaced, and appending to an empty spool would then
    /// replace real content. The bytes are checked against the length the GET announced.
    func makeSpool(for node: Node, download: Bool) throws(FSError) -> SpoolFile {
        let (path, fd) = try spool.create()
        let open = SpoolFile(inode: node.inode, path: path, fd: fd, size: 0, dirty: !download, baseETag: node.etag)
        guard download else { return open }
        var offset: Int64 = 0
        var failure: FSError? = nil
        let info: ObjectInfo
        do {
            info = try store.get(key: node.key, range: nil) { bytes in
                guard failure == nil else { return }
                var done = 0
                while done < bytes.count {
                    let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset + Int64(done)))
                    if n < 0 {
                        if errno == EINTR { continue }
                        failure = Spool.error("write to spool \(path)")
                        return
                    }
                    done += n
                }
                offset += Int64(bytes.count)
            }
        } catch {
            open.discard()
            throw FSError(storeError: error, operation: "open for writing", path: node.key)
        }
        if let failure {
            open.discard()
            throw failure
        }
        guard offset == info.size else {
            open.discard()
            throw FSError(
                .ioError, "open for writing '\(node.key)': the server sent \(offset) of \(info.size) bytes; try again")
        }
        open.state.withLock { o in
            o.size = offset
            o.baseETag = info.etag
        }
        return open
    }

    private func handle(_ number: UInt64) throws(FSError) -> Handle {
        guard let handle = state.withLock({ $0.handles.file(number) }) else {
            throw FSError(.invalidArgument, "unknown file handle \(number)")
        }
        return handle
    }

    /// Where a read of an open handle is served from, decided under one lock.
    private enum ReadSource {
        case spool(SpoolFile)
        /// Another handle's spool (it may retire meanwhile, once its bytes are stored).
        case othersSpool(SpoolFile)
        /// `anotherVersionKnown`: see `read(_:handle:…)`.
        case reader(FileReader, InodeNumber, anotherVersionKnown: Bool)
        /// The handle's reader is for another version or key: one for the node as it is now.
        case newReader(Node)
        case removed(String)
    }

    public func read(handle number: UInt64, offset: Int64, length: Int, reply: (UnsafeRawBufferPointer) -> Void)
        throws(FSError)
    {
        // Every handle of one file sees what was written through this mount: a writer's spool
        // while there is one, else the version stored last (a handle opened before keeps reading
        // the old one otherwise), under its current key (renamed, or a directory above it).
        let source: ReadSource? = state.withLock { s in
            switch s.handles.file(number) {
            case nil: return nil
            case .spool(let open, _)?: return .spool(open)
            case .remote(let reader, let inode, let version)?:
                if let spool = s.openFiles[inode] { return .othersSpool(spool) }
                guard let node = s.inodes[inode] else { return .reader(reader, inode, anotherVersionKnown: false) }
                if node.localVersion != version || (node.linked && !node.key.isSameKey(as: reader.key)) {
                    return node.linked ? .newReader(node) : .removed(node.key)
                }
                return .reader(reader, inode, anotherVersionKnown: heldPastAnotherVersion(reader, node))
            }
        }
        switch source {
        case nil: throw FSError(.invalidArgument, "unknown file handle \(number)")
        case .spool(let open)?: try open.read(offset: offset, length: length, reply: reply)
        case .othersSpool(let open)?:
            do {
                try open.read(offset: offset, length: length, reply: reply)
            } catch where open.state.withLock({ $0.phase == .retired }) {
                // Retired under this read (its file is gone with it): its bytes are stored, and
                // the node describes them now.
                try read(handle: number, offset: offset, length: length, reply: reply)
            }
        case .reader(let reader, let inode, let anotherVersionKnown)?:
            try read(
                reader, handle: number, inode: inode, offset: offset, length: length, anotherVersionKnown: anotherVersionKnown,
                reply: reply)
        case .removed(let key)?: throw FSError(.stale, "read of '\(key)': the file was removed after it changed here")
        case .newReader(let node)?:
            let reader = makeReader(node)
            state.withLock { s in
                s.handles.replace(number, with: .remote(reader, node.inode, localVersion: node.localVersion))
            }
            try read(reader, handle: number, inode: node.inode, offset: offset, length: length, reply: reply)
        }
    }

    /// A read through `reader`, the reader of handle `number`. Close-to-open (issue 23): a
    /// handle that has shown nothing of the object yet and finds that another client replaced
    /// it since this mount last looked takes the new version and reads it. A handle that may
    /// have shown the old version fails with ESTALE instead: one that has answered a read, or
    /// one opened with the kernel's pages kept, which the kernel may have served some of without
    /// asking (a file partly in its page cache). The next open then starts afresh.
    /// A handle held open (longer than `attr_timeout`) whose node learned of another client's
    /// version since (a poll, a HEAD, a listing: `Filesystem+Poll` subtlety 4) reads no more of
    /// the old one, which the block cache may still hold: `anotherVersionKnown`.
    private func read(
        _ reader: FileReader, handle number: UInt64, inode: InodeNumber, offset: Int64, length: Int,
        anotherVersionKnown: Bool = false, reply: (UnsafeRawBufferPointer) -> Void
    ) throws(FSError) {
        do throws(FSError) {
            if anotherVersionKnown {
                throw FSError(.stale, "read '\(reader.key)': another client replaced the object while it was held open")
            }
            try reader.read(offset: offset, length: length, reply: reply)
        } catch where error.code == .stale && !reader.hasAnswered {
            let adopted = try adoptNewVersion(inode: inode, replacing: reader, because: error)
            // The kernel's pages of the old version go once this read is answered, and not on its
            // thread: the kernel holds the pages the read is for locked until then, and dropping
            // them waits for that.
            defer { _ = pool.submit { [self] in kernelCache.invalidate(inode) } }
            // The handle keeps the old version (the next open drops the kernel's pages: its ETag
            // is no longer the cached one).
            guard !reader.keptPages else { throw error }
            let newer = makeReader(adopted)
            state.withLock { s in
                s.handles.replace(number, with: .remote(newer, inode, localVersion: adopted.localVersion))
            }
            // Its attributes go now if the file grew, so that a read past the old size asks for
            // the new one; if it shrank, they stay until the short answer has set the new size (a
            // changed attribute version would make the kernel fill the old size with zeros).
            if adopted.size > reader.size { kernelCache.invalidate(inode, pages: false) }
            try newer.read(offset: offset, length: length, reply: reply)
        }
    }

    /// Whether `node` (no spool, same local version) describes another version of the object
    /// than the one `reader` reads, and the handle has been open longer than `attr_timeout`.
    func heldPastAnotherVersion(_ reader: FileReader, _ node: Node) -> Bool {
        node.manifest == nil && reader.manifest == nil && !node.etag.isEmpty && !reader.etag.isEmpty
            && node.etag != reader.etag && now() - reader.openedAt > configuration.attributeCacheSeconds
    }

    /// The node as of the version of the object that another client stored since `reader`'s
    /// was confirmed: a HEAD describes it (the rule admits it as a newer version), and the next
    /// open does not keep the kernel's pages. (The block cache drops the old version's blocks
    /// when the first new one is stored.) `failure` is what the reader met; it is thrown if the
    /// object is gone or no newer version can be taken (a writer opened the file meanwhile, or
    /// a local change is unstored).
    private func adoptNewVersion(
        inode: InodeNumber, replacing reader: FileReader, because failure: FSError
    ) throws(FSError) -> Node {
        let askedAt = storeClock.tick()
        let info: ObjectInfo
        do throws(ObjectStoreError) {
            info = try store.head(key: reader.key)
        } catch {
            throw error.code == .notFound ? failure : FSError(storeError: error, operation: "read", path: reader.key)
        }
        let adopted: Node? = state.withLock { s in
            guard s.openFiles[inode] == nil,
                let node = s.inodes.update(inode, { apply(info, askedAt: askedAt, to: &$0) }),
                node.linked, node.key.isSameKey(as: reader.key), node.etag == info.etag, node.etag != reader.etag
                    || node.manifest != reader.manifest
            else { return nil }
            return s.inodes.update(inode) { $0.cachedEtag = nil }
        }
        guard let adopted else { throw failure }
        logger.debug("'\(reader.key)' was replaced by another client since it was opened")
        return adopted
    }

    public func write(handle number: UInt64, offset: Int64, bytes: UnsafeRawBufferPointer) throws(FSError) {
        guard case .spool(let open, writable: true) = try handle(number) else {
            throw FSError(.invalidArgument, "write on a handle not open for writing")
        }
        try open.write(bytes, at: offset)
        startEarlyParts(open, writtenEnd: offset + Int64(bytes.count))
        touch(open.inode)
    }

    /// Once a file is over the multipart threshold, uploads the parts its writer has passed
    /// (see `EarlyParts`), so that close has less to send.
    private func startEarlyParts(_ open: SpoolFile, writtenEnd: Int64) {
        let multipart = configuration.multipartThreshold
        // The key (for --status) is looked up only when a pipeline starts, not at every write.
        let starts = open.state.withLock { $0.size > multipart && $0.earlyParts == nil && !$0.isRemoved }
        let key = starts ? state.withLock { $0.inodes[open.inode]?.key } ?? open.path : open.path
        // (Begun outside the spool's lock: a store may ask the server. One begun by a writer that
        // loses the race below is never used; on Swift it cost nothing.)
        let session = starts ? try? store.beginUpload(key: key) : nil
        let (parts, generations): (EarlyParts?, [Int: UInt64]) = open.state.withLock { o in
            guard o.size > multipart, !o.isRemoved else { return (nil, [:]) }
            if o.earlyParts == nil, let session {
                o.earlyParts = EarlyParts(
                    store: store, session: session, partSize: configuration.partSize,
                    concurrency: configuration.uploadConcurrency, pool: pool, transfers: transfers)
            }
            return (o.earlyParts, o.partGenerations)
        }
        parts?.advance(path: open.path, writtenEnd: writtenEnd) { generations[$0] ?? 0 }
    }

    /// Drops the parts of a pipeline no upload will finish with.
    func discard(_ parts: EarlyParts) {
        pool.submit { [store] in
            _ = parts.finish()
            store.abortUpload(parts.session)
        }
    }

    /// flush (each close of a descriptor) and fsync: store the file if it changed.
    public func flush(handle number: UInt64) throws(FSError) {
        guard case .spool(let open, let writable) = try handle(number), writable else { return }
        if configuration.writeBack {
            try queueUpload(open)
        } else {
            try commit(open)
        }
    }

    /// fsync: like flush, and the file's owed attributes are stored too (a handle that does not
    /// write has no spool to store them).
    public func fsync(handle number: UInt64) throws(FSError) {
        switch try handle(number) {
        case .spool(let open, let writable):
            if writable { try commit(open) }
            try storeOwedAttributes(open.inode)
        case .remote(_, let inode, _):
            try storeOwedAttributes(inode)
        }
    }

    public func release(handle number: UInt64) {
        guard let handle = state.withLock({ $0.handles.closeFile(number) }) else { return }
        guard case .spool(let open, let writable) = handle else { return }
        detach(open, writable: writable)
    }

    /// Drops one handle's hold on a spool; the last one stores what changed and retires it.
    private func detach(_ open: SpoolFile, writable: Bool) {
        switch open.state.withLock({ $0.detach(writable: writable) }) {
        case .keep: return
        // The flush made what the close promises durable; what changed since (a chmod between
        // the close and its release) is made durable by the next sync (WriteBack subtlety 5).
        case .journal: journal(open, sync: false)
        case .retire: retire(open)
        case .upload:
            do {
                try commit(open)
                retire(open)
            } catch {
                // The writer saw this error at close already; keep the bytes and keep trying.
                logger.error(
                    "\(error.message); the data stays in \(open.path) and is retried",
                    metadata: logFields(error, operation: "release"))
                afterFailure(open, open.state.withLock { $0.uploadFailed() }, error: error)
            }
        }
    }

    /// Runs `body` on the spool of `inode` while holding it like a writer, so that a concurrent
    /// last release cannot retire it half-way; returns false when the file has no spool. When this
    /// was the last hold, the change is stored before returning, as a path-based call must.
    private func withSpool(of inode: InodeNumber, _ body: (SpoolFile) throws(FSError) -> Void) throws(FSError) -> Bool {
        guard let open = attach(inode, writable: true) else { return false }
        do {
            try body(open)
        } catch {
            detach(open, writable: true)
            throw error
        }
        switch open.state.withLock({ $0.detach(writable: true) }) {
        case .keep: break
        // A change by path (chmod, touch, truncate) of a closed, queued file: the note survives
        // the process at once, a power cut from the next synced one (WriteBack subtlety 5).
        case .journal: journal(open, sync: false)
        case .retire: retire(open)
        case .upload:
            do {
                try commit(open)
            } catch {
                afterFailure(open, open.state.withLock { $0.uploadFailed() }, error: error)
                throw error
            }
            retire(open)
        }
        return true
    }

    /// Drops a spool whose content is stored (or that was removed), and the node if the kernel
    /// forgot it. Does nothing while the spool is held or owes an upload.
    func retire(_ open: SpoolFile) {
        let done: Bool = state.withLock { s in
            guard s.openFiles[open.inode] === open, open.state.withLock({ $0.retire() }) else { return false }
            s.openFiles[open.inode] = nil
            // The listing first, as when attributes settle: unpinned, the node goes if the
            // kernel forgot it, and the next lookup makes one from the remembered entry, which
            // a change stored while the file was open (a chmod) did not update.
            if let node = s.inodes[open.inode], node.kind == .file { correctListing(describing: node, comparingTimes: true, in: &s) }
            s.inodes.unpin(open.inode)
            s.sweep()
            return true
        }
        guard done else { return }
        transfers.clearOwed(open.inode)
        // (Retired now: whether it was removed before is not known here, so bytes of a removed file
        // with a failed write are kept too; they are the operator's to delete.)
        let (failure, unstored) = open.state.withLock { ($0.writeFailure, $0.dataDirty) }
        if let failure, unstored {
            // Never uploaded (they are not what was written); kept for the operator, never deleted.
            open.closeDescriptor()
            spool.removeNote(dataPath: open.path)
            let kept = Spool.keepLost(dataPath: open.path) ?? open.path
            logger.error(
                "not stored, because a write to the cache failed (\(failure.message)); the bytes written are kept in \(kept)",
                metadata: logFields(failure, operation: "release"))
            return
        }
        open.discard()
    }

    /// The fields of an error line (see `FSError.logMetadata`).
    func logFields(_ error: FSError, operation: String) -> Logger.Metadata {
        error.logMetadata(operation: operation, rootPrefix: configuration.rootPrefix).mapValues { .string($0) }
    }

    /// Carries out what the spool's state machine decided after a failed upload.
    func afterFailure(_ open: SpoolFile, _ decision: SpoolState.Failure, error: FSError) {
        switch decision {
        case .keep: break
        case .retire: retire(open)
        case .scheduleRetry(let tries):
            // Jitter: after an outage, the owed uploads of a mount (and of many mounts) spread out.
            let delay = min(60, configuration.pendingRetrySeconds * Double(1 << min(tries - 1, 10)))
                * Double.random(in: 0.8...1.2)
            transfers.scheduleRetry(open.inode, in: delay)
            pool.submit(after: delay) { [self] in retryUpload(open) }
            open.closeWhileWaiting()
        }
    }

    /// Before the mount ends (unmount, SIGTERM, `umount` through the helper): waits for uploads
    /// in progress and retries owed ones at once and then with backoff, until nothing is owed or
    /// `timeout` seconds passed. `report` hears what it waits for (once per round). Returns the
    /// keys still owed: they stay journaled for the next mount.
    public func drain(timeout: Double, report: (String) -> Void) -> [String] {
        let deadline = Transfers.monotonic() + timeout
        var pause = 0.05
        var lastReport = ""
        while true {
            // Owed with no handle (a retry is scheduled), and owed with a handle still open (its
            // next close would try again; before an unmount through the helper, try now).
            let owedInodes = transfers.owedInodes
            let (due, queued, held): ([SpoolFile], [SpoolFile], [SpoolFile]) = state.withLock { s in
                let due = s.openFiles.values.filter { open in open.state.withLock { $0.retryIsDue() } }
                // Write-back: the queue's uploads, at once.
                let queued = s.openFiles.values.filter { open in open.state.withLock { $0.isQueued && $0.isIdle } }
                let held = owedInodes.compactMap { s.openFiles[$0] }.filter { open in
                    open.state.withLock { !$0.retryIsDue() && !$0.isIdle }
                }
                return (due, queued, held)
            }
            // Attribute changes wait for nothing now (they are not stored after the drain).
            let attributes = storeOwedAttributes()
            let running = transfers.running, owed = transfers.owed
            // Write-back deletes: sent now, waited for below.
            let deletesOwed = deletes.flush(timeout: 0) ? 0 : deletes.backlog().count
            // What an earlier mount owed and the background recovery has not stored yet.
            let earlier = recovered.count
            if due.isEmpty && queued.isEmpty && running.isEmpty && owed.isEmpty && attributes.isEmpty && deletesOwed == 0
                && earlier == 0
            {
                return []
            }
            let left = deadline - Transfers.monotonic()
            if left <= 0 {
                return owed.map(\.key) + attributes.map { "attributes of \($0)" }
                    + (deletesOwed == 0 ? [] : ["\(deletesOwed) delete(s)"])
                    + (earlier == 0 ? [] : ["\(earlier) change(s) an earlier mount owed"])
            }
            let waiting = "waiting up to \(Int(left.rounded(.up))) s (drain_timeout) for \(running.count) upload(s) in progress "
                + "and \(owed.count) owed" + (owed.isEmpty ? "" : ": " + owed.prefix(5).map { "'\($0.key)'" }.joined(separator: ", "))
                + (owed.count > 5 ? ", …" : "")
                + (attributes.isEmpty ? "" : ", and the attributes of \(attributes.count) file(s)")
                + (deletesOwed == 0 ? "" : ", and \(deletesOwed) delete(s)")
                + (earlier == 0 ? "" : ", and \(earlier) change(s) an earlier mount owed")
            if waiting != lastReport {
                report(waiting)
                lastReport = waiting
            }
            for open in due { retryUpload(open) }
            uploadInParallel(queued)
            for open in held { try? commit(open) }
            if earlier > 0 { recovered.storeOwed() }
            usleep(UInt32(min(pause, max(left, 0.01)) * 1_000_000))
            pause = min(pause * 2, 5)
        }
    }

    /// Stores queued files `upload_parallel` at once (the drain's; the queue's own jobs may
    /// run beside it: `uploadQueued` stores each spool once).
    private func uploadInParallel(_ queued: [SpoolFile]) {
        let next = Locked(0)
        let done = DispatchGroup()
        // Threads of their own: concurrentPerform runs only as many as there are cores, and
        // Dispatch adds a thread a second when its threads block.
        for _ in 0..<min(max(configuration.uploadConcurrency, 1), queued.count) {
            done.enter()
            startThread { [self] in
                while let index = next.withLock({ n -> Int? in
                    guard n < queued.count else { return nil }
                    defer { n += 1 }
                    return n
                }) {
                    uploadQueued(queued[index])
                }
                done.leave()
            }
        }
        done.wait()
    }

    private func retryUpload(_ open: SpoolFile) {
        guard open.state.withLock({ $0.retryIsDue() }) else { return }
        do {
            try commit(open)
            logger.notice("stored \(open.path) after an earlier failure")
            retire(open)
        } catch {
            logger.warning("retrying upload of \(open.path) later: \(error.message)", metadata: logFields(error, operation: "retry"))
            afterFailure(open, open.state.withLock { $0.retryFailed() }, error: error)
        }
    }

    /// The check every upload of bytes makes right before its last request (issue 22: no silent
    /// lost update): bytes that replace the version `base` go to `key` only while the object
    /// there is still that version, a new name's (`base` empty) only while nothing is there.
    func lostUpdateCheck(key: String, base: String, bytes: (path: String, size: Int64), store: (any ObjectStore)? = nil)
        -> Uploader.Check
    {
        Uploader.Check(
            destination: { () throws(ObjectStoreError) in
                try self.uploadDestination(key: key, base: base, bytes: bytes, store: store)
            },
            expectsAbsent: base.isEmpty)
    }

    /// Where an upload of bytes that replace `base` goes: `key` while the object there is
    /// still that version (or still absent for a new name) or already holds these `bytes`, else
    /// a conflict copy beside it, so that neither another client's newer version nor ours is lost.
    func uploadDestination(
        key: String, base: String, bytes: (path: String, size: Int64), store: (any ObjectStore)? = nil
    ) throws(ObjectStoreError) -> String {
        let store = store ?? self.store
        let current: String?
        do {
            current = try store.head(key: key).etag
        } catch where error.code == .notFound {
            current = nil
        }
        if current == (base.isEmpty ? nil : base) { return key }
        // An earlier attempt whose answer was lost may have stored these very bytes: that is
        // this mount's version, not another client's.
        if let current, uploader(store).expectedETag(path: bytes.path, size: bytes.size) == current {
            logger.notice("'\(key)' holds this mount's bytes already (an earlier upload's answer was lost)")
            return key
        }
        let conflict = try freeConflictKey(Self.conflictKey(for: key, at: Timestamp.now()), store: store)
        let change = current == nil ? "deleted" : "replaced"
        logger.warning(
            "conflict: '\(key)' was \(change) by another client since this mount read or wrote it; storing this mount's version as '\(conflict)'")
        return conflict
    }

    /// `name`, or `name-2`, `name-3`, … the first where nothing is: two conflicts of one key in
    /// one second must not overwrite each other (the two-mount model found the second copy
    /// replacing the first).
    func freeConflictKey(_ name: String, store: any ObjectStore) throws(ObjectStoreError) -> String {
        for n in 1...1_000 {
            let candidate = n == 1 ? name : name + "-\(n)"
            do {
                _ = try store.head(key: candidate)
            } catch where error.code == .notFound {
                return candidate
            }
        }
        throw ObjectStoreError(.invalidRequest, "1 000 conflict copies of '\(name)' exist already")
    }

    /// `KEY.cssp-conflict-YYYYMMDDTHHMMSSZ`, in UTC.
    static func conflictKey(for key: String, at time: Timestamp) -> String {
        var seconds = time_t(time.seconds)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        let stamp = "\(parts.tm_year + 1900)\(two(parts.tm_mon + 1))\(two(parts.tm_mday))T"
            + "\(two(parts.tm_hour))\(two(parts.tm_min))\(two(parts.tm_sec))Z"
        return key + ".cssp-conflict-" + stamp
    }

    /// The content type and metadata headers that store `node`'s attributes.
    func storedForm(of node: Node) -> (contentType: String, metadata: [String: String]) {
        (node.stored.contentType(base: node.baseContentType), node.stored.metadata(mergedInto: node.extraMetadata))
    }

    /// The same over what a HEAD just said: its content type and its other metadata headers.
    func storedForm(of node: Node, over info: ObjectInfo) -> (contentType: String, metadata: [String: String]) {
        (node.stored.contentType(base: StoredAttributes.parse(contentType: info.contentType).base),
            node.stored.metadata(mergedInto: info.metadata))
    }

    /// Uploads the spool (or only its metadata) if it changed since the last upload. Bytes go to
    /// a conflict copy when the object changed since this mount read or wrote it
    /// (`lostUpdateCheck`).
    func commit(_ open: SpoolFile) throws(FSError) {
        // Counted as under way, under the file's attribute lock: an attribute HEAD + POST of it
        // either waits for this upload or finishes before it starts (`postHoldingUploads`).
        let inode = open.inode
        attributeLock(inode).withLock {
            state.withLock { s in
                if let (count, done) = s.uploading[inode] {
                    s.uploading[inode] = (count + 1, done)
                } else {
                    let done = DispatchGroup()
                    done.enter()
                    s.uploading[inode] = (1, done)
                }
            }
        }
        // Ended before the note's sync, which takes the attribute lock a waiting POST holds.
        let end = { [self] in
            let ended: DispatchGroup? = state.withLock { s in
                guard let (count, done) = s.uploading[inode] else { return nil }
                if count > 1 {
                    s.uploading[inode] = (count - 1, done)
                    return nil
                }
                s.uploading[inode] = nil
                return done
            }
            ended?.leave()
        }
        do {
            try open.uploadLock.withLock { () throws(FSError) in try commitLocked(open) }
        } catch {
            end()
            throw error
        }
        end()
        syncAttributeNote(open.inode)
    }

    /// A failed write to the spool (a full `cache_dir`) is reported at every flush: its bytes are
    /// not what the application wrote, so they are never stored.
    static func requireNoWriteFailure(_ snapshot: SpoolState) throws(FSError) {
        guard let failure = snapshot.writeFailure, snapshot.dataDirty, !snapshot.isRemoved else { return }
        throw FSError(
            failure.code,
            "a write to the cache failed earlier (\(failure.message)): the file is not stored, the previous "
                + "version stays, and the bytes written are kept in lost+found/ at the last close")
    }

    /// `commit`, for a caller that holds the spool's upload lock.
    func commitLocked(_ open: SpoolFile) throws(FSError) {
        let snapshot = open.state.withLock { $0 }
        try Self.requireNoWriteFailure(snapshot)
        if !snapshot.needsUpload { return }
        guard let node = state.withLock({ $0.inodes[open.inode] }) else { return }
        let (contentType, metadata) = storedForm(of: node)
        var etag = node.etag
        var manifest = node.manifest
        forgetPrefetched(keys: [node.key])
        do throws(ObjectStoreError) {
            if snapshot.dataDirty {
                // This upload uses (or discards) the parts sent early; later writes start anew.
                let early: EarlyParts? = open.state.withLock { o in
                    defer {
                        o.earlyParts = nil
                        o.partGenerations = [:]
                    }
                    return o.earlyParts
                }
                // The parts this upload makes unreachable are those of the manifest at the key now,
                // read again: another mount may have renamed the file (its parts then belong to
                // the new name) or replaced it.
                let replaced: String? = node.manifest == nil ? nil : (try? store.head(key: node.key))?.manifest
                let result = try uploader.upload(
                    path: open.path, size: snapshot.size, key: node.key, contentType: contentType,
                    metadata: metadata, early: early, generations: snapshot.partGenerations,
                    check: lostUpdateCheck(key: node.key, base: snapshot.baseETag, bytes: (open.path, snapshot.size)))
                if !result.key.isSameKey(as: node.key) {
                    return afterConflictCopy(open, snapshot: snapshot, node: node)
                }
                if let replaced, replaced != result.manifest {
                    uploader.deleteParts(manifest: replaced, ofKey: node.key)
                }
                etag = result.etag
                manifest = result.manifest
            } else {
                try store.setMetadata(key: node.key, contentType: contentType, metadata: metadata, manifest: node.manifest)
            }
        } catch {
            throw failedUpload(open, node: node, size: snapshot.size, FSError(storeError: error, operation: "upload", path: node.key))
        }
        transfers.clearOwed(open.inode)
        // The upload stored the node's attributes as they were when it started.
        settleAttributes(open.inode, storedAt: node.attributeVersion)
        let stored = storeClock.tick()
        // The spool turns clean, the node describes what was stored and the note goes, in one
        // step: a write-back flush or a retire in between would otherwise see a clean spool
        // beside a node that still describes the old version, and a crash would find a note
        // whose base is not on the server any more.
        open.noteLock.withLock { note in
            let stillOwed: Bool = state.withLock { s in
                let stillOwed = open.state.withLock { o in
                    if snapshot.dataDirty { o.baseETag = etag }
                    _ = o.uploaded(generation: snapshot.generation)
                    return o.needsUpload
                }
                let updated = s.inodes.update(open.inode) { current in
                    current.acknowledge(at: stored)
                    current.size = snapshot.size
                    current.etag = etag
                    current.manifest = manifest
                    current.confirmedAt = now()
                    current.metadataKnownAt = current.confirmedAt
                    current.cachedEtag = etag
                    current.lastModified = Timestamp.now()
                    if snapshot.dataDirty { current.localVersion += 1 }
                }
                if let updated { updateListing(describing: updated, in: &s) }
                return stillOwed
            }
            // Written meanwhile: the note describes the newer bytes over the version just stored.
            if stillOwed {
                journalHeld(open, note: &note)
            } else {
                spool.removeNote(dataPath: open.path)
                note = nil
            }
        }
        if snapshot.dataDirty {
            seedCache(from: open, generation: snapshot.generation, size: snapshot.size, key: node.key, etag: etag)
        }
    }

    /// An upload of `open` failed: journals it (unless the file was removed) and lists it as
    /// owed, before the writer hears of it. Returns the error to throw.
    private func failedUpload(_ open: SpoolFile, node: Node, size: Int64, _ error: FSError) -> FSError {
        if !open.state.withLock({ $0.isRemoved }) {
            journal(open)
            transfers.recordFailure(open.inode, key: node.key, size: size, error: error.message)
        }
        return error
    }

    /// The spool was stored under a conflict name (the object at its own name changed since
    /// this mount read or wrote it); the name then shows the other client's version again.
    private func afterConflictCopy(_ open: SpoolFile, snapshot: SpoolState, node: Node) {
        configuration.metrics.conflicts.add()
        transfers.clearOwed(open.inode)
        // As in `commitLocked`: the spool turns clean and the note goes (or describes what was
        // written meanwhile) in one step.
        open.noteLock.withLock { note in
            let stillOwed = open.state.withLock { o in
                _ = o.uploaded(generation: snapshot.generation)
                return o.needsUpload
            }
            if stillOwed {
                journalHeld(open, note: &note)
            } else {
                spool.removeNote(dataPath: open.path)
                note = nil
            }
        }
        let stored = storeClock.tick()
        state.withLock { s in
            s.inodes.update(open.inode) { $0.forgetWhatWasSaid(at: stored) }
            s.directories.drop(node.parent)
        }
    }

    /// Returns when cache seeding started so far is written (tests; unmount).
    public func waitForCacheWrites() {
        seeding.wait()
        configuration.blockCache?.waitUntilWritten()
    }

    /// Offers what was just stored to the block cache, in the background, so that reading it back
    /// (after the kernel dropped its pages, or from the next mount) needs no GET. Stops at the
    /// first sign of a newer change: blocks must hold exactly the bytes of `etag`.
    func seedCache(from open: SpoolFile, generation: UInt64, size: Int64, key: String, etag: String) {
        guard let cache = configuration.blockCache, size > 0, size <= cache.capacity / 4, !etag.isEmpty else { return }
        let fd = (try? open.usingDescriptor { dup($0) }) ?? -1
        guard fd >= 0 else { return }
        let object = BlockCache.Object(name: cacheName(key), etag: etag)
        seeding.enter()
        let started = pool.submit { [seeding] in
            defer { seeding.leave() }
            defer { close(fd) }
            let blockSize = Int64(cache.blockSize)
            var index: Int64 = 0
            while index * blockSize < size {
                let count = Int(min(blockSize, size - index * blockSize))
                let buffer = ByteBuffer(capacity: count)
                let offset = index * blockSize
                while buffer.count < count {
                    var n = 0
                    buffer.fill { space in
                        n = pread(fd, space.baseAddress!, count - buffer.count, off_t(offset + Int64(buffer.count)))
                        return max(n, 0)
                    }
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { return }
                }
                guard open.isUnchanged(since: generation) else { return }
                cache.store(object, block: index, bytes: buffer, range: 0..<count, waitForRoom: true)
                index += 1
            }
        }
        if !started {
            close(fd)
            seeding.leave()
        }
    }

    /// The listing entry that describes `node` as we last stored it.
    func entry(for node: Node) -> DirectoryEntry {
        DirectoryEntry(
            name: node.name, kind: node.kind, key: node.key, size: node.manifest == nil ? node.size : 0,
            etag: node.etag, lastModified: node.lastModified,
            contentType: node.stored.contentType(base: node.baseContentType))
    }

    // MARK: Attributes

    public func setattr(_ inode: InodeNumber, _ changes: AttributeChanges) throws(FSError) -> Attributes {
        if configuration.readOnly { throw FSError(.readOnly, "this mount is read-only") }
        let node = try node(inode)
        // A failure leaves the node as it was, to be asked for again (the answer may be lost).
        try forgettingOnFailure([(node.parent, node.name)], restoring: node) { () throws(FSError) in
            if let size = changes.size {
                guard node.kind == .file else {
                    throw FSError(node.kind == .directory ? .isADirectory : .invalidArgument, "truncate of a \(node.kind)")
                }
                try truncate(node, to: size)
            }
            let metadataChanged = changes.mode != nil || changes.uid != nil || changes.gid != nil || changes.modified != nil
            // Another tool's version no HEAD has described yet: its headers' mtime, not the
            // listing's, is what the change keeps (the store's POST replaces them all).
            if metadataChanged, let current = state.withLock({ $0.inodes[inode] }), current.linked, awaitsHead(current) {
                _ = try refresh(current)
            }
            if let accessed = changes.accessed {
                // Kept by this mount only: the store has no access time.
                state.withLock { s in _ = s.inodes.update(inode) { $0.accessedAt = accessed; $0.changedAt = Timestamp.now() } }
            }
            if metadataChanged {
                let updated: Node = state.withLock { s in
                    s.inodes.update(inode) { n in
                        if let mode = changes.mode { n.stored.mode = mode & 0o7777 }
                        if let uid = changes.uid { n.stored.uid = uid }
                        if let gid = changes.gid { n.stored.gid = gid }
                        if let modified = changes.modified { n.stored.mtime = modified }
                        // An object without a stored mtime (another tool's) keeps the one it
                        // showed: the change is stored with it, not with the store's new time.
                        if n.stored.mtime == nil && n.kind == .file { n.stored.mtime = n.lastModified.roundedUpToSecond }
                        n.changedAt = Timestamp.now()
                        n.attributeVersion += 1
                    } ?? node
                }
                // A file whose bytes are all stored (closed, or its release not yet come: rsync's
                // chmod right after close) owes the change; one with unstored bytes stores it with them.
                let unstored = state.withLock { $0.openFiles[inode] }.map { open in open.state.withLock { $0.isDirty } } ?? false
                if defersAttributes(of: updated) && !unstored {
                    oweAttributes(inode)
                } else if try !withSpool(of: inode, { open in open.markMetadataDirty() }) {
                    try persistAttributes(of: updated)
                }
            }
        }
        return try getattr(inode)
    }

    /// Data changed now (a write, a truncation): mtime and ctime move, and the new mtime is stored
    /// with the data.
    func touch(_ inode: InodeNumber) {
        let now = Timestamp.now()
        _ = state.withLock { s in
            s.inodes.update(inode) { node in
                node.stored.mtime = now
                node.changedAt = now
                node.attributeVersion += 1
            }
        }
    }

    private func truncate(_ node: Node, to size: Int64) throws(FSError) {
        if try withSpool(of: node.inode, { (open) throws(FSError) in
            try open.truncate(to: size)
            touch(node.inode)
        }) {
            return
        }
        // No open handle (truncate(2) on a path): download, cut, store, done.
        let open = try makeSpool(for: node, download: size > 0)
        defer { open.discard() }
        try open.truncate(to: size)
        touch(node.inode)
        try commit(open)
    }

    /// Writes a node's stored attributes to the server, keeping every other header. Updates of one
    /// node are serialised and each sends the node's latest attributes, so two concurrent changes
    /// (rsync's generator and receiver) cannot store an older state last.
    func persistAttributes(of original: Node) throws(FSError) {
        try attributeLock(original.inode).withLock { () throws(FSError) in
            guard let node = state.withLock({ $0.inodes[original.inode] }) else { return }
            try persistAttributesLocked(node)
        }
    }

    private func persistAttributesLocked(_ node: Node) throws(FSError) {
        forgetPrefetched(keys: [node.key])
        do {
            switch node.kind {
            case .file where now() - node.metadataKnownAt <= configuration.attributeCacheSeconds:
                // Just stored or confirmed (rsync's chmod and utimes right after writing): what
                // the POST must keep is known, no HEAD needed.
                try postHoldingUploads(node.inode) { () throws(ObjectStoreError) in
                    // An upload that ended while this waited stored another version: its
                    // manifest is the one to keep, which only a HEAD says for sure.
                    let current = state.withLock { $0.inodes[node.inode] } ?? node
                    let info = current.etag == node.etag ? nil : try store.head(key: node.key)
                    try store.setMetadata(
                        key: node.key,
                        contentType: info.map { storedForm(of: node, over: $0).contentType }
                            ?? node.stored.contentType(base: node.baseContentType),
                        metadata: info.map { storedForm(of: node, over: $0).metadata }
                            ?? node.stored.metadata(mergedInto: node.extraMetadata),
                        manifest: info.map(\.manifest) ?? node.manifest)
                }
            case .file, .symlink, .fifo, .socket:
                try postHoldingUploads(node.inode) { () throws(ObjectStoreError) in
                    let info = try store.head(key: node.key)
                    let (contentType, metadata) = storedForm(of: node, over: info)
                    try store.setMetadata(key: node.key, contentType: contentType, metadata: metadata, manifest: info.manifest)
                }
            case .directory:
                // The root of the mount has no object to keep attributes on.
                guard !node.key.isEmpty else { return }
                let marker = node.key
                let contentType = node.stored.contentType(base: ObjectKey.directoryContentType)
                do {
                    let info = try store.head(key: marker)
                    try store.setMetadata(
                        key: marker, contentType: contentType, metadata: node.stored.metadata(mergedInto: info.metadata),
                        manifest: nil)
                } catch where error.code == .notFound {
                    try store.put(
                        key: marker, body: .bytes([]), contentType: contentType,
                        metadata: node.stored.metadata(mergedInto: [:]))
                }
            }
        } catch {
            throw FSError(storeError: error, operation: "set attributes of", path: node.key)
        }
        let stored = storeClock.tick()
        state.withLock { s in
            let current = s.inodes.update(node.inode) {
                $0.acknowledge(at: stored, version: node.attributeVersion)
                $0.confirmedAt = now()
            }
            if node.kind != .directory, let current { updateListing(describing: current, in: &s) }
        }
    }

    // MARK: Recovery

    /// Stores what earlier processes owed, for as long as it takes (until `shutdown`): their
    /// journaled deletes first (their names are hidden from the start, `JournaledStore`), then
    /// their uploads and attribute changes, oldest first (`RecoveredWork`: their names are served
    /// only once stored), as conflict copies where another client changed the object meanwhile.
    /// Keeps data files without a note in `lost+found/`. A delete that fails stays queued and is
    /// retried; an upload of a key whose delete is still owed waits for it.
    public func recoverPendingUploads() {
        if !deletes.isEmpty && !deletes.flush(timeout: 60) {
            logger.warning("deletes an earlier mount owed are not all stored yet; retrying in the background")
        }
        for (path, upload) in spool.leftovers where upload == nil {
            let kept = Spool.keepLost(dataPath: path)
            let place = kept ?? path
            logger.warning(
                "bytes of an earlier mount that no close acknowledged as stored: not uploaded, kept in \(place) (delete it when it is not needed)")
        }
        for entry in recovered.entries {
            var pause = 1.0
            while true {
                do {
                    try recovered.store(entry)
                    break
                } catch {
                    if pause == 1.0 {
                        let failure = FSError(storeError: error, operation: "recover", path: entry.item.key)
                        logger.error(
                            "cannot store '\(entry.item.key)', owed by an earlier mount, yet: \(error); retrying (its name waits for it)",
                            metadata: logFields(failure, operation: "recover"))
                    }
                    guard recovered.pause(pause) else { return }
                    pause = min(pause * 2, 60)
                }
            }
        }
    }

    /// Stores one thing an earlier mount owed (`RecoveredWork`), through `recoveryStore`.
    func storeRecovered(_ item: RecoveredWork.Item) throws(ObjectStoreError) {
        switch item {
        case .upload(let path, let upload):
            var st = stat()
            guard stat(path, &st) == 0 else { return }
            let size = Int64(st.st_size)
            // A note without a base (written before bases were kept) is stored as it says.
            let check = upload.base.map { lostUpdateCheck(key: upload.key, base: $0, bytes: (path, size), store: recoveryStore) }
            let stored = try uploader(recoveryStore).upload(
                path: path, size: size, key: upload.key, contentType: upload.contentType, metadata: upload.metadata,
                check: check)
            if !stored.key.isSameKey(as: upload.key) { configuration.metrics.conflicts.add() }
            Spool.remove(dataPath: path)
            logger.notice("stored '\(stored.key)' from \(path), owed by an earlier mount")
        case .attributes(let note, let change):
            try recoverAttributes(note: note, change: change)
        }
    }
}
