import Dispatch
import FSCore
import Locking
import Logging
import ObjectStore

/// One listing of a whole subtree instead of one listing per directory (issue 21): when a walk
/// is evident, the rest of the subtree is listed flat (no delimiter, 10 000 keys a page),
/// and every directory in it that the pages cover whole becomes a listing fetched ahead
/// (`ListingsAhead`), as if it had been listed by itself. A tree of 1 000 directories of
/// 100 files costs 10 requests instead of 1 000.
///
/// Subtleties:
/// 1. Evident: `walkListingAfter` subdirectories of one directory were read from listings
///    fetched ahead, and at least `walkListingMinimum` more wait their turn. The flat listing
///    starts after the last of them read (its key as the marker), and replaces the waiting
///    directories' own listings.
/// 2. A directory's listing is made from the keys below it as a delimiter listing would show
///    them: its objects, a common prefix for each subdirectory (its `dir/` marker rolls into
///    it), its own marker as an object. The keys of a directory are contiguous in a flat
///    listing, so a directory is complete once a key past it comes. A directory the marker cut
///    (the one just read, the subtree's own) is never made. Each is read by a `DirectoryReader`
///    over that one page, so collisions and markers are resolved as for any listing.
/// 3. The same rules as other listings ahead: usable only while nothing changed through this
///    mount since its page was asked for (`generation`), within `dir_timeout`, at most
///    `listAheadEntryLimit` entries. The walk listing pauses while listings of
///    `walkAheadEntries` entries (or 16 windows of directories) wait unused, and goes on as the
///    walk uses them. A readdir of a directory the walk has not
///    reached yet waits for its pages (at most `lookupListingWait`), then lists by itself.
/// 4. One walk listing at a time; a failure ends it quietly (each readdir then lists by itself).
///    Never of the container root, which holds the multipart parts.
/// 5. Markers: a directory's attributes live on its `dir/` marker, which no delimiter listing of
///    its parent shows, so each lookup of a subdirectory HEADs it. rsync looks up every
///    subdirectory of a level before it goes into any: lookups that wait for a marker count as
///    steps of a walk too, and start the walk listing at the marker of the one looked up. In a
///    flat listing a directory's marker is its first key, so a directory whose first key is
///    another has none: that answer is recorded (as a HEAD's, asked when the page was) as the
///    page is placed, and a lookup of a subdirectory the walk listing will reach waits for its
///    page (one page at most) instead of HEADing. The queued background HEADs of the markers
///    it covers are dropped.
/// 6. Lanes: the walk listing runs as `walkLanes` flat listings at once, each over an equal
///    share of the waiting subdirectories (in byte order): a lane after the first starts after
///    its first directory's key without the slash (so that its marker comes) and the lane
///    before ends there (`end_marker`). A directory's keys all start with `d/`, and no lane's
///    end does, so they fall in one lane whole: each lane completes its directories as one
///    listing does. A server with cores to spare lists the lanes at once; more lanes than 2
///    fetch the last directories so early that rsync, which looks them up twice (every
///    directory of a level first, then their names), found them past `dir_timeout`.
/// 7. Directories whose listings (a walk listing's too) expired unused are queued again one by
///    one (`ListingsAhead`, subtlety 6) and never handed to another walk listing: the
///    walk is slower than its listings there, and a second flat listing of the rest of the
///    subtree expired in turn (`du` of 100 000 indexed objects: 10 s instead of 5 in two runs
///    of five, with 20 flat pages instead of 10).
package final class WalkListing: Sendable {
    package let prefix: String
    /// Keys after this one.
    package let startMarker: String
    /// Keys before this one (nil: to the end of the prefix): the lane's end (subtlety 6).
    package let endMarker: String?

    package struct OpenDirectory {
        package var prefix: String
        package var entries: [ListEntry] = []
        package var tooLarge = false
        package var askedAt: UInt64
        package var startedAt: Double
        package var generation: UInt64
    }

    package struct Scan {
        package var marker: String
        /// Directories with keys seen and maybe more to come, outermost first.
        package var open: [OpenDirectory] = []
        /// The last key seen: directories before it are made (or were not wanted).
        package var position: String
        /// The last key of the last page whose directories are made and markers recorded.
        package var reached: String
        /// Directories opened by a key other than their own marker: they have none
        /// (subtlety 5).
        package var unmarked: [String] = []
        package var done = false
        package var running = false
        /// The page being fetched (and its directories made), for readdirs that wait for it.
        package var page: DispatchGroup? = nil
        /// Directories the page in hand completed, being made into listings.
        package var placing: [String] = []
    }

    package let scan: Locked<Scan>

    package init(prefix: String, after marker: String, before end: String? = nil) {
        self.prefix = prefix
        startMarker = marker
        endMarker = end
        scan = Locked(Scan(marker: marker, position: marker, reached: marker))
    }

    /// Whether the keys of the directory at `key` are in this lane's range (a directory's
    /// keys are never split between lanes: subtlety 6).
    package func holds(_ key: String) -> Bool {
        key.utf8.starts(with: prefix.utf8) && startMarker.utf8.lexicographicallyPrecedes(key.utf8)
            && (endMarker.map { key.utf8.lexicographicallyPrecedes($0.utf8) } ?? true)
    }

    /// Whether a walk listing under way will show whether the directory at `key` has a
    /// marker; if so, the page to wait for (one whose keys may reach it, or the one being
    /// placed). Subtlety 5.
    package func willReach(_ key: String) -> DispatchGroup? {
        scan.withLock { s in
            guard !s.done, let page = s.page, holds(key), s.reached.utf8.lexicographicallyPrecedes(key.utf8) else { return nil }
            return page
        }
    }

    /// The page a readdir of the directory at `key` may wait for: one that may reach it
    /// (not yet seen), the one whose directories are being made, or the next when it is the
    /// innermost directory still open (the last of a page: the next one ends it). Not an
    /// ancestor open since an earlier page: it is made only once its whole subtree is
    /// listed, which a depth-first walk reads after it.
    package func willCover(_ key: String) -> DispatchGroup? {
        scan.withLock { s in
            guard !s.done, let page = s.page, holds(key), !startMarker.utf8.starts(with: key.utf8),
                s.position.utf8.lexicographicallyPrecedes(key.utf8)
                    || s.placing.contains(where: { $0.utf8.elementsEqual(key.utf8) })
                    || s.open.last.map({ $0.prefix.utf8.elementsEqual(key.utf8) }) ?? false
            else { return nil }
            return page
        }
    }
}

