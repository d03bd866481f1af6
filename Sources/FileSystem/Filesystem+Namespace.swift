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
    func requireWritableDirectory(_ parent: InodeNumber, name: String, suffix: Int = 0) throws(FSError) -> Node {
        if configuration.readOnly { throw FSError(.readOnly, "this mount is read-only") }
        let directory = try namespace.node(parent)
        guard directory.kind == .directory else { throw FSError(.notADirectory, "not a directory") }
        guard DirectoryBuilder.isValidName(name) else {
            throw FSError(name.utf8.count > 255 ? .nameTooLong : .invalidArgument, "invalid name '\(name)'")
        }
        try Namespace.requireStorable(directory.key + name, suffix: suffix)
        if namespace.isHidden(name, in: directory) { throw FSError(.notPermitted, "'\(name)' is reserved for multipart parts") }
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
        self.names.withLock { s in
            for (parent, name) in names {
                s.directories.forget(name, in: parent)
                guard let node = s.inodes.child(parent, name) else { continue }
                var pending = [node.inode]
                while let inode = pending.popLast() {
                    let restore = original?.inode == inode && s.spools[inode] == nil
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
        namespace.forgetPrefetched(keys: keys, prefixes: prefixes)
    }

    /// Adds a node for a name we just made, counting one kernel lookup.
    private func insert(_ node: Node, in s: inout NamespaceTables) -> Node {
        var node = node
        node.confirmedAt = now()
        // Made here (and stored, but for a file being created): older answers describe another object.
        node.acknowledge(at: storeClock.tick())
        let inserted = s.inodes.insert(node)
        s.sweep()
        return inserted
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
        let result: (Node, SpoolFile, UInt64) = withTables { s, f in
            var node = Node(
                inode: 0, parent: parent, name: name, kind: .file, key: key, size: 0, etag: etag,
                lastModified: Timestamp.now())
            node.stored = stored
            node.baseContentType = contentType
            node = insert(node, in: &s)
            // Stored already (exclusive): a close with nothing written sends nothing more.
            let open = SpoolFile(inode: node.inode, path: path, fd: fd, size: 0, dirty: etag.isEmpty, baseETag: etag)
            _ = open.state.withLock { $0.attach(writable: true) }
            f.openFiles[node.inode] = open
            s.spools[node.inode] = open
            s.inodes.pin(node.inode)
            let handle = f.handles.open(.spool(open, writable: true))
            namespace.updateListing(parent, name: name, entry: node.listingEntry, in: &s)
            return (node, open, handle)
        }
        recordSpoolHandle(result.2, result.1, writable: true)
        return (attributes(of: result.0), OpenResult(handle: result.2, keepCache: false))
    }

    /// The empty object of an exclusive create, stored only where nothing is. EEXIST when
    /// another client's object is there: what this mount remembered of the name is dropped, and
    /// so is the kernel's "no such file" for it.
    private func storeExclusively(_ key: String, stored: StoredAttributes, contentType: String, parent: InodeNumber, name: String)
        throws(FSError) -> String
    {
        namespace.forgetPrefetched(keys: [key])
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
            namespace.forgetPrefetched(keys: [key])
            let etag: String
            do throws(ObjectStoreError) {
                etag = try store.put(
                    key: key, body: .bytes([]), contentType: stored.contentType(base: base),
                    metadata: stored.metadata(mergedInto: [:]))
            } catch {
                throw FSError(storeError: error, operation: "mknod", path: key)
            }
            let node: Node = names.withLock { s in
                var node = Node(inode: 0, parent: parent, name: name, kind: kind, key: key, etag: etag, lastModified: Timestamp.now())
                node.stored = stored
                node.baseContentType = base
                node = insert(node, in: &s)
                namespace.updateListing(parent, name: name, entry: node.listingEntry, in: &s)
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
            namespace.forgetPrefetched(keys: [prefix, String(prefix.dropLast())])
            do throws(ObjectStoreError) {
                try store.put(
                    key: prefix, body: .bytes([]), contentType: stored.contentType(base: ObjectKey.directoryContentType),
                    metadata: stored.metadata(mergedInto: [:]))
            } catch {
                throw FSError(storeError: error, operation: "mkdir", path: prefix)
            }
            let node: Node = names.withLock { s in
                var node = Node(
                    inode: 0, parent: parent, name: name, kind: .directory, key: prefix, size: 0, etag: "",
                    lastModified: Timestamp.now())
                node.stored = stored
                node = insert(node, in: &s)
                s.directories.rememberEmpty(node.inode, now: now(), askedAt: storeClock.tick())
                namespace.updateListing(parent, name: name, entry: DirectoryBuilder.directory(name, key: prefix), in: &s)
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
            namespace.forgetPrefetched(keys: [key])
            do throws(ObjectStoreError) {
                etag = try store.put(
                    key: key, body: .bytes(Array(target.utf8)),
                    contentType: stored.contentType(base: StoredAttributes.symlinkContentType), metadata: metadata)
            } catch {
                throw FSError(storeError: error, operation: "symlink", path: key)
            }
            let node: Node = names.withLock { s in
                var node = Node(
                    inode: 0, parent: parent, name: name, kind: .symlink, key: key, size: Int64(target.utf8.count),
                    etag: etag, lastModified: Timestamp.now())
                node.stored = stored
                node.baseContentType = StoredAttributes.symlinkContentType
                node.symlinkTarget = target
                node = insert(node, in: &s)
                namespace.updateListing(parent, name: name, entry: node.listingEntry, in: &s)
                return node
            }
            return attributes(of: node)
        }
    }

    public func readlink(_ inode: InodeNumber) throws(FSError) -> String {
        try describeIfAdopted(inode)
        let node = try namespace.node(inode)
        guard node.kind == .symlink else { throw FSError(.invalidArgument, "not a symlink") }
        if let target = node.symlinkTarget { return target }
        do {
            let bytes = try store.getBytes(key: node.key, range: nil)
            let target = String(decoding: bytes, as: UTF8.self)
            names.withLock { _ = $0.inodes.update(inode) { $0.symlinkTarget = target } }
            return target
        } catch {
            throw FSError(storeError: error, operation: "readlink", path: node.key)
        }
    }


    /// What `name` in `parent` is, for an operation on it: the node the name leads to, else what
    /// the server says (then the node may be gone from the table already: it counts no lookup).
    func target(_ parent: InodeNumber, _ name: String) throws(FSError) -> Node {
        // A name confirmed within attr_timeout, or with unstored bytes, is trusted as the kernel
        // trusts its dentry; anything older is asked for again (another client may have removed it).
        let known: Node? = names.withLock { s in
            guard let node = s.inodes.child(parent, name),
                s.spools[node.inode] != nil || now() - node.confirmedAt <= configuration.attributeCacheSeconds
            else { return nil }
            return node
        }
        if let known { return known }
        let attributes = try lookup(parent: parent, name: name)
        let node: Node? = names.withLock { s in
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
            let open: SpoolFile? = withTables { s, f in
                let open = f.openFiles[target.inode]
                if open != nil { s.inodes.pin(target.inode) }
                return open
            }
            defer {
                if open != nil {
                    names.withLock { s in
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
                namespace.forgetPrefetched(keys: [target.key])
                if !neverStored {
                    if configuration.writeBack {
                        // The node as the last upload left it (it may have ended since `target`).
                        let node = names.withLock { $0.inodes[target.inode] } ?? target
                        let base = open?.state.withLock { $0.baseETag } ?? ""
                        let seen = node.etag.isEmpty ? base : DeleteEntry.version(etag: node.etag, manifest: node.manifest)
                        try deletes.enqueue(
                            key: target.key, etag: seen, kind: node.manifest != nil || node.size == 0 ? .manifest : .object)
                    } else {
                        try removeObject(target)
                    }
                }
                if let open { markRemoved(open) }
                names.withLock { s in
                    if s.inodes.child(parent, name)?.inode == target.inode || s.inodes.child(parent, name) == nil {
                        s.inodes.unhook(parent: parent, name: name)
                    }
                    // Owed attributes of a deleted object: nothing to store them on.
                    s.inodes.settleAttributes(target.inode)
                    namespace.updateListing(parent, name: name, entry: nil, in: &s)
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
                namespace.forgetPrefetched(keys: [target.key, String(target.key.dropLast())])
                try deletes.enqueue(key: target.key, etag: "", kind: .directory)
            } else {
                try removeDirectoryMarkers(prefix: target.key)
            }
            names.withLock { s in
                s.inodes.unhook(parent: parent, name: name)
                namespace.updateListing(parent, name: name, entry: nil, in: &s)
                s.directories.drop(target.inode)
                s.sweep()
            }
        }
    }

    /// ENOTEMPTY unless the directory holds nothing but its own marker (on the server or here).
    func requireEmpty(_ directory: Node) throws(FSError) {
        let localChildren = names.withLock { s in
            s.inodes.children(of: directory.inode).contains { s.spools[$0.inode] != nil }
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
    func removeDirectoryMarkers(prefix: String) throws(FSError) {
        namespace.forgetPrefetched(keys: [prefix, String(prefix.dropLast())])
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
}
