import Dispatch
import ObjectStore
import Synchronization

/// Background HEADs after a listing: the metadata a listing cannot show.
///
/// A listing gives name, size, ETag, time and content type. That is everything for files csspfs
/// wrote (their attributes ride in the content type), but not for:
/// - objects other tools wrote, whose mtime and mode are `X-Object-Meta-*` headers only a HEAD returns;
/// - zero-byte objects, which may be DLO manifests;
/// - directories, whose attributes live on a `dir/` marker object.
/// After a listing is remembered, up to `metadataPrefetchLimit` such entries are HEADed by
/// `prefetchConcurrency` background workers, so that the `stat`s and lookups which follow find
/// the answer instead of each sending a HEAD in turn.
///
/// Subtleties:
/// 1. `ls -l` never waits for these HEADs: readdirplus sends the listing's attributes, or the
///    HEAD's if it is already known. A lookup waits for a HEAD already running for its name, and
///    sends a queued one itself (the queue is then one worker wider).
/// 2. A file's answer holds while the listing shows the same ETag and time (a POST of new
///    metadata changes the listing's time), so a later listing of an unchanged directory sends no
///    HEAD again. A directory marker's answer holds for `directoryCacheSeconds`, like a listing.
/// 3. The table of answers is bounded (`prefetchTableLimit`); when full, every answer is dropped.
///    HEADs sent by lookups and readdir collisions feed it too, also with `meta_prefetch=0`.
extension Filesystem {
    static let prefetchConcurrency = 4
    static let prefetchTableLimit = 50_000

    struct PrefetchJob: Sendable {
        var parent: InodeNumber
        var entry: DirectoryEntry
        /// The node the name led to when the job was queued (nil: none of the entry's kind): the
        /// answer may reach only that node, and only as the attribute rule admits it (the HEAD
        /// counts as asked when it is sent).
        var inode: InodeNumber?
    }

    enum PrefetchSlot {
        case queued
        case running(DispatchGroup)
        /// The HEAD's answer (nil: no such object, meaning no marker for a directory).
        case done(HeadAnswer, etag: String, listed: Timestamp, at: Double)
    }

    struct PrefetchState {
        var slots: [ExactString: PrefetchSlot] = [:]
        var queue: [PrefetchJob] = []
        var next = 0
        var workers = 0
        var stopped = false
        /// Keys we changed while a HEAD of them was running: its answer describes the old object.
        var stale: Set<ExactString> = []
    }

    /// Our own change of `keys`, or of every key below `prefixes`: what a HEAD said of them
    /// before is stale (a mode we just set must not come back from an older HEAD's answer).
    func forgetPrefetched(keys: [String], prefixes: [String] = []) {
        prefetch.withLock { p in
            func drop(_ key: String) {
                if case .running? = p.slots[key.exact] { p.stale.insert(key.exact) } else { p.slots[key.exact] = nil }
            }
            for key in keys { drop(key) }
            guard !prefixes.isEmpty else { return }
            for key in p.slots.keys where prefixes.contains(where: { key.string.utf8.starts(with: $0.utf8) }) { drop(key.string) }
        }
    }

    /// Drops every answer once the table is full (queued and running HEADs stay).
    private static func bound(_ p: inout PrefetchState) {
        guard p.slots.count >= prefetchTableLimit else { return }
        p.slots = p.slots.filter { if case .done = $0.value { false } else { true } }
    }

    /// Whether a listed entry's attributes need a HEAD (see the type's notes).
    static func needsMetadata(_ entry: DirectoryEntry) -> Bool {
        switch entry.kind {
        case .directory: return true
        case .symlink, .fifo, .socket: return false
        case .file: return entry.size == 0 || entry.parsedContentType.attributes.mtime == nil
        }
    }

    /// Queues HEADs for the entries of a listing of `parent` that need one and have no answer yet.
    func prefetchMetadata(of entries: PackedEntries, in parent: InodeNumber) {
        guard configuration.metadataPrefetchLimit > 0 else { return }
        // (Lazily: only the entries queued are made.)
        prefetchMetadata(wanted: entries.indices.lazy.filter(entries.needsMetadata).map { entries[$0] }, in: parent)
    }

