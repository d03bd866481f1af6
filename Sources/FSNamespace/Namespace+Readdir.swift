import Dispatch
import FSCore
import Locking
import Logging
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

// Directories: opendir, readdir(plus), the walk of one directory handle, and the collision rule's
// HEADs. Listings come from the namespace room (DirectoryCache, DirectoryReader).
extension Namespace {
    // MARK: Directories

    package func opendir(_ inode: InodeNumber) throws(FSError) -> UInt64 {
        let directory = try node(inode)
        guard directory.kind == .directory else { throw FSError(.notADirectory, "opendir of a file") }
        return names.withLock { s in
            s.directoryHandles.open(OpenDirectory())
        }
    }

    /// The listing of `directory` as it is now: a remembered one younger than dir_timeout (which
    /// our own changes keep current; `ls -l` twice in a row costs one LIST), else the server's.
    package func directoryReader(_ directory: Node) -> DirectoryReader {
        noteReaddir(of: directory)
        let remembered: (PackedEntries, askedAt: UInt64, count: UInt64)? = names.withLock { s in
            guard
                let listing = s.directories.listing(
                    directory.inode, now: now(), maximumAge: configuration.directoryCacheSeconds)
            else { return nil }
            return (listing.entries.sorted, listing.askedAt, s.directories.changeCount(directory.inode))
        }
        return remembered.map {
            DirectoryReader(prefix: directory.key, remembered: $0.0, startedAt: $0.count, askedAt: $0.askedAt)
        } ?? readerFromListingAhead(directory) ?? makeDirectoryReader(directory)
    }

    /// One thing readdir shows.
    package enum Item {
        case dot(String, InodeNumber)
        /// A name from the listing, asked for at `askedAt` (the attribute rule) when the
        /// directory's change count was `since` (DirectoryCache rule 4).
        case listed(DirectoryEntry, askedAt: UInt64, since: UInt64)
        /// A file created here that the server does not list yet (open, or waiting for its upload).
        case local(String, InodeNumber)
    }

    /// Emits entries from `offset` on; `emit(name, kind, inode, nextOffset)` returns false when full.
    package func readdir(
        _ inode: InodeNumber, handle: UInt64, offset: Int64,
        emit: (String, NodeKind, InodeNumber, Int64) -> Bool
    ) throws(FSError) {
        try walk(inode, handle: handle, offset: offset) { item, next in
            switch item {
            case .dot(let name, let target): return emit(name, .directory, target, next)
            case .listed(let entry, _, _):
                let shown = shownInode(entry.name, kind: entry.kind, in: inode, kindUnknown: entry.kindUnknown)
                return emit(entry.name, shown.kind, shown.inode, next)
            case .local(let name, let child): return emit(name, .file, shownInode(name, kind: .file, in: inode, local: child).inode, next)
            }
        }
    }

