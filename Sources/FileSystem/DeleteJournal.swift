import Locking

#if canImport(Glibc)
import Glibc
#endif

/// One delete a write-back mount owes the store (docs/writeback-design.md, "Deletes").
struct DeleteEntry: Equatable, Sendable {
    enum Kind: UInt8, Sendable {
        /// A plain object: one DELETE, or a line of a bulk delete.
        case object = 0
        /// A file that may be a DLO manifest (listed with size 0, or known as one): read again
        /// first, and its parts deleted after it.
        case manifest = 1
        /// A directory's `dir/` marker; a `dir` object beside it goes too when it is a directory
        /// object (application/directory).
        case directory = 2
    }

    var sequence: UInt64
    var key: String
    /// The version this mount last saw (`version(etag:manifest:)`; "": unknown, delete
    /// whatever is there). Another client's newer version is not deleted (`DeleteQueue`).
    var etag: String
    var kind: Kind

    /// What names one version of an object: its ETag, or for a DLO manifest its part prefix
    /// (a DLO's ETag is computed over whatever parts are there when it is asked).
    static func version(etag: String, manifest: String?) -> String {
        manifest.map { manifestTag + $0 } ?? etag
    }

    static let manifestTag = "manifest:"
}

/// The journal's file as the delete journal uses it: appends, a sync that makes them durable,
/// and a whole replacement that is durable when it returns. `DiskJournalFile` is the real one;
/// the power-cut test uses a double that loses what was not synced.
protocol JournalFile: Sendable {
    /// What the file holds now.
    func contents() -> [UInt8]
    /// Appends `bytes` (one write); false when it could not.
    func append(_ bytes: [UInt8]) -> Bool
    /// Makes every append so far durable; false when it could not.
    func sync() -> Bool
    /// Replaces the whole file durably (a new file, synced, renamed over, its directory synced).
    func replace(with bytes: [UInt8]) -> Bool
}

/// The delete journal: an append-only file of records, `D` (a delete owed: sequence, kind,
/// ETag, key) and `X` (that sequence is done, or was given up before its unlink returned).
/// Fields end in NUL, which no key holds. What a crash cut short at the end is ignored.
///
/// Subtleties:
/// 1. Group commit: `commit(upTo:)` makes appends durable with one sync for every caller that
///    arrived while the last sync ran (leader and followers), so many unlinks at once cost one
///    `fdatasync`, not one each.
/// 2. A `D` record counts only once synced: an unlink returns after `commit`. One whose sync
///    failed gets an `X` before the unlink reports EIO, so a later mount does not delete a name
///    the application was told is still there.
/// 3. `X` records are synced before the key they free may be written again (`DeleteQueue`), so
///    a power cut never replays a delete over a newer version this mount stored.
/// 4. At open, the records left are read and the file is rewritten with only the deletes still
///    owed (compacted), before anything is appended.
final class DeleteJournal: Sendable {
    private struct Sync {
        /// Appends made, and the appends known durable.
        var appended: UInt64 = 0
        var synced: UInt64 = 0
        var syncing = false
    }

    let file: any JournalFile
    /// Appends and the group commit (a leaf lock; held across the append's write, never a sync).
    private let state = ConditionLocked(Sync())

    /// The deletes owed in `file` (oldest first); the file is compacted to them.
    let leftovers: [DeleteEntry]

    init(file: any JournalFile, adopting others: [any JournalFile] = []) {
        self.file = file
        var entries = Self.parse(file.contents())
        for other in others { entries += Self.parse(other.contents()) }
        // Renumbered in order: the adopted ones after this directory's own.
        var renumbered: [DeleteEntry] = []
        for (index, entry) in entries.enumerated() {
            var entry = entry
            entry.sequence = UInt64(index + 1)
            renumbered.append(entry)
        }
        leftovers = renumbered
        if !renumbered.isEmpty || !file.contents().isEmpty {
            _ = file.replace(with: renumbered.flatMap(Self.record))
        }
        for other in others { _ = other.replace(with: []) }
    }

    /// Appends the record of `entry`; returns the append's number for `commit`, or nil.
    func append(_ entry: DeleteEntry) -> UInt64? {
        append(Self.record(entry))
    }

