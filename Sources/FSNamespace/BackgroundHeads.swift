import BlockCache
import Dispatch
import FSCore
import Locking
import Logging
import ObjectStore

/// What the background HEADs need of the filesystem around them: the store and its clock, the
/// configuration (and its metadata index) and time, the pool, and the nodes the listed names
/// lead to (read and written under the filesystem's own lock).
package protocol BackgroundHeadsHost: NamespaceHost {
    /// The nodes the names of `entries` (in `parent`) lead to now, where of the entry's kind.
    func nodes(of entries: [DirectoryEntry], in parent: InodeNumber) -> [ExactString: InodeNumber]
    /// Hands a recorded answer to the node it was asked for, if the name still leads there.
    func applyPrefetched(_ job: PrefetchJob, answer: HeadAnswer)
}

/// Background HEADs: the metadata a listing cannot show.
///
/// A listing gives name, size, ETag, time and content type. That is everything for files csspfs
/// wrote (their attributes ride in the content type), but not for:
/// - zero-byte objects, which may be DLO manifests, and directories, whose attributes live on a
///   `dir/` marker object: after a listing is remembered, up to `metadataPrefetchLimit` of them
///   are HEADed in the background (`prefetchMetadata(of:in:)`);
/// - objects other tools wrote (*foreign*: no `cssp-mtime` in the content type), whose mtime and
///   mode are `X-Object-Meta-*` headers only a HEAD returns. With `foreign_attrs=head` their
///   HEADs follow the program instead of the listing (`prefetchAhead`): the first lookup of such
///   a file in a directory queues the next `prefetchWindow` ones of its listing, each later
///   lookup moves the window on, and a lookup in another directory drops what is queued for
///   the last one. `find` (names only) sends none; `ls -l`, `du` and rsync find each answer
///   ready or running. With `foreign_attrs=listing` they are never HEADed for their metadata.
/// `prefetchConcurrency` workers send them.
///
/// Subtleties:
/// 1. `ls -l` never waits for these HEADs in readdirplus: it sends the attributes known (the
///    listing's for csspfs's own files, an answer's for foreign ones), and a name alone where
///    only a HEAD would tell (the kernel looks it up). A lookup waits for a HEAD already running
///    for its name, and sends a queued one itself.
/// 2. A file's answer holds while the listing shows the same ETag and time (a POST of new
///    metadata changes the listing's time; a HEAD's whole-second time agrees with the listing's
///    of the same second), so a later listing of an unchanged directory sends no HEAD again.
///    A directory marker's answer holds for `directoryCacheSeconds`, like a listing.
/// 3. HEADs queued or running and answers are separate tables: answers are bounded
///    (`prefetchTableLimit`, `foreignTableLimit` for foreign files, whose answers are in the
///    index too and used within a moment; when full, all are dropped at once), the queue by the
///    window and by `metadataPrefetchLimit` per listing. (One table of both, with every answer
///    recorded while 50 000 HEADs waited, scanned the whole table at each answer: a walk of
///    100 000 foreign objects slowed to 40 names a second, issue 38.)
/// 4. Answers of foreign files also go to the metadata index (`MetadataIndex`, SQLite in
///    `cache_dir`), by key, ETag and time, so that a later mount needs no HEAD for an unchanged
///    object; a lookup or readdirplus asks the index before a HEAD.
///
/// This room owns its state (`heads`, behind its own lock) and its workers (`running`); the
/// filesystem (`BackgroundHeadsHost`) is passed to each call and never held.
package final class BackgroundHeads: Sendable {
    /// (16, not 8: `ls -l` of other tools' files waits on one HEAD after another. On loopback
    /// over s3:// 16 took `ls -l` of 10 000 from 47.2 s to 43.8-45.1 s; on a distant server,
    /// where each HEAD waits a round trip, what is in flight bounds the rate.)
    package static let prefetchConcurrency = 16
    package static let prefetchTableLimit = 50_000
    /// Foreign files' answers in memory: the window's are used within a moment, and every one
    /// is in the index too (a few hundred bytes each).
    package static let foreignTableLimit = 4_096
    /// Foreign files HEADed ahead of the program's lookups (subtlety above).
    package static let prefetchWindow = 64
    package static let markerRequeueSeconds: Double = 30
    /// Seconds between the first answer kept for the metadata index and its write.
    package static let indexFlushDelay: Double = 1

    /// The HEADs queued and running, their answers, and the window (lock 6 of the facade's
    /// LOCKING block: never taken together with the filesystem's `names` or `files`).
    package let heads = Locked(PrefetchState())
    /// The workers running.
    package let running = DispatchGroup()

    package init() {}

    /// Our own change of `keys`, or of every key below `prefixes`: what a HEAD said of them
    /// before is stale (a mode we just set must not come back from an older HEAD's answer).
    package func forgetPrefetched(keys: [String], prefixes: [String] = [], _ host: any BackgroundHeadsHost) {
        heads.withLock { p in
            func drop(_ key: ExactString) {
                if case .running? = p.pending[key] { p.stale.insert(key) } else { p.pending[key] = nil }
                p.answers[key] = nil
                p.foreignAnswers[key] = nil
            }
            for key in keys { drop(key.exact) }
            guard !prefixes.isEmpty else { return }
            func below(_ key: ExactString) -> Bool { prefixes.contains { key.string.utf8.starts(with: $0.utf8) } }
            for key in p.pending.keys where below(key) { drop(key) }
            for key in p.answers.keys where below(key) { drop(key) }
            for key in p.foreignAnswers.keys where below(key) { drop(key) }
        }
        if let index = host.configuration.metadataIndex, index.forget(keys: keys, prefixes: prefixes) { scheduleIndexFlush(index, host) }
    }

    /// Writes the index's changes a moment from now (a batch: `MetadataIndex` subtlety 2).
    private func scheduleIndexFlush(_ index: MetadataIndex, _ host: any BackgroundHeadsHost) {
        host.pool.submit(after: Self.indexFlushDelay) { index.flush() }
    }

    /// Whether a listed entry's attributes need a HEAD whatever the mode: a directory (its
    /// marker) or a zero-byte file (maybe a DLO manifest). Foreign files: `isForeign`.
    package static func needsMetadata(_ entry: DirectoryEntry) -> Bool {
        switch entry.kind {
        case .directory: return true
        case .symlink, .fifo, .socket: return false
        case .file: return entry.size == 0
        }
    }

    /// Whether a listed entry is another tool's file or symlink (svfs's: `application/link`):
    /// without csspfs's attributes in its content type, so that only a HEAD shows its mtime,
    /// mode and owner. (A zero-byte file is HEADed whatever its content type: `needsMetadata`.)
    package static func isForeign(_ entry: DirectoryEntry) -> Bool {
        (entry.kind == .file && entry.size > 0 || entry.kind == .symlink) && entry.parsedContentType.attributes.mtime == nil
    }

    /// Queues HEADs for the entries of a listing of `parent` that need one whatever the mode and
    /// have no answer yet (directories, zero-byte files).
    /// The subdirectories' markers only once per `markerRequeueSeconds` per directory: a walk
    /// slower than `dir_timeout` (one HEAD per foreign file) lists its parents again and again,
    /// and each listing queued a HEAD of every sibling's marker, expired since (17 000 marker
    /// HEADs in a `du` of 1 000 directories, issue 38). A lookup of a directory whose marker's
    /// answer expired asks by itself.
    package func prefetchMetadata(of entries: PackedEntries, in parent: InodeNumber, _ host: any BackgroundHeadsHost) {
        guard host.configuration.metadataPrefetchLimit > 0 else { return }
        let now = host.now()
        let markers: Bool = heads.withLock { p in
            if let last = p.markersQueued[parent], now - last < Self.markerRequeueSeconds { return false }
            if p.markersQueued.count >= Self.prefetchTableLimit { p.markersQueued.removeAll() }
            p.markersQueued[parent] = now
            return true
        }
        // (Lazily: only the entries queued are made.)
        let wanted = entries.indices.lazy.filter { entries.needsMetadata($0) && (markers || !entries.isDirectory($0)) }
        enqueue(wanted.map { entries[$0] }, in: parent, limit: host.configuration.metadataPrefetchLimit, host)
    }

    /// The program looked up the foreign file `key` in `parent` (listed at `listedAt`): unless
    /// it is in the first half of the window queued last, queues HEADs of the foreign files that
    /// follow it in `following` (the listing after it, in order; called with how many are
    /// wanted), up to `prefetchWindow` ahead, and drops the foreign files' HEADs still queued for
    /// another directory.
    package func prefetchAhead(
        of key: String, in parent: InodeNumber, listedAt: UInt64, following: (Int) -> [DirectoryEntry], _ host: any BackgroundHeadsHost
    ) {
        guard host.configuration.foreignAttributes == .head, host.configuration.metadataPrefetchLimit > 0 else { return }
        let due: Bool = heads.withLock { p in
            guard !p.stopped else { return false }
            if let window = p.window, window.parent == parent {
                // (A second pass starts before the window: due again.)
                return key.utf8.lexicographicallyPrecedes(window.start.string.utf8)
                    || !key.utf8.lexicographicallyPrecedes(window.refillAt.string.utf8)
            }
            // Another directory: the files queued for the last one are not needed any more.
            if let window = p.window {
                for job in p.queue[p.next...] where job.parent == window.parent && Self.isForeign(job.entry) {
                    p.dropQueued(job.entry.key.exact)
                }
            }
            return true
        }
        guard due else { return }
        let wanted = following(Self.prefetchWindow).filter(Self.isForeign)
        heads.withLock { p in
            // Refilled once the program passes the middle (or, at the listing's end, its end).
            let middle = wanted.isEmpty ? key : wanted[wanted.count / 2].key
            p.window = (parent, key.exact, middle.exact)
        }
        guard !wanted.isEmpty else { return }
        enqueue(wanted, in: parent, limit: Self.prefetchWindow, known: indexedAnswers(for: wanted, listedAt: listedAt, host), host)
    }

    /// Queues a HEAD for each of `wanted` (in `parent`) without an answer or one on its way, up
    /// to `limit` new ones; `known`: answers the index holds, recorded instead.
    private func enqueue(
        _ wanted: some Collection<DirectoryEntry>, in parent: InodeNumber, limit: Int,
        known: [ExactString: HeadAnswer] = [:], _ host: any BackgroundHeadsHost
    ) {
        guard limit > 0, !wanted.isEmpty else { return }
        let now = host.now()
        let targets = host.nodes(of: Array(wanted), in: parent)
        let start: Int = heads.withLock { p in
            guard !p.stopped else { return 0 }
            if p.next == p.queue.count {
                p.queue.removeAll(keepingCapacity: true)
                p.next = 0
            }
            // The limit counts new HEADs only: answers kept from earlier listings are free, so
            // repeated listings of a large directory work through it.
            var queued = 0
            for entry in wanted {
                if queued >= limit { break }
                let key = entry.key.exact
                if p.pending[key] != nil { continue }
                if let answer = p.answer(entry), isValid(entry, answer, now: now, host) { continue }
                if let head = known[key] {
                    Self.record(&p, entry, head: head, now: now)
                    continue
                }
                queued += 1
                p.pending[key] = .queued
                p.queue.append(PrefetchJob(parent: parent, entry: entry, inode: targets[entry.name.exact]))
            }
            let idle = Self.prefetchConcurrency - p.workers
            let starting = max(0, min(idle, p.queue.count - p.next))
            p.workers += starting
            return starting
        }
        host.pool.startWorkers(start, in: running, { [self] in runPrefetchWorker(host) }) { heads.withLock { $0.workers -= 1 } }
    }

    /// Whether `answer` describes what `entry` lists (subtlety 2).
    package func isValid(_ entry: DirectoryEntry, _ answer: PrefetchAnswer, now: Double, _ host: any BackgroundHeadsHost) -> Bool {
        entry.kind == .directory
            ? now - answer.at <= host.configuration.directoryCacheSeconds
            : answer.etag == entry.etag && answer.listed.agrees(with: entry.lastModified)
    }

    private func runPrefetchWorker(_ host: any BackgroundHeadsHost) {
        while true {
            let claimed: (PrefetchJob, DispatchGroup)? = heads.withLock { p in
                while p.next < p.queue.count && !p.stopped {
                    let job = p.queue[p.next]
                    p.next += 1
                    // A lookup may have taken the job over, or a window moved away from it.
                    guard case .queued? = p.pending[job.entry.key.exact] else { continue }
                    let group = DispatchGroup()
                    group.enter()
                    p.pending[job.entry.key.exact] = .running(group)
                    return (job, group)
                }
                p.workers -= 1
                return nil
            }
            guard let (job, group) = claimed else { return }
            let askedAt = host.storeClock.tick()
            let answer = headForPrefetch(job.entry, host)
            finishPrefetch(job, answer: answer, askedAt: askedAt, group: group, host)
        }
    }

    /// HEAD of a listed entry: `.some(nil)` when there is no such object, nil on any other error.
    private func headForPrefetch(_ entry: DirectoryEntry, _ host: any BackgroundHeadsHost) -> ObjectInfo?? {
        do {
            return .some(try host.store.head(key: entry.key))
        } catch where error.code == .notFound {
            return .some(nil)
        } catch {
            host.logger.debug("background HEAD of '\(entry.key)' failed: \(error)")
            return nil
        }
    }

    /// Records `head` as the answer for `entry`, dropping every answer once the table is full.
    private static func record(_ p: inout PrefetchState, _ entry: DirectoryEntry, head: HeadAnswer, now: Double) {
        let answer = PrefetchAnswer(head: head, etag: entry.etag, listed: entry.lastModified, at: now)
        if isForeign(entry) {
            if p.foreignAnswers.count >= foreignTableLimit { p.foreignAnswers.removeAll() }
            p.foreignAnswers[entry.key.exact] = answer
        } else {
            if p.answers.count >= prefetchTableLimit { p.answers.removeAll() }
            p.answers[entry.key.exact] = answer
        }
    }

    /// Records the answer of a HEAD of a listed entry (nil: the HEAD failed). A file's answer is
    /// kept only if it describes the listed object (a zero-byte one may be a DLO manifest, whose
    /// HEAD names the parts' ETag). A foreign file's goes to the metadata index too.
    @discardableResult
    package func recordPrefetched(
        _ entry: DirectoryEntry, answer: ObjectInfo??, askedAt: UInt64, fromWorker: Bool = false, _ host: any BackgroundHeadsHost
    ) -> Bool {
        let now = host.now()
        let kept: Bool = heads.withLock { p in
            let key = entry.key.exact
            if fromWorker, p.stale.remove(key) != nil {
                p.pending[key] = nil
                return false
            }
            p.pending[key] = nil
            if let answer, entry.kind == .directory || entry.size == 0 || answer?.etag == entry.etag {
                Self.record(&p, entry, head: HeadAnswer(info: answer, askedAt: askedAt), now: now)
            } else {
                // Failed, or the object changed since the listing.
                p.answers[key] = nil
                p.foreignAnswers[key] = nil
            }
            return true
        }
        if kept, case let info?? = answer, info.etag == entry.etag, Self.isForeign(entry),
            let index = host.configuration.metadataIndex, index.record(info, listed: entry.lastModified)
        {
            scheduleIndexFlush(index, host)
        }
        return kept
    }

    /// Records a HEAD's answer, wakes waiters, and hands the answer to a node the kernel knows.
    private func finishPrefetch(_ job: PrefetchJob, answer: ObjectInfo??, askedAt: UInt64, group: DispatchGroup, _ host: any BackgroundHeadsHost) {
        let recorded = recordPrefetched(job.entry, answer: answer, askedAt: askedAt, fromWorker: true, host)
        group.leave()
        guard recorded, let answer else { return }
        host.applyPrefetched(job, answer: HeadAnswer(info: answer, askedAt: askedAt))
    }

    /// The background HEAD's answer for `entry` (or, for a foreign file, the index's, as asked
    /// at `listedAt`: when the listing that showed the entry was). With `wait`, waits for a HEAD
    /// that is running and takes a queued one out of the queue (`.yours`).
    package func prefetchedMetadata(_ entry: DirectoryEntry, wait: Bool, listedAt: UInt64? = nil, _ host: any BackgroundHeadsHost) -> PrefetchResult {
        let now = host.now()
        let key = entry.key.exact
        let (pending, answer): (PrefetchPending?, PrefetchAnswer?) = heads.withLock { p in
            let pending = p.pending[key]
            if wait, case .queued? = pending { p.pending[key] = nil }
            return (pending, p.answer(entry))
        }
        switch pending {
        case .running(let group)? where wait:
            group.wait()
            return prefetchedMetadata(entry, wait: false, listedAt: listedAt, host)
        case .queued? where wait:
            return .yours
        default:
            if let answer, isValid(entry, answer, now: now, host) { return .known(answer.head) }
            // (Not kept in memory: the index answers as fast, and readdirplus, which asks it
            // most, describes the node at once.)
            if let listedAt, Self.isForeign(entry), let head = indexedAnswers(for: [entry], listedAt: listedAt, host)[key] {
                return .known(head)
            }
            return .unknown
        }
    }

    /// What the metadata index holds for the foreign files `entries`, valid for the version
    /// each lists, as answers asked at `listedAt`, when the listing that showed them was: the
    /// index's answer is as recent as that listing, no more (a node described since, by a newer
    /// version or a change of ours, refuses it under the attribute rule).
    package func indexedAnswers(for entries: [DirectoryEntry], listedAt: UInt64, _ host: any BackgroundHeadsHost) -> [ExactString: HeadAnswer] {
        guard let index = host.configuration.metadataIndex, !entries.isEmpty else { return [:] }
        return index.answers(for: entries).mapValues { HeadAnswer(info: $0, askedAt: listedAt) }
    }

    /// Drops the queued HEADs of the markers the walk listing's `lanes` will show: they would
    /// only race it.
    package func forgetQueuedMarkerHeads(coveredBy lanes: [WalkListing]) {
        heads.withLock { p in
            let covered = p.pending.keys.filter { key in
                guard case .queued? = p.pending[key], key.string.utf8.last == UInt8(ascii: "/") else { return false }
                return lanes.contains { $0.holds(key.string) }
            }
            for key in covered { p.pending[key] = nil }
        }
    }

    /// Returns when every background HEAD queued so far has ended (tests).
    package func waitUntilIdle() { running.wait() }

    /// Drops queued HEADs and queues no more (unmount). Does not wait for the few running: they
    /// are optional, and a server that stopped answering would hold the exit for their retries.
    package func stop() {
        heads.withLock { p in
            p.stopped = true
            p.pending = p.pending.filter { if case .queued = $0.value { false } else { true } }
            p.queue.removeAll()
            p.next = 0
        }
    }
}

