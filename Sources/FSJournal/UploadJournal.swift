import FSCore
import Locking

#if canImport(Glibc)
import Glibc
#endif

/// The upload journal of a spool directory (`uploads.journal`): what each data file beside it
/// is owed, as an append-only file of records. `U` (a data file's note: where its bytes go and
/// how they are stored, `Spool.PendingUpload`) and `R` (that data file is owed nothing any more,
/// its bytes kept). The last record of a data file counts; a record of a data file that is gone
/// counts for nothing (a spool is removed by deleting its data file). What a crash cut short at
/// the end is ignored.
///
/// Subtleties:
/// 1. Why one file and not a note beside each spool: a note is rewritten at every close, chmod,
///    touch and rename of a queued file, and a note written whole (a new file renamed over the
///    old) makes and frees an inode each time. On ext4 that allocation scans recently freed
///    inodes (`recently_deleted`): half of the daemon's CPU in an rsync into a write-back mount.
///    Appends make no inode, and one `fdatasync` covers every close of a group (`AppendLog`).
/// 2. A sync also syncs the spool directory first when a data file was made in it since the
///    last sync (`dataFileMade`): the data file's name is what the record points at.
/// 3. Compaction: once the file holds more than `compactBytes` and four times what is still
///    owed, it is replaced (durably) with the last record of each data file still there, in
///    order. At open it is compacted to what earlier processes left.
/// 4. Order: leftovers come oldest first, by their last record (a note rewritten is younger).
package final class UploadJournal: Sendable {
    package static let fileName = "uploads.journal"
    package static let compactBytes = 1 << 20

    private struct Owed {
        /// The data files owed something, with the order and the bytes of their last record.
        package var notes: [String: (order: UInt64, record: [UInt8])] = [:]
        package var nextOrder: UInt64 = 0
        /// The file's size, and the bytes of the records in `notes`.
        package var size = 0
        package var owedBytes = 0
    }

    package let directory: String
    private let log: AppendLog
    private let owed = Locked(Owed())
    /// Data files made in the directory, and those whose names a sync made durable.
    private let made = Locked((made: UInt64(0), synced: UInt64(0)))

    /// The data files an earlier process left a note for (name, note), oldest first.
    package let leftovers: [(name: String, note: Spool.PendingUpload)]

    /// Opens the journal of `directory` in `file`, keeping only the notes of data files that
    /// exist (`exists`, by name) and compacting the file to them.
    package init(directory: String, file: any JournalFile, exists: (String) -> Bool) {
        self.directory = directory
        let found = Self.parse(file.contents()).filter { exists($0.name) }
        leftovers = Self.decoded(found)
        var start = Owed()
        for (name, bytes) in found {
            let record = Self.record(name, note: bytes)
            start.notes[name] = (start.nextOrder, record)
            start.nextOrder += 1
            start.size += record.count
        }
        start.owedBytes = start.size
        let records = found.flatMap { Self.record($0.name, note: $0.note) }
        if !records.isEmpty || !file.contents().isEmpty { _ = file.replace(with: records) }
        owed.withLock { $0 = start }
        let made = self.made
        log = AppendLog(file: file) {
            let target = made.withLock { $0.made }
            if made.withLock({ $0.synced }) != target {
                guard DiskJournalFile.syncDirectory(of: directory + "/" + Self.fileName) else { return false }
                made.withLock { $0.synced = max($0.synced, target) }
            }
            return file.sync()
        }
    }

    /// A data file was made in the directory: the next sync makes its name durable.
    package func dataFileMade() {
        made.withLock { $0.made += 1 }
    }

    /// Records `note` as what data file `name` is owed; with `sync`, returns once it is durable
    /// (with every note before it). False when it could not be written or synced.
    package func write(_ name: String, note: Spool.PendingUpload, sync: Bool) -> Bool {
        let record = Self.record(name, note: note.encoded)
        let number = log.append(record) {
            owed.withLock { o in
                let before = o.notes[name]?.record.count ?? 0
                o.notes[name] = (o.nextOrder, record)
                o.nextOrder += 1
                o.size += record.count
                o.owedBytes += record.count - before
            }
        }
        guard let number else { return false }
        compactIfLarge()
        return !sync || log.commit(upTo: number)
    }

    /// Records that data file `name` is owed nothing any more (its bytes stay).
    package func remove(_ name: String) {
        let record = Array("R\0\(name)\0".utf8)
        _ = log.append(record) {
            owed.withLock { o in
                o.owedBytes -= o.notes.removeValue(forKey: name)?.record.count ?? 0
                o.size += record.count
            }
        }
    }

    /// Makes every record so far durable.
    package func sync() -> Bool {
        log.commit(upTo: log.appended)
    }

    /// The number of records appended (tests count the notes written with it).
    package var appended: UInt64 { log.appended }

    /// Subtlety 3.
    private func compactIfLarge() {
        guard owed.withLock({ $0.size > Self.compactBytes && $0.size > 4 * $0.owedBytes }) else { return }
        let last = log.appended
        let kept = owed.withLock { o -> [UInt8] in
            o.notes = o.notes.filter { name, _ in access(directory + "/" + name, F_OK) == 0 }
            return o.notes.values.sorted { $0.order < $1.order }.flatMap(\.record)
        }
        // Not if a record came meanwhile (the next write tries again).
        if log.replace(ifLastAppend: last, with: kept) {
            owed.withLock { o in
                o.size = kept.count
                o.owedBytes = kept.count
            }
        }
    }

    // MARK: Records

    /// The notes `parse` found, decoded (one that does not decode is dropped).
    package static func decoded(_ notes: [(name: String, note: [UInt8])]) -> [(name: String, note: Spool.PendingUpload)] {
        notes.compactMap { name, bytes in
            Spool.PendingUpload(decoding: String(decoding: bytes, as: UTF8.self)).map { (name, $0) }
        }
    }

    /// `U`, the data file's name, the note's length in bytes, the note (which holds NULs).
    package static func record(_ name: String, note: [UInt8]) -> [UInt8] {
        Array("U\0\(name)\0\(note.count)\0".utf8) + note
    }

    /// The notes of a journal's bytes: the last of each data file, oldest first. Parsing stops at
    /// the first record that is not whole (the end a crash cut short).
    package static func parse(_ bytes: [UInt8]) -> [(name: String, note: [UInt8])] {
        var notes: [String: (order: Int, note: [UInt8])] = [:]
        var index = 0
        var order = 0
        /// The field from `index` to the next NUL, moving past it; nil when there is no NUL.
        func field() -> String? {
            guard let end = bytes[index...].firstIndex(of: 0) else { return nil }
            defer { index = end + 1 }
            return String(decoding: bytes[index..<end], as: UTF8.self)
        }
        parsing: while index < bytes.count {
            let start = index
            switch field() {
            case "U":
                guard let name = field(), !name.isEmpty, let length = field().flatMap(Int.init),
                    length >= 0, index + length <= bytes.count
                else { break parsing }
                notes[name] = (order, Array(bytes[index..<index + length]))
                index += length
            case "R":
                guard let name = field() else { break parsing }
                notes[name] = nil
            default:
                index = start
                break parsing
            }
            order += 1
        }
        return notes.sorted { $0.value.order < $1.value.order }.map { ($0.key, $0.value.note) }
    }
}
