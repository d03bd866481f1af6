import Dispatch
import FSCore
import Locking
import Logging
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

// Lookups: a name in a directory, from a remembered listing, a readdir under way, or the
// server (HEAD and a one-entry listing at once), and forget.
extension Namespace {
    // MARK: Lookup

    /// Resolves `name` in directory `parent`; on success the kernel holds one more lookup on it.
    package func lookup(parent: InodeNumber, name: String) throws(FSError) -> Attributes {
        // An answer from before a change made here that no node remembers is asked again
        // (DirectoryCache rule 4); the last try takes what it gets, unless this mount removed the
        // name after the answer (see `link`).
        do {
            for attempt in 1...Self.lookupAttempts {
                if let attributes = try lookupOnce(parent: parent, name: name, lastTry: attempt == Self.lookupAttempts) {
                    if attributes.kind != .directory { names.withLock { $0.directories.noteNamesUsed(parent, now: now()) } }
                    return attributes
                }
            }
        } catch where error.code == .notFound {
            // A directory the store no longer shows is there while a file below it is being
            // written (`directoriesHoldingFilesBeingWritten`).
            let kept: Attributes? = names.withLock { s in
                guard let node = s.inodes.child(parent, name), node.kind == .directory,
                    directoriesHoldingFilesBeingWritten(in: s).contains(node.inode)
                else { return nil }
                s.inodes.countLookup(node.inode)
                return attributes(of: node)
            }
            if let kept { return kept }
            throw error
        }
        preconditionFailure("INTERNAL ERROR: the last lookup attempt returns or throws")
    }

    /// The directories a file being written (open, or its upload pending) lies below, under
    /// names that lead to it. Such a directory is there whatever a listing says (another client
    /// removed every other key below it): a listing that lacks it keeps it, lookups find it and
    /// readdir shows it, as it does the file (its upload makes the directory again).
    package func directoriesHoldingFilesBeingWritten(in s: NamespaceTables) -> Set<InodeNumber> {
        var holding = Set<InodeNumber>()
        for open in s.spools.keys {
            var current = s.inodes[open]
            while let node = current, node.linked, node.inode != Self.rootInode, holding.insert(node.parent).inserted {
                current = s.inodes[node.parent]
            }
        }
        return holding
    }

    package static let lookupAttempts = 3