extension ListingsAhead {
    package static let walkAheadEntries = 200_000

    /// The parent directory's key of a directory's key (`a/b/` → `a/`).
    package static func parentKey(of key: String) -> String {
        var bytes = Array(key.utf8.dropLast())
        while let last = bytes.last, last != UInt8(ascii: "/") { bytes.removeLast() }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Counts a listing ahead that a readdir of `key` used; starts a walk listing of its parent
    /// when the walk is evident (subtlety 1). Under the list-ahead lock; returns the walk to run.
    package func noteListingUsed(_ key: String, in a: inout AheadState, _ host: any ListingsAheadHost) -> [WalkListing] {
        noteWalkStep(key, in: &a, after: key, host)
    }

    /// Counts a lookup of the subdirectory at `key` that has to wait for its marker: rsync looks
    /// up every subdirectory of a level before it goes into any (subtlety 5). The walk listing
    /// it may start begins at that subdirectory's marker. Under the list-ahead lock.
    package func noteSubdirectoryLookup(_ key: String, in a: inout AheadState, _ host: any ListingsAheadHost) -> [WalkListing] {
        noteWalkStep(key, in: &a, after: String(key.dropLast()), host)
    }

    /// A step of a walk through the subdirectory at `key` (subtlety 1); starts the walk listing
    /// of its parent after `marker` when the walk is evident.
    private func noteWalkStep(_ key: String, in a: inout AheadState, after marker: String, _ host: any ListingsAheadHost) -> [WalkListing] {
        let parent = Self.parentKey(of: key)
        // One at a time; a paused one (its walk went elsewhere) may be replaced.
        guard !parent.isEmpty, a.walks.allSatisfy({ $0.scan.withLock { $0.done || !$0.running } }) else { return [] }
        if a.hits.count > 1_000 { a.hits = [:] }
        a.hits[parent.exact, default: 0] += 1
        guard a.hits[parent.exact]! >= host.configuration.walkListingAfter,
            // (Not the directories queued again after their listings expired unused, subtlety 7:
            // the walk is slower than its listings there.)
            let index = a.batches.lastIndex(where: { batch in
                batch.entries.first.map {
                    Self.parentKey(of: $0.key).utf8.elementsEqual(parent.utf8) && !a.requeued.contains($0.key.exact)
                } ?? false
            })
        else { return [] }
        // The waiting siblings after it become the walk listing's (their readdirs wait for its
        // pages); any before it (a walk in another order than the bytes') stay queued. Not worth
        // it for fewer than `walkListingMinimum` still queued (a listing of the parent made
        // again queues the directories whose listings ahead were used already).
        let waiting = a.batches[index].entries[a.batches[index].next...]
        let before = waiting.filter { $0.key.utf8.lexicographicallyPrecedes(key.utf8) }
        let handed = waiting.filter { directory in
            guard case .queued? = a.slots[directory.key.exact] else { return false }
            return !directory.key.utf8.lexicographicallyPrecedes(key.utf8)
        }
        guard handed.count >= host.configuration.walkListingMinimum else { return [] }
        var batch = a.batches.remove(at: index)
        for directory in handed { a.clear(directory.key.exact) }
        a.waiting -= waiting.count - before.count
        if !before.isEmpty {
            batch = (Array(before), 0)
            a.batches.insert(batch, at: index)
        }
        a.hits[parent.exact] = nil
        // Lanes (subtlety 6): the directories handed over, in byte order, in equal shares of at
        // least `walkListingMinimum`; each lane after the first starts at its first directory's
        // marker (the key without its slash) and ends where the next starts.
        let directories = handed.map(\.key).sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        let lanes = max(1, min(host.configuration.walkLanes, directories.count / max(1, host.configuration.walkListingMinimum)))
        let starts = [marker] + (1..<lanes).map { String(directories[$0 * directories.count / lanes].dropLast()) }
        a.walks = starts.indices.map { i in
            let lane = WalkListing(prefix: parent, after: starts[i], before: i + 1 < starts.count ? starts[i + 1] : nil)
            lane.scan.withLock { $0.running = true; $0.page = DispatchGroup(); $0.page!.enter() }
            return lane
        }
        host.logger.debug("listing '\(parent)' whole after '\(marker)' in \(lanes) lane(s): a walk goes through it")
        return a.walks
    }

    /// For a lookup of the subdirectory `entry` whose marker is not known: counts the step
    /// (`noteSubdirectoryLookup`), then waits for a walk listing that will show the marker, one
    /// page at most. Its answer is then recorded for `prefetchedMetadata`.
    package func awaitMarkerFromWalk(_ entry: DirectoryEntry, _ host: any ListingsAheadHost) {
        guard host.configuration.listAhead > 0, host.configuration.directoryCacheSeconds > 0 else { return }
        let (started, page): ([WalkListing], DispatchGroup?) = ahead.withLock { a in
            guard !a.stopped else { return ([], nil) }
            let started = noteSubdirectoryLookup(entry.key, in: &a, host)
            return (started, a.walks.lazy.compactMap { $0.willReach(entry.key) }.first)
        }
        startWalkListing(started, host)
        _ = page?.wait(timeout: .now() + Self.lookupListingWait)
    }

    /// Runs the `lanes` of a walk listing on the pool (each one's first page's group is entered
    /// already). A new walk's lanes drop the queued background HEADs of the markers they will
    /// show (subtlety 5): those HEADs would only race them.
    package func startWalkListing(_ lanes: [WalkListing], new: Bool = true, _ host: any ListingsAheadHost) {
        guard !lanes.isEmpty else { return }
        if new { host.forgetQueuedMarkerHeads(coveredBy: lanes) }
        for lane in lanes { startWalkListing(lane, host) }
    }

    private func startWalkListing(_ walk: WalkListing, _ host: any ListingsAheadHost) {
        running.enter()
        let started = host.pool.submit { [self] in
            runWalkListing(walk, host)
            running.leave()
        }
        if !started {
            endWalkListing(walk)
            running.leave()
        }
    }

    /// Records that the directories the last page opened without their own marker have none
    /// (subtlety 5): the answer a HEAD of each marker would give, asked when the page was.
    private func recordNoMarkers(of walk: WalkListing, askedAt: UInt64, _ host: any ListingsAheadHost) {
        let unmarked: [String] = walk.scan.withLock { s in
            defer { s.unmarked = [] }
            // (Not one the start marker cut: its marker, if any, was before the first key.)
            return s.unmarked.filter { !walk.startMarker.utf8.starts(with: $0.utf8) }
        }
        for key in unmarked {
            let name = String(key.dropLast().split(separator: "/", omittingEmptySubsequences: false).last ?? "")
            host.recordNoMarker(DirectoryBuilder.directory(name, key: key), askedAt: askedAt)
        }
    }

    private func endWalkListing(_ walk: WalkListing) {
        let page: DispatchGroup? = walk.scan.withLock { s in
            s.done = true
            s.running = false
            defer { s.page = nil }
            return s.page
        }
        page?.leave()
    }

    /// A page of a walk listing and when it was asked for (nil page: the request failed).
    private struct WalkPage {
        package var page: ListPage?
        package var generation: UInt64
        package var askedAt: UInt64
        package var startedAt: Double
    }

    private func fetchWalkPage(_ walk: WalkListing, after marker: String, _ host: any ListingsAheadHost) -> WalkPage {
        let generation = host.namespaceGeneration().generation
        let askedAt = host.storeClock.tick()
        let startedAt = host.now()
        do {
            let page = try host.store.list(
                prefix: walk.prefix, delimiter: nil, marker: marker, endMarker: walk.endMarker, limit: host.configuration.listPageSize)
            return WalkPage(page: page, generation: generation, askedAt: askedAt, startedAt: startedAt)
        } catch {
            host.logger.debug("listing '\(walk.prefix)' whole failed: \(error)")
            return WalkPage(page: nil, generation: generation, askedAt: askedAt, startedAt: startedAt)
        }
    }

    /// `fetchWalkPage` on the pool; the returned function waits for it, or fetches the page
    /// itself if the pool has not started it (a busy pool, or one shutting down).
    private func fetchWalkPageAhead(_ walk: WalkListing, after marker: String, _ host: any ListingsAheadHost) -> () -> WalkPage {
        enum Job {
            case waiting
            case running(DispatchGroup)
            case done(WalkPage)
            case taken
        }
        let job = Locked(Job.waiting)
        _ = host.pool.submit { [self] in
            let group = DispatchGroup()
            group.enter()
            let mine: Bool = job.withLock { j in
                guard case .waiting = j else { return false }
                j = .running(group)
                return true
            }
            guard mine else { return group.leave() }
            let page = fetchWalkPage(walk, after: marker, host)
            job.withLock { $0 = .done(page) }
            group.leave()
        }
        return { [self] in
            let state: Job = job.withLock { j in
                defer { if case .waiting = j { j = .taken } }
                return j
            }
            switch state {
            case .waiting, .taken: return fetchWalkPage(walk, after: marker, host)
            case .done(let page): return page
            case .running(let group):
                group.wait()
                guard case .done(let page) = job.withLock({ $0 }) else { return fetchWalkPage(walk, after: marker, host) }
                return page
            }
        }
    }

    private func runWalkListing(_ walk: WalkListing, _ host: any ListingsAheadHost) {
        // The next page, asked for while this one is placed and read: the server lists and the
        // daemon reads at once.
        var asked: (() -> WalkPage)? = nil
        while true {
            let go: Bool = ahead.withLock { a in
                guard !a.stopped, a.walks.contains(where: { $0 === walk }) else { return false }
                return true
            }
            guard go else {
                _ = asked?()
                return endWalkListing(walk)
            }
            let fetched = asked?() ?? fetchWalkPage(walk, after: walk.scan.withLock { $0.marker }, host)
            asked = nil
            guard let page = fetched.page else { return endWalkListing(walk) }
            let (generation, askedAt, startedAt) = (fetched.generation, fetched.askedAt, fetched.startedAt)
            if let next = page.nextMarker, !page.entries.isEmpty, ahead.withLock({ canWalkOn($0, host) }) {
                asked = fetchWalkPageAhead(walk, after: next, host)
            }
            var complete: [WalkListing.OpenDirectory] = []
            walk.scan.withLock { s in
                for entry in page.entries {
                    guard case .object(let summary) = entry else { continue }
                    Self.place(summary, in: &s, below: walk.prefix, complete: &complete) {
                        WalkListing.OpenDirectory(prefix: $0, askedAt: askedAt, startedAt: startedAt, generation: generation)
                    }
                    s.position = summary.key
                }
                if let next = page.nextMarker { s.marker = next }
                if page.nextMarker == nil || page.entries.isEmpty {
                    complete.append(contentsOf: s.open.reversed())
                    s.open = []
                }
                s.placing = complete.map(\.prefix)
            }
            recordNoMarkers(of: walk, askedAt: askedAt, host)
            let made = complete.compactMap { directory in
                directory.tooLarge || walk.startMarker.utf8.starts(with: directory.prefix.utf8) ? nil : listing(of: directory, host)
            }
            let more = page.nextMarker != nil && !page.entries.isEmpty
            let now = host.now()
            let paused: Bool = ahead.withLock { a in
                a.expire(now: now, maximumAge: host.configuration.directoryCacheSeconds)
                // (One older than dir_timeout is no use: it spent a pause open.)
                for (key, listing) in made where now - listing.startedAt <= host.configuration.directoryCacheSeconds {
                    switch a.slots[key.exact] {
                    case nil, .queued?:
                        a.keep(key.exact, listing)
                        a.held += 1
                    case .running?, .done?: break
                    }
                }
                return !canWalkOn(a, host)
            }
            // The page is in: readdirs waiting for it look again (and wait for the next one).
            let finished: DispatchGroup? = walk.scan.withLock { s in
                s.placing = []
                s.reached = s.position
                let finished = s.page
                if more && !paused {
                    s.page = DispatchGroup()
                    s.page!.enter()
                } else {
                    s.page = nil
                    s.running = false
                    s.done = !more
                }
                return finished
            }
            finished?.leave()
            if !more || paused {
                // (A page asked for ahead is asked again when the walk listing goes on.)
                _ = asked?()
                return
            }
        }
    }

    /// Whether the walk listing may fetch its next page: its directories waiting unused hold
    /// fewer than `walkAheadEntries` entries (it runs ahead of the directories listed one by
    /// one, which fill the window before it starts), and at most 16 windows of directories.
    package func canWalkOn(_ a: AheadState, _ host: any ListingsAheadHost) -> Bool {
        a.heldEntries < Self.walkAheadEntries && a.held < 16 * host.configuration.listAheadWindow
    }

    /// The lanes of the walk listing to start again: those that paused, if the window has room
    /// (under the list-ahead lock).
    package func resumableWalk(_ a: inout AheadState, _ host: any ListingsAheadHost) -> [WalkListing] {
        a.expire(now: host.now(), maximumAge: host.configuration.directoryCacheSeconds)
        guard !a.stopped, canWalkOn(a, host) else { return [] }
        return a.walks.filter { lane in
            lane.scan.withLock { s in
                guard !s.done, !s.running else { return false }
                s.running = true
                s.page = DispatchGroup()
                s.page!.enter()
                return true
            }
        }
    }

    /// Every directory's listing in `entries`, one whole flat listing of the subtree at `base`
    /// (`Poller`): as its own delimiter listing would show it (subtlety 2), by the
    /// directory's key; one with no keys is absent (its listing is empty). `tooLarge`: those of
    /// more than `listAheadEntryLimit` entries, which are not made.
    package static func directoryListings(
        ofFlat entries: [ListEntry], below base: String
    ) -> (listings: [ExactString: [ListEntry]], tooLarge: Set<ExactString>) {
        let make = { (prefix: String) in WalkListing.OpenDirectory(prefix: prefix, askedAt: 0, startedAt: 0, generation: 0) }
        var scan = WalkListing.Scan(marker: "", position: "", reached: "")
        scan.open = [make(base)]
        var complete: [WalkListing.OpenDirectory] = []
        for entry in entries {
            guard case .object(let summary) = entry else { continue }
            place(summary, in: &scan, below: base, complete: &complete, open: make)
        }
        complete.append(contentsOf: scan.open.reversed())
        var listings: [ExactString: [ListEntry]] = [:]
        var tooLarge = Set<ExactString>()
        for directory in complete {
            if directory.tooLarge {
                tooLarge.insert(directory.prefix.exact)
            } else {
                listings[directory.prefix.exact] = directory.entries
            }
        }
        return (listings, tooLarge)
    }

    /// Adds one key of a flat listing below `base` to the directories it belongs to (subtlety 2),
    /// moving the directories it is past to `complete`.
    private static func place(
        _ summary: ObjectSummary, in s: inout WalkListing.Scan, below base: String,
        complete: inout [WalkListing.OpenDirectory], open make: (String) -> WalkListing.OpenDirectory
    ) {
        let key = summary.key.utf8
        while let top = s.open.last, !key.starts(with: top.prefix.utf8) {
            complete.append(s.open.removeLast())
        }
        var parent = s.open.last?.prefix ?? base
        var rest = key.dropFirst(parent.utf8.count)
        while let slash = rest.firstIndex(of: UInt8(ascii: "/")) {
            let directory = parent + String(decoding: rest[..<rest.index(after: slash)], as: UTF8.self)
            if !s.open.isEmpty { append(.commonPrefix(directory), to: &s.open[s.open.count - 1]) }
            s.open.append(make(directory))
            if !key.elementsEqual(directory.utf8) { s.unmarked.append(directory) }
            parent = directory
            rest = rest[rest.index(after: slash)...]
        }
        if !s.open.isEmpty { append(.object(summary), to: &s.open[s.open.count - 1]) }
    }

    private static func append(_ entry: ListEntry, to directory: inout WalkListing.OpenDirectory) {
        guard !directory.tooLarge else { return }
        // A subdirectory's keys follow one another: its common prefix once. (Bytes: two
        // spellings of "é" are two directories, which String's == would take for one.)
        if case .commonPrefix(let new) = entry, case .commonPrefix(let last)? = directory.entries.last,
            new.utf8.elementsEqual(last.utf8)
        {
            return
        }
        if directory.entries.count >= listAheadEntryLimit {
            directory.tooLarge = true
            directory.entries = []
            return
        }
        directory.entries.append(entry)
    }

    /// A directory's listing made from its keys (subtlety 2); nil if reading it fails.
    private func listing(of directory: WalkListing.OpenDirectory, _ host: any ListingsAheadHost) -> (String, AheadListing)? {
        let reader = DirectoryReader(
            prefix: directory.prefix, page: ListPage(entries: directory.entries, nextMarker: nil), startedAt: 0,
            askedAt: directory.askedAt)
        do {
            var index = 0
            while true {
                let (batch, complete) = try reader.entries(from: index, resolvingWith: host)
                index += batch.count
                if complete { break }
            }
        } catch {
            host.logger.debug("a directory of a walk listing failed: \(error.message)")
            return nil
        }
        guard let entries = reader.completeEntries() else { return nil }
        if !reader.sawMarker && host.now() - directory.startedAt <= host.configuration.directoryCacheSeconds {
            let name = String(directory.prefix.dropLast().split(separator: "/", omittingEmptySubsequences: false).last ?? "")
            host.recordNoMarker(DirectoryBuilder.directory(name, key: directory.prefix), askedAt: directory.askedAt)
        }
        return (
            directory.prefix,
            AheadListing(entries: entries, askedAt: directory.askedAt, startedAt: directory.startedAt, generation: directory.generation)
        )
    }
}
