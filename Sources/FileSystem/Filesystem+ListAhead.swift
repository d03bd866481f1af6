import Dispatch
import FSCore
import FSFiles
import FSJournal
import FSNamespace
import Locking
import ObjectStore

/// Listings of subdirectories sent ahead of a walk (issue 20, part 2): `find`, `du`, `ls -R`
/// and rsync read a directory, then each directory in it in turn, and each of those readdirs
/// would wait for its own listing, one round trip after another. When a readdir completes a
/// listing from the server, the listings of the subdirectories it showed go out in the
/// background, `listAhead` at once, and the readdir of one of them takes its listing instead of
/// asking.
///
/// Subtleties:
/// 1. A listing fetched ahead is used only if nothing in the namespace changed through this
///    mount since it started (`DirectoryCache.generation`; a change anywhere drops them all, so
///    a directory renamed, removed or made since never shows what the old one held) and only
///    within `dir_timeout` of its start, as a remembered listing is. It is then remembered as a
///    listing that started when it is used (no change since), under DirectoryCache's rules.
/// 2. A readdir that finds its listing still running waits for it (at most
///    `lookupListingWait`); one that finds it queued lists by itself and the queued job is
///    dropped.
/// 3. Bounded: at most `listAheadWindow` listings running or fetched and not used yet (a
///    worker stops there, and a readdir that uses one starts it again, so a walk of thousands of
///    directories keeps its listings coming just ahead of it), fetched ones older than
///    `dir_timeout` dropped (no longer usable), at most `listAheadBacklogLimit` directories
///    waiting, and a directory larger than `listAheadEntryLimit` entries is left to its readdir.
///    Failures are dropped silently: the readdir lists by itself and reports its own error.
///    Once a listing expires unused, the walk is slower than its listings, and the window
///    follows its pace for `pacedSeconds`: half the directories whose listings it asked for
///    (readdirs, and lookups' listings: rsync reads no directory) in the last `dir_timeout`
///    (at least 2), so that what is fetched is used well before it expires.
///    (`du` of other tools' objects HEADs each file: 3 directories a second; a window of 256
///    fetched listings that expired unused, and every directory was listed twice, issue 38.)
/// 4. A directory's attributes live on its `dir/` marker, which the lookup before its readdir
///    HEADs (or takes from `prefetchMetadata`). A listing of `dir/` shows the marker too, so one
///    that does not show it answers that HEAD: no marker (the layout other tools leave), one
///    round trip fewer per directory.
/// 5. A listing of a parent made again (its own expired: a slow walk looks its subdirectories
///    up again as it goes into each) queues only the subdirectories after the one its walk last
///    read (within `lookupListingWindow`): the walk has passed the others. (`du` of 1 000
///    directories listed the first ones again each time, up to 6 times, issue 38.)
/// 6. A listing that expires unused (a walk slower than its listings: a walk listing's pages
///    hold a hundred directories each) is queued again, once, and fetched again as the window
///    reaches it: the walk's readdir takes it instead of listing by itself, and the lookup
///    before that readdir finds its marker's answer fresh instead of HEADing it.
extension Filesystem {
    static let listAheadBacklogLimit = 100_000
    static let listAheadEntryLimit = 10_000
    static let listAheadMinimumWindow = 2
    static let pacedSeconds: Double = 60

    struct AheadListing: Sendable {
        var entries: PackedEntries
        /// The `StoreClock` tick before its first request (the attribute rule).
        var askedAt: UInt64
        /// When it started (the configuration's clock) and the namespace generation then.
        var startedAt: Double
        var generation: UInt64
    }

    enum AheadSlot {
        case queued
        case running(DispatchGroup)
        case done(AheadListing)
    }

    struct AheadState {
        var slots: [ExactString: AheadSlot] = [:]
        /// Directories waiting, as batches (one per listing that showed them, in its order), the
        /// newest batch first: walkers go depth first, so a directory's subdirectories are read
        /// before the rest of its siblings (subtlety 3).
        var batches: [(entries: [DirectoryEntry], next: Int)] = []
        /// Directories waiting in all batches.
        var waiting = 0
        var workers = 0
        var stopped = false
        /// Listings running or fetched and not used yet (subtlety 3).
        var held = 0
        /// Entries in the fetched ones not used yet.
        var heldEntries = 0
        /// The flat listing of a subtree under way, if any (`Filesystem+WalkListing`; its scan
        /// lock is taken inside this one, never the other way).
        var walks: [WalkListing] = []
        /// Per directory, how many of its subdirectories' listings ahead readdirs used.
        var hits: [ExactString: Int] = [:]
        /// The fetched ones, oldest first, with when they started (some may be used already).
        var fetched: [(key: ExactString, startedAt: Double)] = []
        var fetchedNext = 0
        /// When the walk asked for a directory's listing (`readerFromListingAhead`), oldest
        /// first, those of the last `dir_timeout` from `reachedNext` on: its pace (subtlety 3).
        var reachedAt: [Double] = []
        var reachedNext = 0
        /// Directories whose listings expired unused and were queued again (subtlety 6).
        var requeued: Set<ExactString> = []
        /// Per parent directory, the subdirectory a readdir last read, and when (subtlety 5).
        var lastRead: [ExactString: (key: String, at: Double)] = [:]