    /// `lookup`; nil when the answer predates a change made here (DirectoryCache rule 4) and
    /// this is not the `lastTry`.
    package func lookupOnce(parent: InodeNumber, name: String, lastTry: Bool) throws(FSError) -> Attributes? {
        let directory = try node(parent)
        guard directory.kind == .directory else { throw FSError(.notADirectory, "lookup in a file") }
        guard DirectoryBuilder.isValidName(name) else {
            throw FSError(name.utf8.count > 255 ? .nameTooLong : .notFound, "no such name '\(name)'")
        }
        if isHidden(name, in: directory) { throw FSError(.notFound, "'\(name)' is reserved for multipart parts") }
        try Self.requireStorable(directory.key + name)
        // A file created here and not yet stored exists only in our tables.
        let local: Attributes? = names.withLock { s in
            s.directories.touch(parent)
            guard let node = s.inodes.child(parent, name) else { return nil }
            return lookUpSpooled(node.inode, in: &s)
        }
        if let local { return local }

        // Where the entry comes from: a remembered listing, or a readdir's listing under way.
        enum Source {
            case table(EntryTable, askedAt: UInt64, since: UInt64)
            case reader(DirectoryReader)
        }
        let source: Source? = names.withLock { s in
            // A reader in use stays in use while lookups go on, whichever source serves them:
            // `ls -l` reads 6 000 names with one getdents (1 MiB), then stats each.
            // Not one older than the changes this mount still knows of: what it shows of a name
            // changed since could not be told from the store's answer (rule 4's `.unknown`),
            // and the last try would take it (core model seed 80335: a file unlinked here, then
            // an upload refused, found again by its name).
            var reader: DirectoryReader? = nil
            if let (inUse, at) = s.readers[parent], now() - at <= configuration.directoryCacheSeconds,
                s.directories.knowsChanges(parent, since: inUse.startedAt)
            {
                reader = inUse
                s.readers[parent]?.at = now()
            }
            if let listing = s.directories.listing(parent, now: now(), maximumAge: configuration.directoryCacheSeconds) {
                return .table(listing.entries, askedAt: listing.askedAt, since: s.directories.changeCount(parent))
            }
            return reader.map { .reader($0) }
        }
        var listed: (entry: DirectoryEntry?, askedAt: UInt64, since: UInt64)? = nil
        // The entries after the name's, for the HEADs ahead of the program (`prefetchAhead`).
        var following: (Int) -> [DirectoryEntry] = { _ in [] }
        switch source {
        case .table(let table, let askedAt, let since)?:
            listed = (table[name.exact], askedAt, since)
            following = { table.following(name.exact, count: $0) }
        case .reader(let reader)?:
            // Only a name the reader showed: one it has not read yet may come on a later page.
            if let found = reader.listedEntry(named: name) {
                listed = (found, reader.askedAt, reader.startedAt)
                following = { reader.entries(following: name, count: $0) }
            }
        case nil: break
        }
        var entry: DirectoryEntry
        // When the entry was asked for (the attribute rule), and the directory's change count
        // then (DirectoryCache rule 4).
        var listedAt: UInt64
        var since: UInt64
        // A HEAD's answer: the file's full description (a DLO's real size and manifest, metadata
        // headers), or a directory's marker (none: no marker).
        var head: HeadAnswer? = nil
        switch listed {
        case (let found?, let askedAt, let count)?: (entry, listedAt, since) = (found, askedAt, count)
        case (nil, _, _)?: throw FSError(.notFound, "no '\(name)' in '\(directory.key)'")
        case nil:
            if let (listing, askedAt, count) = try listForLookups(directory) {
                guard let found = listing[name.exact] else { throw FSError(.notFound, "no '\(name)' in '\(directory.key)'") }
                (entry, listedAt, since) = (found, askedAt, count)
                following = { listing.following(name.exact, count: $0) }
            } else {
                since = names.withLock { $0.directories.changeCount(parent) }
                listedAt = storeClock.tick()
                let (found, headed) = try resolve(name: name, prefix: directory.key)
                entry = found
                head = headed.map { HeadAnswer(info: $0, askedAt: listedAt) }
            }
        }
        // Zero-byte files may be DLO manifests; directories keep their attributes on a marker.
        var fresh = false
        let needsHead = (entry.kind == .file && entry.size == 0) || entry.kind == .directory
        if head != nil {
            // Described by the HEAD already.
        } else if needsHead {
            let known = names.withLock { s in s.inodes.child(parent, name) }
            if let known, known.kind == entry.kind, now() - known.confirmedAt <= configuration.attributeCacheSeconds {
                // A zero-byte listing entry may be a DLO whose size and ETag the node has from a HEAD.
                fresh = true
            } else if case .known(let answer) = prefetchedMetadataForLookup(entry) {
                guard answer.info != nil || entry.kind == .directory else {
                    throw FSError(.notFound, "'\(entry.key)' is gone from the server")
                }
                head = answer
            } else {
                let askedAt = storeClock.tick()
                var info: ObjectInfo? = nil
                do {
                    info = try store.head(key: entry.key)
                } catch where error.code == .notFound && entry.kind == .directory {
                    // No marker: the directory's attributes are the defaults.
                } catch {
                    throw FSError(storeError: error, operation: "lookup", path: entry.key)
                }
                head = HeadAnswer(info: info, askedAt: askedAt)
                recordPrefetched(entry, answer: .some(info), askedAt: askedAt)
            }
        } else if awaitsHead(entry) {
            // Another tool's object (`foreign_attrs=head`): its metadata headers before its
            // first report, from the node (this version, described by a HEAD already), a HEAD
            // ahead of the program, the index, or a HEAD now. The next ones go out meanwhile.
            prefetchAhead(of: entry.key, in: parent, listedAt: listedAt, following: following)
            let known = names.withLock { s in s.inodes.child(parent, name) }
            if let known, known.kind == entry.kind, known.etag == entry.etag, known.metadataKnownAt > 0,
                known.lastModified.agrees(with: entry.lastModified)
            {
                // (merge keeps what the node's HEAD said of the version it lists.)
            } else if case .known(let answer) = prefetchedMetadata(entry, wait: true, listedAt: listedAt) {
                head = answer
            } else {
                let askedAt = storeClock.tick()
                do {
                    let info = try store.head(key: entry.key)
                    head = HeadAnswer(info: info, askedAt: askedAt)
                    recordPrefetched(entry, answer: .some(info), askedAt: askedAt)
                } catch where error.code == .notFound {
                    recordPrefetched(entry, answer: .some(nil), askedAt: askedAt)
                    throw FSError(.notFound, "'\(entry.key)' is gone from the server")
                } catch {
                    // Not the listing's attributes instead: they would change once a HEAD
                    // answers (the rule of `ForeignAttributes`).
                    recordPrefetched(entry, answer: nil, askedAt: askedAt)
                    throw FSError(storeError: error, operation: "lookup", path: entry.key)
                }
            }
        }
        return try names.withLock { (s) throws(FSError) in
            try self.link(entry, parent: parent, listedAt: listedAt, since: since, lastTry: lastTry, head: head, fresh: fresh, in: &s)
        }
    }