    private func prefetchMetadata(wanted: some Collection<DirectoryEntry>, in parent: InodeNumber) {
        let limit = configuration.metadataPrefetchLimit
        guard limit > 0 else { return }
        let now = self.now()
        guard !wanted.isEmpty else { return }
        let targets: [ExactString: InodeNumber] = state.withLock { s in
            var targets: [ExactString: InodeNumber] = [:]
            for entry in wanted {
                if let node = s.inodes.child(parent, entry.name), node.kind == entry.kind { targets[entry.name.exact] = node.inode }
            }
            return targets
        }
        let start: Int = prefetch.withLock { p in
            guard !p.stopped else { return 0 }
            Self.bound(&p)
            if p.next == p.queue.count {
                p.queue.removeAll(keepingCapacity: true)
                p.next = 0
            }
            // The limit counts new HEADs only: answers kept from earlier listings are free, so
            // repeated listings of a large directory work through it.
            var queued = 0
            for entry in wanted {
                if queued >= limit { break }
                switch p.slots[entry.key.exact] {
                case .queued?, .running?: continue
                case .done(_, let etag, let listed, let at)?:
                    if isValid(entry, etag: etag, listed: listed, at: at, now: now) { continue }
                case nil: break
                }
                queued += 1
                p.slots[entry.key.exact] = .queued
                p.queue.append(PrefetchJob(parent: parent, entry: entry, inode: targets[entry.name.exact]))
            }
            let idle = Self.prefetchConcurrency - p.workers
            let starting = max(0, min(idle, p.queue.count - p.next))
            p.workers += starting
            return starting
        }
        startWorkers(start, in: prefetching, { [self] in runPrefetchWorker() }) { prefetch.withLock { $0.workers -= 1 } }
    }

    /// Starts `count` workers running `body` on the pool, each inside `group`; `unstarted`
    /// takes back the count of one the pool refused (it is shutting down).
    func startWorkers(
        _ count: Int, in group: DispatchGroup, _ body: @escaping @Sendable () -> Void, unstarted: () -> Void
    ) {
        for _ in 0..<count {
            group.enter()
            let started = pool.submit {
                body()
                group.leave()
            }
            if !started {
                unstarted()
                group.leave()
            }
        }
    }

    private func isValid(_ entry: DirectoryEntry, etag: String, listed: Timestamp, at: Double, now: Double) -> Bool {
        entry.kind == .directory
            ? now - at <= configuration.directoryCacheSeconds
            : etag == entry.etag && listed == entry.lastModified
    }

    private func runPrefetchWorker() {
        while true {
            let claimed: (PrefetchJob, DispatchGroup)? = prefetch.withLock { p in
                while p.next < p.queue.count && !p.stopped {
                    let job = p.queue[p.next]
                    p.next += 1
                    // A lookup may have taken the job over (its slot is then no longer queued).
                    guard case .queued? = p.slots[job.entry.key.exact] else { continue }
                    let group = DispatchGroup()
                    group.enter()
                    p.slots[job.entry.key.exact] = .running(group)
                    return (job, group)
                }
                p.workers -= 1
                return nil
            }
            guard let (job, group) = claimed else { return }
            let askedAt = storeClock.tick()
            let answer = headForPrefetch(job.entry)
            finishPrefetch(job, answer: answer, askedAt: askedAt, group: group)
        }
    }

    /// HEAD of a listed entry: `.some(nil)` when there is no such object, nil on any other error.
    private func headForPrefetch(_ entry: DirectoryEntry) -> ObjectInfo?? {
        do {
            return .some(try store.head(key: entry.key))
        } catch where error.code == .notFound {
            return .some(nil)
        } catch {
            logger.debug("background HEAD of '\(entry.key)' failed: \(error)")
            return nil
        }
    }

    /// Records the answer of a HEAD of a listed entry (nil: the HEAD failed). A file's answer is
    /// kept only if it describes the listed object (a zero-byte one may be a DLO manifest, whose
    /// HEAD names the parts' ETag).
    @discardableResult
    func recordPrefetched(_ entry: DirectoryEntry, answer: ObjectInfo??, askedAt: UInt64, fromWorker: Bool = false) -> Bool {
        prefetch.withLock { p in
            if fromWorker, p.stale.remove(entry.key.exact) != nil {
                p.slots[entry.key.exact] = nil
                return false
            }
            Self.bound(&p)
            if let answer, entry.kind == .directory || entry.size == 0 || answer?.etag == entry.etag {
                p.slots[entry.key.exact] = .done(
                    HeadAnswer(info: answer, askedAt: askedAt), etag: entry.etag, listed: entry.lastModified, at: now())
            } else {
                p.slots[entry.key.exact] = nil  // failed, or the object changed since the listing
            }
            return true
        }
    }

