import ObjectStore

/// Change notification (issue 22, `poll_s`): an idle mount sees another client's changes without
/// waiting for its caches to expire, at one request per `poll_s`.
///
/// Subtleties:
/// 1. One request a tick. The directories used within `pollWatchSeconds` (read, a file in
///    them looked up, changed here, or holding an open file; not passed through on the way to
///    a subdirectory) are listed in turn, the one polled longest ago first: a change in
///    the one directory in use shows within a tick, in one of `n` within `n` ticks. With none,
///    the tick HEADs the container; a changed object count or byte count expires every remembered
///    listing (the next lookup or readdir lists again). A same-size rewrite elsewhere shows at the caches'
///    own times (`attr_timeout`, `dir_timeout`).
/// 2. A poll listing is remembered as any listing is (DirectoryCache rule 2: this mount's own
///    changes are applied to it), and goes through the attribute rule for each node: only an
///    answer that shows another client's version changes one. What changed is dropped from the
///    kernel: a file's pages and attributes (its next read or `stat` asks the mount), and the
///    names that came or went (the kernel's "no such file" included).
/// 3. Directories of more than `pollListingLimit` names are not polled (a listing of 200 000
///    names a second would cost more than it saves); their caches' times apply. One found so is
///    tried again after `pollLargeAgainSeconds`.
/// 4. A file held open for reading (subtlety of `read`): a handle open for longer than
///    `attr_timeout` when the mount learns of another version takes it at its next read if it
///    has returned nothing yet, else fails with ESTALE; a younger one reads on the version it
///    began with, as an open within `attr_timeout` does (close-to-open): the kernel's pages
///    and attributes of the file are dropped only once its youngest handle has aged past that.
/// 5. This mount's own creates and removes are applied to every listing for `dir_timeout`
///    (DirectoryCache rule 2: container listings lag behind writes), so a file made here and
///    removed by another client would show here for that long. A file made here that a poll
///    listing lacks is checked by a HEAD (at most `pollChecksPerTick` a tick): when it is gone,
///    another client removed it, and the create made here is no longer applied. (A name removed
///    here and made again by another client still shows as removed for up to `dir_timeout`.)
/// 6. Errors are logged at debug level and the tick ends: a failed poll makes the mount slower
///    to notice, never wrong (the caches' times still apply).
extension Filesystem {
    struct PollState {
        /// When each directory was last listed by a poll.
        var polledAt: [InodeNumber: Double] = [:]
        /// Directories found too large to poll (subtlety 3), and when: tried again after
        /// `pollLargeAgainSeconds`.
        var tooLarge: [InodeNumber: Double] = [:]
        /// The container's counts at the last HEAD.
        var container: ContainerInfo?
        var running = false
    }

    /// Directories used within this many seconds are polled (subtlety 1).
    static let pollWatchSeconds: Double = 60
    /// Directories with more names are not polled (subtlety 3).
    static let pollListingLimit = 10_000
    static let pollLargeAgainSeconds: Double = 600
    /// At most this many HEADs a tick tell a lagging listing from another client's change
    /// (subtlety 5).
    static let pollChecksPerTick = 16

    /// Starts polling every `poll_s` seconds (the mount calls it once it serves); nothing when
    /// `pollSeconds` is 0.
    public func startPolling() {
        let seconds = configuration.pollSeconds
        guard seconds > 0 else { return }
        pool.submit(after: seconds) { [self] in
            pollOnce()
            startPolling()
        }
    }

    /// One tick: lists the watched directory polled longest ago, or HEADs the container.
    public func pollOnce() {
        let now = self.now()
        let start: Bool = poll.withLock { p in
            defer { p.running = true }
            return !p.running
        }
        guard start else { return }
        defer { poll.withLock { $0.running = false } }
        let polledAt = poll.withLock { $0.polledAt }
        let skip: Set<InodeNumber> = poll.withLock { p in
            p.tooLarge = p.tooLarge.filter { now - $0.value < Self.pollLargeAgainSeconds }
            return Set(p.tooLarge.keys)
        }
        let directory: Node? = state.withLock { s in
            var watched = Set(s.directories.usedSince(now - Self.pollWatchSeconds))
            for open in Set(s.openFiles.keys).union(s.handles.remoteInodes) {
                if let parent = s.inodes[open]?.parent { watched.insert(parent) }
            }
            return watched.subtracting(skip).compactMap { s.inodes[$0] }.filter { $0.kind == .directory && $0.linked }
                .min { (polledAt[$0.inode] ?? 0, $0.inode) < (polledAt[$1.inode] ?? 0, $1.inode) }
        }
        if let directory {
            poll.withLock { $0.polledAt[directory.inode] = now }
            pollDirectory(directory)
        } else {
            pollContainer()
        }
        poll.withLock { p in
            // Directories no longer watched are forgotten.
            p.polledAt = p.polledAt.filter { now - $0.value <= Self.pollWatchSeconds }
        }
    }