    /// The second name looked up in a directory within `lookupListingWindow` seconds lists the
    /// whole directory (up to `lookupListingLimit` entries) and remembers it, so that a walk over
    /// many names (rsync, `stat` of each file, a build) costs one listing instead of two requests
    /// per name. A first lookup, or one in a directory too large to list, asks about its name only.
    /// A lookup while such a listing runs waits for it (creates from several processes in one
    /// directory share one listing).
    /// A listing fetched ahead of a walk serves at once (rsync looks up every name of a tree
    /// without reading its directories), and a listing made here sends the subdirectories'
    /// listings ahead, as a readdir's does.
    /// Returns the listing, when it was asked and the change count it is current as of.
    package func listForLookups(_ directory: Node) throws(FSError) -> (EntryTable, askedAt: UInt64, since: UInt64)? {
        let inode = directory.inode
        if let reader = readerFromListingAhead(directory, dropQueued: false), let entries = reader.completeEntries() {
            let table = remember(reader, entries, for: inode)
            listAhead(subdirectoriesOf: entries, in: inode)
            return (table, reader.askedAt, reader.startedAt)
        }
        let now = self.now()
        enum Start {
            case list(UInt64, DispatchGroup)
            case wait(DispatchGroup)
            case no
        }
        let start: Start = names.withLock { s in
            defer { s.directories.lastResolved[inode] = now }
            if let running = s.directories.listingForLookup[inode] { return .wait(running) }
            guard let last = s.directories.lastResolved[inode], now - last <= Self.lookupListingWindow else { return .no }
            let group = DispatchGroup()
            group.enter()
            s.directories.listingForLookup[inode] = group
            return .list(s.directories.changeCount(inode), group)
        }
        switch start {
        case .no: return nil
        case .wait(let running):
            // Bounded: a listing of a huge directory must not hold every FUSE thread; a lookup
            // that waited long enough asks about its name instead.
            guard running.wait(timeout: .now() + Self.lookupListingWait) == .success else { return nil }
            return names.withLock { s in
                s.directories.listing(inode, now: self.now(), maximumAge: configuration.directoryCacheSeconds)
                    .map { ($0.entries, $0.askedAt, s.directories.changeCount(inode)) }
            }
        case .list(let startedAt, let group):
            defer {
                names.withLock { _ = $0.directories.listingForLookup.removeValue(forKey: inode) }
                group.leave()
            }
            let reader = makeDirectoryReader(directory, startedAt: startedAt)
            guard let entries = try readWhole(reader, limit: Self.lookupListingLimit) else { return nil }
            // Changes made since the reader started are in the table (DirectoryCache rule 2).
            let table = remember(reader, entries, for: inode)
            listAhead(subdirectoriesOf: entries, in: inode)
            return (table, reader.askedAt, reader.startedAt)
        }
    }

