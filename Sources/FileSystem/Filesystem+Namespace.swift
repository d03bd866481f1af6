import Dispatch
import FSCore
import FSFiles
import FSJournal
import FSNamespace
import Locking
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Creating, removing and renaming names.
///
/// Subtleties:
/// 1. mkdir writes a zero-byte `dir/` marker with content type application/directory: tools that
///    follow either convention (trailing-slash markers, or the content type) see a directory.
/// 2. A file is renamed by a server-side copy and a delete; a multipart file by writing a new
///    manifest that points at the same parts. A directory is renamed key by key: not atomic, and
///    a failure half-way leaves both names holding part of the tree (the man page says so).
/// 3. An unlinked file that is still open is never uploaded again.
extension Filesystem {
    /// The directory `parent`, where `name` may be made or removed. `suffix`: bytes the key adds
    /// after the name (1 for a directory's `/`).
    private func requireWritableDirectory(_ parent: InodeNumber, name: String, suffix: Int = 0) throws(FSError) -> Node {
        if configuration.readOnly { throw FSError(.readOnly, "this mount is read-only") }
        let directory = try node(parent)
        guard directory.kind == .directory else { throw FSError(.notADirectory, "not a directory") }
        guard DirectoryBuilder.isValidName(name) else {
            throw FSError(name.utf8.count > 255 ? .nameTooLong : .invalidArgument, "invalid name '\(name)'")
        }
        try Self.requireStorable(directory.key + name, suffix: suffix)
        if isHidden(name, in: directory) { throw FSError(.notPermitted, "'\(name)' is reserved for multipart parts") }
        return directory
    }

    /// Runs an operation on names; when it fails, nothing remembered about them is trusted any
    /// more (see `forgetAfterFailure`).
    func forgettingOnFailure<T>(
        _ names: [(parent: InodeNumber, name: String)], restoring original: Node? = nil, _ body: () throws(FSError) -> T
    ) throws(FSError) -> T {
        do {
            return try body()
        } catch {
            forgetAfterFailure(names, restoring: original)
            throw error
        }
    }

    /// A failure part-way through an operation on these names: the store may hold the old state,
    /// the new one, or a mix (a COPY done and its DELETE not; an answer lost after the server did
    /// the work). The parents' listings are dropped, and the nodes and everything below them are
    /// asked for again at their next lookup or stat. `original`: the node as it was before a
    /// failed attribute change, whose attributes it gets back (the server's answer decides later).
    func forgetAfterFailure(_ names: [(parent: InodeNumber, name: String)], restoring original: Node? = nil) {
        var keys: [String] = []
        var prefixes: [String] = []
        let failedAt = storeClock.tick()
        state.withLock { s in
            for (parent, name) in names {
                s.directories.forget(name, in: parent)
                guard let node = s.inodes.child(parent, name) else { continue }
                var pending = [node.inode]
                while let inode = pending.popLast() {
                    let restore = original?.inode == inode && s.openFiles[inode] == nil
                    guard let current = s.inodes.update(inode, { n in
                        if restore, let original { n.stored = original.stored }
                        n.forgetWhatWasSaid(at: failedAt)
                    }) else { continue }
                    keys.append(current.key)
                    if current.kind == .directory {
                        s.directories.drop(inode)
                        keys.append(String(current.key.dropLast()))
                        prefixes.append(current.key)
                        pending += s.inodes.children(of: inode).map(\.inode)
                    }
                }
            }
        }
        forgetPrefetched(keys: keys, prefixes: prefixes)
    }

    /// Adds a node for a name we just made, counting one kernel lookup.
    private func insert(_ node: Node, in s: inout State) -> Node {
        var node = node
        node.confirmedAt = now()
        // Made here (and stored, but for a file being created): older answers describe another object.
        node.acknowledge(at: storeClock.tick())
        let inserted = s.inodes.insert(node)
        s.sweep()
        return inserted
    }

    /// ENAMETOOLONG for a key the store cannot hold (`maximumKeyLength` bytes).
    static func requireStorable(_ key: String, suffix: Int = 0) throws(FSError) {
        guard key.utf8.count + suffix <= maximumKeyLength else {
            throw FSError(
                .nameTooLong, "the path is \(key.utf8.count + suffix) bytes as a key; the store takes at most \(maximumKeyLength)")
        }
    }

    /// The attributes of a name made now by `caller` in `directory`. In a setgid directory the new
    /// entry takes the directory's group, and a new subdirectory keeps the setgid bit (as ext4).
    private func newAttributes(mode: UInt16, caller: Caller, in directory: Node, isDirectory: Bool = false)
        -> StoredAttributes
    {
        var stored = StoredAttributes(mode: mode & 0o7777, uid: caller.uid, gid: caller.gid, mtime: Timestamp.now())
        let parent = attributes(of: directory)
        if parent.permissions & 0o2000 != 0 {
            stored.gid = parent.gid
            if isDirectory { stored.mode = (mode & 0o7777) | 0o2000 }
        }
        return stored
    }