    /// Appends `X` records for `sequences`; returns the append's number for `commit`, or nil.
    func appendDone(_ sequences: [UInt64]) -> UInt64? {
        guard !sequences.isEmpty else { return state.withLock { $0.appended } }
        return append(sequences.flatMap(Self.doneRecord))
    }

    private func append(_ bytes: [UInt8]) -> UInt64? {
        state.withLock { s in
            guard file.append(bytes) else { return nil }
            s.appended += 1
            return s.appended
        }
    }

    /// Returns once append number `number` is durable (subtlety 1); false when a sync failed.
    func commit(upTo number: UInt64) -> Bool {
        // Waits while another caller's sync runs (it may cover this append); else leads one.
        let target = state.withLock(when: { $0.synced >= number || !$0.syncing }) { s -> UInt64? in
            guard s.synced < number else { return nil }
            s.syncing = true
            return s.appended
        } ?? nil
        guard let target else { return true }
        let ok = file.sync()
        state.withLock { s in
            if ok { s.synced = max(s.synced, target) }
            s.syncing = false
        }
        return ok
    }

    /// Empties the file once nothing is owed, unless something was appended after append
    /// number `number` (the caller's last, which found nothing owed).
    func truncate(ifLastAppend number: UInt64) -> Bool {
        state.withLock { s in s.appended == number && file.replace(with: []) }
    }

    // MARK: Records

    static func record(_ entry: DeleteEntry) -> [UInt8] {
        Array("D\0\(entry.sequence)\0\(entry.kind.rawValue)\0\(entry.etag)\0\(entry.key)\0".utf8)
    }

    static func doneRecord(_ sequence: UInt64) -> [UInt8] {
        Array("X\0\(sequence)\0".utf8)
    }

    /// The deletes a journal's bytes still owe, oldest first. Parsing stops at the first record
    /// that is not whole (the end a crash cut short).
    static func parse(_ bytes: [UInt8]) -> [DeleteEntry] {
        var fields = bytes.split(separator: 0, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
        // The text after the last NUL is no whole field.
        fields.removeLast()
        var owed: [UInt64: DeleteEntry] = [:]
        var order: [UInt64] = []
        var index = 0
        parsing: while index < fields.count {
            switch fields[index] {
            case "D":
                guard index + 4 < fields.count, let sequence = UInt64(fields[index + 1]),
                    let raw = UInt8(fields[index + 2]), let kind = DeleteEntry.Kind(rawValue: raw),
                    !fields[index + 4].isEmpty
                else { break parsing }
                owed[sequence] = DeleteEntry(sequence: sequence, key: fields[index + 4], etag: fields[index + 3], kind: kind)
                order.append(sequence)
                index += 5
            case "X":
                guard index + 1 < fields.count, let sequence = UInt64(fields[index + 1]) else { break parsing }
                owed[sequence] = nil
                index += 2
            default:
                break parsing
            }
        }
        return order.compactMap { owed[$0] }
    }
}

/// The delete journal's file on disk.
final class DiskJournalFile: JournalFile {
    let path: String
    /// The descriptor (opened for appending on first use; -1 when closed).
    private let descriptor = Locked<Int32>(-1)

    init(path: String) {
        self.path = path
    }

    deinit {
        descriptor.withLock { fd in if fd >= 0 { close(fd) } }
    }

    func contents() -> [UInt8] {
        Spool.read(path).map { Array($0.utf8) } ?? []
    }

    private func withDescriptor<T>(_ body: (Int32) -> T?) -> T? {
        descriptor.withLock { fd in
            if fd < 0 { fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600) }
            guard fd >= 0 else { return nil }
            return body(fd)
        }
    }

    func append(_ bytes: [UInt8]) -> Bool {
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

    func sync() -> Bool {
        withDescriptor { fdatasync($0) == 0 } ?? false
    }

    func replace(with bytes: [UInt8]) -> Bool {
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
    static func syncDirectory(of path: String) -> Bool {
        let parent = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? "."
        let fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return fsync(fd) == 0
    }
}