    /// Reads `reader`'s listing to its end: its entries, or nil once `limit` entries came with
    /// more to come (a full page of `limit` decides, not the page after it).
    package func readWhole(_ reader: DirectoryReader, limit: Int) throws(FSError) -> PackedEntries? {
        try reader.readWhole(limit: limit, resolvingWith: self)
    }

    package static let lookupListingWindow = ListingsAhead.lookupListingWindow
    package static let lookupListingWait = ListingsAhead.lookupListingWait
    package static let lookupListingLimit = 100_000
    /// Changes made here are applied to the listings that follow for `dir_timeout`, but at least
    /// 2 s (container listings lag behind writes) and at most 30 (memory; DirectoryCache rule 2).
    package static func journalSeconds(directoryTimeout: Double) -> Double { min(max(directoryTimeout, 2), 30) }

    /// Stores the complete listing `entries` of directory `inode` that `reader` read, with this
    /// mount's recent changes applied (DirectoryCache rule 2); returns it as a table.
    @discardableResult
    package func remember(_ reader: DirectoryReader, _ entries: PackedEntries, for inode: InodeNumber) -> EntryTable {
        let listed = EntryTable(entries)
        let table = names.withLock { s in rememberLocked(reader, listed, for: inode, in: &s).table }
        prefetchMetadata(of: entries, in: inode)
        return table
    }

    /// `remember`, under the state lock, of a table made before it (the caller prefetches
    /// metadata after).
    package func rememberLocked(
        _ reader: DirectoryReader, _ listed: EntryTable, for inode: InodeNumber, confirmed: Set<ExactString> = [],
        in s: inout NamespaceTables
    ) -> (table: EntryTable, remembered: Bool) {
        guard s.inodes[inode] != nil else { return (listed, false) }
        // Keys below it, or the directory itself, are being moved: what the store listed is
        // neither the old tree nor the new.
        guard !s.isMoving(reader.prefix) else { return (listed, false) }
        let (table, remembered) = s.directories.remember(
            listed, for: inode, now: now(), startedAt: reader.startedAt, askedAt: reader.askedAt,
            stillListed: reader.stillListed, confirmed: confirmed
        ) { name in
            // A name made here, which the listing lacks: its node as it is now, if any.
            guard let node = s.inodes.child(inode, name.string), node.kind != .directory else { return nil }
            return node.listingEntry
        }
        guard remembered else { return (table, false) }
        // Names the server no longer lists are gone (another client removed them), unless
        // they hold bytes not stored yet (a directory: below it).
        let holding = directoriesHoldingFilesBeingWritten(in: s)
        for (name, child) in s.inodes.children(of: inode)
        where table[name] == nil && s.spools[child] == nil && !holding.contains(child) {
            s.inodes.unhook(parent: inode, name: name.string)
        }
        s.sweep()
        return (table, true)
    }

    /// A reader of the server's listing of `directory`, which starts at change count `startedAt`
    /// (now, when nil); `pagesAhead`: see `DirectoryReader`.
    package func makeDirectoryReader(_ directory: Node, startedAt: UInt64? = nil, pagesAhead: Bool = true) -> DirectoryReader {
        let (count, removed) = names.withLock { s in
            (s.directories.changeCount(directory.inode), s.directories.removedHere(directory.inode, now: now()))
        }
        return DirectoryReader(
            store: store, prefix: directory.key, pageSize: configuration.listPageSize, hidden: hiddenName(in: directory),
            removedHere: removed, startedAt: startedAt ?? count, askedAt: storeClock.tick(), pagesAhead: pagesAhead)
    }

