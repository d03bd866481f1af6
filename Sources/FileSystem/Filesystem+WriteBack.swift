import FSCore
import FSFiles
import FSJournal
import FSNamespace
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Write-back (`-o writeback`; docs/writeback-design.md, step 1). A close (flush) makes the
/// file's bytes and its journal note durable on the local disk and returns; the queue stores the
/// file `writeBackDelay` seconds later, on the background pool. Until then the spool is the
/// file: reads, listings and `stat` show it, and a later mount stores what the note says if
/// this one dies. `fsync(2)` and the drain at unmount upload at once, as without write-back.
///
/// Subtleties:
/// 1. The release after the close does not upload (`SpoolState.queued` makes it `.journal`).
/// 2. A file this mount made (no version of it stored before, an empty `baseETag`) is stored as
///    at a close: one PUT. One that replaces a stored version is checked first, as an owed upload
///    is, and goes to a conflict copy if another client changed the object meanwhile.
/// 3. A rename of a queued file never stored moves the node and rewrites the note: no request;
///    the queue stores it under its last name (`Filesystem+Rename.renameFileHeld`). An unlink
///    of one removes the note: no request either.
/// 4. A flush while the queue's upload runs leaves newer bytes: `SpoolState.requeue` queues the
///    spool again once that upload ends.
/// 5. A close syncs its bytes and its note; nothing else waits for a sync. A flush whose bytes
///    a flush already synced (the close of a dup'ed descriptor) syncs nothing, a note that would
///    say what the last one said is not written again (the release after a close), and the
///    notes of a chmod, chown, touch or rename of a queued file are written without a sync:
///    they survive the process at once, and a power cut once the next close, an fsync of the
///    directory (`fsyncDirectory`: the spool's filesystem synced) or the upload makes them
///    durable, as a rename on a local disk is durable at the next fsync of its directory.
/// 6. The queue is bounded (`writeBackMaxBytes`): a close that finds the files owed holding
///    more waits for room (`waitForRoom`), storing the oldest queued file itself. Failed
///    uploads count too: with the server gone, closes wait (never ENOSPC, never a drop) until
///    retries store enough.
extension Filesystem {
    /// The flush of a write-back mount: journals the spool's bytes (fdatasync, then a synced
    /// note) and queues their upload. Fails, with nothing queued, when the bytes or the note
    /// cannot be made durable; reports a failed write to the spool as `commit` does.
    func queueUpload(_ open: SpoolFile) throws(FSError) {
        let snapshot = open.state.withLock { $0 }
        try Self.requireNoWriteFailure(snapshot)
        guard snapshot.needsUpload, let node = names.withLock({ $0.inodes[open.inode] }) else { return }
        if snapshot.syncedGeneration != snapshot.generation || snapshot.changesInProgress > 0 {
            try open.usingDescriptor { (fd) throws(FSError) in
                guard fdatasync(fd) == 0 else {
                    throw FSError(.ioError, "cannot sync \(open.path) for write-back: \(String(cString: strerror(errno)))")
                }
            }
            if snapshot.changesInProgress == 0 { open.state.withLock { $0.syncedGeneration = snapshot.generation } }
        }
        guard journal(open) else {
            // Stored meanwhile (the queue's upload of an earlier flush took these bytes too), or
            // removed: nothing to queue.
            if !open.state.withLock({ $0.needsUpload }) { return }
            throw FSError(.ioError, "cannot journal '\(node.key)' for write-back in \(open.path): the file is not queued")
        }
        guard open.state.withLock({ $0.queue() }) else { return }
        transfers.recordQueued(open.inode, key: node.key, size: snapshot.size, in: configuration.writeBackDelay)
        scheduleQueuedUpload(open, after: configuration.writeBackDelay)
        waitForRoom(open)
    }

    /// Back-pressure (`writeback_max_mb`, subtlety 6): while the files owed hold more bytes
    /// than the bound, the close stores the oldest queued file itself (this one, if it is the
    /// oldest), or waits for an upload under way or a retry to end. Nothing is dropped, and the
    /// spool never grows past the bound by more than the files being written.
    func waitForRoom(_ open: SpoolFile) {
        let limit = configuration.writeBackMaxBytes
        while !transfers.hasRoom(limit: limit, for: open.inode) {
            let oldest: SpoolFile? = transfers.queuedInodes.lazy.compactMap { inode in
                self.files.withLock { $0.openFiles[inode] }
            }.first { $0.state.withLock { $0.isQueued } }
            if let oldest {
                uploadQueued(oldest)
            } else {
                transfers.waitForChange(limit: limit, for: open.inode, timeout: 1)
            }
        }
    }

