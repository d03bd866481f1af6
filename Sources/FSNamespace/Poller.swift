import FSCore
import Locking
import Logging
import ObjectStore

/// What the poller needs of the filesystem it polls for. The filesystem conforms and passes
/// itself with each call; the poller keeps no reference to it.
package protocol PollHost: NamespaceHost {
    /// The namespace room's tables (the facade's lock 3).
    var names: Locked<NamespaceTables> { get }
    /// The inodes of the files open here (spools, and handles reading from the store).
    func openInodes() -> Set<InodeNumber>
    func dropListingsAhead(of keys: [String]?)
    func makeDirectoryReader(_ directory: Node, startedAt: UInt64?, pagesAhead: Bool) -> DirectoryReader
    func hiddenName(in directory: Node) -> String?
    func readWhole(_ reader: DirectoryReader, limit: Int) throws(FSError) -> PackedEntries?
    func isDeletePending(_ key: String) -> Bool
    /// Takes a poll's listing of `directory` into the tables (subtlety 2): `listed` with the
    /// names `confirmed` and `madeAgain`. Returns the files whose version changed and the names
    /// that came or went.
    func takePollListing(
        _ reader: DirectoryReader, _ entries: PackedEntries, _ listed: EntryTable, confirmed: Set<ExactString>,
        madeAgain: [ExactString: DirectoryEntry], of directory: Node
    ) -> (changed: [InodeNumber], names: [String])
    /// Drops from the kernel what a poll found changed in `directory` (subtleties 2 and 4).
    func dropFromKernel(changed: [InodeNumber], names: [String], in directory: InodeNumber)
}

