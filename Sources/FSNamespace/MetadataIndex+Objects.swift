import BlockCache
import FSCore
import ObjectStore

/// The metadata index (`BlockCache.MetadataIndex`) in the filesystem's terms: HEAD answers for
/// listed versions (ETag and time).
extension MetadataIndex {
    /// Keeps what a HEAD said of the version listed with time `listed`; true when a flush is due.
    package func record(_ info: ObjectInfo, listed: Timestamp) -> Bool {
        record(Record(info, listed: PackedEntries.nanoseconds(listed) ?? 0))
    }

    /// The answers kept for the versions `wanted` lists (same ETag and size, times that agree:
    /// `Timestamp.agrees`), by key.
    package func answers(for wanted: [DirectoryEntry]) -> [ExactString: ObjectInfo] {
        var answers: [ExactString: ObjectInfo] = [:]
        for (entry, record) in zip(wanted, lookup(wanted.map(\.key))) {
            guard let record, record.info.etag == entry.etag, record.info.size == entry.size,
                PackedEntries.timestamp(record.listed).agrees(with: entry.lastModified)
            else { continue }
            answers[entry.key.exact] = record.info
        }
        return answers
    }
}
