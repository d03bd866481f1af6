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

// Storing a file: commit (the upload with its lost-update check and conflict copy), retire,
// drain, retries after failures, and seeding the block cache from the spool.
extension Filesystem {
    /// Drops a spool whose content is stored (or that was removed), and the node if the kernel
    /// forgot it. Does nothing while the spool is held or owes an upload.
    func retire(_ open: SpoolFile) {
        let done: Bool = withTables { s, f in
            guard f.openFiles[open.inode] === open, open.state.withLock({ $0.retire() }) else { return false }
            f.openFiles[open.inode] = nil
            s.spools[open.inode] = nil
            // The listing first, as when attributes settle: unpinned, the node goes if the
            // kernel forgot it, and the next lookup makes one from the remembered entry, which
            // a change stored while the file was open (a chmod) did not update.
            if let node = s.inodes[open.inode], node.kind == .file { namespace.correctListing(describing: node, comparingTimes: true, in: &s) }
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
            let (due, queued, held): ([SpoolFile], [SpoolFile], [SpoolFile]) = files.withLock { s in
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
    func uploadInParallel(_ queued: [SpoolFile]) {
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

    func retryUpload(_ open: SpoolFile) {
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

    /// The check every upload of bytes makes right before its last request (`Uploader.lostUpdateCheck`).
    func lostUpdateCheck(key: String, base: String, bytes: (path: String, size: Int64), store: (any ObjectStore)? = nil)
        -> Uploader.Check
    {
        uploader(store ?? self.store).lostUpdateCheck(key: key, base: base, bytes: bytes, logger: logger)
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
            files.withLock { s in
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
            let ended: DispatchGroup? = files.withLock { s in
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
        guard let node = names.withLock({ $0.inodes[open.inode] }) else { return }
        let (contentType, metadata) = storedForm(of: node)
        var etag = node.etag
        var manifest = node.manifest
        namespace.forgetPrefetched(keys: [node.key])
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
            let stillOwed: Bool = names.withLock { s in
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
                if let updated {
                    namespace.updateListing(describing: updated, in: &s)
                    if snapshot.dataDirty { recordReaders(following: updated) }
                    // What an upload of the spool would store changed (its base, attributes).
                    if configuration.handleLog != nil { files.withLock { f in recordSpoolHandles(of: open, node: updated, in: &f) } }
                }
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
    func failedUpload(_ open: SpoolFile, node: Node, size: Int64, _ error: FSError) -> FSError {
        if !open.state.withLock({ $0.isRemoved }) {
            journal(open)
            transfers.recordFailure(open.inode, key: node.key, size: size, error: error.message)
        }
        return error
    }

    /// The spool was stored under a conflict name (the object at its own name changed since
    /// this mount read or wrote it); the name then shows the other client's version again.
    func afterConflictCopy(_ open: SpoolFile, snapshot: SpoolState, node: Node) {
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
        names.withLock { s in
            s.inodes.update(open.inode) { $0.forgetWhatWasSaid(at: stored) }
            s.directories.drop(node.parent)
        }
    }

    /// Returns when cache seeding started so far is written (tests; unmount).
    public func waitForCacheWrites() {
        seeding.wait()
        configuration.blockCache?.waitUntilWritten()
    }

    /// Offers what was just stored to the block cache (`SpoolFile.seedCache`).
    func seedCache(from open: SpoolFile, generation: UInt64, size: Int64, key: String, etag: String) {
        guard let cache = configuration.blockCache, !etag.isEmpty else { return }
        open.seedCache(
            cache, as: BlockCache.Object(name: cacheName(key), etag: etag), generation: generation, size: size, pool: pool,
            seeding: seeding)
    }
}