/// Change notification (issue 22, `poll_s`): an idle mount sees another client's changes without
/// waiting for its caches to expire, at one request per `poll_s`.
///
/// Subtleties:
/// 1. One request a tick, for the directories in use: those whose names were used within
///    `hotSeconds` (or two ticks; read, a file in them looked up, changed here) or that
///    hold an open file. Passing through a directory on the way to a subdirectory is not a
///    use. They are covered by as few listings as subtlety 7 allows, listed in turn, the one
///    polled longest ago first: usually one listing covers them all, and a change shows within a
///    tick. A directory that goes out of use is no longer polled, and its remembered listing
///    (and any listing fetched ahead of it) expires once then: nothing keeps it true, so its next
///    use lists again instead of showing a listing up to `dir_timeout` old. With no directory
///    in use, the tick HEADs the container; a changed object count or byte count expires every
///    remembered listing (the next lookup or readdir lists again). A same-size rewrite seen by
///    no listing shows at the caches' own times (`attr_timeout`, `dir_timeout`).
/// 2. A poll listing is remembered as any listing is (DirectoryCache rule 2: this mount's own
///    changes are applied to it), and goes through the attribute rule for each node: only an
///    answer that shows another client's version changes one. What changed is dropped from the
///    kernel: a file's pages and attributes (its next read or `stat` asks the mount), and the
///    names that came or went (the kernel's "no such file" included). A listing that is not
///    remembered is not acted on either: it may describe the directory as it no longer is (a
///    rename of it, or of a directory above or below it, ended or was under way meanwhile:
///    `NamespaceTables.isMoving`; mount model seed 78 saw the kernel told to drop a directory
///    that had only moved).
/// 3. Directories of more than `listingLimit` names are not polled (a listing of 200 000
///    names a second would cost more than it saves); their caches' times apply. One found so is
///    tried again after `largeAgainSeconds`.
/// 4. A file held open for reading (subtlety of `read`): a handle open for longer than
///    `attr_timeout` when the mount learns of another version takes it at its next read if it
///    has returned nothing yet, else fails with ESTALE; a younger one reads on the version it
///    began with, as an open within `attr_timeout` does (close-to-open): the kernel's pages
///    and attributes of the file are dropped only once its youngest handle has aged past that.
/// 5. This mount's own creates and removes are applied to every listing for `dir_timeout`
///    (DirectoryCache rule 2: container listings lag behind writes), so a file made here and
///    removed by another client would show here for that long. A file made here that a poll
///    listing lacks is checked by a HEAD (at most `checksPerTick` a tick): when it is gone,
///    another client removed it, and the create made here is no longer applied. The other way
///    round, a name removed here that a poll listing still shows is HEADed too: when it is
///    there, another client made it again (unless a delete of it is still owed), and it shows.
/// 6. Errors are logged at debug level and the tick ends: a failed poll makes the mount slower
///    to notice, never wrong (the caches' times still apply).
/// 7. Several directories in use are listed by one flat listing (no delimiter) of the prefix they
///    share, `a/` for `a/x/` and `a/y/`, when it is one page (`listingLimit` keys): each
///    directory's listing is made from it as `WalkListing` makes them (subtlety 2
///    there), the same as its own delimiter listing, and taken as in subtlety 2. A prefix found
///    larger (that tick is spent) is not tried again for `largeAgainSeconds`: its directories
///    are grouped by the name below it that leads to them, each group so again, and the groups
///    listed in turn. With the root among them the shared prefix is the whole container: fine
///    for a small one; a large one splits at once.
package final class Poller: Sendable {
    struct State {
        /// When each directory in use was last listed by a poll.
        var polledAt: [InodeNumber: Double] = [:]
        /// Directories found too large to poll (subtlety 3), and when: tried again after
        /// `largeAgainSeconds`.
        var tooLarge: [InodeNumber: Double] = [:]
        /// Prefixes whose flat listing filled a page (subtlety 7), and when.
        var tooLargeFlat: [ExactString: Double] = [:]
        /// Directories out of use whose listings were expired since (subtlety 1).
        var expired: Set<InodeNumber> = []
        /// The container's counts at the last HEAD.
        var container: ContainerInfo?
        var running = false
    }

    /// What one tick lists: one directory (a delimiter listing), or several below one prefix
    /// (one flat listing of it, subtlety 7).
    package enum Unit {
        case directory(Node)
        case subtree(String, [Node])

        package var directories: [Node] {
            switch self {
            case .directory(let node): [node]
            case .subtree(_, let nodes): nodes
            }
        }
    }

    /// Directories whose names were used within this many seconds (or `2 × poll_s`) are polled
    /// (subtlety 1).
    package static let hotSeconds: Double = 5
    /// Directories used within this many seconds are remembered as out of use (their listings
    /// expired once), subtlety 1.
    static let watchSeconds: Double = 60
    /// Directories with more names, and prefixes with more keys, are not polled (subtleties 3, 7).
    package static let listingLimit = 10_000
    static let largeAgainSeconds: Double = 600
    /// At most this many HEADs a tick tell a lagging listing from another client's change
    /// (subtlety 5).
    static let checksPerTick = 16

    /// The poll's own table (a leaf lock: taken alone, never across I/O).
    private let state = Locked(State())

    package init() {}

    /// Starts polling every `poll_s` seconds (the mount calls it once it serves); nothing when
    /// `pollSeconds` is 0.
    package func start(_ host: some PollHost) {
        let seconds = host.configuration.pollSeconds
        guard seconds > 0 else { return }
        host.pool.submit(after: seconds) { [self] in
            pollOnce(host)
            start(host)
        }
    }

    /// One tick: lists the directories in use polled longest ago, or HEADs the container.
    package func pollOnce(_ host: some PollHost) {
        let now = host.now()
        let start: Bool = state.withLock { p in
            defer { p.running = true }
            return !p.running
        }
        guard start else { return }
        defer { state.withLock { $0.running = false } }
        let (skip, skipFlat, expired) = state.withLock { p in
            p.tooLarge = p.tooLarge.filter { now - $0.value < Self.largeAgainSeconds }
            p.tooLargeFlat = p.tooLargeFlat.filter { now - $0.value < Self.largeAgainSeconds }
            return (Set(p.tooLarge.keys), Set(p.tooLargeFlat.keys), p.expired)
        }
        let hotSeconds = max(Self.hotSeconds, 2 * host.configuration.pollSeconds)
        let open = host.openInodes()
        let (hot, cooled, expiring): ([Node], Set<InodeNumber>, [String]) = host.names.withLock { s in
            var hot = Set(s.directories.usedSince(now - hotSeconds))
            for open in open {
                if let parent = s.inodes[open]?.parent { hot.insert(parent) }
            }
            // Out of use: the listing expires once (subtlety 1).
            let cool = Set(s.directories.usedSince(now - Self.watchSeconds)).subtracting(hot)
            let expiring = cool.subtracting(expired)
            for directory in expiring { s.directories.expireListing(directory) }
            let nodes = hot.subtracting(skip).compactMap { s.inodes[$0] }.filter { $0.kind == .directory && $0.linked }
            return (nodes, cool, expiring.compactMap { s.inodes[$0]?.key })
        }
        if !expiring.isEmpty { host.dropListingsAhead(of: expiring) }
        let inUse = Set(hot.map(\.inode))
        state.withLock { p in
            p.expired = cooled
            // Directories out of use are forgotten.
            p.polledAt = p.polledAt.filter { inUse.contains($0.key) }
        }
        let units = Self.units(of: hot) { skipFlat.contains($0.exact) }
        let polledAt = state.withLock { $0.polledAt }
        func age(_ unit: Unit) -> (Double, InodeNumber) {
            unit.directories.map { (polledAt[$0.inode] ?? 0, $0.inode) }.min { $0 < $1 }!
        }
        guard let unit = units.min(by: { age($0) < age($1) }) else { return pollContainer(host) }
        state.withLock { p in
            for directory in unit.directories { p.polledAt[directory.inode] = now }
        }
        switch unit {
        case .directory(let directory): take(host.makeDirectoryReader(directory, startedAt: nil, pagesAhead: false), of: directory, host)
        case .subtree(let prefix, let directories): pollSubtree(prefix, directories, host)
        }
    }

    /// The units that cover `directories` (subtlety 7): all of them by a flat listing of the
    /// prefix they share, unless `tooLarge` says it fills a page; then grouped by the name below
    /// it that leads to them, each group so again.
    package static func units(of directories: [Node], tooLarge: (String) -> Bool) -> [Unit] {
        guard directories.count > 1 else { return directories.map { .directory($0) } }
        let prefix = sharedDirectoryPrefix(directories.map(\.key))
        guard tooLarge(prefix) else { return [.subtree(prefix, directories)] }
        var units: [Unit] = []
        var groups: [ExactString: [Node]] = [:]
        for directory in directories {
            let rest = directory.key.utf8.dropFirst(prefix.utf8.count)
            guard let slash = rest.firstIndex(of: UInt8(ascii: "/")) else {
                units.append(.directory(directory))
                continue
            }
            groups[String(decoding: rest[...slash], as: UTF8.self).exact, default: []].append(directory)
        }
        for name in groups.keys.sorted() { units += Self.units(of: groups[name]!, tooLarge: tooLarge) }
        return units
    }

    /// The longest directory key (`a/b/`, or the root's "") that every one of `keys` starts with.
    package static func sharedDirectoryPrefix(_ keys: [String]) -> String {
        guard var shared = keys.first.map({ Array($0.utf8) }) else { return "" }
        for key in keys.dropFirst() {
            let same = zip(shared, key.utf8).prefix { $0 == $1 }.count
            shared.removeLast(shared.count - same)
        }
        while let last = shared.last, last != UInt8(ascii: "/") { shared.removeLast() }
        return String(decoding: shared, as: UTF8.self)
    }

    private func pollContainer(_ host: some PollHost) {
        let info: ContainerInfo
        do {
            info = try host.store.headContainer()
        } catch {
            host.logger.debug("poll: HEAD of the container failed: \(error)")
            return
        }
        let before: ContainerInfo? = state.withLock { p in
            defer { p.container = info }
            return p.container
        }
        guard let before, before != info else { return }
        host.logger.debug("poll: the container changed (\(before.objectCount) -> \(info.objectCount) objects)")
        host.names.withLock { s in s.directories.expireAllListings() }
        host.dropListingsAhead(of: nil)
    }

    /// One flat listing of `prefix` for `directories` below it (subtlety 7); each takes what
    /// changed, as from its own listing.
    private func pollSubtree(_ prefix: String, _ directories: [Node], _ host: some PollHost) {
        // What a listing of each directory would start from, before the request.
        let starts = host.names.withLock { s in
            directories.map { (s.directories.changeCount($0.inode), s.directories.removedHere($0.inode, now: host.now())) }
        }
        let askedAt = host.storeClock.tick()
        let page: ListPage
        do {
            page = try host.store.list(prefix: prefix, delimiter: nil, marker: nil, limit: Self.listingLimit)
        } catch {
            host.logger.debug("poll: listing of '\(prefix)' whole failed: \(error)")
            return
        }
        guard page.nextMarker == nil else {
            host.logger.debug("poll: '\(prefix)' holds more than \(Self.listingLimit) keys: its directories are listed apart")
            state.withLock { $0.tooLargeFlat[prefix.exact] = host.now() }
            return
        }
        let (listings, tooLarge) = ListingsAhead.directoryListings(ofFlat: page.entries, below: prefix)
        for (directory, (count, removed)) in zip(directories, starts) where !tooLarge.contains(directory.key.exact) {
            let reader = DirectoryReader(
                prefix: directory.key, page: ListPage(entries: listings[directory.key.exact] ?? [], nextMarker: nil),
                hidden: host.hiddenName(in: directory), removedHere: removed, startedAt: count, askedAt: askedAt)
            take(reader, of: directory, host)
        }
    }

    /// Takes what changed in `directory` from the poll's listing `reader` (subtlety 2).
    private func take(_ reader: DirectoryReader, of directory: Node, _ host: some PollHost) {
        let entries: PackedEntries
        do {
            guard let whole = try host.readWhole(reader, limit: Self.listingLimit) else {
                state.withLock { $0.tooLarge[directory.inode] = host.now() }
                return
            }
            entries = whole
        } catch {
            host.logger.debug("poll: listing of '\(directory.key)' failed: \(error.message)")
            return
        }
        let listed = EntryTable(entries)
        let confirmed = confirmAgainstJournal(directory, listed, reader, host)
        let madeAgain = madeAgainElsewhere(directory, reader, host)
        let (changed, names) = host.takePollListing(
            reader, entries, listed, confirmed: confirmed, madeAgain: madeAgain, of: directory)
        // (No metadata HEADs after a poll's listing: they would cost requests every tick; a
        // lookup or open asks for what it needs.)
        if !changed.isEmpty || !names.isEmpty {
            host.logger.debug("poll: '\(directory.key)' changed: \(changed.count) files, \(names.count) names")
        }
        host.dropFromKernel(changed: changed, names: names, in: directory.inode)
    }

    /// Names removed here that the poll's listing still shows and a HEAD finds (subtlety 5):
    /// another client made them again. A listing lagging behind the delete is not believed (the
    /// HEAD finds nothing), nor one whose delete is still owed (`-o writeback`: the object the
    /// HEAD finds may be the one it removes). At most `checksPerTick` HEADs.
    private func madeAgainElsewhere(_ directory: Node, _ reader: DirectoryReader, _ host: some PollHost) -> [ExactString: DirectoryEntry] {
        var found: [ExactString: DirectoryEntry] = [:]
        for name in reader.stillListed.sorted().prefix(Self.checksPerTick) {
            let key = directory.key + name.string
            guard !host.isDeletePending(key) else { continue }
            do {
                let info = try host.store.head(key: key)
                if !ObjectKey.isDirectoryContentType(info.contentType) { found[name] = DirectoryEntry(name: name.string, info: info) }
            } catch where error.code == .notFound {
                // The listing lags behind the delete.
            } catch {
                host.logger.debug("poll: HEAD of '\(key)' failed: \(error)")
            }
        }
        return found
    }

    /// The files made here that the poll's listing lacks and a HEAD finds gone (subtlety 5):
    /// the listing is right, another client removed them. At most `checksPerTick` HEADs.
    private func confirmAgainstJournal(
        _ directory: Node, _ listed: EntryTable, _ reader: DirectoryReader, _ host: some PollHost
    ) -> Set<ExactString> {
        let disputed = host.names.withLock { s in
            s.directories.madeHereButNotListed(directory.inode, by: listed, startedAt: reader.startedAt)
        }
        var confirmed = Set<ExactString>()
        for name in disputed.prefix(Self.checksPerTick) {
            do {
                _ = try host.store.head(key: directory.key + name.string)
            } catch where error.code == .notFound {
                confirmed.insert(name)
            } catch {
                host.logger.debug("poll: HEAD of '\(directory.key + name.string)' failed: \(error)")
            }
        }
        return confirmed
    }
}