    private func pollContainer() {
        let info: ContainerInfo
        do {
            info = try store.headContainer()
        } catch {
            logger.debug("poll: HEAD of the container failed: \(error)")
            return
        }
        let before: ContainerInfo? = poll.withLock { p in
            defer { p.container = info }
            return p.container
        }
        guard let before, before != info else { return }
        logger.debug("poll: the container changed (\(before.objectCount) -> \(info.objectCount) objects)")
        state.withLock { s in s.directories.expireAllListings() }
    }

    /// Lists `directory` and takes what changed (subtlety 2).
    private func pollDirectory(_ directory: Node) {
        let inode = directory.inode
        let reader = makeDirectoryReader(directory)
        let entries: PackedEntries
        do {
            guard let whole = try readWhole(reader, limit: Self.pollListingLimit) else {
                poll.withLock { $0.tooLarge[inode] = now() }
                return
            }
            entries = whole
        } catch {
            logger.debug("poll: listing of '\(directory.key)' failed: \(error.message)")
            return
        }
        let listed = EntryTable(entries)
        let confirmed = confirmAgainstJournal(directory, listed, reader)
        var changed: [InodeNumber] = []
        var names: [String] = []
        state.withLock { s in
            guard s.inodes[inode] != nil else { return }
            let before = s.directories.anyListing(inode)
            let children = s.inodes.children(of: inode)
            let table = rememberLocked(reader, listed, for: inode, confirmed: confirmed, in: &s)
            for (name, child) in children {
                guard let entry = table[name] else {
                    names.append(name.string)
                    continue
                }
                guard s.openFiles[child] == nil, let node = s.inodes[child], node.kind == .file, entry.kind == .file,
                    entry.etag != node.etag
                else { continue }
                if Self.describesWhole(entry) {
                    let updated = s.inodes.update(child) {
                        $0.merge(entry, listedAt: reader.askedAt, head: nil, fresh: false, now: now())
                    }
                    if let updated, updated.etag != node.etag || updated.size != node.size { changed.append(child) }
                } else if node.manifest == nil && node.size != 0 {
                    // Emptied, or made a DLO (both list as zero bytes): only a HEAD can tell, so
                    // the next stat or open asks one.
                    s.inodes.update(child) { $0.confirmedAt = -.infinity }
                    changed.append(child)
                }
                // (A DLO lists as zero bytes whatever its parts: its attr_timeout applies.)
            }
            // New names: the kernel may remember that they did not exist (negative_timeout).
            if let before, !before.dropped {
                for position in entries.indices {
                    let name = entries[position].name
                    if before.entries[name.exact] == nil, s.inodes.child(inode, name) == nil { names.append(name) }
                }
            }
        }
        // (No metadata HEADs after a poll's listing: they would cost requests every tick; a
        // lookup or open asks for what it needs.)
        if !changed.isEmpty || !names.isEmpty {
            logger.debug("poll: '\(directory.key)' changed: \(changed.count) files, \(names.count) names")
        }
        for name in names { kernelCache.forgetEntry(inode, name) }
        // A handle younger than attr_timeout reads on its version (subtlety 4): the kernel keeps
        // that version's pages and size until the handle has aged past it (a shorter size under
        // a fresh mmap would be SIGBUS: ReplacedFileTests), then drops them.
        let noticedAt = now()
        let latest = state.withLock { $0.handles.latestOpen(of: Set(changed)) }
        for child in changed {
            let wait = (latest[child] ?? -.infinity) + configuration.attributeCacheSeconds + 0.05 - noticedAt
            if wait <= 0 {
                kernelCache.invalidate(child)
            } else {
                pool.submit(after: wait) { [kernelCache] in kernelCache.invalidate(child) }
            }
        }
    }

    /// The files made here that the poll's listing lacks and a HEAD finds gone (subtlety 5):
    /// the listing is right, another client removed them. At most `pollChecksPerTick` HEADs.
    private func confirmAgainstJournal(_ directory: Node, _ listed: EntryTable, _ reader: DirectoryReader) -> Set<ExactString> {
        let disputed = state.withLock { s in
            s.directories.madeHereButNotListed(directory.inode, by: listed, startedAt: reader.startedAt)
        }
        var confirmed = Set<ExactString>()
        for name in disputed.prefix(Self.pollChecksPerTick) {
            do {
                _ = try store.head(key: directory.key + name.string)
            } catch where error.code == .notFound {
                confirmed.insert(name)
            } catch {
                logger.debug("poll: HEAD of '\(directory.key + name.string)' failed: \(error)")
            }
        }
        return confirmed
    }
}
