import Dispatch
import FSCore
import Locking
import Logging
import ObjectStore

/// What the listings ahead need of the filesystem around them: the store and its clock, the
/// configuration and time, the namespace's tables (read under the filesystem's own lock), and
/// the background HEADs of directory markers (`BackgroundHeads`).
package protocol ListingsAheadHost: NamespaceHost, ListingResolver {
    /// Of `directories`, subdirectories of `parent`, those whose own listing is not remembered
    /// and fresh at `now`.
    func withoutFreshListings(_ directories: [DirectoryEntry], in parent: InodeNumber, now: Double) -> [DirectoryEntry]
    /// The namespace's generation (`DirectoryCache.generation`) and the time, read together.
    func namespaceGeneration() -> (generation: UInt64, now: Double)
    /// A reader over `listing`, fetched ahead for `directory`, if it may still be used: nothing
    /// changed in the namespace since it started, and it is within `dir_timeout` (subtlety 1).
    func reader(over listing: AheadListing, of directory: Node) -> DirectoryReader?
    /// Records that `directory` has no `dir/` marker: what its HEAD asked at `askedAt` would say.
    func recordNoMarker(_ directory: DirectoryEntry, askedAt: UInt64)
    /// Drops the queued background HEADs of the markers `lanes` will show (WalkListing subtlety 5).
    func forgetQueuedMarkerHeads(coveredBy lanes: [WalkListing])
}

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
///    directories listed the first ones again each time, up to 6 times, issue 38.) They wait
///    behind its subdirectories queued before (`AheadState.enqueue`), and those queued again
///    (subtlety 6) go in the walk's order: served first, the walk's last directories were
///    fetched while its next ones waited, and expired unused.
/// 6. A listing that expires unused (a walk slower than its listings: a walk listing's pages
///    hold a hundred directories each) is queued again, once, and fetched again as the window
///    reaches it: the walk's readdir takes it instead of listing by itself, and the lookup
///    before that readdir finds its marker's answer fresh instead of HEADing it.
///
/// This room owns its state (`ahead`, behind its own lock) and its workers (`running`); the
/// filesystem (`ListingsAheadHost`) is passed to each call and never held.
package final class ListingsAhead: Sendable {
    package static let listAheadBacklogLimit = 100_000
    package static let listAheadEntryLimit = 10_000
    package static let listAheadMinimumWindow = 2
    package static let pacedSeconds: Double = 60
    /// A second name looked up in a directory within this many seconds lists the directory.
    package static let lookupListingWindow: Double = 30
    /// The longest a readdir or lookup waits for a listing under way.
    package static let lookupListingWait: DispatchTimeInterval = .seconds(2)

    /// The listings queued, running and fetched, and the walk listings (lock: taken alone, or
    /// with a walk listing's `scan` inside it).
    package let ahead = Locked(AheadState())
    /// The workers and walk listings running.
    package let running = DispatchGroup()

    package init() {}

    /// Queues the listings of the subdirectories among `entries` (a listing of `parent` just
    /// read from the server), oldest first, and starts workers up to `listAhead`. Not those whose
    /// own listing is remembered and fresh: a walk went through them already (the parent's
    /// listing, made again once its own expired, queued every one of them again).
    package func listAhead(subdirectoriesOf entries: some Collection<DirectoryEntry>, in parent: InodeNumber, _ host: any ListingsAheadHost) {
        let width = host.configuration.listAhead
        guard width > 0, host.configuration.directoryCacheSeconds > 0 else { return }
        let now = host.now()
        // Past the subdirectory the walk last read (subtlety 5).
        let passed: String? = entries.first.flatMap { first in
            ahead.withLock { a in
                a.lastRead[Self.parentKey(of: first.key).exact].flatMap { now - $0.at <= Self.lookupListingWindow ? $0.key : nil }
            }
        }
        let listed = entries.lazy.filter { entry in
            entry.kind == .directory && passed.map { $0.utf8.lexicographicallyPrecedes(entry.key.utf8) } ?? true
        }
        guard !listed.isEmpty else { return }
        let directories = host.withoutFreshListings(Array(listed), in: parent, now: now)
        guard !directories.isEmpty else { return }
        let start: Int = ahead.withLock { a in
            guard !a.stopped else { return 0 }
            var batch: [DirectoryEntry] = []
            for directory in directories
            where a.waiting + batch.count < Self.listAheadBacklogLimit && a.slots[directory.key.exact] == nil {
                a.slots[directory.key.exact] = .queued
                batch.append(directory)
            }
            a.enqueue(batch, afterSiblings: passed != nil)
            return a.startable(width: width)
        }
        startListAheadWorkers(start, host)
    }

    private func startListAheadWorkers(_ count: Int, _ host: any ListingsAheadHost) {
        host.pool.startWorkers(count, in: running, { [self] in runListAheadWorker(host) }) { ahead.withLock { $0.workers -= 1 } }
    }

    private func runListAheadWorker(_ host: any ListingsAheadHost) {
        while true {
            let now = host.now()
            let claimed: (DirectoryEntry, DispatchGroup)? = ahead.withLock { a in
                a.expire(now: now, maximumAge: host.configuration.directoryCacheSeconds)
                // Far enough ahead: a readdir that uses a listing starts a worker again.
                let window = a.window(minimum: Self.listAheadMinimumWindow, limit: host.configuration.listAheadWindow, now: now)
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
            let listing = fetchAhead(directory, host)
            ahead.withLock { a in
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
    private func fetchAhead(_ directory: DirectoryEntry, _ host: any ListingsAheadHost) -> AheadListing? {
        let prefix = directory.key
        let (generation, startedAt) = host.namespaceGeneration()
        let reader = DirectoryReader(
            store: host.store, prefix: prefix, pageSize: min(host.configuration.listPageSize, Self.listAheadEntryLimit + 1),
            hidden: nil, startedAt: 0, askedAt: host.storeClock.tick(), pagesAhead: false)
        let entries: PackedEntries
        do {
            guard let whole = try reader.readWhole(limit: Self.listAheadEntryLimit, resolvingWith: host) else { return nil }
            entries = whole
        } catch {
            host.logger.debug("listing '\(prefix)' ahead of a walk failed: \(error.message)")
            return nil
        }
        if !reader.sawMarker { host.recordNoMarker(directory, askedAt: reader.askedAt) }
        return AheadListing(entries: entries, askedAt: reader.askedAt, startedAt: startedAt, generation: generation)
    }

    /// A reader over the listing of `directory` fetched ahead (subtlety 1), nil when there is
    /// none that may be used; a queued one is dropped (subtlety 2) if `dropQueued` (a readdir,
    /// which lists by itself; a lookup asks about its name and leaves the job).
    package func readerFromListingAhead(_ directory: Node, dropQueued: Bool = true, _ host: any ListingsAheadHost) -> DirectoryReader? {
        guard host.configuration.listAhead > 0 else { return nil }
        let key = directory.key.exact
        let started = host.now()
        var slot = ahead.withLock { a in
            // A step of the walk, by a readdir or by a lookup's listing (rsync reads no
            // directory): its pace (subtlety 3). Those expired are queued again now (subtlety 6):
            // the workers take them as the window moves on.
            a.noteReached(now: started, maximumAge: host.configuration.directoryCacheSeconds)
            a.expire(now: started, maximumAge: host.configuration.directoryCacheSeconds)
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
                let (current, walkPage) = ahead.withLock { a in
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
            slot = ahead.withLock { $0.slots[key] }
        }
        guard let slot else { return nil }
        switch slot {
        case .running: return nil
        case .queued:
            let now = host.now()
            let (start, lanes): (Int, [WalkListing]) = ahead.withLock { a in
                if dropQueued, case .queued? = a.slots[key] { a.clear(key) }
                a.expire(now: now, maximumAge: host.configuration.directoryCacheSeconds)
                if a.held >= a.window(minimum: Self.listAheadMinimumWindow, limit: host.configuration.listAheadWindow, now: now) {
                    a.makeRoom()
                }
                return a.stopped ? (0, []) : (a.startable(width: host.configuration.listAhead), resumableWalk(&a, host))
            }
            startListAheadWorkers(start, host)
            startWalkListing(lanes, new: false, host)
            return nil
        case .done(let listing):
            let (start, started, resumed): (Int, [WalkListing], [WalkListing]) = ahead.withLock { a in
                // (Only this listing: the slot may hold a later one of the directory by now.)
                guard a.take(key, startedAt: listing.startedAt) else { return (0, [], []) }
                guard !a.stopped else { return (0, [], []) }
                let started = noteListingUsed(directory.key, in: &a, host)
                return (a.startable(width: host.configuration.listAhead), started, started.isEmpty ? resumableWalk(&a, host) : [])
            }
            startListAheadWorkers(start, host)
            startWalkListing(started, host)
            startWalkListing(resumed, new: false, host)
            return host.reader(over: listing, of: directory)
        }
    }

    /// A readdir of `directory` from its start: where the walk is among its parent's
    /// subdirectories (subtlety 5).
    package func noteReaddir(of directory: Node, _ host: any ListingsAheadHost) {
        guard host.configuration.listAhead > 0, directory.inode != InodeTable.root else { return }
        let now = host.now()
        ahead.withLock { a in
            if a.lastRead.count > 1_000 { a.lastRead = [:] }
            a.lastRead[Self.parentKey(of: directory.key).exact] = (directory.key, now)
        }
    }

    /// Drops the fetched listings ahead of the directories at `keys` (nil: of every directory),
    /// which may no longer be true (`Poller`): their readdirs list again.
    package func dropListingsAhead(of keys: [String]?) {
        ahead.withLock { a in
            for key in keys?.map(\.exact) ?? Array(a.slots.keys) {
                if case .done(let listing)? = a.slots[key] { _ = a.take(key, startedAt: listing.startedAt) }
            }
        }
    }

    /// Waits until no listing ahead is queued or running (tests).
    package func waitForListingsAhead() { running.wait() }

    package func stop() {
        ahead.withLock { a in
            a.stopped = true
            a.slots = a.slots.filter { if case .queued = $0.value { false } else { true } }
            a.batches.removeAll()
            a.waiting = 0
            a.walks = []
        }
    }
}

package struct AheadListing: Sendable {
    package var entries: PackedEntries
    /// The `StoreClock` tick before its first request (the attribute rule).
    package var askedAt: UInt64
    /// When it started (the configuration's clock) and the namespace generation then.
    package var startedAt: Double
    package var generation: UInt64
}

package enum AheadSlot {
    case queued
    case running(DispatchGroup)
    case done(AheadListing)
}

package struct AheadState {
    package var slots: [ExactString: AheadSlot] = [:]
    /// Directories waiting, as batches (one per listing that showed them, in its order), the
    /// newest batch first: walkers go depth first, so a directory's subdirectories are read
    /// before the rest of its siblings (subtlety 3).
    package var batches: [(entries: [DirectoryEntry], next: Int)] = []
    /// Directories waiting in all batches.
    package var waiting = 0
    package var workers = 0
    package var stopped = false
    /// Listings running or fetched and not used yet (subtlety 3).
    package var held = 0
    /// Entries in the fetched ones not used yet.
    package var heldEntries = 0
    /// The flat listing of a subtree under way, if any (`WalkListing`; its scan
    /// lock is taken inside this one, never the other way).
    package var walks: [WalkListing] = []
    /// Per directory, how many of its subdirectories' listings ahead readdirs used.
    package var hits: [ExactString: Int] = [:]
    /// The fetched ones, oldest first, with when they started (some may be used already).
    package var fetched: [(key: ExactString, startedAt: Double)] = []
    package var fetchedNext = 0
    /// When the walk asked for a directory's listing (`readerFromListingAhead`), oldest
    /// first, those of the last `dir_timeout` from `reachedNext` on: its pace (subtlety 3).
    package var reachedAt: [Double] = []
    package var reachedNext = 0
    /// Directories whose listings expired unused and were queued again (subtlety 6).
    package var requeued: Set<ExactString> = []
    /// Per parent directory, the subdirectory a readdir last read, and when (subtlety 5).
    package var lastRead: [ExactString: (key: String, at: Double)] = [:]

    /// Notes that the walk asked for a directory's listing at `now`.
    package mutating func noteReached(now: Double, maximumAge: Double) {
        reachedAt.append(now)
        while reachedNext < reachedAt.count, now - reachedAt[reachedNext] > maximumAge { reachedNext += 1 }
        if reachedNext > 1_024 && reachedNext * 2 > reachedAt.count {
            reachedAt.removeFirst(reachedNext)
            reachedNext = 0
        }
    }

    /// When a listing last expired unused (subtlety 3).
    package var expiredAt = -Double.infinity

    /// Listings held at most: `limit`, or, for a while after a listing expired unused, half
    /// those the walk reached lately (at least `minimum`) (subtlety 3).
    package func window(minimum: Int, limit: Int, now: Double) -> Int {
        guard now - expiredAt <= ListingsAhead.pacedSeconds else { return limit }
        return min(limit, max(minimum, (reachedAt.count - reachedNext) / 2))
    }

    /// Drops fetched listings that started more than `maximumAge` before `now`; those no
    /// readdir used are queued again, once (subtlety 6).
    package mutating func expire(now: Double, maximumAge: Double) {
        var again: [DirectoryEntry] = []
        while fetchedNext < fetched.count, now - fetched[fetchedNext].startedAt > maximumAge {
            let (key, startedAt) = fetched[fetchedNext]
            fetchedNext += 1
            // (A later listing of the same directory has a record of its own.)
            guard take(key, startedAt: startedAt) else { continue }
            expiredAt = now
            if !stopped, waiting < ListingsAhead.listAheadBacklogLimit {
                if requeued.count >= ListingsAhead.listAheadBacklogLimit { requeued = [] }
                guard requeued.insert(key).inserted else { continue }
                let name = key.string.dropLast().split(separator: "/", omittingEmptySubsequences: false).last.map(String.init) ?? ""
                slots[key] = .queued
                again.append(DirectoryBuilder.directory(name, key: key.string))
            }
        }
        // In the walk's order: they expire in the order their fetches ended, and several
        // workers end them out of order.
        again.sort { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
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
    package mutating func clear(_ key: ExactString) {
        slots[key] = nil
        if slots.isEmpty { slots = [:] }
    }

    /// Keeps a fetched listing of `key` until a readdir uses it.
    package mutating func keep(_ key: ExactString, _ listing: AheadListing) {
        slots[key] = .done(listing)
        fetched.append((key, listing.startedAt))
        heldEntries += listing.entries.count
    }

    /// Takes the fetched listing of `key` that started at `startedAt` out, if it is still there.
    package mutating func take(_ key: ExactString, startedAt: Double) -> Bool {
        guard case .done(let listing)? = slots[key], listing.startedAt == startedAt else { return false }
        clear(key)
        held -= 1
        heldEntries -= listing.entries.count
        return true
    }

    /// How many more workers may start, at most `width` in all.
    package mutating func startable(width: Int) -> Int {
        let starting = max(0, min(width - workers, waiting))
        workers += starting
        return starting
    }

    /// Queues `batch`, subdirectories of one directory in its listing's order. Newest batch
    /// first: walkers go depth first, so a directory's subdirectories are read before the rest of
    /// its siblings. `afterSiblings` (a listing of a directory the walk has been in, made again:
    /// subtlety 5): after the batch of its subdirectories still waiting, if there is one, which
    /// the walk reaches first. (Served first, it had the walk's last directories fetched while
    /// the next ones waited, and they expired unused.)
    package mutating func enqueue(_ batch: [DirectoryEntry], afterSiblings: Bool) {
        guard let first = batch.first else { return }
        waiting += batch.count
        let parent = ListingsAhead.parentKey(of: first.key).exact
        if afterSiblings,
            let siblings = batches.lastIndex(where: { b in
                b.next < b.entries.count && ListingsAhead.parentKey(of: b.entries[b.next].key).exact == parent
            })
        {
            batches.insert((batch, 0), at: siblings)
        } else {
            batches.append((batch, 0))
        }
    }

    /// The next directory waiting, newest batch first.
    package mutating func nextWaiting() -> DirectoryEntry? {
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
    package mutating func makeRoom() {
        while fetchedNext < fetched.count {
            let (key, startedAt) = fetched[fetchedNext]
            fetchedNext += 1
            if take(key, startedAt: startedAt) { return }
        }
    }
}
