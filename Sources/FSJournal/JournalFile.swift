import FSCore
import Locking

#if canImport(Glibc)
import Glibc
#endif

/// A journal's file as the journals use it (`DeleteJournal`, `UploadJournal`): appends, a sync
/// that makes them durable, and a whole replacement that is durable when it returns.
/// `DiskJournalFile` is the real one; the power-cut tests use a double that loses what was not
/// synced.
package protocol JournalFile: Sendable {
    /// What the file holds now.
    func contents() -> [UInt8]
    /// Appends `bytes` (one write); false when it could not.
    func append(_ bytes: [UInt8]) -> Bool
    /// Makes every append so far durable; false when it could not.
    func sync() -> Bool
    /// Replaces the whole file durably (a new file, synced, renamed over, its directory synced).
    func replace(with bytes: [UInt8]) -> Bool
}

/// An append-only journal file with group commit: `commit(upTo:)` makes appends durable with
/// one sync for every caller that arrived while the last sync ran (a leader and its followers),
/// so many closes or unlinks at once cost one `fdatasync`, not one each.
package final class AppendLog: Sendable {
    private struct Counts {
        /// Appends made, and the appends known durable.
        package var appended: UInt64 = 0
        package var synced: UInt64 = 0
        package var syncing = false
    }

    package let file: any JournalFile
    /// What the leader of a group runs to make the appends durable (by default the file's sync;
    /// the upload journal syncs the spool directory first).
    private let syncAll: @Sendable () -> Bool
    /// Appends and the group commit (a leaf lock; held across an append's write, never a sync).
    private let counts = ConditionLocked(Counts())

    package init(file: any JournalFile, sync: (@Sendable () -> Bool)? = nil) {
        self.file = file
        syncAll = sync ?? { file.sync() }
    }

    /// The number of the last append.
    package var appended: UInt64 { counts.withLock { $0.appended } }

    /// Appends `bytes` (one write) and runs `then` under the same lock, so that what it records
    /// is in the order of the file; returns the append's number for `commit`, or nil.
    package func append(_ bytes: [UInt8], then: () -> Void = {}) -> UInt64? {
        counts.withLock { c in
            guard file.append(bytes) else { return nil }
            c.appended += 1
            then()
            return c.appended
        }
    }

    /// Returns once append number `number` is durable; false when a sync failed.
    package func commit(upTo number: UInt64) -> Bool {
        // Waits while another caller's sync runs (it may cover this append); else leads one.
        let target = counts.withLock(when: { $0.synced >= number || !$0.syncing }) { c -> UInt64? in
            guard c.synced < number else { return nil }
            c.syncing = true
            return c.appended
        } ?? nil
        guard let target else { return true }
        let ok = syncAll()
        counts.withLock { c in
            if ok { c.synced = max(c.synced, target) }
            c.syncing = false
        }
        return ok
    }

    /// Replaces the whole file durably with `bytes`, unless something was appended after append
    /// number `number` (nil: whatever was appended); everything appended so far counts as
    /// durable then.
    package func replace(ifLastAppend number: UInt64? = nil, with bytes: [UInt8]) -> Bool {
        counts.withLock { c in
            guard number == nil || c.appended == number, file.replace(with: bytes) else { return false }
            c.synced = c.appended
            return true
        }
    }
}

/// A journal's file on disk.
package final class DiskJournalFile: JournalFile {
    package let path: String
    /// The descriptor (opened for appending on first use; -1 when closed).
    private let descriptor = Locked<Int32>(-1)

    package init(path: String) {
        self.path = path
    }

    deinit {
        descriptor.withLock { fd in if fd >= 0 { close(fd) } }
    }

    package func contents() -> [UInt8] {
        Spool.readBytes(path) ?? []
    }

    private func withDescriptor<T>(_ body: (Int32) -> T?) -> T? {
        descriptor.withLock { fd in
            if fd < 0 { fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600) }
            guard fd >= 0 else { return nil }
            return body(fd)
        }
    }

    package func append(_ bytes: [UInt8]) -> Bool {
        withDescriptor { fd in
            var done = 0
            while done < bytes.count {
                let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, bytes.count - done) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return false }
                done += n
            }
            return true
        } ?? false
    }

    package func sync() -> Bool {
        withDescriptor { fdatasync($0) == 0 } ?? false
    }

    package func replace(with bytes: [UInt8]) -> Bool {
        descriptor.withLock { fd in
            let temporary = path + ".new"
            let out = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard out >= 0 else { return false }
            let written = bytes.isEmpty ? 0 : bytes.withUnsafeBytes { write(out, $0.baseAddress, $0.count) }
            let synced = fsync(out) == 0
            close(out)
            guard written == bytes.count, synced, rename(temporary, path) == 0 else {
                unlink(temporary)
                return false
            }
            if fd >= 0 { close(fd) }
            fd = -1
            return Self.syncDirectory(of: path)
        }
    }

    /// fsync of the directory holding `path` (a rename in it is durable then).
    package static func syncDirectory(of path: String) -> Bool {
        let parent = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? "."
        let fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return fsync(fd) == 0
    }
}