    /// readdirplus: as `readdir`, and with the attributes of every entry the listing describes
    /// fully (each counts as a kernel lookup). Directories and zero-byte files, whose attributes
    /// need a HEAD, come without (nil): the kernel looks them up when it needs them.
    /// `emit(name, kind, inode, attributes, nextOffset)` returns false when full.
    package func readdirplus(
        _ inode: InodeNumber, handle: UInt64, offset: Int64,
        emit: (String, NodeKind, InodeNumber, Attributes?, Int64) -> Bool
    ) throws(FSError) {
        try walk(inode, handle: handle, offset: offset) { item, next in
            // Another tool's object: its metadata headers if a HEAD (or the index) has them;
            // else, with `foreign_attrs=head`, the name alone (the kernel looks it up if the
            // program wants more, and the lookup waits for the HEAD).
            var head: HeadAnswer? = nil
            var nameOnly = false
            if case .listed(let entry, let listedAt, _) = item, awaitsHead(entry) {
                if case .known(let answer) = prefetchedMetadata(entry, wait: false, listedAt: listedAt), answer.info != nil {
                    head = answer
                } else {
                    nameOnly = true
                }
            }
            let linked: (String, NodeKind, Attributes?)? = names.withLock { s in
                switch item {
                case .dot: return nil
                case .listed(let entry, let listedAt, let since):
                    // A file being written here: its spool describes it, whatever the listing
                    // (or this mount's journaled entry of the create) says, even another kind of
                    // object (a write-back rename over it, not stored yet).
                    if let local = s.inodes.child(inode, entry.name), local.kind == .file,
                        let attributes = lookUpSpooled(local.inode, in: &s)
                    {
                        return (entry.name, .file, attributes)
                    }
                    guard entry.kind == .symlink || (entry.kind == .file && entry.size > 0), !nameOnly else { return nil }
                    // nil: the listing is older than a change made here (the kernel looks it up).
                    let attributes = try? link(entry, parent: inode, listedAt: listedAt, since: since, head: head, in: &s)
                    return (entry.name, attributes?.kind ?? entry.kind, attributes)
                case .local(let name, let child):
                    return lookUpSpooled(child, in: &s).map { (name, .file, $0) }
                }
            }
            if let (name, kind, attributes) = linked, let attributes {
                if emit(name, kind, attributes.inode, attributes, next) { return true }
                forget(attributes.inode, count: 1)  // not sent: the kernel never saw this lookup
                return false
            }
            switch item {
            case .dot(let name, let target): return emit(name, .directory, target, nil, next)
            case .listed(let entry, _, _):
                let shown = shownInode(entry.name, kind: entry.kind, in: inode, kindUnknown: entry.kindUnknown)
                return emit(entry.name, shown.kind, shown.inode, nil, next)
            case .local(let name, let child): return emit(name, .file, child, nil, next)
            }
        }
    }

    package func walk(_ inode: InodeNumber, handle: UInt64, offset: Int64, emit: (Item, Int64) -> Bool) throws(FSError) {
        // A dead worker's handle (issue 40) is taken over with no reader: it lists the
        // directory again from the offset asked for.
        guard var open = names.withLock({ $0.directoryHandles.inherit(handle, OpenDirectory()) }) else {
            throw FSError(.badHandle, "unknown directory handle \(handle)")
        }
        let reader: DirectoryReader
        if offset == 0 || open.reader == nil {
            // The first readdir, or rewinddir (the kernel cannot tell them apart): the directory
            // as it is now. glibc's rewinddir before any readdir must show changes made since
            // opendir too, so opendir takes no listing.
            reader = directoryReader(try node(inode))
            open.reader = reader
            names.withLock { s in
                s.directoryHandles.replace(handle, with: open)
                if !reader.isRemembered { s.readers[inode] = (reader, now()) }
            }
        } else {
            reader = open.reader!
        }
        let parent = names.withLock { s in
            s.directories.touch(inode)
            s.directories.noteNamesUsed(inode, now: now())
            // A reader still being read serves lookups (`NamespaceTables.readers`): `ls -l` of 200 000
            // names reads for minutes when each needs a HEAD.
            if s.readers[inode]?.reader === reader { s.readers[inode]?.at = now() }
            return s.inodes[inode]?.parent
        } ?? Self.rootInode
        if offset == 0 && !emit(.dot(".", inode), 1) { return }
        if offset <= 1 && !emit(.dot("..", parent), 2) { return }
        var index = Int(max(offset, 2) - 2)
        while true {
            let (batch, complete) = try reader.entries(from: index, resolvingWith: self)
            if batch.isEmpty {
                if complete { finishListing(reader, for: inode, from: index, emit: emit) }
                return
            }
            for entry in batch {
                index += 1
                if !emit(.listed(entry, askedAt: reader.askedAt, since: reader.startedAt), Int64(index) + 2) { return }
            }
        }
    }

