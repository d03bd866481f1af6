import FSCore
import Locking

#if canImport(Glibc)
import Glibc
#endif

/// One delete a write-back mount owes the store (docs/writeback-design.md, "Deletes").
package struct DeleteEntry: Equatable, Sendable {
    package enum Kind: UInt8, Sendable {
        /// A plain object: one DELETE, or a line of a bulk delete.
        case object = 0
        /// A file that may be a DLO manifest (listed with size 0, or known as one): read again
        /// first, and its parts deleted after it.
        case manifest = 1
        /// A directory's `dir/` marker; a `dir` object beside it goes too when it is a directory
        /// object (application/directory).
        case directory = 2
    }

    package var sequence: UInt64
    package var key: String
    /// The version this mount last saw (`version(etag:manifest:)`; "": unknown, delete
    /// whatever is there). Another client's newer version is not deleted (`DeleteQueue`).
    package var etag: String
    package var kind: Kind

    /// What names one version of an object: its ETag, or for a DLO manifest its part prefix
    /// (a DLO's ETag is computed over whatever parts are there when it is asked).
    package static func version(etag: String, manifest: String?) -> String {
        manifest.map { manifestTag + $0 } ?? etag
    }

    package static let manifestTag = "manifest:"
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
package final class DeleteJournal: Sendable {
    /// The file and its group commit.
    private let log: AppendLog
    package var file: any JournalFile { log.file }

    /// The deletes owed in `file` (oldest first); the file is compacted to them.
    package let leftovers: [DeleteEntry]

    package init(file: any JournalFile, adopting others: [any JournalFile] = []) {
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
        log = AppendLog(file: file)
    }

    /// Appends the record of `entry`; returns the append's number for `commit`, or nil.
    package func append(_ entry: DeleteEntry) -> UInt64? {
        log.append(Self.record(entry))
    }

    /// Appends `X` records for `sequences`; returns the append's number for `commit`, or nil.
    package func appendDone(_ sequences: [UInt64]) -> UInt64? {
        guard !sequences.isEmpty else { return log.appended }
        return log.append(sequences.flatMap(Self.doneRecord))
    }

    /// Returns once append number `number` is durable (subtlety 1); false when a sync failed.
    package func commit(upTo number: UInt64) -> Bool {
        log.commit(upTo: number)
    }

    /// Empties the file once nothing is owed, unless something was appended after append
    /// number `number` (the caller's last, which found nothing owed).
    package func truncate(ifLastAppend number: UInt64) -> Bool {
        log.replace(ifLastAppend: number, with: [])
    }

    // MARK: Records

    package static func record(_ entry: DeleteEntry) -> [UInt8] {
        Array("D\0\(entry.sequence)\0\(entry.kind.rawValue)\0\(entry.etag)\0\(entry.key)\0".utf8)
    }

    package static func doneRecord(_ sequence: UInt64) -> [UInt8] {
        Array("X\0\(sequence)\0".utf8)
    }

    /// The deletes a journal's bytes still owe, oldest first. Parsing stops at the first record
    /// that is not whole (the end a crash cut short).
    package static func parse(_ bytes: [UInt8]) -> [DeleteEntry] {
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
