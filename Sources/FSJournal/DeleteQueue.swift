import FSCore
import Locking
import Logging
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

/// The deletes a write-back mount owes the store (docs/writeback-design.md, "Deletes"): an
/// unlink or rmdir of a stored name journals its delete (durable before it returns) and the
/// queue sends it later, in bulk where the server can, else one DELETE per key, several at once.
/// A later mount sends what a crash left in the journal.
///
/// Subtleties:
/// 1. Until its delete is done, a key is hidden from everything this mount asks of the store
///    (`JournaledStore`): listings, HEADs, emptiness checks, recovery.
/// 2. Order per name: the store is asked to write a key (PUT, COPY, POST) only after a delete
///    of that key owed earlier is done (`settle`), its `X` record synced; and a directory's
///    marker is deleted only after the deletes of the names below it that came before it.
/// 3. A failed send keeps the deletes queued, in order, and retries with backoff for as long as
///    it takes; it is logged once per streak, counted, and shown in `--status`.
/// 4. The sender reads the store through the raw store (not `JournaledStore`), which would
///    hide the very keys it deletes.
/// 5. A delete removes the version this mount saw: a key another client wrote after the unlink
///    (its ETag is not the one journaled) is left alone and logged. The check is a listing of
///    each directory's range of keys in the batch (a HEAD where it disagrees), so `rm -rf` of a
///    directory costs a listing and a bulk delete per batch; a write between the check and the
///    delete is still lost to it, as to any DELETE (Swift has no conditional one).
package final class DeleteQueue: Sendable {
    package struct Pending: Sendable {
        package var entry: DeleteEntry
        /// Journaled and synced: the sender may take it.
        package var durable: Bool
        /// When it was journaled (monotonic seconds).
        package var since: Double
    }

    package struct State {
        /// Deletes not sent yet, oldest first.
        package var queued: [Pending] = []
        /// Deletes being sent (by the sender or a `settle`).
        package var inFlight: [UInt64: Pending] = [:]
        /// The newest delete owed per key (queued or in flight): its sequence and the version
        /// it deletes.
        package var byKey: [ExactString: (sequence: UInt64, version: String)] = [:]
        package var nextSequence: UInt64 = 1
        /// Senders running.
        package var senders = 0
        /// Failures in a row (0: the last send worked), and the first error of the streak.
        package var failures = 0
        package var lastError: String? = nil
        /// No sender starts before this (a backoff after a failure).
        package var notBefore: Double = 0

        package func sendable() -> Bool { queued.contains { $0.durable } }
    }

    private let journal: DeleteJournal
    /// The store itself (subtlety 4).
    private let store: any ObjectStore
    private let pool: BackgroundPool
    private let logger: Logger
    /// Senders at once, and deletes per sender without bulk delete.
    private let width: Int
    /// Deletes the parts of a DLO manifest `key` pointed at (the uploader's).
    private let deleteParts: @Sendable (_ manifest: String, _ key: String) -> Void
    package let state = ConditionLocked(State())

    package init(
        journal: DeleteJournal, store: any ObjectStore, pool: BackgroundPool, width: Int, logger: Logger,
        deleteParts: @escaping @Sendable (String, String) -> Void
    ) {
        self.journal = journal
        self.store = store
        self.pool = pool
        self.width = max(1, width)
        self.logger = logger
        self.deleteParts = deleteParts
        let now = monotonicNow()
        state.withLock { s in
            for entry in journal.leftovers {
                s.queued.append(Pending(entry: entry, durable: true, since: now))
                s.byKey[entry.key.exact] = (entry.sequence, entry.etag)
            }
            s.nextSequence = (journal.leftovers.last?.sequence ?? 0) + 1
        }
        if !journal.leftovers.isEmpty {
            logger.notice("\(journal.leftovers.count) delete(s) an earlier mount journaled: sending them")
            kick()
        }
    }

    // MARK: What the mount asks

    /// Journals the delete of `key` (durable when this returns) and queues it. Throws EIO, with
    /// nothing owed, when the journal cannot be written.
    package func enqueue(key: String, etag: String, kind: DeleteEntry.Kind) throws(FSError) {
        let entry: DeleteEntry = state.withLock { s in
            let entry = DeleteEntry(sequence: s.nextSequence, key: key, etag: etag, kind: kind)
            s.nextSequence += 1
            s.queued.append(Pending(entry: entry, durable: false, since: monotonicNow()))
            s.byKey[key.exact] = (entry.sequence, etag)
            return entry
        }
        let durable = journal.append(entry).map { journal.commit(upTo: $0) } ?? false
        guard durable else {
            // Given up: an X so that no later mount deletes a name the caller keeps (DeleteJournal
            // subtlety 2), then nothing is owed.
            _ = journal.appendDone([entry.sequence])
            state.withLock { s in
                s.queued.removeAll { $0.entry.sequence == entry.sequence }
                if s.byKey[key.exact]?.sequence == entry.sequence { s.byKey[key.exact] = nil }
            }
            throw FSError(.ioError, "cannot journal the delete of '\(key)' in \(journalPath): the cache directory is not writable or full")
        }
        state.withLock { s in
            if let index = s.queued.firstIndex(where: { $0.entry.sequence == entry.sequence }) { s.queued[index].durable = true }
        }
        kick()
    }

    private var journalPath: String { (journal.file as? DiskJournalFile)?.path ?? "the delete journal" }

    /// Whether a delete of `key` is owed.
    package func isPending(_ key: String) -> Bool { pendingVersion(key) != nil }

    /// The version an owed delete of `key` removes ("": whatever is there), or nil when none is
    /// owed.
    package func pendingVersion(_ key: String) -> String? {
        state.withLock { $0.byKey.isEmpty ? nil : $0.byKey[key.exact]?.version }
    }

    /// Whether nothing is owed (cheap: listings ask it first).
    package var isEmpty: Bool { state.withLock { $0.byKey.isEmpty } }

    /// The owed deletes of keys starting with `prefix` (the prefix itself included): the
    /// version each removes.
    package func pendingVersions(withPrefix prefix: String) -> [ExactString: String] {
        state.withLock { s in
            s.byKey.isEmpty ? [:] : s.byKey.filter { $0.key.string.utf8.starts(with: prefix.utf8) }.mapValues(\.version)
        }
    }

    /// How many owed deletes are of keys starting with `prefix` (the prefix itself included).
    package func pendingCount(withPrefix prefix: String) -> Int {
        state.withLock { s in
            s.byKey.isEmpty ? 0 : s.byKey.keys.reduce(0) { n, key in n + (key.string.utf8.starts(with: prefix.utf8) ? 1 : 0) }
        }
    }

    /// Deletes owed now, and the age of the oldest (`--status`).
    package func backlog(now: Double = monotonicNow()) -> (count: Int, oldest: Double, lastError: String?) {
        state.withLock { s in
            let all = s.queued + Array(s.inFlight.values)
            return (all.count, all.map { now - $0.since }.max() ?? 0, s.failures > 0 ? s.lastError : nil)
        }
    }

    /// Sends the owed deletes of `key` (or of every key below `prefix`, when `below`) now, or
    /// waits for the thread that sends or journals them (subtlety 2): the caller writes there
    /// next. Throws when a delete it sent failed (it stays owed).
    package func settle(_ key: String, below: Bool = false) throws(FSError) {
        func matches(_ pending: Pending) -> Bool {
            below ? pending.entry.key.utf8.starts(with: key.utf8) : pending.entry.key.exact == key.exact
        }
        while true {
            let (taken, owed): ([Pending], Bool) = state.withLock { s in
                guard !s.byKey.isEmpty else { return ([], false) }
                let taken = s.queued.filter { $0.durable && matches($0) }
                s.queued.removeAll { $0.durable && matches($0) }
                for pending in taken { s.inFlight[pending.entry.sequence] = pending }
                return (taken, !taken.isEmpty || s.queued.contains(where: matches) || s.inFlight.values.contains(where: matches))
            }
            guard owed else { return }
            if taken.isEmpty {
                // Another thread sends it, or journals it: wait until it is done or durable.
                _ = state.withLock(when: { s in
                    !s.inFlight.values.contains(where: matches) && !s.queued.contains { !$0.durable && matches($0) }
                }) { _ in }
                continue
            }
            do {
                try send(taken)
            } catch {
                requeue(taken, error)
                throw FSError(storeError: error, operation: "delete before write", path: key)
            }
            finish(taken)
        }
    }

    /// Sends everything now (no backoff) and waits until nothing is owed or `timeout` passed;
    /// returns whether nothing is owed (fsync of a directory, `sync`, the drain at unmount).
    package func flush(timeout: Double) -> Bool {
        state.withLock { $0.notBefore = 0 }
        kick()
        return state.withLock(when: { $0.byKey.isEmpty || ($0.senders == 0 && $0.failures > 0) }, timeout: timeout) {
            $0.byKey.isEmpty
        } ?? false
    }

    // MARK: The sender

    /// Starts senders while there is sendable work (up to `width`, not during a backoff).
    package func kick() {
        let start: Int = state.withLock { s in
            guard monotonicNow() >= s.notBefore else { return 0 }
            let wanted = min(width, s.queued.count) - s.senders
            guard wanted > 0 else { return 0 }
            s.senders += wanted
            return wanted
        }
        for _ in 0..<start {
            if !pool.submit({ [self] in runSender() }) { state.withLock { $0.senders -= 1 } }
        }
    }

    private func runSender() {
        while let batch = takeBatch() {
            do {
                try send(batch)
                finish(batch)
            } catch {
                requeue(batch, error)
                break
            }
        }
        state.withLock { $0.senders -= 1 }
    }

    /// The next deletes to send together, oldest first (nil: none, or a backoff runs): up to
    /// the bulk limit (shared among senders), or one without bulk delete. A directory's marker
    /// waits while a name below it is in the batch or being sent (subtlety 2).
    private func takeBatch() -> [Pending]? {
        let limit = store.bulkDeleteLimit
        return state.withLock { s -> [Pending]? in
            guard monotonicNow() >= s.notBefore else { return nil }
            let size = limit.map { min($0, max(50, s.queued.count / width + 1)) } ?? 1
            var batch: [Pending] = []
            var taken: Set<UInt64> = []
            for pending in s.queued {
                if batch.count >= size { break }
                guard pending.durable else { continue }
                if pending.entry.kind == .directory {
                    let marker = pending.entry.key
                    let busy = (batch + Array(s.inFlight.values)).contains { other in
                        other.entry.key.utf8.count > marker.utf8.count && other.entry.key.utf8.starts(with: marker.utf8)
                    }
                    if busy { break }
                }
                batch.append(pending)
                taken.insert(pending.entry.sequence)
            }
            guard !batch.isEmpty else { return nil }
            s.queued.removeAll { taken.contains($0.entry.sequence) }
            for pending in batch { s.inFlight[pending.entry.sequence] = pending }
            return batch
        }
    }

    /// Sends `batch`: plain objects in one bulk delete where the server can, the rest one by one.
    /// A key another client wrote since this mount saw it is left alone (subtlety 5).
    private func send(_ batch: [Pending]) throws(ObjectStoreError) {
        var plain: [DeleteEntry] = []
        for pending in batch {
            let entry = pending.entry
            switch entry.kind {
            case .object: plain.append(entry)
            case .manifest: try deleteFile(entry)
            case .directory: try Self.deleteMarkers(entry.key, in: store)
            }
        }
        try deletePlain(try unchanged(plain))
    }

    /// The keys of `entries` whose object is still the version this mount saw (or is gone, or
    /// was not known): one listing over each directory's range of keys, and a HEAD for a key the
    /// listing shows with another ETag (a listing may lag behind this mount's own last write).
    private func unchanged(_ entries: [DeleteEntry]) throws(ObjectStoreError) -> [String] {
        var keys: [String] = []
        var byParent: [String: [DeleteEntry]] = [:]
        for entry in entries {
            if entry.etag.isEmpty {
                keys.append(entry.key)
            } else {
                byParent[Self.parent(of: entry.key), default: []].append(entry)
            }
        }
        for (_, group) in byParent {
            let listed = try etags(of: group.map(\.key))
            for entry in group {
                guard let current = listed[entry.key.exact], current != entry.etag else {
                    keys.append(entry.key)
                    continue
                }
                let now: String
                do {
                    now = try store.head(key: entry.key).etag
                } catch where error.code == .notFound {
                    continue
                }
                if now == entry.etag {
                    keys.append(entry.key)
                } else {
                    logger.warning(
                        "not deleting '\(entry.key)': another client stored a new version after this mount removed it")
                }
            }
        }
        return keys
    }

    /// What a listing says of `keys` (one directory's): their ETags, absent when not listed.
    private func etags(of keys: [String]) throws(ObjectStoreError) -> [ExactString: String] {
        let sorted = keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        guard let first = sorted.first, let last = sorted.last else { return [:] }
        let common = String(decoding: zip(first.utf8, last.utf8).prefix { $0 == $1 }.map(\.0), as: UTF8.self)
        let wanted = Set(keys.map(\.exact))
        var found: [ExactString: String] = [:]
        var marker: String? = nil
        repeat {
            let page = try store.list(prefix: common, delimiter: "/", marker: marker, limit: 10_000)
            for case .object(let summary) in page.entries where wanted.contains(summary.key.exact) {
                found[summary.key.exact] = summary.etag
            }
            marker = page.nextMarker
            if let name = page.entries.last?.name, last.utf8.lexicographicallyPrecedes(name.utf8) { break }
        } while marker != nil
        return found
    }

    package static func parent(of key: String) -> String {
        guard let slash = key.utf8.lastIndex(of: UInt8(ascii: "/")) else { return "" }
        return String(key[...slash])
    }

    private func deletePlain(_ plain: [String]) throws(ObjectStoreError) {
        if plain.count > 1, store.bulkDeleteLimit != nil {
            let failed = try store.bulkDelete(keys: plain)
            for key in failed { try deleteIgnoringAbsent(key) }
        } else {
            for key in plain { try deleteIgnoringAbsent(key) }
        }
    }

    private func deleteIgnoringAbsent(_ key: String) throws(ObjectStoreError) {
        do {
            try store.delete(key: key)
        } catch where error.code == .notFound {}
    }

    /// A file that may be a DLO manifest: read again, deleted (unless another client stored a
    /// new version meanwhile), then its parts.
    private func deleteFile(_ entry: DeleteEntry) throws(ObjectStoreError) {
        let info: ObjectInfo
        do {
            info = try store.head(key: entry.key)
        } catch where error.code == .notFound {
            return
        }
        if !entry.etag.isEmpty && DeleteEntry.version(etag: info.etag, manifest: info.manifest) != entry.etag {
            logger.warning("not deleting '\(entry.key)': another client stored a new version after this mount removed it")
            return
        }
        try deleteIgnoringAbsent(entry.key)
        if let manifest = info.manifest { deleteParts(manifest, entry.key) }
    }

    /// Deletes a directory's `dir/` marker, and a `dir` object only when it is a directory object
    /// (application/directory): a regular file `dir` beside the marker is another name.
    package static func deleteMarkers(_ prefix: String, in store: any ObjectStore) throws(ObjectStoreError) {
        do {
            try store.delete(key: prefix)
        } catch where error.code == .notFound {}
        let typed = String(prefix.dropLast())
        guard !typed.isEmpty else { return }
        let info: ObjectInfo
        do {
            info = try store.head(key: typed)
        } catch where error.code == .notFound {
            return
        }
        guard ObjectKey.isDirectoryContentType(info.contentType) else { return }
        do {
            try store.delete(key: typed)
        } catch where error.code == .notFound {}
    }

    /// The batch is done: its X records synced (DeleteJournal subtlety 3), then the keys freed.
    private func finish(_ batch: [Pending]) {
        let sequences = batch.map(\.entry.sequence)
        let number = journal.appendDone(sequences)
        if number == nil || !journal.commit(upTo: number!) {
            // Not durable: a later mount would send these again (harmless now, the keys are
            // gone), but also after this mount wrote one of them again.
            logger.error("cannot sync the delete journal \(journalPath): a crash now could delete names written again later")
        }
        let (recovered, empty): (Bool, Bool) = state.withLock { s in
            for pending in batch {
                s.inFlight[pending.entry.sequence] = nil
                if s.byKey[pending.entry.key.exact]?.sequence == pending.entry.sequence { s.byKey[pending.entry.key.exact] = nil }
            }
            let recovered = s.failures > 0
            s.failures = 0
            s.lastError = nil
            return (recovered, s.byKey.isEmpty && s.inFlight.isEmpty)
        }
        if recovered { logger.notice("deletes are being stored again") }
        if empty, let number { _ = journal.truncate(ifLastAppend: number) }
    }

    /// The batch failed: back to the front of the queue, in order; a retry after a backoff.
    private func requeue(_ batch: [Pending], _ error: ObjectStoreError) {
        let (first, delay): (Bool, Double) = state.withLock { s in
            for pending in batch { s.inFlight[pending.entry.sequence] = nil }
            s.queued = (s.queued + batch).sorted { $0.entry.sequence < $1.entry.sequence }
            s.failures += 1
            let first = s.failures == 1
            if first { s.lastError = error.message }
            let delay = min(30, 0.2 * Double(1 << min(s.failures - 1, 8))) * Double.random(in: 0.8...1.2)
            s.notBefore = monotonicNow() + delay
            return (first, delay)
        }
        if first {
            logger.warning("deleting \(batch.count) key(s) failed, retrying until it works: \(error.message)")
        }
        pool.submit(after: delay) { [self] in kick() }
    }
}