    /// The attributes of a file with a spool (its bytes not all stored: the spool describes it,
    /// not the server), counting one kernel lookup; nil without a spool.
    package func lookUpSpooled(_ inode: InodeNumber, in s: inout NamespaceTables) -> Attributes? {
        guard var node = s.inodes[inode], let open = s.spools[inode] else { return nil }
        s.inodes.countLookup(inode)
        node.size = open.size
        return attributes(of: node)
    }

    /// The kind and inode number readdir shows for `name`: its node's, else one reserved for it,
    /// which the node a later lookup makes will take (so that d_ino and st_ino agree).
    /// `local`: the node of a file being written, which the listing lacks.
    /// `kindUnknown`: the listing does not say which kind of object (an S3 listing shows no
    /// content type): a node of any kind but a directory is the name's.
    package func shownInode(
        _ name: String, kind: NodeKind, in directory: InodeNumber, local: InodeNumber? = nil, kindUnknown: Bool = false
    ) -> (kind: NodeKind, inode: InodeNumber) {
        names.withLock { s in
            let child = s.inodes.child(directory, name) ?? local.flatMap { s.inodes[$0] }
            // A file being written here is what the name shows, whatever kind of object the store
            // still has there (a write-back rename over it, not stored yet). A node of another
            // kind is the name's old object: a lookup makes a new one.
            if let node = child,
                node.kind == kind || (node.kind == .file && s.spools[node.inode] != nil) || (kindUnknown && node.kind != .directory)
            {
                // One the kernel holds no lookup of may go before the lookup that follows (its
                // upload ends, the spool retires): the next node for the name takes its number.
                if node.lookups == 0 { s.directories.reserve(directory, name, node.inode) }
                return (node.kind, node.inode)
            }
            if let local { return (.file, local) }
            return (kind, s.directories.reservedInode(directory, name, isFree: { s.inodes[$0] == nil }) { s.inodes.reserveInode() })
        }
    }

    /// After the listing: remember it (once per reader), then emit what this mount made that
    /// the listing lacks: names it recorded (DirectoryCache rule 2) and files open, not stored yet.
    package func finishListing(
        _ reader: DirectoryReader, for inode: InodeNumber, from index: Int, emit: (Item, Int64) -> Bool
    ) {
        guard let entries = reader.completeEntries() else { return }
        let tail = reader.tail { () -> [DirectoryReader.TailItem] in
            defer {
                if !reader.isRemembered {
                    prefetchMetadata(of: entries, in: inode)
                    listAhead(subdirectoriesOf: entries, in: inode)
                }
            }
            let listed = reader.isRemembered ? nil : EntryTable(entries)
            // One look: a file whose upload ends in between would be neither open nor in the
            // table (its journaled change may have been forgotten after a failure).
            return names.withLock { s in
                let table = listed.map { rememberLocked(reader, $0, for: inode, in: &s).table }
                // What the reader's entries show, and what this mount recorded that they lack:
                // a fresh listing's table has the changes; a remembered listing's entries are
                // as the reader took them, and what was recorded since is added here (an upload
                // that ended during a walk put a file shown as open into the listing).
                let shown: EntryTable
                let recorded: [DirectoryEntry]
                if let table {
                    (shown, recorded) = (table, table.addedHere)
                } else {
                    shown = EntryTable(entries)
                    recorded = (s.directories.anyListing(inode)?.entries.addedHere ?? []).filter { shown[$0.name.exact] == nil }
                }
                let recordedNames = Set(recorded.map(\.name.exact))
                func lacks(_ name: ExactString) -> Bool {
                    shown[name] == nil && !recordedNames.contains(name) && !(table?.listed(name) ?? false)
                }
                // (Open files first: a directory of 200 000 names has as many children to look up.)
                let children = s.spools.isEmpty ? [] : s.inodes.children(of: inode)
                let open = children.filter { s.spools[$0.inode] != nil && lacks($0.name) }
                let writing = children.isEmpty ? [] : directoriesHoldingFilesBeingWritten(in: s)
                let holding = children.compactMap { child -> DirectoryEntry? in
                    guard writing.contains(child.inode), lacks(child.name), let node = s.inodes[child.inode] else { return nil }
                    return DirectoryBuilder.directory(child.name.string, key: node.key)
                }
                return recorded.map { .listed($0) } + holding.map { .listed($0) }
                    + open.sorted { $0.name < $1.name }.map { .local($0.name.string, $0.inode) }
            }
        }
        let start = index - entries.count
        for (i, item) in tail.enumerated() where i >= start {
            let next = Int64(entries.count + i + 1) + 2
            switch item {
            case .listed(let entry): if !emit(.listed(entry, askedAt: reader.askedAt, since: reader.startedAt), next) { return }
            case .local(let name, let child): if !emit(.local(name, child), next) { return }
            }
        }
    }

