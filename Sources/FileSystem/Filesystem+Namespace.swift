import Dispatch
import ObjectStore
import Synchronization

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
    private func requireWritableDirectory(_ parent: InodeNumber, name: String) throws(FSError) -> Node {
        if configuration.readOnly { throw FSError(.readOnly, "this mount is read-only") }
        let directory = try node(parent)
        guard directory.kind == .directory else { throw FSError(.notADirectory, "not a directory") }
        guard DirectoryBuilder.isValidName(name) else {
            throw FSError(name.utf8.count > 255 ? .nameTooLong : .invalidArgument, "invalid name '\(name)'")
        }
        if isHidden(name, in: directory) { throw FSError(.notPermitted, "'\(name)' is reserved for multipart parts") }
        return directory
    }

    /// Adds a node for a name we just made, counting one kernel lookup.
    private func insert(_ node: Node, in s: inout State) -> Node {
        var node = node
        node.inode = s.nextInode
        node.lookups = 1
        node.confirmedAt = Self.now()
        s.nextInode += 1
        s.nodes[node.inode] = node
        s.children[node.parent, default: [:]][node.name] = node.inode
        return node
    }

    private func newAttributes(mode: UInt16, caller: Caller) -> StoredAttributes {
        StoredAttributes(mode: mode & 0o7777, uid: caller.uid, gid: caller.gid, mtime: Timestamp.now())
    }

    /// Creates a file and opens it for writing. It is stored when it is closed.
    public func create(parent: InodeNumber, name: String, mode: UInt16, caller: Caller) throws(FSError)
        -> (Attributes, OpenResult)
    {
        let directory = try requireWritableDirectory(parent, name: name)
        let (path, fd) = try spool.create()
        let result: (Node, OpenFile, UInt64) = state.withLock { s in
            var node = Node(
                inode: 0, parent: parent, name: name, kind: .file, key: directory.key + name, size: 0, etag: "",
                lastModified: Timestamp.now())
            node.stored = newAttributes(mode: mode, caller: caller)
            node.baseContentType = "application/octet-stream"
            node = insert(node, in: &s)
            let open = OpenFile(inode: node.inode, path: path, fd: fd, size: 0, dirty: true)
            open.state.withLock { $0.writers = 1 }
            s.openFiles[node.inode] = open
            let handle = s.nextHandle
            s.nextHandle += 1
            s.fileHandles[handle] = .spool(open, writable: true)
            updateListing(parent, name: name, entry: entry(for: node), in: &s)
            return (node, open, handle)
        }
        return (attributes(of: result.0), OpenResult(handle: result.2, keepCache: false))
    }

    /// mknod: regular files only (stored at once, empty); other types are EPERM.
    public func mknod(parent: InodeNumber, name: String, mode: UInt16, isRegular: Bool, caller: Caller) throws(FSError)
        -> Attributes
    {
        guard isRegular else { throw FSError(.notPermitted, "only regular files can be stored") }
        let (attributes, opened) = try create(parent: parent, name: name, mode: mode, caller: caller)
        defer { release(handle: opened.handle) }
        try flush(handle: opened.handle)
        return attributes
    }

    public func mkdir(parent: InodeNumber, name: String, mode: UInt16, caller: Caller) throws(FSError) -> Attributes {
        let directory = try requireWritableDirectory(parent, name: name)
        let prefix = directory.key + name + "/"
        let stored = newAttributes(mode: mode, caller: caller)
        do {
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
            s.listings[node.inode] = Listing(entries: [:], completedAt: Self.now())
            updateListing(parent, name: name, entry: DirectoryBuilder.directory(name, key: prefix), in: &s)
            return node
        }
        return attributes(of: node)
    }

    public func symlink(parent: InodeNumber, name: String, target: String, caller: Caller) throws(FSError) -> Attributes {
        let directory = try requireWritableDirectory(parent, name: name)
        let key = directory.key + name
        var stored = newAttributes(mode: 0o777, caller: caller)
        stored.mode = nil
        var metadata = stored.metadata(mergedInto: [:])
        // svfs's header, when the target fits in a header as it is; the body always holds it.
        if target.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) { metadata[StoredAttributes.symlinkTargetHeader] = target }
        let etag: String
        do {
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

    public func readlink(_ inode: InodeNumber) throws(FSError) -> String {
        let node = try node(inode)
        guard node.kind == .symlink else { throw FSError(.invalidArgument, "not a symlink") }
        if let target = node.symlinkTarget { return target }
        do {
            let bytes = try store.getBytes(key: node.key, range: nil)
            let target = String(decoding: bytes, as: UTF8.self)
            state.withLock { $0.nodes[inode]?.symlinkTarget = target }
            return target
        } catch {
            throw FSError(storeError: error, operation: "readlink", path: node.key)
        }
    }

    /// The child `name` of `parent` as a node (looked up without counting a kernel lookup).
    private func child(_ parent: InodeNumber, _ name: String) throws(FSError) -> Node {
        let known = state.withLock { s in s.children[parent]?[name].flatMap { s.nodes[$0] } }
        if let known { return known }
        let attributes = try lookup(parent: parent, name: name)
        forget(attributes.inode, count: 1)
        if let node = state.withLock({ $0.nodes[attributes.inode] }) { return node }
        // Forgotten at once: rebuild what lookup saw.
        let directory = try node(parent)
        let entry = try resolve(name: name, prefix: directory.key)
        return Node(
            inode: attributes.inode, parent: parent, name: name, kind: entry.kind, key: entry.key, size: entry.size,
            etag: entry.etag, lastModified: entry.lastModified)
    }

    public func unlink(parent: InodeNumber, name: String) throws(FSError) {
        _ = try requireWritableDirectory(parent, name: name)
        let target = try child(parent, name)
        guard target.kind != .directory else { throw FSError(.isADirectory, "unlink of a directory") }
        let open = state.withLock { $0.openFiles[target.inode] }
        let (neverStored, earlyParts) = open?.state.withLock { o in
            o.unlinked = true
            defer { o.earlyParts = nil }
            return (o.dataDirty && target.etag.isEmpty, o.earlyParts)
        } ?? (false, nil)
        if let earlyParts { discard(earlyParts) }
        if !neverStored {
            try removeObject(key: target.key, manifest: target.manifest)
        }
        state.withLock { s in
            if s.children[parent]?[name] == target.inode { s.children[parent]?[name] = nil }
            updateListing(parent, name: name, entry: nil, in: &s)
            if let node = s.nodes[target.inode], node.lookups == 0, s.openFiles[target.inode] == nil {
                s.nodes[target.inode] = nil
            }
        }
        if let open { retire(open) }
    }

    /// Deletes an object, and its parts when it is a multipart file of ours.
    private func removeObject(key: String, manifest: String?) throws(FSError) {
        var manifest = manifest
        if manifest == nil, let info = try? store.head(key: key) { manifest = info.manifest }
        do {
            try store.delete(key: key)
        } catch where error.code == .notFound {
            // Already gone: the name is gone either way.
        } catch {
            throw FSError(storeError: error, operation: "unlink", path: key)
        }
        if let manifest { uploader.deleteParts(manifest: manifest, ofKey: key) }
    }

    public func rmdir(parent: InodeNumber, name: String) throws(FSError) {
        _ = try requireWritableDirectory(parent, name: name)
        let target = try child(parent, name)
        guard target.kind == .directory else { throw FSError(.notADirectory, "rmdir of a file") }
        try requireEmpty(target)
        try removeDirectoryMarkers(prefix: target.key)
        state.withLock { s in
            if s.children[parent]?[name] == target.inode { s.children[parent]?[name] = nil }
            updateListing(parent, name: name, entry: nil, in: &s)
            s.listings[target.inode] = nil
        }
    }

    /// ENOTEMPTY unless the directory holds nothing but its own marker (on the server or here).
    private func requireEmpty(_ directory: Node) throws(FSError) {
        let localChildren = state.withLock { s in
            (s.children[directory.inode] ?? [:]).values.contains { s.openFiles[$0] != nil }
        }
        if localChildren { throw FSError(.notEmpty, "'\(directory.key)' holds files being written") }
        let page: ListPage
        do {
            page = try store.list(prefix: directory.key, delimiter: "/", marker: nil, limit: 2)
        } catch {
            throw FSError(storeError: error, operation: "rmdir", path: directory.key)
        }
        if page.entries.contains(where: { $0.name != directory.key }) {
            throw FSError(.notEmpty, "'\(directory.key)' is not empty")
        }
    }

    private func removeDirectoryMarkers(prefix: String) throws(FSError) {
        for key in [prefix, String(prefix.dropLast())] {
            do {
                try store.delete(key: key)
            } catch where error.code == .notFound {
            } catch {
                throw FSError(storeError: error, operation: "rmdir", path: key)
            }
        }
    }

    public func link() throws(FSError) {
        throw FSError(.notPermitted, "hard links are not supported: objects have one name each")
    }

    // MARK: Rename

    public func rename(parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, noReplace: Bool)
        throws(FSError)
    {
        _ = try requireWritableDirectory(parent, name: name)
        let destinationDirectory = try requireWritableDirectory(newParent, name: newName)
        let source = try child(parent, name)
        var existing: Node? = nil
        do {
            existing = try child(newParent, newName)
        } catch where error.code == .notFound {
            existing = nil
        }
        if let existing {
            if existing.inode == source.inode { return }
            if noReplace { throw FSError(.exists, "'\(newName)' exists") }
            switch (source.kind == .directory, existing.kind == .directory) {
            case (true, false): throw FSError(.notADirectory, "cannot replace a file with a directory")
            case (false, true): throw FSError(.isADirectory, "cannot replace a directory with a file")
            case (true, true): try requireEmpty(existing)
            case (false, false): break
            }
        }
        if source.kind == .directory {
            try renameDirectory(source, to: destinationDirectory.key + newName + "/")
            if let existing { try removeDirectoryMarkers(prefix: existing.key) }
        } else {
            try renameFile(source, to: destinationDirectory.key + newName, replacing: existing)
        }
        state.withLock { s in
            if s.children[parent]?[name] == source.inode { s.children[parent]?[name] = nil }
            if let existing, s.children[newParent]?[newName] == existing.inode {
                s.children[newParent]?[newName] = nil
                if let old = s.nodes[existing.inode], old.lookups == 0, s.openFiles[existing.inode] == nil {
                    s.nodes[existing.inode] = nil
                }
            }
            s.children[newParent, default: [:]][newName] = source.inode
            guard var node = s.nodes[source.inode] else { return }
            node.parent = newParent
            node.name = newName
            node.key = source.kind == .directory ? destinationDirectory.key + newName + "/" : destinationDirectory.key + newName
            s.nodes[source.inode] = node
            updateListing(parent, name: name, entry: nil, in: &s)
            updateListing(
                newParent, name: newName,
                entry: node.kind == .directory ? DirectoryBuilder.directory(newName, key: node.key) : entry(for: node),
                in: &s)
            if source.kind == .directory { rekeyDescendants(from: source.key, to: node.key, in: &s) }
        }
    }

    private func renameFile(_ source: Node, to key: String, replacing existing: Node?) throws(FSError) {
        // Unstored changes go first, so the copy carries the latest bytes and attributes.
        if let open = state.withLock({ $0.openFiles[source.inode] }) { try commit(open) }
        let oldManifest: String?
        if let existing { oldManifest = existing.manifest ?? (try? store.head(key: existing.key))?.manifest } else {
            oldManifest = nil
        }
        do {
            let info = try store.head(key: source.key)
            if let manifest = info.manifest {
                let container = store.containerName + "/"
                var partPrefix = String(manifest.dropFirst(container.count))
                if !partPrefix.utf8.starts(with: Filesystem.partsPrefix.utf8) {
                    // Parts below the old name would turn into a directory there: move them to ours.
                    partPrefix = try moveParts(from: partPrefix)
                }
                try store.putManifest(key: key, partPrefix: partPrefix, contentType: info.contentType, metadata: info.metadata)
                try store.delete(key: source.key)
                state.withLock { $0.nodes[source.inode]?.manifest = container + partPrefix }
            } else {
                try store.copy(from: source.key, to: key, metadata: nil)
                try store.delete(key: source.key)
            }
        } catch {
            throw FSError(storeError: error, operation: "rename", path: source.key)
        }
        if let oldManifest, oldManifest != state.withLock({ $0.nodes[source.inode]?.manifest }) {
            uploader.deleteParts(manifest: oldManifest, ofKey: key)
        }
    }

    /// Copies every part below `prefix` to a new prefix of ours and deletes the originals.
    private func moveParts(from prefix: String) throws(ObjectStoreError) -> String {
        let destination = Filesystem.partsPrefix + String(UInt64.random(in: 0...UInt64.max), radix: 16) + "/"
        let keys = try store.listAll(prefix: prefix, delimiter: nil).map(\.name)
        for key in keys {
            try store.copy(from: key, to: destination + String(key.dropFirst(prefix.count)), metadata: nil)
        }
        for key in keys { try? store.delete(key: key) }
        return destination
    }

    /// Moves every key below `source` (a prefix) below `destination`, then the markers.
    private func renameDirectory(_ directory: Node, to destination: String) throws(FSError) {
        if let open = state.withLock({ s in
            s.openFiles.values.first { o in s.nodes[o.inode].map { $0.key.utf8.starts(with: directory.key.utf8) } ?? false }
        }) {
            try commit(open)
        }
        let keys: [ListEntry]
        do {
            keys = try store.listAll(prefix: directory.key, delimiter: nil)
        } catch {
            throw FSError(storeError: error, operation: "rename", path: directory.key)
        }
        let store = self.store
        let source = directory.key
        let failure = Concurrently.forEach(keys.count, width: 8) { (index) throws(ObjectStoreError) in
            guard case .object(let summary) = keys[index] else { return }
            let newKey = destination + String(summary.key.dropFirst(source.count))
            // Only zero-byte objects can be DLO manifests; they move as manifests, not as bytes.
            if summary.size == 0, case let info = try store.head(key: summary.key), let manifest = info.manifest {
                let partPrefix = String(manifest.dropFirst(store.containerName.count + 1))
                try store.putManifest(
                    key: newKey, partPrefix: partPrefix, contentType: info.contentType, metadata: info.metadata)
            } else {
                try store.copy(from: summary.key, to: newKey, metadata: nil)
            }
            try store.delete(key: summary.key)
        }
        if let failure {
            throw FSError(storeError: failure, operation: "rename (partly done)", path: directory.key)
        }
        // An application/directory object named like the directory moves too.
        let typedMarker = String(source.dropLast())
        if let info = try? store.head(key: typedMarker), ObjectKey.isDirectoryContentType(info.contentType) {
            do {
                try store.copy(from: typedMarker, to: String(destination.dropLast()), metadata: nil)
                try store.delete(key: typedMarker)
            } catch {
                throw FSError(storeError: error, operation: "rename", path: typedMarker)
            }
        }
    }

    /// After a directory rename: every known node below it gets its new key; listings are dropped.
    private func rekeyDescendants(from old: String, to new: String, in s: inout State) {
        for (inode, var node) in s.nodes where node.key.utf8.starts(with: old.utf8) && node.key != new {
            if node.key == old { continue }
            node.key = new + String(node.key.dropFirst(old.count))
            s.nodes[inode] = node
            s.listings[inode] = nil
        }
    }
}