        /// Notes that the walk asked for a directory's listing at `now`.
        mutating func noteReached(now: Double, maximumAge: Double) {
            reachedAt.append(now)
            while reachedNext < reachedAt.count, now - reachedAt[reachedNext] > maximumAge { reachedNext += 1 }
            if reachedNext > 1_024 && reachedNext * 2 > reachedAt.count {
                reachedAt.removeFirst(reachedNext)
                reachedNext = 0
            }
        }

        /// When a listing last expired unused (subtlety 3).
        var expiredAt = -Double.infinity

        /// Listings held at most: `limit`, or, for a while after a listing expired unused, half
        /// those the walk reached lately (at least `minimum`) (subtlety 3).
        func window(minimum: Int, limit: Int, now: Double) -> Int {
            guard now - expiredAt <= Filesystem.pacedSeconds else { return limit }
            return min(limit, max(minimum, (reachedAt.count - reachedNext) / 2))
        }

        /// Drops fetched listings that started more than `maximumAge` before `now`; those no
        /// readdir used are queued again, once (subtlety 6).
        mutating func expire(now: Double, maximumAge: Double) {
            var again: [DirectoryEntry] = []
            while fetchedNext < fetched.count, now - fetched[fetchedNext].startedAt > maximumAge {
                let (key, startedAt) = fetched[fetchedNext]
                fetchedNext += 1
                // (A later listing of the same directory has a record of its own.)
                guard take(key, startedAt: startedAt) else { continue }
                expiredAt = now
                if !stopped, waiting < Filesystem.listAheadBacklogLimit {
                    if requeued.count >= Filesystem.listAheadBacklogLimit { requeued = [] }
                    guard requeued.insert(key).inserted else { continue }
                    let name = key.string.dropLast().split(separator: "/", omittingEmptySubsequences: false).last.map(String.init) ?? ""
                    slots[key] = .queued
                    again.append(DirectoryBuilder.directory(name, key: key.string))
                }
            }
            if let last = batches.indices.last, let first = batches[last].entries.first, requeued.contains(first.key.exact) {
                // After those queued again before, which the walk reaches first.
                batches[last].entries += again
                waiting += again.count
            } else if !again.isEmpty {
                batches.append((again, 0))
                waiting += again.count
            }
            if fetchedNext > 1_024 && fetchedNext * 2 > fetched.count {
                fetched.removeFirst(fetchedNext)
                fetchedNext = 0
            }
        }

        /// Forgets `key`'s slot; once none is left, the table's room too (a walk of thousands of
        /// directories grew it, and a dictionary keeps its room when emptied).
        mutating func clear(_ key: ExactString) {
            slots[key] = nil
            if slots.isEmpty { slots = [:] }
        }

        /// Keeps a fetched listing of `key` until a readdir uses it.
        mutating func keep(_ key: ExactString, _ listing: AheadListing) {
            slots[key] = .done(listing)
            fetched.append((key, listing.startedAt))
            heldEntries += listing.entries.count
        }

        /// Takes the fetched listing of `key` that started at `startedAt` out, if it is still there.
        mutating func take(_ key: ExactString, startedAt: Double) -> Bool {
            guard case .done(let listing)? = slots[key], listing.startedAt == startedAt else { return false }
            clear(key)
            held -= 1
            heldEntries -= listing.entries.count
            return true
        }

        /// How many more workers may start, at most `width` in all.
        mutating func startable(width: Int) -> Int {
            let starting = max(0, min(width - workers, waiting))
            workers += starting
            return starting
        }

        /// The next directory waiting, newest batch first.
        mutating func nextWaiting() -> DirectoryEntry? {
            while let last = batches.indices.last {
                if batches[last].next < batches[last].entries.count {
                    defer { batches[last].next += 1 }
                    waiting -= 1
                    return batches[last].entries[batches[last].next]
                }
                batches.removeLast()
            }
            return nil
        }

        /// A readdir found a directory's listing still waiting: the walk is past the listings
        /// fetched, which hold the window (a walk gone deeper than the siblings fetched ahead):
        /// the oldest fetched one goes, so that the walk's next directories get listed.
        mutating func makeRoom() {
            while fetchedNext < fetched.count {
                let (key, startedAt) = fetched[fetchedNext]
                fetchedNext += 1
                if take(key, startedAt: startedAt) { return }
            }
        }
    }

