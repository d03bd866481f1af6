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

/// The handle log (issue 40, docs/restart-design.md): every file handle the kernel holds is
/// recorded before the reply that makes its number known, so that a worker that replaces a
/// dead one takes it over (`adoptHandles`).
///
/// Subtleties:
/// 1. A reader of a stored version is recorded with that version (key, size, ETag, manifest),
///    and again whenever this mount stores a newer one (`recordReaders(following:)`): a handle
///    reads what was written through this mount.
/// 2. A handle on a spool (a writer, or a reader of a file being written) is recorded with the
///    spool's path and what an upload of it would store: the ETag its bytes replace and the
///    node's attributes in stored form. It is recorded again when those change (an upload, a
///    chmod). Writes are not recorded one by one: a writer's spool counts as unstored, and a
///    spool file changed after its record was written later, so its time is the file's mtime.
/// 3. A handle's release is recorded after its spool's upload (the release's work), so that a
///    release the dead worker had read and not finished is done by the successor (RESEND).
/// 4. Under the files lock (one writer at a time). A full log, or one that holds many times
///    more records than handles open, is written again whole from `FileTables.recordedHandles`.
extension Filesystem {
    /// Records handle `number` as `adopted` says (under the files lock).
    func record(_ number: UInt64, _ adopted: AdoptedHandle, in f: inout FileTables) {
        guard let log = configuration.handleLog else { return }
        f.recordedHandles[number] = adopted
        f.handleLogRecords += 1
        if log.opened(number, adopted) {
            compactHandleLog(in: &f)
        } else {
            rewriteHandleLog(log, in: &f)
        }
    }

    /// Records that the kernel released handle `number`, if it was recorded (under the files lock).
    func recordRelease(_ number: UInt64, in f: inout FileTables) {
        guard let log = configuration.handleLog, f.recordedHandles.removeValue(forKey: number) != nil else { return }
        log.released(number)
        f.handleLogRecords += 1
        compactHandleLog(in: &f)
    }

    /// Writes the handle log again from what is open once it holds many times more records than
    /// that: every open and release appends, and a successor reads the whole log (`cat` of small
    /// files in a loop had it at 100 MiB of shared memory, read at each takeover).
    private func compactHandleLog(in f: inout FileTables) {
        guard let log = configuration.handleLog, f.handleLogRecords > 4_096 && f.handleLogRecords > 8 * f.recordedHandles.count
        else { return }
        rewriteHandleLog(log, in: &f)
    }

    private func rewriteHandleLog(_ log: any HandleLog, in f: inout FileTables) {
        log.restart()
        f.handleLogRecords = f.recordedHandles.count
        for (other, adopted) in f.recordedHandles where !log.opened(other, adopted) {
            logger.warning("the handle log is full: a worker that replaces this one will not know every open file")
            log.commit(false)
            return
        }
        log.commit(true)
    }

    /// The handles reading `node` from the store read the version this mount just stored from
    /// now on (subtlety 1): recorded so, for a successor, which would otherwise take them for
    /// handles of an older version.
    func recordReaders(following node: Node) {
        guard configuration.handleLog != nil else { return }
        let version = AdoptedHandle(inode: node.inode, key: node.key, size: node.size, etag: node.etag, manifest: node.manifest)
        files.withLock { f in
            for (number, handle) in f.handles.open {
                if case .remote(_, let inode, _) = handle, inode == node.inode { record(number, version, in: &f) }
            }
        }
    }

    /// Handle `number` on spool `open` (subtlety 2), before the reply that makes it known.
    func recordSpoolHandle(_ number: UInt64, _ open: SpoolFile, writable: Bool) {
        guard configuration.handleLog != nil else { return }
        withTables { s, f in
            guard f.handles[number] != nil else { return }
            record(number, spoolRecord(open, writable: writable, node: s.inodes[open.inode]), in: &f)
        }
    }

    /// Every handle on the spool of `inode` again: what its upload would store changed (an
    /// attribute change). Under the namespace lock (`s`).
    func recordSpoolHandles(of inode: InodeNumber, in s: inout NamespaceTables) {
        guard configuration.handleLog != nil else { return }
        files.withLock { f in
            guard let open = f.openFiles[inode] else { return }
            recordSpoolHandles(of: open, node: s.inodes[inode], in: &f)
        }
    }

    /// Every handle on `open` again, its node being `node` (under the files lock).
    func recordSpoolHandles(of open: SpoolFile, node: Node?, in f: inout FileTables) {
        guard configuration.handleLog != nil else { return }
        for (number, handle) in f.handles.open {
            guard case .spool(let attached, let writable) = handle, attached === open else { continue }
            record(number, spoolRecord(open, writable: writable, node: node), in: &f)
        }
    }

    private func spoolRecord(_ open: SpoolFile, writable: Bool, node: Node?) -> AdoptedHandle {
        let (base, dirty, size) = open.state.withLock { ($0.baseETag, $0.isDirty, $0.size) }
        let (contentType, metadata) = node.map { storedForm(of: $0) } ?? ("", [:])
        return AdoptedHandle(
            inode: open.inode, key: node?.key ?? "", size: size, etag: base, manifest: nil,
            spool: AdoptedSpool(
                path: open.path, writable: writable, dirty: writable || dirty, contentType: contentType,
                metadata: metadata, recordedAt: Timestamp.now()))
    }