    /// Creates a file and opens it for writing. It is stored when it is closed. `exclusive`
    /// (`O_EXCL`) with `excl_create=server`: the empty file is stored before the open returns,
    /// with `If-None-Match: *`, so that of two hosts creating the same name one gets EEXIST
    /// (issue 22). Otherwise, and where the server ignores the header (`honoursIfNoneMatch`), the
    /// name is checked by this mount's lookup only; the upload at the close is still stored only
    /// where nothing is, else as a conflict copy (`lostUpdateCheck`).
    public func create(parent: InodeNumber, name: String, mode: UInt16, caller: Caller, exclusive: Bool = false)
        throws(FSError) -> (Attributes, OpenResult)
    {
        defer { boundNodes() }
        let directory = try requireWritableDirectory(parent, name: name)
        let stored = newAttributes(mode: mode, caller: caller, in: directory)
        let key = directory.key + name
        let contentType = "application/octet-stream"
        var etag = ""
        if exclusive && configuration.serverExclusiveCreates && store.honoursIfNoneMatch {
            etag = try storeExclusively(key, stored: stored, contentType: contentType, parent: parent, name: name)
        }
        let (path, fd) = try spool.create()
        let result: (Node, SpoolFile, UInt64) = state.withLock { s in
            var node = Node(
                inode: 0, parent: parent, name: name, kind: .file, key: key, size: 0, etag: etag,
                lastModified: Timestamp.now())
            node.stored = stored
            node.baseContentType = contentType
            node = insert(node, in: &s)
            // Stored already (exclusive): a close with nothing written sends nothing more.
            let open = SpoolFile(inode: node.inode, path: path, fd: fd, size: 0, dirty: etag.isEmpty, baseETag: etag)
            _ = open.state.withLock { $0.attach(writable: true) }
            s.openFiles[node.inode] = open
            s.inodes.pin(node.inode)
            let handle = s.handles.open(.spool(open, writable: true))
            updateListing(parent, name: name, entry: entry(for: node), in: &s)
            return (node, open, handle)
        }
        return (attributes(of: result.0), OpenResult(handle: result.2, keepCache: false))
    }

    /// The empty object of an exclusive create, stored only where nothing is. EEXIST when
    /// another client's object is there: what this mount remembered of the name is dropped, and
    /// so is the kernel's "no such file" for it.
    private func storeExclusively(_ key: String, stored: StoredAttributes, contentType: String, parent: InodeNumber, name: String)
        throws(FSError) -> String
    {
        forgetPrefetched(keys: [key])
        let token = String(UInt64.random(in: 0...UInt64.max), radix: 16)
        do throws(ObjectStoreError) {
            var metadata = stored.metadata(mergedInto: [:])
            metadata[StoredAttributes.createTokenHeader] = token
            let started = monotonicNow()
            let etag = try store.put(
                key: key, body: .bytes([]), contentType: stored.contentType(base: contentType), metadata: metadata,
                onlyIfAbsent: true)
            // Swift checks If-None-Match when a PUT starts and stores the object when it ends: of
            // two PUTs at once both may pass, and the one stored last (the later to reach the
            // proxy) stays. Read back whose it is, once a PUT that started while ours ran has
            // had as long again as ours took to end (`excl_create` in the man page).
            let took = monotonicNow() - started
            usleep(UInt32(min(max(took, 0.005), 1) * 1_000_000))
            guard try store.head(key: key).metadata[StoredAttributes.createTokenHeader] == token else {
                throw ObjectStoreError(.preconditionFailed, "another client's create of '\(key)' was stored after ours")
            }
            return etag
        } catch where error.code == .preconditionFailed {
            forgetAfterFailure([(parent, name)])
            // Not on this thread: the kernel holds the directory's lock for the create.
            _ = pool.submit { [kernelCache] in kernelCache.forgetEntry(parent, name) }
            throw FSError(.exists, "'\(key)' exists: another client made it")
        } catch {
            throw FSError(storeError: error, operation: "create", path: key)
        }
    }

    /// mknod: a regular file (stored at once, empty), a FIFO or a socket (an empty object whose
    /// content type names the type); `kind` nil (a device) is EPERM.
    public func mknod(parent: InodeNumber, name: String, mode: UInt16, kind: NodeKind?, caller: Caller) throws(FSError)
        -> Attributes
    {
        defer { boundNodes() }
        switch kind {
        case .file?:
            // mknod fails where the name exists: exclusive, as O_EXCL.
            let (attributes, opened) = try create(parent: parent, name: name, mode: mode, caller: caller, exclusive: true)
            defer { release(handle: opened.handle) }
            try flush(handle: opened.handle)
            return attributes
        case .fifo?, .socket?:
            return try makeSpecial(kind!, parent: parent, name: name, mode: mode, caller: caller)
        case .directory?, .symlink?, nil:
            throw FSError(.notPermitted, "device files cannot be stored")
        }
    }