    package func releasedir(handle: UInt64) {
        names.withLock { s in
            if let reader = s.directoryHandles[handle]?.reader {
                for (inode, current) in s.readers where current.reader === reader { s.readers[inode] = nil }
            }
            _ = s.directoryHandles.close(handle)
        }
    }

    /// Resolves a readdir collision (see DirectoryBuilder).
    package func resolve(_ collision: DirectoryBuilder.Collision, prefix: String) throws(FSError)
        -> DirectoryBuilder.Collision.Resolution
    {
        guard collision.file.size == 0 else { return .directoryWins }
        do {
            let askedAt = storeClock.tick()
            let info = try store.head(key: collision.file.key)
            // The lookup that follows uses this HEAD (the file is a zero-byte object, see needsMetadata).
            recordPrefetched(DirectoryBuilder.file(collision.name, collision.file), answer: .some(info), askedAt: askedAt)
            let children = try store.list(prefix: collision.file.key + "/", delimiter: "/", marker: nil, limit: 2)
            return DirectoryBuilder.resolve(
                key: collision.file.key, manifest: info.manifest, container: store.containerName,
                childrenPreview: children.entries)
        } catch where error.code == .notFound {
            return .directoryWins
        } catch {
            throw FSError(storeError: error, operation: "readdir", path: collision.file.key)
        }
    }

    /// Records a change we made in the remembered listing of `parent` (nil entry = removed).
    package func updateListing(_ parent: InodeNumber, name: String, entry: DirectoryEntry?, in s: inout NamespaceTables) {
        s.directories.record(parent, name: name, entry: entry, now: now())
    }

    /// Records `node` in its directory's remembered listing where that describes another
    /// version (ETag, size, kind) or another mode or owner (a name the listing lacks is left
    /// alone). `comparingTimes`: the modification time too, for a node this mount changed;
    /// not for one the kernel forgets, since other tools' objects carry their time in a header
    /// only a HEAD shows, and every such node would be recorded as changed here.
    package func correctListing(describing node: Node, comparingTimes: Bool, in s: inout NamespaceTables) {
        guard let listing = s.directories.anyListing(node.parent), !listing.dropped,
            let listed = listing.entries[node.name.exact]
        else { return }
        let stored = listed.parsedContentType.attributes
        guard listed.etag != node.etag || listed.size != (node.manifest == nil ? node.size : 0) || listed.kind != node.kind
            || stored.mode != node.stored.mode || stored.uid != node.stored.uid || stored.gid != node.stored.gid
            || (comparingTimes && stored.mtime != node.stored.mtime)
        else { return }
        updateListing(describing: node, correction: true, in: &s)
    }

    /// Records what we stored for `node` in its directory's listing, if a name still leads to it.
    /// `correction`: what the node knows better than the listing, not a change made here (another
    /// client may have removed the name since: later listings are not given it back).
    package func updateListing(describing node: Node, correction: Bool = false, in s: inout NamespaceTables) {
        guard s.inodes.child(node.parent, node.name)?.inode == node.inode else { return }
        s.directories.record(node.parent, name: node.name, entry: node.listingEntry, now: now(), correction: correction)
    }
}
