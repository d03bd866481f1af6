import FSCore
import Locking
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

/// What earlier processes of this spool directory owed the store and left journaled: uploads
/// (a data file and its note) and attribute changes (a note). This mount stores them, oldest
/// first, in the background (`Filesystem.recoverPendingUploads`), and before it serves any name
/// involved: `JournaledStore` settles a key here before it HEADs, GETs or writes it, and the
/// keys a listing would show (or a directory it would show) before it lists.
///
/// Subtleties:
/// 1. A listing with a delimiter settles its direct children, and for each subdirectory that
///    only owed keys may create, the oldest upload below it (one is enough for the directory
///    to be listed). Without a delimiter (a directory rename, a flat walk) everything below.
/// 2. Each entry has a lock of its own, held while it is stored: a reader and the background
///    recovery never store it twice, and a reader waits for the upload it needs, not for all.
/// 3. Settling goes to the store through `JournaledStore` without this table (see
///    `Filesystem.recoveryStore`): the store calls a recovery makes must not wait for themselves.
/// 4. A failure leaves the entry owed: the caller gets the error (EIO for a stat or read, as
///    for any store failure), the background loop retries with backoff, and a mount that ends
///    first leaves the files for the next one.
package final class RecoveredWork: Sendable {
    package enum Item: Sendable {
        case upload(data: String, note: Spool.PendingUpload)
        case attributes(note: String, change: Spool.PendingUpload)

        package var key: String {
            switch self {
            case .upload(_, let note): return note.key
            case .attributes(_, let change): return change.key
            }
        }

        package var isUpload: Bool { if case .upload = self { return true } else { return false } }
    }

    package final class Entry: Sendable {
        package let item: Item
        /// Whether it is stored (or dropped, or moved to a conflict copy); held while storing.
        package let done = Locked(false)

        package init(_ item: Item) { self.item = item }
    }

    /// Stores one item; errors leave it owed.
    package typealias Perform = @Sendable (Item) throws(ObjectStoreError) -> Void

    private struct State {
        /// Owed entries by key, oldest first.
        package var byKey: [ExactString: [Entry]] = [:]
        package var perform: Perform?
        package var stopped = false
    }

    /// Every entry, oldest first (the background loop's order).
    package let entries: [Entry]
    private let state: ConditionLocked<State>

    package init(_ items: [Item]) {
        entries = items.map(Entry.init)
        var byKey: [ExactString: [Entry]] = [:]
        for entry in entries { byKey[entry.item.key.exact, default: []].append(entry) }
        state = ConditionLocked(State(byKey: byKey))
    }

    /// What earlier processes left owed, uploads first: each upload (a data file and its note)
    /// and each attribute note, except the notes an upload of the same name supersedes. Those
    /// are older than it: while a file has bytes to store, its attribute changes go into its
    /// upload's note (`Filesystem.setattr`), so an attribute note beside an upload note was
    /// written before the file was written again, and the upload carries what it says and
    /// what came after (a utimens while the file was open). Stored after the upload, the note
    /// would put older attributes back: the upload of the same bytes has the ETag the note was
    /// made on (core model seed 40061).
    package static func owed(
        uploads: [(data: String, note: Spool.PendingUpload)], attributes: [(note: String, change: Spool.PendingUpload)]
    ) -> (items: [Item], superseded: [(path: String, key: String)]) {
        let uploaded = Set(uploads.map(\.note.key.exact))
        var items = uploads.map { Item.upload(data: $0.data, note: $0.note) }
        var superseded: [(path: String, key: String)] = []
        for (note, change) in attributes {
            if uploaded.contains(change.key.exact) {
                superseded.append((note, change.key))
            } else {
                items.append(.attributes(note: note, change: change))
            }
        }
        return (items, superseded)
    }

    /// Installs how an item is stored (the filesystem, once it exists).
    package func install(_ perform: @escaping Perform) { state.withLock { $0.perform = perform } }

    /// Whether nothing is owed (cheap: every store call asks it first).
    package var isEmpty: Bool { state.withLock { $0.byKey.isEmpty } }

    /// How many entries are owed (`--status`, the drain).
    package var count: Int { state.withLock { $0.byKey.values.reduce(0) { $0 + $1.count } } }

    /// Stores what is owed under `key` itself.
    package func settle(_ key: String) throws(ObjectStoreError) {
        guard let owed = state.withLock({ $0.byKey.isEmpty ? nil : $0.byKey[key.exact] }) else { return }
        for entry in owed { try store(entry) }
    }

    /// Stores what a listing of `prefix` would show (subtlety 1).
    package func settle(listing prefix: String, delimiter: String?) throws(ObjectStoreError) {
        let owed: [Entry] = state.withLock { s in
            guard !s.byKey.isEmpty else { return [] }
            var direct: [Entry] = []
            var firstBelow: [ExactString: Entry] = [:]
            for entry in entries where s.byKey[entry.item.key.exact] != nil {
                let key = entry.item.key
                guard key.utf8.starts(with: prefix.utf8) else { continue }
                let rest = Substring(key.utf8.dropFirst(prefix.utf8.count))
                guard let delimiter, let directory = Self.through(delimiter, in: rest) else {
                    direct.append(entry)
                    continue
                }
                if entry.item.isUpload && firstBelow[String(directory).exact] == nil { firstBelow[String(directory).exact] = entry }
            }
            return direct + firstBelow.values
        }
        for entry in owed { try store(entry) }
    }

    /// `text` up to and including the first `delimiter`, nil without one.
    private static func through(_ delimiter: String, in text: Substring) -> Substring? {
        let bytes = text.utf8, mark = delimiter.utf8
        guard !mark.isEmpty else { return nil }
        var index = bytes.startIndex
        while index != bytes.endIndex {
            if bytes[index...].starts(with: mark) {
                return Substring(bytes[..<bytes.index(index, offsetBy: mark.count)])
            }
            index = bytes.index(after: index)
        }
        return nil
    }

    /// Stores `entry` unless it is stored already (subtlety 2).
    package func store(_ entry: Entry) throws(ObjectStoreError) {
        try entry.done.withLock { (done: inout Bool) throws(ObjectStoreError) in
            guard !done else { return }
            guard let perform = state.withLock({ $0.perform }) else {
                throw ObjectStoreError(.transient, "'\(entry.item.key)' is owed by an earlier mount and not stored yet")
            }
            try perform(entry.item)
            done = true
            state.withLock { s in
                s.byKey[entry.item.key.exact]?.removeAll { $0 === entry }
                if s.byKey[entry.item.key.exact]?.isEmpty == true { s.byKey[entry.item.key.exact] = nil }
            }
        }
    }

    /// Tries each owed entry once, now (the drain); errors leave them owed.
    package func storeOwed() {
        let owed = state.withLock { s in
            entries.filter { entry in s.byKey[entry.item.key.exact]?.contains { $0 === entry } == true }
        }
        for entry in owed { try? store(entry) }
    }

    /// Waits `seconds` before a retry; false once `stop` was called.
    package func pause(_ seconds: Double) -> Bool {
        _ = state.withLock(when: { $0.stopped }, timeout: seconds) { _ in }
        return !state.withLock { $0.stopped }
    }

    /// Ends the background loop's waits (shutdown).
    package func stop() { state.withLock { $0.stopped = true } }
}
