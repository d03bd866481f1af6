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

    /// Puts bytes of version `etag` a random reader fetched into the kernel's page cache, while
    /// that is the version the kernel was last told to keep pages of (`cachedEtag`, set by each
    /// open) and the file has no spool (a writer). A writer that appears while the bytes are
    /// stored gets the kernel's pages of the file dropped, so it never reads older bytes than its
    /// own; an open of another version waits for the store (`open`).
    func offerToKernel(_ inode: InodeNumber, version etag: String, at offset: Int64, _ bytes: UnsafeRawBufferPointer) {
        kernelCache.store(inode, at: offset, bytes) { [self] in
            files.withLock { $0.openFiles[inode] == nil } && names.withLock { $0.inodes[inode]?.cachedEtag } == etag
        }
    }

    /// The name of `key`'s blocks in the block cache.
    func cacheName(_ key: String) -> String { configuration.cacheIdentity + "/" + key }

    private func register(_ handle: FileHandle) -> UInt64 {
        files.withLock { f in
            let number = f.handles.open(handle)
            if case .remote(let reader, let inode, _) = handle { record(number, reader.adopted(as: inode), in: &f) }
            return number
        }
    }

    /// Handle `number` reads through `handle` from now on (another version, another key).
    private func replace(_ number: UInt64, with handle: FileHandle) {
        files.withLock { f in
            f.handles.replace(number, with: handle)
            if f.handles[number] != nil, case .remote(let reader, let inode, _) = handle {
                record(number, reader.adopted(as: inode), in: &f)
            }
        }
    }

    public func open(_ inode: InodeNumber, writable: Bool, truncate: Bool) throws(FSError) -> OpenResult {
        try describeIfAdopted(inode)
        var node = try namespace.node(inode)
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
            let handle = register(.spool(open, writable: writable))
            recordSpoolHandle(handle, open, writable: writable)
            return OpenResult(handle: handle, keepCache: true)
        }
        // Close-to-open: a file opened after its writer closed it shows the new content.
        // (Not a node no name leads to, opened again through /proc/PID/fd: its old key may
        // hold another object now.)
        if !truncate && node.linked && now() - node.confirmedAt > configuration.attributeCacheSeconds {
            let known = node
            node = try namespace.refresh(node)
            // Another client's version: the kernel's size of the file (its attributes may be
            // younger than the node's confirmation) would cut the new version's reads short.
            if node.etag != known.etag || node.size != known.size { kernelCache.invalidate(inode, pages: false) }
        }
        guard writable || truncate else {
            let (keep, otherVersion) = names.withLock { s in
                let cached = s.inodes[inode]?.cachedEtag
                s.inodes.update(inode) { $0.cachedEtag = node.etag }
                return (cached == node.etag, cached != nil && cached != node.etag)
            }
            // The node took another version since the kernel last opened the file (a poll, a
            // listing): the kernel's size may be that version's, and would cut reads short.
            if otherVersion { kernelCache.invalidate(inode, pages: false) }
            // The answer makes the kernel drop the file's pages: no store of an older version's
            // bytes may land after it.
            if !keep { kernelCache.waitForStores(of: inode) }
            let handle = register(.remote(makeReader(node, keptPages: keep), inode, localVersion: node.localVersion))
            return OpenResult(handle: handle, keepCache: keep)
        }
        let open = try makeSpool(for: node, download: !truncate)
        // Another thread may have opened the same file meanwhile: its spool wins. Taking the spool
        // and counting this handle on it is one step, so a retiring spool is never attached to.
        let attached: SpoolFile? = withTables { s, f in
            if let existing = f.openFiles[inode], existing.state.withLock({ $0.attach(writable: writable) }) {
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
            f.openFiles[inode] = open
            s.spools[inode] = open
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
        let pagesOfThisVersion = !base.isEmpty && names.withLock { $0.inodes[inode]?.cachedEtag } == base
        // The download found another version than the node knew: the kernel's size is the old
        // one's, and would cut the spool's reads short.
        if attached === open && !truncate && base != node.etag { kernelCache.invalidate(inode, pages: false) }
        let handle = register(.spool(attached, writable: writable))
        recordSpoolHandle(handle, attached, writable: writable)
        return OpenResult(handle: handle, keepCache: !truncate && (attached !== open || pagesOfThisVersion))
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
        makeReader(
            AdoptedHandle(inode: node.inode, key: node.key, size: node.size, etag: node.etag, manifest: node.manifest),
            keptPages: keptPages)
    }

    /// A reader of the version `node` names.
    func makeReader(_ node: AdoptedHandle, keptPages: Bool = false) -> FileReader {
        var kernel: (cache: KernelCache, store: @Sendable (Int64, UnsafeRawBufferPointer) -> Void)? = nil
        if kernelCache.isInstalled {
            let (inode, etag) = (node.inode, node.etag)
            kernel = (kernelCache, { [weak self] (offset: Int64, bytes: UnsafeRawBufferPointer) in
                self?.offerToKernel(inode, version: etag, at: offset, bytes)
            })
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
        files.withLock { s in
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

    private func handle(_ number: UInt64) throws(FSError) -> FileHandle {
        guard let handle = files.withLock({ $0.handles[number] }) else {
            throw FSError(.badHandle, "unknown file handle \(number)")
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
        /// A handle taken over from a dead worker on a node not described yet (issue 40).
        case undescribed(InodeNumber)
        case lost(String)
    }

    public func read(handle number: UInt64, offset: Int64, length: Int, reply: (UnsafeRawBufferPointer) -> Void)
        throws(FSError)
    {
        // Every handle of one file sees what was written through this mount: a writer's spool
        // while there is one, else the version stored last (a handle opened before keeps reading
        // the old one otherwise), under its current key (renamed, or a directory above it).
        let source: ReadSource? = withTables { s, f in
            switch f.handles[number] {
            case nil: return nil
            case .spool(let open, _)?: return .spool(open)
            case .lost(_, let key, _)?: return .lost(key)
            case .remote(let reader, let inode, let version)?:
                if let spool = f.openFiles[inode] { return .othersSpool(spool) }
                if s.inodes.undescribed.contains(inode) { return .undescribed(inode) }
                guard let node = s.inodes[inode] else { return .reader(reader, inode, anotherVersionKnown: false) }
                if node.localVersion != version || (node.linked && !node.key.isSameKey(as: reader.key)) {
                    return node.linked ? .newReader(node) : .removed(node.key)
                }
                return .reader(reader, inode, anotherVersionKnown: heldPastAnotherVersion(reader, node))
            }
        }
        switch source {
        case nil: throw FSError(.badHandle, "unknown file handle \(number)")
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
        case .lost(let key)?:
            throw FSError(.stale, "read of '\(key)': its bytes were in a spool that is gone")
        case .undescribed(let inode)?:
            try describeIfAdopted(inode)
            try read(handle: number, offset: offset, length: length, reply: reply)
        case .newReader(let node)?:
            let reader = makeReader(node)
            replace(number, with: .remote(reader, node.inode, localVersion: node.localVersion))
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
    /// version since (a poll, a HEAD, a listing: `Poller` subtlety 4) reads no more of
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
            replace(number, with: .remote(newer, inode, localVersion: adopted.localVersion))
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
        let adopted: Node? = names.withLock { s in
            guard s.spools[inode] == nil,
                let node = s.inodes.update(inode, { namespace.apply(info, askedAt: askedAt, to: &$0) }),
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
        let handle = try handle(number)
        if case .lost(_, let key, writable: true) = handle {
            throw FSError(.stale, "write of '\(key)': the spool of this descriptor is gone")
        }
        guard case .spool(let open, writable: true) = handle else {
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
        // (A store that fixes an upload's metadata when it begins would need a copy of the whole
        // object at the end to give it the file's: its uploads begin at close.)
        guard !store.fixesUploadMetadataAtBegin else { return }
        // The key (for --status) is looked up only when a pipeline starts, not at every write.
        let starts = open.state.withLock { $0.size > multipart && $0.earlyParts == nil && !$0.isRemoved }
        let key = starts ? names.withLock { $0.inodes[open.inode]?.key } ?? open.path : open.path
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
        let handle = try handle(number)
        if case .lost(_, let key, writable: true) = handle {
            throw FSError(.ioError, "close of '\(key)': what was written through this descriptor is lost with its spool")
        }
        guard case .spool(let open, let writable) = handle, writable else { return }
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
        case .lost(_, let key, writable: true):
            throw FSError(.ioError, "fsync of '\(key)': what was written through this descriptor is lost with its spool")
        case .remote(_, let inode, _), .lost(let inode, _, writable: false):
            try storeOwedAttributes(inode)
        }
    }

    public func release(handle number: UInt64) {
        let handle: FileHandle? = files.withLock { f in f.handles.close(number) }
        // Recorded once done (the upload a spool's last release makes): a release the worker
        // died in is done again by its successor (`Filesystem+HandleLog` subtlety 3).
        defer { if configuration.handleLog != nil { files.withLock { f in recordRelease(number, in: &f) } } }
        guard case .spool(let open, let writable)? = handle else { return }
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
        case .upload: storeUnwritten(open, operation: "release")
        }
    }

    /// Stores changed bytes of `open` that no writer holds any more (the last close, a dead
    /// worker's spool taken over), and retires the spool once idle. A failure keeps the bytes
    /// and retries them (the writer, if any, saw the error at its close).
    func storeUnwritten(_ open: SpoolFile, operation: String) {
        do {
            try commit(open)
            retire(open)
        } catch {
            logger.error(
                "\(error.message); the data stays in \(open.path) and is retried", metadata: logFields(error, operation: operation))
            afterFailure(open, open.state.withLock { $0.uploadFailed() }, error: error)
        }
    }

    /// Runs `body` on the spool of `inode` while holding it like a writer, so that a concurrent
    /// last release cannot retire it half-way; returns false when the file has no spool. When this
    /// was the last hold, the change is stored before returning, as a path-based call must.
    func withSpool(of inode: InodeNumber, _ body: (SpoolFile) throws(FSError) -> Void) throws(FSError) -> Bool {
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
}