    func scheduleQueuedUpload(_ open: SpoolFile, after delay: Double) {
        pool.submit(after: delay) { [self] in uploadQueued(open) }
    }

    /// The queue's job for one spool: stores it unless an fsync, the drain, a rename or an
    /// unlink dealt with it first.
    func uploadQueued(_ open: SpoolFile) {
        guard open.state.withLock({ $0.isQueued }) else { return }
        do {
            try commit(open)
        } catch {
            logger.warning(
                "write-back of \(open.path) failed, retrying later: \(error.message)",
                metadata: logFields(error, operation: "write-back"))
            afterFailure(open, open.state.withLock { $0.uploadFailed() }, error: error)
            return
        }
        if open.state.withLock({ $0.requeue() }) {
            // Flushed again during the upload: queued again (the upload left the note naming
            // the version it stored as the base).
            if let node = names.withLock({ $0.inodes[open.inode] }) {
                transfers.recordQueued(open.inode, key: node.key, size: open.size, in: 0)
            }
            scheduleQueuedUpload(open, after: 0)
            return
        }
        retire(open)
    }

    /// Writes `open`'s note from its node as it is now: what a later mount stores if this one
    /// cannot. Only while an upload is owed (not after it was stored or the file was removed);
    /// returns whether the note says that now. A note that would say what the last one said is
    /// not written again. `sync: false` (an attribute change of a closed file): the note
    /// survives the process, and the next synced note (a close, a rename) a power cut.
    @discardableResult
    func journal(_ open: SpoolFile, sync: Bool = true) -> Bool {
        open.noteLock.withLock { note in journalHeld(open, note: &note, sync: sync) }
    }

    /// `journal`, for a caller that holds the spool's `noteLock` (`note`: what it guards).
    @discardableResult
    func journalHeld(_ open: SpoolFile, note: inout SpoolFile.WrittenNote?, sync: Bool = true) -> Bool {
        guard let node = names.withLock({ $0.inodes[open.inode] }) else { return false }
        let (owed, base) = open.state.withLock { ($0.needsUpload, $0.baseETag) }
        guard owed else { return false }
        let (contentType, metadata) = storedForm(of: node)
        let upload = Spool.PendingUpload(key: node.key, contentType: contentType, metadata: metadata, base: base)
        if let note, note.upload == upload, note.synced || !sync { return true }
        guard spool.writePendingNote(dataPath: open.path, upload: upload, sync: sync) else { return false }
        note = SpoolFile.WrittenNote(upload: upload, synced: sync)
        return true
    }

    /// `mount.cssp --status`: the uploads (`Transfers.report`), then the deletes owed.
    public func statusReport() -> String {
        let (count, oldest, lastError) = deletes.backlog()
        var out = transfers.report()
        if configuration.writeBack {
            out += "write-back journal: \(Transfers.bytes(transfers.owedBytes)) owed of \(Transfers.bytes(configuration.writeBackMaxBytes)) (writeback_max_mb)\n"
        }
        let earlier = recovered.count
        if earlier > 0 { out += "owed by an earlier mount, not stored yet: \(earlier) (uploads and attribute changes)\n" }
        out += "deletes owed: \(count)"
        if count > 0 { out += ", the oldest for \(Transfers.seconds(oldest))" }
        if let lastError { out += "; failing, last error: \(lastError)" }
        return out + "\n"
    }

    /// fsync of a directory: the journal's notes are made durable (renames and attribute
    /// changes of queued files, written unsynced), and the deletes owed are stored.
    public func fsyncDirectory() throws(FSError) {
        guard configuration.writeBack || !deletes.isEmpty else { return }
        guard spool.sync() else {
            throw FSError(.ioError, "cannot sync the journal in \(spool.directory): \(String(cString: strerror(errno)))")
        }
        guard !deletes.isEmpty else { return }
        guard deletes.flush(timeout: .infinity) else {
            throw FSError(.ioError, "deletes this mount owes are not stored yet: \(deletes.backlog().lastError ?? "the store failed")")
        }
    }
}