    /// Queues the listings of the subdirectories among `entries` (a listing of `parent` just
    /// read from the server), oldest first, and starts workers up to `listAhead`. Not those whose
    /// own listing is remembered and fresh: a walk went through them already (the parent's
    /// listing, made again once its own expired, queued every one of them again).
    func listAhead(subdirectoriesOf entries: some Collection<DirectoryEntry>, in parent: InodeNumber) {
        let width = configuration.listAhead
        guard width > 0, configuration.directoryCacheSeconds > 0 else { return }
        let now = self.now()
        // Past the subdirectory the walk last read (subtlety 5).
        let passed: String? = entries.first.flatMap { first in
            listingsAhead.withLock { a in
                a.lastRead[Self.parentKey(of: first.key).exact].flatMap { now - $0.at <= Self.lookupListingWindow ? $0.key : nil }
            }
        }
        let listed = entries.lazy.filter { entry in
            entry.kind == .directory && passed.map { $0.utf8.lexicographicallyPrecedes(entry.key.utf8) } ?? true
        }
        guard !listed.isEmpty else { return }
        let directories: [DirectoryEntry] = state.withLock { s in
            listed.filter { directory in
                guard let node = s.inodes.child(parent, directory.name), node.kind == .directory else { return true }
                return s.directories.listing(node.inode, now: now, maximumAge: configuration.directoryCacheSeconds) == nil
            }
        }
        guard !directories.isEmpty else { return }
        let start: Int = listingsAhead.withLock { a in
            guard !a.stopped else { return 0 }
            var batch: [DirectoryEntry] = []
            for directory in directories
            where a.waiting + batch.count < Self.listAheadBacklogLimit && a.slots[directory.key.exact] == nil {
                a.slots[directory.key.exact] = .queued
                batch.append(directory)
            }
            if !batch.isEmpty {
                a.batches.append((batch, 0))
                a.waiting += batch.count
            }
            return a.startable(width: width)
        }
        startListAheadWorkers(start)
    }

    private func startListAheadWorkers(_ count: Int) {
        startWorkers(count, in: listingAhead, { [self] in runListAheadWorker() }) { listingsAhead.withLock { $0.workers -= 1 } }
    }

    private func runListAheadWorker() {
        while true {
            let now = self.now()
            let claimed: (DirectoryEntry, DispatchGroup)? = listingsAhead.withLock { a in
                a.expire(now: now, maximumAge: configuration.directoryCacheSeconds)
                // Far enough ahead: a readdir that uses a listing starts a worker again.
                let window = a.window(minimum: Self.listAheadMinimumWindow, limit: configuration.listAheadWindow, now: now)
                while !a.stopped && a.held < window, let directory = a.nextWaiting() {
                    // A readdir may have taken the directory over (subtlety 2).
                    guard case .queued? = a.slots[directory.key.exact] else { continue }
                    let group = DispatchGroup()
                    group.enter()
                    a.slots[directory.key.exact] = .running(group)
                    a.held += 1
                    return (directory, group)
                }
                a.workers -= 1
                return nil
            }
            guard let (directory, group) = claimed else { return }
            let listing = fetchAhead(directory)
            listingsAhead.withLock { a in
                let key = directory.key.exact
                guard case .running(let running)? = a.slots[key], running === group else {
                    a.held -= 1
                    return
                }
                if let listing {
                    a.keep(key, listing)
                } else {
                    a.clear(key)
                    a.held -= 1
                }
            }
            group.leave()
        }
    }

    /// The whole listing of `directory`, nil when it fails or is too large (subtlety 3). A
    /// listing without the directory's `dir/` marker also answers the marker's HEAD (subtlety 4).
    private func fetchAhead(_ directory: DirectoryEntry) -> AheadListing? {
        let prefix = directory.key
        let (generation, startedAt) = state.withLock { s in (s.directories.generation, now()) }
        let reader = DirectoryReader(
            store: store, prefix: prefix, pageSize: min(configuration.listPageSize, Self.listAheadEntryLimit + 1),
            hidden: nil, startedAt: 0, askedAt: storeClock.tick(), pagesAhead: false)
        let entries: PackedEntries
        do {
            guard let whole = try readWhole(reader, limit: Self.listAheadEntryLimit) else { return nil }
            entries = whole
        } catch {
            logger.debug("listing '\(prefix)' ahead of a walk failed: \(error.message)")
            return nil
        }
        if !reader.sawMarker { recordPrefetched(directory, answer: .some(nil), askedAt: reader.askedAt) }
        return AheadListing(entries: entries, askedAt: reader.askedAt, startedAt: startedAt, generation: generation)
    }