    private func makeSpecial(_ kind: NodeKind, parent: InodeNumber, name: String, mode: UInt16, caller: Caller)
        throws(FSError) -> Attributes
    {
        try forgettingOnFailure([(parent, name)]) { () throws(FSError) in
            let directory = try requireWritableDirectory(parent, name: name)
            let key = directory.key + name
            let base = kind == .fifo ? StoredAttributes.fifoContentType : StoredAttributes.socketContentType
            let stored = newAttributes(mode: mode, caller: caller, in: directory)
            forgetPrefetched(keys: [key])
            let etag: String
            do throws(ObjectStoreError) {
                etag = try store.put(
                    key: key, body: .bytes([]), contentType: stored.contentType(base: base),
                    metadata: stored.metadata(mergedInto: [:]))
            } catch {
                throw FSError(storeError: error, operation: "mknod", path: key)
            }
            let node: Node = state.withLock { s in
                var node = Node(inode: 0, parent: parent, name: name, kind: kind, key: key, etag: etag, lastModified: Timestamp.now())
                node.stored = stored
                node.baseContentType = base
                node = insert(node, in: &s)
                updateListing(parent, name: name, entry: entry(for: node), in: &s)
                return node
            }
            return attributes(of: node)
        }
    }

    public func mkdir(parent: InodeNumber, name: String, mode: UInt16, caller: Caller) throws(FSError) -> Attributes {
        defer { boundNodes() }
        return try forgettingOnFailure([(parent, name)]) { () throws(FSError) in
            let directory = try requireWritableDirectory(parent, name: name, suffix: 1)
            let prefix = directory.key + name + "/"
            let stored = newAttributes(mode: mode, caller: caller, in: directory, isDirectory: true)
            forgetPrefetched(keys: [prefix, String(prefix.dropLast())])
            do throws(ObjectStoreError) {
                try store.put(
                    key: prefix, body: .bytes([]), contentType: stored.contentType(base: ObjectKey.directoryContentType),
                    metadata: stored.metadata(mergedInto: [:]))
            } catch {
                throw FSError(storeError: error, operation: "mkdir", path: prefix)
            }
            let node: Node = state.withLock { s in
                var node = Node(
                    inode: 0, parent: parent, name: name, kind: .directory, key: prefix, size: 0, etag: "",
                    lastModified: Timestamp.now())
                node.stored = stored
                node = insert(node, in: &s)
                s.directories.rememberEmpty(node.inode, now: now(), askedAt: storeClock.tick())
                updateListing(parent, name: name, entry: DirectoryBuilder.directory(name, key: prefix), in: &s)
                return node
            }
            return attributes(of: node)
        }
    }