package struct PrefetchJob: Sendable {
    package var parent: InodeNumber
    package var entry: DirectoryEntry
    /// The node the name led to when the job was queued (nil: none of the entry's kind): the
    /// answer may reach only that node, and only as the attribute rule admits it (the HEAD
    /// counts as asked when it is sent).
    package var inode: InodeNumber?
}

package enum PrefetchPending {
    case queued
    case running(DispatchGroup)
}

package struct PrefetchAnswer: Sendable {
    /// The HEAD's answer (nil info: no such object, meaning no marker for a directory).
    package var head: HeadAnswer
    /// The listed ETag and time it belongs to, and when it came (the configuration's clock).
    package var etag: String
    package var listed: Timestamp
    package var at: Double
}

package struct PrefetchState {
    package var pending: [ExactString: PrefetchPending] = [:]
    /// Answers for directories and zero-byte files, and for foreign files: two tables, so
    /// that the many answers of a walk's files never drop its few directories' (subtlety 3).
    package var answers: [ExactString: PrefetchAnswer] = [:]
    package var foreignAnswers: [ExactString: PrefetchAnswer] = [:]

    package func answer(_ entry: DirectoryEntry) -> PrefetchAnswer? {
        BackgroundHeads.isForeign(entry) ? foreignAnswers[entry.key.exact] : answers[entry.key.exact]
    }
    package var queue: [PrefetchJob] = []
    package var next = 0
    package var workers = 0
    package var stopped = false
    /// Keys we changed while a HEAD of them was running: its answer describes the old object.
    package var stale: Set<ExactString> = []
    /// When a listing of each directory last queued its subdirectories' markers.
    package var markersQueued: [InodeNumber: Double] = [:]
    /// The directory whose foreign files the window follows, the key it started at, and the
    /// key from which a lookup refills it.
    package var window: (parent: InodeNumber, start: ExactString, refillAt: ExactString)? = nil

    /// Takes a queued job out of the queue's bookkeeping (it stays in `queue`, skipped).
    package mutating func dropQueued(_ key: ExactString) {
        if case .queued? = pending[key] { pending[key] = nil }
    }
}

package enum PrefetchResult {
    /// What the HEAD said (`info` nil: no such object), and when it was asked.
    case known(HeadAnswer)
    /// The HEAD was queued and is now the caller's to send (and to `recordPrefetched`).
    case yours
    /// No answer, and none coming.
    case unknown
}