    /// Records a HEAD's answer, wakes waiters, and hands the answer to a node the kernel knows.
    private func finishPrefetch(_ job: PrefetchJob, answer: ObjectInfo??, askedAt: UInt64, group: DispatchGroup) {
        let recorded = recordPrefetched(job.entry, answer: answer, askedAt: askedAt, fromWorker: true)
        group.leave()
        guard recorded, let answer else { return }
        applyPrefetched(job, answer: HeadAnswer(info: answer, askedAt: askedAt))
    }

    /// Hands a recorded answer to the node it was asked for. This runs after `recordPrefetched`,
    /// in a critical section of its own: a rename, mkdir or rmdir may run in between, and its
    /// `forgetPrefetched` finds the answer recorded, not running, so nothing marks it stale.
    /// Hence the check that the name still leads to the same node.
    func applyPrefetched(_ job: PrefetchJob, answer: HeadAnswer) {
        let entry = job.entry
        state.withLock { s in
            // The node the listed name leads to now, if it is the node the HEAD was asked for
            // and still describes the listed object.
            guard let node = s.inodes.child(job.parent, entry.name), node.inode == job.inode, node.kind == entry.kind,
                node.key.isSameKey(as: entry.key), s.openFiles[node.inode] == nil
            else { return }
            s.inodes.update(node.inode) { node in
                switch entry.kind {
                case .directory:
                    node.merge(entry, listedAt: 0, head: answer, fresh: false, now: now())
                case .file, .symlink, .fifo, .socket:
                    guard let info = answer.info, info.etag == node.etag else { return }
                    apply(info, askedAt: answer.askedAt, to: &node)
                }
            }
        }
    }

    enum PrefetchAnswer {
        /// What the HEAD said (`info` nil: no such object), and when it was asked.
        case known(HeadAnswer)
        /// The HEAD was queued and is now the caller's to send (and to `recordPrefetched`).
        case yours
        /// No answer, and none coming.
        case unknown
    }

    /// The background HEAD's answer for `entry`. With `wait`, waits for a HEAD that is running and
    /// takes a queued one out of the queue (`.yours`).
    func prefetchedMetadata(_ entry: DirectoryEntry, wait: Bool) -> PrefetchAnswer {
        let now = self.now()
        let slot: PrefetchSlot? = prefetch.withLock { p in
            let slot = p.slots[entry.key.exact]
            if wait, case .queued? = slot { p.slots[entry.key.exact] = nil }
            return slot
        }
        switch slot {
        case .done(let info, let etag, let listed, let at)?:
            return isValid(entry, etag: etag, listed: listed, at: at, now: now) ? .known(info) : .unknown
        case .running(let group)? where wait:
            group.wait()
            return prefetchedMetadata(entry, wait: false)
        case .queued? where wait:
            return .yours
        default:
            return .unknown
        }
    }

    /// `prefetchedMetadata(entry, wait: true)` for a lookup: a directory's marker may come from
    /// a walk listing under way (or one its lookup starts) instead of a HEAD of its own.
    func prefetchedMetadataForLookup(_ entry: DirectoryEntry) -> PrefetchAnswer {
        if entry.kind == .directory {
            if case .known(let answer) = prefetchedMetadata(entry, wait: false) { return .known(answer) }
            awaitMarkerFromWalk(entry)
        }
        return prefetchedMetadata(entry, wait: true)
    }

    /// Drops the queued HEADs of the markers the walk listing's `lanes` will show: they would
    /// only race it.
    func forgetQueuedMarkerHeads(coveredBy lanes: [WalkListing]) {
        prefetch.withLock { p in
            let covered = p.slots.keys.filter { key in
                guard case .queued? = p.slots[key], key.string.utf8.last == UInt8(ascii: "/") else { return false }
                return lanes.contains { $0.holds(key.string) }
            }
            for key in covered { p.slots[key] = nil }
        }
    }

    /// Returns when every background HEAD queued so far has ended (tests).
    public func waitForPrefetch() {
        prefetching.wait()
    }

    /// Drops queued HEADs and queues no more (unmount). Does not wait for the few running: they
    /// are optional, and a server that stopped answering would hold the exit for their retries.
    public func stopPrefetching() {
        prefetch.withLock { p in
            p.stopped = true
            p.slots = p.slots.filter { if case .queued = $0.value { false } else { true } }
            p.queue.removeAll()
            p.next = 0
        }
    }
}