    /// The name a listing of `directory` never shows: the multipart parts prefix at the root.
    package func hiddenName(in directory: Node) -> String? {
        directory.key.isEmpty ? String(manifestPartsPrefix.dropLast()) : nil
    }

    /// Creates or updates the node for `entry` and counts one kernel lookup.
    /// `fresh`: the node's attributes were confirmed within `attr_timeout`; only count the lookup.
    /// `since`: the directory's change count when the entry was asked: a new node takes what
    /// this mount made of the name after it instead, and none is made (nil) when that was a
    /// removal or is no longer known (DirectoryCache rule 4). nil: take the entry as it is.
    /// `lastTry` (a lookup that asked `lookupAttempts` times, each answer older than a change
    /// here): a removal here after the answer is final (notFound), the answer is taken when the
    /// journal forgot what came after it or when only a HEAD would describe this mount's entry.
    package func link(
        _ answer: DirectoryEntry, parent: InodeNumber, listedAt answerAskedAt: UInt64, since: UInt64?,
        lastTry: Bool = false, head answerHead: HeadAnswer?, fresh: Bool = false, in s: inout NamespaceTables
    ) throws(FSError) -> Attributes? {
        var (entry, listedAt, head) = (answer, answerAskedAt, answerHead)
        if let since, s.inodes.child(parent, entry.name)?.kind != entry.kind {
            switch s.directories.changeSince(parent, entry.name, count: since) {
            case .nothing: break
            case .changed(let mine?) where mine.kind == entry.kind && !mine.etag.isEmpty && mine.etag == entry.etag:
                // The answer shows the version this mount made (a HEAD after the upload).
                break
            case .changed(let mine?) where !Self.describesWhole(mine):
                // A directory or a DLO (its entry says size 0): only a HEAD describes it.
                if !lastTry { return nil }
            case .changed(let mine?):
                // Recorded after the store acknowledged it: as of now.
                (entry, listedAt, head) = (mine, storeClock.tick(), nil)
            case .changed(nil):
                if lastTry { throw FSError(.notFound, "'\(entry.name)' was removed here after the store answered") }
                return nil
            case .unknown:
                if !lastTry { return nil }
            }
        }
        let parentKey = s.inodes[parent]?.key ?? configuration.rootPrefix
        let linked = s.inodes.link(
            parent: parent, name: entry.name, kind: Self.kind(of: entry, head: head), key: Self.key(of: entry, below: parentKey),
            lookups: 1,
            reserved: s.directories.takeReservation(parent, entry.name))
        if let open = s.spools[linked.inode] {
            // The spool describes the file (changes not stored yet): the server's view must not win.
            var node = linked
            node.size = open.size
            return attributes(of: node)
        }
        let node = s.inodes.update(linked.inode) { node in
            node.merge(entry, listedAt: listedAt, head: head, fresh: fresh, now: now(), foreign: configuration.foreignAttributes)
        }
        return attributes(of: node ?? linked)
    }

    /// The kind of a listed object: what its content type says, or, where the listing shows
    /// none (an S3 listing), what its HEAD says (`NodeKind.of(_:)`: a symlink, a FIFO, a socket).
    package static func kind(of entry: DirectoryEntry, head: HeadAnswer?) -> NodeKind {
        guard entry.kindUnknown, let info = head?.info else { return entry.kind }
        return NodeKind.of(info)
    }

    /// Whether a listing entry alone describes its object (no HEAD needed): not a directory
    /// (attributes on its marker), not a zero-byte file (maybe a DLO manifest).
    package static func describesWhole(_ entry: DirectoryEntry) -> Bool {
        entry.kind != .directory && !(entry.kind == .file && entry.size == 0)
    }

