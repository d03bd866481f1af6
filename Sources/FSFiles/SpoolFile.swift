import BlockCache
import FSCore
import FSJournal
import Locking
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The life of one spool, as a state machine that does no I/O: events (a handle attaches or
/// closes, an upload ends, the file is removed, a retry is due) change the state and return what
/// the owner must do. `SpoolFile` holds it under its lock; `Filesystem` carries the actions out.
/// Nothing else changes it. (swift-nio's NIOAsyncWriter.StateMachine is the pattern.)
///
///     active --last close, changed--> (upload) --ok--> retired
///        |                               `--failed--> pending --retry ok--> retired
///        |--flush, write-back--> queued --queue: upload ok--> active (retired once idle)
///        |                          `--upload failed--> pending
///        `--unlink / replaced--> removed --last close--> retired
///
/// The note that journals an owed upload is written on every failed upload (before the writer
/// hears EIO) and at every write-back flush, rewritten when the name or attributes change, and
/// removed when the upload succeeds or the file is removed.
package struct SpoolState: Equatable {
    package enum Phase: Equatable {
        /// Stored at flush, fsync and the last close whenever it changed.
        case active
        /// An upload failed after the last handle closed: a retry is scheduled (`tries` so far).
        case pending(tries: Int)
        /// Write-back: a flush journaled the bytes and returned; the queue uploads them
        /// (docs/writeback-design.md). The last close does not upload.
        case queued
        /// Unlinked or replaced by a rename: no name leads to it, it is never uploaded again.
        case removed
        /// Dropped by its owner; the spool file is gone. Nothing attaches to it any more.
        case retired
    }

    package private(set) var phase = Phase.active
    package private(set) var writers = 0
    package private(set) var readers = 0

    package var size: Int64
    /// Bytes changed since the last successful upload (or never uploaded).
    package var dataDirty: Bool
    /// Mode, owner or time changed since the last successful upload.
    package var metadataDirty = false
    /// Bumped by every change, so an upload knows whether it stored the latest state.
    package var generation: UInt64 = 0
    /// Writes or truncations under way (their bytes may be in the file before `generation` moves).
    package var changesInProgress = 0
    /// Parts uploaded while the file is written (see `EarlyParts`), and the generation of the
    /// last write into each part.
    package var earlyParts: EarlyParts? = nil
    package var partGenerations: [Int: UInt64] = [:]
    /// The ETag of the object these bytes replace ("" for a new name): an owed upload checks it
    /// first, so that another client's newer version is never overwritten (see `Spool`).
    package var baseETag: String
    /// A write or truncation of the spool failed (a full `cache_dir`): its bytes are not what the
    /// application wrote, so they are never uploaded. Every flush reports this error; the last
    /// close keeps the bytes in `lost+found/` and retires the spool. A truncation to 0 starts the
    /// content anew and clears it.
    package var writeFailure: FSError? = nil
    /// A flush came while the spool was queued (see `queue`).
    package private(set) var flushedWhileQueued = false
    /// The generation whose bytes a write-back flush last synced (a second flush of the same
    /// bytes, as a dup'ed descriptor's close makes, syncs nothing).
    package var syncedGeneration: UInt64? = nil

    package init(size: Int64, dataDirty: Bool, baseETag: String = "") {
        self.size = size
        self.dataDirty = dataDirty
        self.baseETag = baseETag
    }

    package static func == (a: SpoolState, b: SpoolState) -> Bool {
        a.phase == b.phase && a.writers == b.writers && a.readers == b.readers && a.size == b.size
            && a.dataDirty == b.dataDirty && a.metadataDirty == b.metadataDirty && a.generation == b.generation
    }

    package var isIdle: Bool { writers == 0 && readers == 0 }
    package var isDirty: Bool { dataDirty || metadataDirty }
    package var isRemoved: Bool { phase == .removed || phase == .retired }

    /// Whether an upload now would store something (changed, and a name still leads to it).
    package var needsUpload: Bool { isDirty && !isRemoved && writeFailure == nil }

    /// A handle opens on the spool. False when it is retired: the caller makes a new one.
    package mutating func attach(writable: Bool) -> Bool {
        guard phase != .retired else { return false }
        if writable { writers += 1 } else { readers += 1 }
        return true
    }

    package enum Release: Equatable {
        /// Other handles remain.
        case keep
        /// The last handle closed on a spool whose upload a scheduled retry or the write-back
        /// queue owns: its note must describe what changed meanwhile (attributes set, bytes
        /// written through a new handle).
        case journal
        /// The last handle closed on changed bytes: upload, then `uploaded`/`uploadFailed`.
        case upload
        /// Nothing is owed: retire the spool.
        case retire
    }

    /// A handle closes.
    package mutating func detach(writable: Bool) -> Release {
        if writable {
            precondition(writers > 0, "INTERNAL ERROR: a spool closed by more writers than it had")
            writers -= 1
        } else {
            precondition(readers > 0, "INTERNAL ERROR: a spool closed by more readers than it had")
            readers -= 1
        }
        guard isIdle else { return .keep }
        if writeFailure != nil && phase != .retired { return .retire }
        switch phase {
        case .pending, .queued: return .journal
        case .retired: return .keep
        case .removed: return .retire
        case .active: return isDirty ? .upload : .retire
        }
    }

    /// An upload of the state at `generation` succeeded. Returns whether the spool can retire.
    package mutating func uploaded(generation stored: UInt64) -> Bool {
        if generation == stored && changesInProgress == 0 {
            dataDirty = false
            metadataDirty = false
        }
        if case .pending = phase { phase = .active }
        if phase == .queued { phase = .active }
        return isIdle && !isDirty && phase == .active
    }

    /// Write-back: a flush journaled changed bytes; the queue owns their upload from now on.
    /// False when there is nothing to queue, a scheduled retry owns the upload already, or it is
    /// queued already (an upload under way may store an older generation: `requeue` then).
    package mutating func queue() -> Bool {
        if phase == .queued { flushedWhileQueued = true }
        guard needsUpload, phase == .active else { return false }
        phase = .queued
        return true
    }

    /// After the queue's upload: queued again when a flush journaled newer bytes meanwhile, or
    /// when no handle holds changes made since (a truncate or chmod by path: no flush follows).
    package mutating func requeue() -> Bool {
        guard flushedWhileQueued || isIdle else { return false }
        flushedWhileQueued = false
        return queue()
    }

    /// Whether the queue's upload of this spool is still to do (not done, removed or failed).
    package var isQueued: Bool { phase == .queued }

    package enum Failure: Equatable {
        /// Keep the bytes; a handle is still open (its next flush tries again), or a retry is
        /// scheduled already.
        case keep
        /// The last handle is gone: schedule retry number `tries`.
        case scheduleRetry(tries: Int)
        /// Removed meanwhile: nothing is owed.
        case retire
    }

    /// An upload failed (the note is written whatever this returns, unless removed).
    package mutating func uploadFailed() -> Failure {
        switch phase {
        case .removed: return isIdle ? .retire : .keep
        case .retired: return .keep
        case .pending: return .keep
        case .active, .queued:
            flushedWhileQueued = false
            guard isIdle else {
                // A handle is open: its next flush queues or uploads again.
                phase = .active
                return .keep
            }
            phase = .pending(tries: 1)
            return .scheduleRetry(tries: 1)
        }
    }

    /// A scheduled retry is due: whether to upload now.
    package func retryIsDue() -> Bool {
        if case .pending = phase { return true }
        return false
    }

    /// The scheduled retry failed again: schedule the next one.
    package mutating func retryFailed() -> Failure {
        guard case .pending(let tries) = phase else { return isIdle && phase == .removed ? .retire : .keep }
        phase = .pending(tries: tries + 1)
        return .scheduleRetry(tries: tries + 1)
    }

    /// The file was unlinked or replaced. Returns the early parts to discard, and whether the
    /// spool can retire now.
    package mutating func remove() -> (early: EarlyParts?, retire: Bool) {
        guard phase != .retired else { return (nil, false) }
        phase = .removed
        let early = earlyParts
        earlyParts = nil
        partGenerations = [:]
        return (early, isIdle)
    }

    /// The owner drops the spool: only when idle and nothing is owed. Returns whether it did.
    package mutating func retire() -> Bool {
        guard isIdle, phase == .removed || (phase == .active && !isDirty) || (phase != .retired && writeFailure != nil)
        else { return false }
        phase = .retired
        return true
    }
}

/// A file open for writing (or closed with its upload still owed): its spool file and its
/// `SpoolState`.
package final class SpoolFile: Spooled {
    package let inode: InodeNumber
    package let path: String

    /// The spool's descriptor (-1: closed) and the calls using it now. It is closed while the
    /// spool only waits for a retry with no handle (a thousand owed files would otherwise use a
    /// thousand descriptors, and EMFILE breaks curl and SQLite for everything), and opened again
    /// by the next use. Lock 5 of the LOCKING block in Filesystem.swift.
    private struct Descriptor {
        package var fd: Int32
        package var users = 0
    }
    private let descriptor: Locked<Descriptor>

    /// Protects the state (lock 4 of the LOCKING block in Filesystem.swift).
    package let state: Locked<SpoolState>
    /// Serialises uploads of this file (lock 2 of the LOCKING block in Filesystem.swift).
    package let uploadLock = SerialLock()
    /// Serialises writing and removing this spool's note with reading what it says (the node,
    /// the state): a leaf but for the filesystem's state lock and this spool's state lock, which
    /// it takes inside. Two threads journaling at once (a release and a rename of a queued file)
    /// otherwise leave whichever note they wrote last, perhaps under the old name.
    /// It guards the note as this process last wrote it (nil: none on disk), so that a note
    /// that would say the same is not written again.
    package let noteLock = Locked<WrittenNote?>(nil)

    /// A note as written: what it says, and whether it was synced (else it survives the
    /// process, not a power cut).
    package struct WrittenNote {
        package var upload: Spool.PendingUpload
        package var synced: Bool

        package init(upload: Spool.PendingUpload, synced: Bool) {
            self.upload = upload
            self.synced = synced
        }
    }

    package init(inode: InodeNumber, path: String, fd: Int32, size: Int64, dirty: Bool, baseETag: String) {
        self.inode = inode
        self.path = path
        self.descriptor = Locked(Descriptor(fd: fd))
        self.state = Locked(SpoolState(size: size, dataDirty: dirty, baseETag: baseETag))
    }

    /// Runs `body` with the spool's descriptor, opening it again if it was closed.
    package func usingDescriptor<T>(_ body: (Int32) throws(FSError) -> T) throws(FSError) -> T {
        let fd = try descriptor.withLock { (d: inout Descriptor) throws(FSError) -> Int32 in
            if d.fd < 0 {
                d.fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC)
                guard d.fd >= 0 else { throw Spool.error("open spool \(path) again") }
            }
            d.users += 1
            return d.fd
        }
        defer { descriptor.withLock { $0.users -= 1 } }
        return try body(fd)
    }

    /// The descriptor now (tests replace it with /dev/full to simulate a full disk).
    package var fd: Int32 { (try? usingDescriptor { $0 }) ?? -1 }

    /// Whether the descriptor is open (tests).
    package var isDescriptorOpen: Bool { descriptor.withLock { $0.fd >= 0 } }

    /// Closes the descriptor while the spool waits for a retry with no handle and no call using
    /// it (the retry uploads from the path).
    package func closeWhileWaiting() {
        state.withLock { s in
            guard s.isIdle, s.retryIsDue() else { return }
            descriptor.withLock { d in
                guard d.users == 0, d.fd >= 0 else { return }
                close(d.fd)
                d.fd = -1
            }
        }
    }

    /// Closes the descriptor for good (the spool is retired).
    package func closeDescriptor() {
        descriptor.withLock { d in
            if d.fd >= 0 { close(d.fd) }
            d.fd = -1
        }
    }

    package var size: Int64 { state.withLock { $0.size } }

    package func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws(FSError) {
        state.withLock { $0.changesInProgress += 1 }
        defer {
            state.withLock { s in
                s.changesInProgress -= 1
                s.generation += 1
                if let parts = s.earlyParts, bytes.count > 0 {
                    let first = Int(offset / parts.partSize)
                    let last = Int((offset + Int64(bytes.count) - 1) / parts.partSize)
                    for index in first...last { s.partGenerations[index] = s.generation }
                }
            }
        }
        try usingDescriptor { (fd) throws(FSError) in
            var done = 0
            while done < bytes.count {
                let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset + Int64(done)))
                if n < 0 {
                    if errno == EINTR { continue }
                    throw failed(Spool.error("write to spool \(path)"))
                }
                done += n
            }
        }
        state.withLock { s in
            s.size = max(s.size, offset + Int64(bytes.count))
            s.dataDirty = true
        }
    }

    package func truncate(to size: Int64) throws(FSError) {
        state.withLock { $0.changesInProgress += 1 }
        defer {
            state.withLock { s in
                s.changesInProgress -= 1
                s.generation += 1
            }
        }
        try usingDescriptor { (fd) throws(FSError) in
            guard ftruncate(fd, off_t(size)) == 0 else { throw failed(Spool.error("truncate spool \(path)")) }
        }
        state.withLock { s in
            if size == 0 { s.writeFailure = nil }
            if let parts = s.earlyParts {
                // Every part between the old and the new end changed.
                let low = Int(min(size, s.size) / parts.partSize)
                let high = Int(max(size, s.size) / parts.partSize)
                for index in low...high { s.partGenerations[index] = s.generation + 1 }
            }
            s.size = size
            s.dataDirty = true
        }
    }

    /// Records that the spool no longer holds what the application wrote (see `writeFailure`).
    private func failed(_ error: FSError) -> FSError {
        state.withLock { s in
            if s.writeFailure == nil { s.writeFailure = error }
        }
        return error
    }

    /// Whether the spool holds exactly what it held at `generation` (no change since, none under way).
    package func isUnchanged(since generation: UInt64) -> Bool {
        state.withLock { $0.generation == generation && $0.changesInProgress == 0 }
    }

    package func markMetadataDirty() {
        state.withLock { s in
            s.metadataDirty = true
            s.generation += 1
        }
    }

    package func read(offset: Int64, length: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(FSError) {
        let size = self.size
        guard offset < size, length > 0 else {
            reply(UnsafeRawBufferPointer(start: nil, count: 0))
            return
        }
        let count = Int(min(Int64(length), size - offset))
        let buffer = BufferRecycler.shared.take(byteCount: count)
        defer { BufferRecycler.shared.give(buffer) }
        let done = try usingDescriptor { (fd) throws(FSError) -> Int in
            var done = 0
            while done < count {
                let n = pread(fd, buffer.baseAddress! + done, count - done, off_t(offset + Int64(done)))
                if n < 0 && errno == EINTR { continue }
                if n < 0 { throw Spool.error("read spool \(path)") }
                if n == 0 { break }
                done += n
            }
            return done
        }
        reply(UnsafeRawBufferPointer(rebasing: buffer[0..<done]))
    }

    /// Closes and deletes the spool.
    package func discard() {
        closeDescriptor()
        Spool.remove(dataPath: path)
    }
}