    /// A reader over the listing of `directory` fetched ahead (subtlety 1), nil when there is
    /// none that may be used; a queued one is dropped (subtlety 2) if `dropQueued` (a readdir,
    /// which lists by itself; a lookup asks about its name and leaves the job).
    func readerFromListingAhead(_ directory: Node, dropQueued: Bool = true) -> DirectoryReader? {
        guard configuration.listAhead > 0 else { return nil }
        let key = directory.key.exact
        let started = now()
        var slot = listingsAhead.withLock { a in
            // A step of the walk, by a readdir or by a lookup's listing (rsync reads no
            // directory): its pace (subtlety 3). Those expired are queued again now (subtlety 6):
            // the workers take them as the window moves on.
            a.noteReached(now: started, maximumAge: configuration.directoryCacheSeconds)
            a.expire(now: started, maximumAge: configuration.directoryCacheSeconds)
            return a.slots[key]
        }
        // A listing under way, or a walk listing that has not reached the directory yet.
        let deadline = DispatchTime.now() + Self.lookupListingWait
        var waitedForWalk = false
        while true {
            let group: DispatchGroup?
            switch slot {
            case .running(let running)?: group = running
            case nil:
                // The slot and the walk listing in one look: its page may have just filled it.
                let (current, walkPage) = listingsAhead.withLock { a in
                    (a.slots[key], a.slots[key] == nil && !waitedForWalk ? a.walks.lazy.compactMap { $0.willCover(directory.key) }.first : nil)
                }
                if current != nil {
                    slot = current
                    continue
                }
                // One page at most: a directory it does not reach is listed here.
                waitedForWalk = true
                group = walkPage
            default: group = nil
            }
            guard let group, group.wait(timeout: deadline) == .success else { break }
            slot = listingsAhead.withLock { $0.slots[key] }
        }
        guard let slot else { return nil }
        switch slot {
        case .running: return nil
        case .queued:
            let now = self.now()
            let (start, lanes): (Int, [WalkListing]) = listingsAhead.withLock { a in
                if dropQueued, case .queued? = a.slots[key] { a.clear(key) }
                a.expire(now: now, maximumAge: configuration.directoryCacheSeconds)
                if a.held >= a.window(minimum: Self.listAheadMinimumWindow, limit: configuration.listAheadWindow, now: now) {
                    a.makeRoom()
                }
                return a.stopped ? (0, []) : (a.startable(width: configuration.listAhead), resumableWalk(&a))
            }
            startListAheadWorkers(start)
            startWalkListing(lanes, new: false)
            return nil
        case .done(let listing):
            let (start, started, resumed): (Int, [WalkListing], [WalkListing]) = listingsAhead.withLock { a in
                // (Only this listing: the slot may hold a later one of the directory by now.)
                guard a.take(key, startedAt: listing.startedAt) else { return (0, [], []) }
                guard !a.stopped else { return (0, [], []) }
                let started = noteListingUsed(directory.key, in: &a)
                return (a.startable(width: configuration.listAhead), started, started.isEmpty ? resumableWalk(&a) : [])
            }
            startListAheadWorkers(start)
            startWalkListing(started)
            startWalkListing(resumed, new: false)
            return state.withLock { s in
                guard listing.generation == s.directories.generation,
                    now() - listing.startedAt <= configuration.directoryCacheSeconds
                else { return nil }
                return DirectoryReader(
                    prefix: directory.key, fetched: listing.entries,
                    removedHere: s.directories.removedHere(directory.inode, now: now()),
                    startedAt: s.directories.changeCount(directory.inode), askedAt: listing.askedAt)
            }
        }
    }

    /// A readdir of `directory` from its start: where the walk is among its parent's
    /// subdirectories (subtlety 5).
    func noteReaddir(of directory: Node) {
        guard configuration.listAhead > 0, directory.inode != Self.rootInode else { return }
        let now = self.now()
        listingsAhead.withLock { a in
            if a.lastRead.count > 1_000 { a.lastRead = [:] }
            a.lastRead[Self.parentKey(of: directory.key).exact] = (directory.key, now)
        }
    }

    /// Drops the fetched listings ahead of the directories at `keys` (nil: of every directory),
    /// which may no longer be true (`Filesystem+Poll`): their readdirs list again.
    func dropListingsAhead(of keys: [String]?) {
        listingsAhead.withLock { a in
            for key in keys?.map(\.exact) ?? Array(a.slots.keys) {
                if case .done(let listing)? = a.slots[key] { _ = a.take(key, startedAt: listing.startedAt) }
            }
        }
    }

    /// Waits until no listing ahead is queued or running (tests).
    func waitForListingsAhead() { listingAhead.wait() }

    func stopListingAhead() {
        listingsAhead.withLock { a in
            a.stopped = true
            a.slots = a.slots.filter { if case .queued = $0.value { false } else { true } }
            a.batches.removeAll()
            a.waiting = 0
            a.walks = []
        }
    }
}