    /// The key of a listed entry below the parent's current key: a listing that started before
    /// the parent was renamed names the old place (DirectoryCache rule 3).
    package static func key(of entry: DirectoryEntry, below parentKey: String) -> String {
        var component = Substring(entry.key)
        if entry.kind == .directory { component = component.dropLast() }
        if let slash = component.lastIndex(of: "/") { component = component[component.index(after: slash)...] }
        return parentKey + component + (entry.kind == .directory ? "/" : "")
    }

    /// Whether `name` in `directory` is the reserved parts prefix (only at the container root).
    package func isHidden(_ name: String, in directory: Node) -> Bool {
        directory.kind == .directory && directory.key.isEmpty && (name + "/").isSameKey(as: manifestPartsPrefix)
    }

    /// Finds `name` below `prefix` on the server: HEAD of the object, a peek below `name/`.
    package func resolve(name: String, prefix: String) throws(FSError) -> (DirectoryEntry, ObjectInfo?) {
        let key = prefix + name
        var file: ObjectInfo? = nil
        var children: [ListEntry] = []
        let askedAt = storeClock.tick()
        // The HEAD and the peek go out together (issue 20, part 2: one round trip, not two).
        let failure = pool.forEach(2, width: 2) { (index) throws(ObjectStoreError) in
            if index == 0 {
                do throws(ObjectStoreError) {
                    file = try store.head(key: key)
                } catch where error.code == .notFound {
                    file = nil
                }
            } else {
                children = try store.list(prefix: key + "/", delimiter: "/", marker: nil, limit: 2).entries
            }
        }
        if let failure { throw FSError(storeError: failure, operation: "lookup", path: key) }
        let directory = DirectoryBuilder.directory(name, key: key + "/")
        switch (file, children.isEmpty) {
        case (nil, true):
            if name.hasSuffix(DirectoryBuilder.shadowSuffix) {
                return try resolveShadowed(alias: name, prefix: prefix)
            }
            throw FSError(.notFound, "no '\(name)' in '\(prefix)'")
        case (nil, false):
            return (directory, nil)
        case (let info?, let noChildren):
            if ObjectKey.isDirectoryContentType(info.contentType) { return (directory, nil) }
            let entry = DirectoryEntry(name: name, info: info)
            // The HEAD has the metadata headers a listing lacks: the lookup uses them.
            recordPrefetched(entry, answer: .some(info), askedAt: askedAt)
            if noChildren { return (entry, info) }
            let resolution = DirectoryBuilder.resolve(
                key: key, manifest: info.manifest, container: store.containerName, childrenPreview: children)
            return resolution == .fileWins ? (entry, info) : (directory, nil)
        }
    }

    /// `x~object`: the file `x` hidden by a directory `x`.
    package func resolveShadowed(alias: String, prefix: String) throws(FSError) -> (DirectoryEntry, ObjectInfo?) {
        let name = String(alias.dropLast(DirectoryBuilder.shadowSuffix.count))
        guard DirectoryBuilder.isValidName(name) else { throw FSError(.notFound, "no '\(alias)' in '\(prefix)'") }
        let (resolved, _) = try resolve(name: name, prefix: prefix)
        guard resolved.kind == .directory else { throw FSError(.notFound, "no '\(alias)' in '\(prefix)'") }
        do {
            let info = try store.head(key: prefix + name)
            var entry = DirectoryEntry(name: alias, info: info)
            entry.key = prefix + name
            return (entry, info)
        } catch {
            throw FSError(storeError: error, operation: "lookup", path: prefix + alias)
        }
    }

    /// The kernel dropped `count` lookups of `inode`.
    package func forget(_ inode: InodeNumber, count: UInt64) {
        names.withLock { s in
            // The listing first, when this drops the node: the next lookup makes a node from
            // the remembered entry, which may describe a version older than the node knew
            // (another client's, a HEAD showed it).
            if let node = s.inodes[inode], node.lookups == count, node.pins == 0, node.linked, node.kind != .directory {
                correctListing(describing: node, comparingTimes: false, in: &s)
            }
            s.inodes.forget(inode, count: count)
            s.sweep()
        }
    }
}