    public func symlink(parent: InodeNumber, name: String, target: String, caller: Caller) throws(FSError) -> Attributes {
        defer { boundNodes() }
        return try forgettingOnFailure([(parent, name)]) { () throws(FSError) in
            let directory = try requireWritableDirectory(parent, name: name)
            let key = directory.key + name
            var stored = newAttributes(mode: 0o777, caller: caller, in: directory)
            stored.mode = nil
            var metadata = stored.metadata(mergedInto: [:])
            // svfs's header, when the target fits in a header as it is; the body always holds it.
            // (Swift caps a metadata value at 256 bytes: a longer target lives in the body only.)
            if target.utf8.count <= 256 && target.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) {
                metadata[StoredAttributes.symlinkTargetHeader] = target
            }
            let etag: String
            forgetPrefetched(keys: [key])
            do throws(ObjectStoreError) {
                etag = try store.put(
                    key: key, body: .bytes(Array(target.utf8)),
                    contentType: stored.contentType(base: StoredAttributes.symlinkContentType), metadata: metadata)
            } catch {
                throw FSError(storeError: error, operation: "symlink", path: key)
            }
            let node: Node = state.withLock { s in
                var node = Node(
                    inode: 0, parent: parent, name: name, kind: .symlink, key: key, size: Int64(target.utf8.count),
                    etag: etag, lastModified: Timestamp.now())
                node.stored = stored
                node.baseContentType = StoredAttributes.symlinkContentType
                node.symlinkTarget = target
                node = insert(node, in: &s)
                updateListing(parent, name: name, entry: entry(for: node), in: &s)
                return node
            }
            return attributes(of: node)
        }
    }

    public func readlink(_ inode: InodeNumber) throws(FSError) -> String {
        let node = try node(inode)
        guard node.kind == .symlink else { throw FSError(.invalidArgument, "not a symlink") }
        if let target = node.symlinkTarget { return target }
        do {
            let bytes = try store.getBytes(key: node.key, range: nil)
            let target = String(decoding: bytes, as: UTF8.self)
            state.withLock { _ = $0.inodes.update(inode) { $0.symlinkTarget = target } }
            return target
        } catch {
            throw FSError(storeError: error, operation: "readlink", path: node.key)
        }
    }


    /// What `name` in `parent` is, for an operation on it: the node the name leads to, else what
    /// the server says (then the node may be gone from the table already: it counts no lookup).
    private func target(_ parent: InodeNumber, _ name: String) throws(FSError) -> Node {
        // A name confirmed within attr_timeout, or with unstored bytes, is trusted as the kernel
        // trusts its dentry; anything older is asked for again (another client may have removed it).
        let known: Node? = state.withLock { s in
            guard let node = s.inodes.child(parent, name),
                s.openFiles[node.inode] != nil || now() - node.confirmedAt <= configuration.attributeCacheSeconds
            else { return nil }
            return node
        }
        if let known { return known }
        let attributes = try lookup(parent: parent, name: name)
        let node: Node? = state.withLock { s in
            let node = s.inodes[attributes.inode]
            s.inodes.forget(attributes.inode, count: 1)
            s.sweep()
            return node
        }
        guard let node else { throw FSError(.stale, "'\(name)' vanished while it was looked up") }
        return node
    }

    public func unlink(parent: InodeNumber, name: String) throws(FSError) {
        try forgettingOnFailure([(parent, name)]) { () throws(FSError) in
            _ = try requireWritableDirectory(parent, name: name)
            let target = try target(parent, name)
            guard target.kind != .directory else { throw FSError(.isADirectory, "unlink of a directory") }
            // A spool's node is pinned once more while this runs: the upload this waits for
            // retires the spool when it ends, and the node must still be here to say what that
            // upload stored (the version the delete names).
            let open: SpoolFile? = state.withLock { s in
                let open = s.openFiles[target.inode]
                if open != nil { s.inodes.pin(target.inode) }
                return open
            }
            defer {
                if open != nil {
                    state.withLock { s in
                        s.inodes.unpin(target.inode)
                        s.sweep()
                    }
                }
            }
            // Holding the file's upload lock: an upload under way ends first, and none starts until
            // the spool is marked removed, so the object cannot reappear after the DELETE.
            try withUploadsHeld(open.map { [$0] } ?? []) { () throws(FSError) in
                // (A queued file renamed over a stored one has an object at its key: the one it
                // replaces at its upload, `baseETag`.)
                let neverStored = open?.state.withLock { $0.dataDirty && target.etag.isEmpty && $0.baseETag.isEmpty } ?? false
                forgetPrefetched(keys: [target.key])
                if !neverStored {
                    if configuration.writeBack {
                        // The node as the last upload left it (it may have ended since `target`).
                        let node = state.withLock { $0.inodes[target.inode] } ?? target
                        let base = open?.state.withLock { $0.baseETag } ?? ""
                        let seen = node.etag.isEmpty ? base : DeleteEntry.version(etag: node.etag, manifest: node.manifest)
                        try deletes.enqueue(
                            key: target.key, etag: seen, kind: node.manifest != nil || node.size == 0 ? .manifest : .object)
                    } else {
                        try removeObject(target)
                    }
                }
                if let open { markRemoved(open) }
                state.withLock { s in
                    if s.inodes.child(parent, name)?.inode == target.inode || s.inodes.child(parent, name) == nil {
                        s.inodes.unhook(parent: parent, name: name)
                    }
                    // Owed attributes of a deleted object: nothing to store them on.
                    s.inodes.settleAttributes(target.inode)
                    updateListing(parent, name: name, entry: nil, in: &s)
                    s.sweep()
                }
            }
            if let open { retire(open) }
            syncAttributeNote(target.inode)
        }
    }

    /// The spool's file is gone (unlinked, or replaced by a rename): its bytes are never uploaded,
    /// its early parts are deleted, and no later mount recovers it.
    func markRemoved(_ open: SpoolFile) {
        let (early, _) = open.state.withLock { $0.remove() }
        if let early { discard(early) }
        open.noteLock.withLock { note in
            spool.removeNote(dataPath: open.path)
            note = nil
        }
        // Owed no more (failed or queued): not listed while a reader keeps the spool.
        transfers.clearOwed(open.inode)
    }

    /// Deletes a file's object, and its parts when it is a multipart file whose parts are ours.
    /// The manifest is read again first: another mount may have replaced or renamed the file.
    private func removeObject(_ node: Node) throws(FSError) {
        var manifest: String? = nil
        // A DLO manifest is read again first (its parts are deleted after it, and another mount
        // may have renamed or replaced it); so is a zero-byte object, which may be one, unless a
        // HEAD or this mount's own upload said within attr_timeout that it is not: then the
        // DELETE is the one request (a parts prefix of a manifest another client made of it in
        // that second would be left, never data).
        let knownPlain = node.manifest == nil && now() - node.metadataKnownAt <= configuration.attributeCacheSeconds
        if node.manifest != nil || (node.size == 0 && !knownPlain) {
            do {
                manifest = try store.head(key: node.key).manifest
            } catch where error.code == .notFound {
                return
            } catch {
                throw FSError(storeError: error, operation: "unlink", path: node.key)
            }
        }
        do {
            try store.delete(key: node.key)
        } catch where error.code == .notFound {
            // Already gone: the name is gone either way.
        } catch {
            throw FSError(storeError: error, operation: "unlink", path: node.key)
        }
        if let manifest { uploader.deleteParts(manifest: manifest, ofKey: node.key) }
    }

    public func rmdir(parent: InodeNumber, name: String) throws(FSError) {
        try forgettingOnFailure([(parent, name)]) { () throws(FSError) in
            _ = try requireWritableDirectory(parent, name: name)
            let target = try target(parent, name)
            guard target.kind == .directory else { throw FSError(.notADirectory, "rmdir of a file") }
            try requireEmpty(target)
            if configuration.writeBack {
                forgetPrefetched(keys: [target.key, String(target.key.dropLast())])
                try deletes.enqueue(key: target.key, etag: "", kind: .directory)
            } else {
                try removeDirectoryMarkers(prefix: target.key)
            }
            state.withLock { s in
                s.inodes.unhook(parent: parent, name: name)
                updateListing(parent, name: name, entry: nil, in: &s)
                s.directories.drop(target.inode)
                s.sweep()
            }
        }
    }

    /// ENOTEMPTY unless the directory holds nothing but its own marker (on the server or here).
    private func requireEmpty(_ directory: Node) throws(FSError) {
        let localChildren = state.withLock { s in
            s.inodes.children(of: directory.inode).contains { s.openFiles[$0.inode] != nil }
        }
        if localChildren { throw FSError(.notEmpty, "'\(directory.key)' holds files being written") }
        let page: ListPage
        do {
            page = try store.list(prefix: directory.key, delimiter: "/", marker: nil, limit: 2)
        } catch {
            throw FSError(storeError: error, operation: "rmdir", path: directory.key)
        }
        if page.entries.contains(where: { !$0.name.isSameKey(as: directory.key) }) {
            throw FSError(.notEmpty, "'\(directory.key)' is not empty")
        }
    }

    /// Deletes a directory's markers now (`DeleteQueue.deleteMarkers`).
    private func removeDirectoryMarkers(prefix: String) throws(FSError) {
        forgetPrefetched(keys: [prefix, String(prefix.dropLast())])
        do {
            try DeleteQueue.deleteMarkers(prefix, in: store)
        } catch {
            throw FSError(storeError: error, operation: "rmdir", path: prefix)
        }
    }

    public func link() throws(FSError) {
        throw FSError(.notPermitted, "hard links are not supported: objects have one name each")
    }

    /// Runs `body` holding the upload locks of `spools` (in inode order, the one order every
    /// holder of several uses): no upload of them runs meanwhile.
    func withUploadsHeld<T>(_ spools: [SpoolFile], _ body: () throws(FSError) -> T) throws(FSError) -> T {
        var unique: [SpoolFile] = []
        for open in spools.sorted(by: { $0.inode < $1.inode }) where !unique.contains(where: { $0 === open }) {
            unique.append(open)
        }
        return try holding(unique[...], body)
    }

    private func holding<T>(_ spools: ArraySlice<SpoolFile>, _ body: () throws(FSError) -> T) throws(FSError) -> T {
        guard let first = spools.first else { return try body() }
        return try first.uploadLock.withLock { () throws(FSError) -> T in
            try holding(spools.dropFirst(), body)
        }
    }

    // MARK: Rename

    public func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, noReplace: Bool)
        throws(FSError)
    {
        try forgettingOnFailure([(parent, name), (newParent, newName)]) { () throws(FSError) in
            _ = try requireWritableDirectory(parent, name: name)
            let destinationDirectory = try requireWritableDirectory(newParent, name: newName)
            let source = try target(parent, name)
            let newKey = destinationDirectory.key + newName + (source.kind == .directory ? "/" : "")
            if source.key.isSameKey(as: newKey) { return }
            if source.kind == .directory && newKey.utf8.starts(with: source.key.utf8) {
                throw FSError(.invalidArgument, "cannot move '\(source.key)' below itself")
            }
            var existing: Node? = nil
            do throws(FSError) {
                existing = try target(newParent, newName)
            } catch where error.code == .notFound {
                existing = nil
            }
            if let existing {
                if noReplace { throw FSError(.exists, "'\(newName)' exists") }
                switch (source.kind == .directory, existing.kind == .directory) {
                case (true, false): throw FSError(.notADirectory, "cannot replace a file with a directory")
                case (false, true): throw FSError(.isADirectory, "cannot replace a directory with a file")
                case (true, true): try requireEmpty(existing)
                case (false, false): break
                }
            }
            forgetPrefetched(
                keys: [source.key, newKey, String(source.key.dropLast()), String(newKey.dropLast())],
                prefixes: source.kind == .directory ? [source.key, newKey] : [])
            let finish = { [self] (s: inout State) -> Void in
                updateListing(parent, name: name, entry: nil, in: &s)
                if s.inodes.child(parent, name)?.inode == source.inode {
                    s.inodes.update(source.inode) { $0.changedAt = Timestamp.now() }
                    // Stored under the new keys: answers asked before describe the old places.
                    let movedAt = storeClock.tick()
                    for inode in s.inodes.move(source.inode, to: newParent, name: newName, key: newKey) {
                        s.inodes.update(inode) { $0.acknowledge(at: movedAt) }
                        if s.inodes[inode]?.kind == .directory { s.directories.drop(inode) }
                    }
                } else {
                    s.inodes.unhook(parent: parent, name: name)
                    s.inodes.unhook(parent: newParent, name: newName)
                }
                let entry: DirectoryEntry
                if let moved = s.inodes.child(newParent, newName), moved.inode == source.inode {
                    entry = moved.kind == .directory ? DirectoryBuilder.directory(newName, key: newKey) : self.entry(for: moved)
                } else {
                    var renamed = source
                    renamed.name = newName
                    renamed.key = newKey
                    entry = source.kind == .directory ? DirectoryBuilder.directory(newName, key: newKey) : self.entry(for: renamed)
                }
                updateListing(newParent, name: newName, entry: entry, in: &s)
                s.sweep()
            }
            defer {
                // Again: a HEAD that started during the rename may have recorded the old objects.
                forgetPrefetched(
                    keys: [source.key, newKey, String(source.key.dropLast()), String(newKey.dropLast())],
                    prefixes: source.kind == .directory ? [source.key, newKey] : [])
            }
            if source.kind == .directory {
                try renameDirectory(source, to: newKey, replacing: existing, finish: finish)
            } else {
                try renameFile(source, to: newKey, replacing: existing, finish: finish)
            }
        }
    }

    private func renameFile(
        _ source: Node, to key: String, replacing existing: Node?, finish: (inout State) -> Void
    ) throws(FSError) {
        let (sourceSpool, replacedSpool) = state.withLock { s in
            (s.openFiles[source.inode], existing.flatMap { s.openFiles[$0.inode] })
        }
        let inodes = [source.inode] + (existing.map { [$0.inode] } ?? [])
        // The attribute locks first (no owed attributes are stored meanwhile: not the source's
        // to the old name, not the replaced file's over the copy), then the upload locks.
        try withAttributesHeld(inodes) { () throws(FSError) in
            try withUploadsHeld([sourceSpool, replacedSpool].compactMap { $0 }) { () throws(FSError) in
                try renameFileHeld(source, to: key, replacing: existing, sourceSpool: sourceSpool, replacedSpool: replacedSpool, finish: finish)
            }
        }
        for inode in inodes { syncAttributeNote(inode) }
        if let replacedSpool { retire(replacedSpool) }
    }

    /// Write-back: a file never stored whose upload is still queued is renamed without a request
    /// (the queue stores it under its new name), when what it replaces is a plain object or
    /// nothing. Called holding the spool's upload lock. Returns whether it did.
    private func renameQueued(
        _ source: Node, _ spool: SpoolFile, replacing existing: Node?, replacedSpool: SpoolFile?,
        finish: (inout State) -> Void
    ) -> Bool {
        // Nothing stored at the source's key either (a queued file renamed over a stored one
        // replaces it only at its upload: its old name still holds that object).
        guard configuration.writeBack, replacedSpool == nil,
            spool.state.withLock({ $0.isQueued && $0.baseETag.isEmpty }),
            state.withLock({ $0.inodes[source.inode]?.etag.isEmpty }) == true
        else { return false }
        if let existing {
            // The replaced object stays until the upload overwrites it: the upload checks it is
            // still that version (a zero-byte object may be a manifest: the usual way then).
            guard existing.manifest == nil, existing.size > 0, !existing.etag.isEmpty else { return false }
            spool.state.withLock { $0.baseETag = existing.etag }
        }
        state.withLock { s in finish(&s) }
        // Not synced: a rename is durable at the next fsync of its directory (as on a local
        // disk), or the next synced note (WriteBack subtlety 5).
        journal(spool, sync: false)
        if let node = state.withLock({ $0.inodes[source.inode] }) { transfers.move(source.inode, to: node.key) }
        return true
    }

    private func renameFileHeld(
        _ source: Node, to key: String, replacing existing: Node?, sourceSpool: SpoolFile?, replacedSpool: SpoolFile?,
        finish: (inout State) -> Void
    ) throws(FSError) {
        if let sourceSpool, renameQueued(source, sourceSpool, replacing: existing, replacedSpool: replacedSpool, finish: finish) {
            return
        }
        // Unstored changes go first, so the copy carries the latest bytes and attributes.
        if let sourceSpool { try commitLocked(sourceSpool) }
        var oldManifest: String? = nil
        if let existing, existing.manifest != nil || existing.size == 0 {
            oldManifest = (try? store.head(key: existing.key))?.manifest
        }
        // The node as it is now (the commit above may have stored it).
        let current = state.withLock { $0.inodes[source.inode] } ?? source
        var newManifest: String? = nil
        // Owed attributes ride on the copy (which then stores them); otherwise it keeps the source's own.
        // An object without a stored mtime (another tool's) keeps the time it showed, not the
        // copy's new one (issue 38): the copy stores it, the object is csspfs's own from then on.
        var shown = current
        if !current.attributesOwed && current.stored.mtime == nil && current.kind == .file {
            shown.stored.mtime = current.lastModified.roundedUpToSecond
        }
        let keepsTime = shown.stored.mtime != current.stored.mtime
        var form: (contentType: String, metadata: [String: String])? =
            current.attributesOwed || keepsTime ? storedForm(of: shown) : nil
        do throws(ObjectStoreError) {
            if !current.etag.isEmpty && current.manifest == nil
                && now() - current.metadataKnownAt <= configuration.attributeCacheSeconds
            {
                // Just stored or confirmed (rsync's temporary file): a plain object whose metadata
                // the node knows, so no HEAD.
                try store.copy(from: source.key, to: key, contentType: form?.contentType, metadata: form?.metadata)
                try deleteMovedLater(source.key, version: current.etag)
            } else {
                let askedAt = storeClock.tick()
                var info = try store.head(key: source.key)
                if current.attributesOwed && info.etag != current.etag {
                    // Another client replaced the object since the change: it keeps theirs.
                    form = nil
                    state.withLock { s in _ = s.inodes.update(source.inode) { apply(info, askedAt: askedAt, to: &$0) } }
                } else if current.attributesOwed || keepsTime {
                    let owed = storedForm(of: shown, over: info)
                    (info.contentType, info.metadata) = owed
                    form = owed
                }
                if let manifest = info.manifest {
                    // The new name points at the same parts. Only parts below the old name itself
                    // (the SDK's layout) move, to ours: left there they would turn into a
                    // directory of that name. Parts anywhere else (another container, another
                    // prefix) are not ours to move.
                    var target = manifest
                    if let partPrefix = store.localPartPrefix(ofManifest: manifest),
                        partPrefix.utf8.starts(with: (source.key + "/").utf8)
                    {
                        target = store.containerName + "/" + (try moveParts(from: partPrefix))
                    }
                    try Self.moveManifest(store, from: source.key, to: key, target: target, info: info, sharedParts: sharedParts)
                    newManifest = target
                } else {
                    try store.copy(from: source.key, to: key, contentType: form?.contentType, metadata: form?.metadata)
                    try deleteMovedLater(source.key, version: info.etag)
                }
            }
        } catch {
            throw FSError(storeError: error, operation: "rename", path: source.key)
        }
        // POSIX: the replaced file's data is gone; its writers keep a file no name leads to.
        if let replacedSpool { markRemoved(replacedSpool) }
        state.withLock { s in
            if let newManifest { s.inodes.update(source.inode) { $0.manifest = newManifest } }
            if keepsTime, form != nil { s.inodes.update(source.inode) { $0.stored.mtime = $0.stored.mtime ?? shown.stored.mtime } }
            finish(&s)
            // The copy stored the owed attributes, unless they changed since; the replaced
            // file's are owed to an object that is gone.
            if current.attributesOwed, form != nil, s.inodes[source.inode]?.attributeVersion == current.attributeVersion {
                s.inodes.settleAttributes(source.inode)
            }
            if let existing, existing.inode != source.inode { s.inodes.settleAttributes(existing.inode) }
            s.sweep()
        }
        if let oldManifest, oldManifest != newManifest { uploader.deleteParts(manifest: oldManifest, ofKey: key) }
    }

    /// Writes `key` as a manifest of `target` (with `info`'s type and metadata) and deletes the
    /// manifest at `source`. Two manifests of the same parts must not both stay: an overwrite of
    /// either deletes the parts of both. So a failed PUT is checked with a HEAD (its answer may
    /// have been lost after the server stored it) before it counts, and so is a failed DELETE.
    /// When neither check settles it, the parts are marked shared (never deleted) before the
    /// failure is returned.
    static func moveManifest(
        _ store: any ObjectStore, from source: String, to key: String, target: String, info: ObjectInfo,
        sharedParts: SharedParts
    ) throws(ObjectStoreError) {
        do {
            try store.putManifest(key: key, manifest: target, contentType: info.contentType, metadata: info.metadata)
        } catch {
            guard let stored = try? store.head(key: key) else {
                sharedParts.mark(target)
                throw error
            }
            guard stored.manifest == target else { throw error }
        }
        do {
            try deleteMoved(store, source)
        } catch {
            sharedParts.mark(target)
            throw error
        }
    }

    /// The old key of a file copied to its new name: its delete is journaled and sent by the
    /// delete queue (`DeleteQueue`), so that a rename waits for one request, the COPY, not two
    /// in series (issue 20, part 2). The old name is gone from the mount at once (its node
    /// moved, `JournaledStore` hides the key); another client sees it until the delete is sent,
    /// a moment later. Deleted now when the journal cannot be written. The delete names the
    /// `version` copied, as an unlink's does: another client's newer version of the old name
    /// shows at once and is left (the sender's check costs a listing per batch, in the
    /// background).
    private func deleteMovedLater(_ key: String, version: String) throws(ObjectStoreError) {
        do {
            try deletes.enqueue(key: key, etag: version, kind: .object)
        } catch {
            try Self.deleteMoved(store, key)
        }
    }

    /// Deletes the old key of something moved. 404 means done (a retry after a lost answer gets
    /// it); another failure is tried once more, since the answer may have been lost.
    static func deleteMoved(_ store: any ObjectStore, _ key: String) throws(ObjectStoreError) {
        do {
            try store.delete(key: key)
        } catch where error.code == .notFound {
        } catch {
            do {
                try store.delete(key: key)
            } catch where error.code == .notFound {}
        }
    }

    /// Copies every part below `prefix` to a new prefix of ours and deletes the originals.
    private func moveParts(from prefix: String) throws(ObjectStoreError) -> String {
        let destination = Filesystem.partsPrefix + String(UInt64.random(in: 0...UInt64.max), radix: 16) + "/"
        let keys = try store.listAll(prefix: prefix, delimiter: nil).map(\.name)
        for key in keys {
            try store.copy(from: key, to: destination + String(key.dropFirst(prefix.count)))
        }
        for key in keys { try? store.delete(key: key) }
        return destination
    }

    /// Moves every key below `directory`'s prefix below `destination`, then the markers. Every
    /// spool below it is stored first and held (no upload under the old prefix meanwhile).
    private func renameDirectory(
        _ directory: Node, to destination: String, replacing existing: Node?, finish: (inout State) -> Void
    ) throws(FSError) {
        let source = directory.key
        // Owed attributes below go first: the copies below keep what the server has.
        if let failed = storeOwedAttributes(below: source).first {
            throw FSError(.ioError, "rename '\(source)': the attributes of '\(failed)' cannot be stored now; try again")
        }
        let spools: [SpoolFile] = state.withLock { s in
            s.openFiles.values.filter { open in s.inodes[open.inode].map { $0.key.utf8.starts(with: source.utf8) } ?? false }
        }
        try withUploadsHeld(spools) { () throws(FSError) in
            for open in spools { try commitLocked(open) }
            // The replaced directory is empty: its markers go first, so that ours take their place.
            if let existing { try removeDirectoryMarkers(prefix: existing.key) }
            let keys: [ListEntry]
            do throws(ObjectStoreError) {
                keys = try store.listAll(prefix: source, delimiter: nil)
            } catch {
                throw FSError(storeError: error, operation: "rename", path: source)
            }
            // Every new key must fit before the first one moves.
            if let longest = keys.map({ $0.name.utf8.count }).max() {
                try Self.requireStorable(destination, suffix: longest - source.utf8.count)
            }
            let store = self.store
            func moved(_ key: String) -> String { destination + String(key.utf8.dropFirst(source.utf8.count))! }
            // Markers are copied first and deleted last: a failure half-way leaves both names
            // directories with their attributes, never one only implied by the keys below it.
            var markers: [String] = []
            for case .object(let summary) in keys where summary.size == 0 && summary.key.utf8.last == UInt8(ascii: "/") {
                markers.append(summary.key)
            }
            markers.sort { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            // An application/directory object named like the directory is one of them.
            let typedMarker = String(source.dropLast())
            var typed = false
            do throws(ObjectStoreError) {
                do throws(ObjectStoreError) {
                    typed = ObjectKey.isDirectoryContentType(try store.head(key: typedMarker).contentType)
                } catch where error.code == .notFound {}
                for marker in markers { try store.copy(from: marker, to: moved(marker)) }
                if typed { try store.copy(from: typedMarker, to: String(destination.dropLast())) }
            } catch {
                throw FSError(storeError: error, operation: "rename (partly done)", path: source)
            }
            let contents = keys.filter { entry in
                guard case .object(let summary) = entry else { return false }
                return !markers.contains { $0.isSameKey(as: summary.key) }
            }
            let failure = pool.forEach(contents.count, width: 8) { (index) throws(ObjectStoreError) in
                guard case .object(let summary) = contents[index] else { return }
                let newKey = moved(summary.key)
                // Only zero-byte objects can be DLO manifests; they move as manifests, not as bytes.
                if summary.size == 0, case let info = try store.head(key: summary.key), let manifest = info.manifest {
                    // Parts below the directory move with it (they are keys below it): the new
                    // manifest points at their new place. Parts elsewhere stay where they are.
                    var target = manifest
                    if let partPrefix = store.localPartPrefix(ofManifest: manifest), partPrefix.utf8.starts(with: source.utf8) {
                        target = store.containerName + "/" + moved(partPrefix)
                    }
                    try Self.moveManifest(store, from: summary.key, to: newKey, target: target, info: info, sharedParts: sharedParts)
                } else {
                    try store.copy(from: summary.key, to: newKey)
                    try Self.deleteMoved(store, summary.key)
                }
            }
            if let failure {
                throw FSError(storeError: failure, operation: "rename (partly done)", path: source)
            }
            do throws(ObjectStoreError) {
                for marker in markers.reversed() + (typed ? [typedMarker] : []) {
                    do throws(ObjectStoreError) {
                        try store.delete(key: marker)
                    } catch where error.code == .notFound {}
                }
            } catch {
                throw FSError(storeError: error, operation: "rename (partly done)", path: source)
            }
            state.withLock { finish(&$0) }
        }
    }
}