    /// Takes over the file handles a dead worker left the kernel holding
    /// (`FilesystemConfiguration.adoptedHandles`).
    /// - A reader of a stored version reads the version it read. Its kernel pages count as
    ///   kept: a handle whose object changed since fails with ESTALE rather than go on in
    ///   another version. (A file removed since it was opened has no node: its handle reads the
    ///   version it read while the block cache or the server has it, as it did.)
    /// - A handle on a spool is attached to the same spool file, whose bytes are on disk; the
    ///   spool's node is described by the record (its object may not exist yet). A spool no
    ///   name leads to any more is a removed file's: it serves its handles and goes with them.
    ///   A spool with unstored bytes and no writer left is stored now.
    /// - A spool file that is gone (never, unless someone removed it) leaves its handles
    ///   failing: reads with ESTALE, a writer's close with EIO.
    func adoptHandles() {
        let adopted = configuration.adoptedHandles
        let owed = Set(adopted.values.compactMap { $0.spool }.filter(\.dirty).map(\.path)).union(spool.keptOwed)
        var spools: [String: SpoolFile?] = [:]
        for (number, record) in adopted.sorted(by: { $0.key < $1.key }) {
            let handle: FileHandle
            if let attachment = record.spool {
                if spools[attachment.path] == nil {
                    spools[attachment.path] = adoptSpool(record, attachment, dirty: owed.contains(attachment.path))
                }
                if let open = spools[attachment.path]!, open.state.withLock({ $0.attach(writable: attachment.writable) }) {
                    handle = .spool(open, writable: attachment.writable)
                } else {
                    handle = .lost(record.inode, key: record.key, writable: attachment.writable)
                }
            } else if record.isLost {
                handle = .lost(record.inode, key: record.key, writable: false)
            } else {
                let localVersion = names.withLock { $0.inodes[record.inode]?.localVersion } ?? 0
                handle = .remote(makeReader(record, keptPages: true), record.inode, localVersion: localVersion)
            }
            withTables { s, f in
                f.handles.adopt(number, handle)
                if case .spool(let open, let writable) = handle {
                    self.record(number, spoolRecord(open, writable: writable, node: s.inodes[open.inode]), in: &f)
                } else {
                    self.record(number, record, in: &f)
                }
            }
        }
        // Unstored bytes no writer will close: stored now, as a writer's close would have.
        for case let open? in spools.values where open.state.withLock({ $0.writers == 0 && $0.needsUpload }) {
            pool.submit { [self] in storeUnwritten(open, operation: "takeover") }
        }
    }

    /// The spool file a dead worker's handle was attached to, as a spool of this worker, or nil
    /// when it is gone. `dirty`: an upload of its bytes may be owed.
    private func adoptSpool(_ record: AdoptedHandle, _ attachment: AdoptedSpool, dirty: Bool) -> SpoolFile? {
        let fd = Glibc.open(attachment.path, O_RDWR | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else {
            logger.error(
                "the spool \(attachment.path) of an open file ('\(record.key)') is gone: \(String(cString: strerror(errno))); its descriptors fail")
            return nil
        }
        var st = stat()
        fstat(fd, &st)
        let size = Int64(st.st_size)
        let written = Timestamp(seconds: Int64(st.st_mtim.tv_sec), nanoseconds: Int32(st.st_mtim.tv_nsec))
        let open = SpoolFile(inode: record.inode, path: attachment.path, fd: fd, size: size, dirty: dirty, baseETag: record.etag)
        let askedAt = storeClock.tick()
        let recordedAt = Double(attachment.recordedAt.seconds) + Double(attachment.recordedAt.nanoseconds) / 1e9
        let named: Bool = withTables { s, f in
            guard f.openFiles[record.inode] == nil else { return false }
            f.openFiles[record.inode] = open
            let linked = s.inodes.undescribed.contains(record.inode) && s.inodes[record.inode]?.kind == .file
            guard linked || s.inodes.adoptUnlinked(record.inode, key: record.key), let node = s.inodes[record.inode] else {
                return false
            }
            let info = ObjectInfo(
                key: node.key, size: size, etag: record.etag, contentType: attachment.contentType, lastModified: recordedAt,
                metadata: attachment.metadata)
            _ = s.inodes.update(record.inode) { n in
                namespace.apply(info, askedAt: askedAt, to: &n)
                // Written after the record: the last write's time is the file's mtime.
                if written > attachment.recordedAt { n.stored.mtime = written }
                // Described by this mount, not by the store: no answer replaces it before an
                // upload is acknowledged.
                n.attributeVersion += 1
                n.localVersion += 1
            }
            s.inodes.markDescribed(record.inode)
            s.spools[record.inode] = open
            s.inodes.pin(record.inode)
            return linked
        }
        // No name leads to it any more (unlinked, replaced), or the name is another file now.
        if !named { _ = open.state.withLock { $0.remove() } }
        return open
    }
}
