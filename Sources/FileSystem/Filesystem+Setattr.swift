import BlockCache
import Dispatch
import FSCore
import FSFiles
import FSJournal
import FSNamespace
import Locking
import Logging
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

// setattr (chmod, chown, utimens, truncate) and the recovery of what an earlier mount owed.
extension Filesystem {
    // MARK: Attributes

    public func setattr(_ inode: InodeNumber, _ changes: AttributeChanges) throws(FSError) -> Attributes {
        try describeIfAdopted(inode)
        if configuration.readOnly { throw FSError(.readOnly, "this mount is read-only") }
        let node = try namespace.node(inode)
        // A failure leaves the node as it was, to be asked for again (the answer may be lost).
        try forgettingOnFailure([(node.parent, node.name)], restoring: node) { () throws(FSError) in
            if let size = changes.size {
                guard node.kind == .file else {
                    throw FSError(node.kind == .directory ? .isADirectory : .invalidArgument, "truncate of a \(node.kind)")
                }
                try truncate(node, to: size)
            }
            let metadataChanged = changes.mode != nil || changes.uid != nil || changes.gid != nil || changes.modified != nil
            // Another tool's version no HEAD has described yet: its headers' mtime, not the
            // listing's, is what the change keeps (the store's POST replaces them all).
            if metadataChanged, let current = names.withLock({ $0.inodes[inode] }), current.linked, namespace.awaitsHead(current) {
                _ = try namespace.refresh(current)
            }
            if let accessed = changes.accessed {
                // Kept by this mount only: the store has no access time.
                names.withLock { s in _ = s.inodes.update(inode) { $0.accessedAt = accessed; $0.changedAt = Timestamp.now() } }
            }
            if metadataChanged {
                let updated: Node = names.withLock { s in
                    s.inodes.update(inode) { n in
                        if let mode = changes.mode { n.stored.mode = mode & 0o7777 }
                        if let uid = changes.uid { n.stored.uid = uid }
                        if let gid = changes.gid { n.stored.gid = gid }
                        if let modified = changes.modified { n.stored.mtime = modified }
                        // An object without a stored mtime (another tool's) keeps the one it
                        // showed: the change is stored with it, not with the store's new time.
                        if n.stored.mtime == nil && n.kind == .file { n.stored.mtime = n.lastModified.roundedUpToSecond }
                        n.changedAt = Timestamp.now()
                        n.attributeVersion += 1
                    } ?? node
                }
                // A file whose bytes are all stored (closed, or its release not yet come: rsync's
                // chmod right after close) owes the change; one with unstored bytes stores it with them.
                let unstored = files.withLock { $0.openFiles[inode] }.map { open in open.state.withLock { $0.isDirty } } ?? false
                if defersAttributes(of: updated) && !unstored {
                    oweAttributes(inode)
                } else if try !withSpool(of: inode, { open in open.markMetadataDirty() }) {
                    try persistAttributes(of: updated)
                }
                // The handles on its spool store the new attributes (a successor's upload too).
                if configuration.handleLog != nil { names.withLock { s in recordSpoolHandles(of: inode, in: &s) } }
            }
        }
        return try getattr(inode)
    }

    /// Data changed now (a write, a truncation): mtime and ctime move, and the new mtime is stored
    /// with the data.
    func touch(_ inode: InodeNumber) {
        let now = Timestamp.now()
        _ = names.withLock { s in
            s.inodes.update(inode) { node in
                node.stored.mtime = now
                node.changedAt = now
                node.attributeVersion += 1
            }
        }
    }

    func truncate(_ node: Node, to size: Int64) throws(FSError) {
        if try withSpool(of: node.inode, { (open) throws(FSError) in
            try open.truncate(to: size)
            touch(node.inode)
        }) {
            return
        }
        // No open handle (truncate(2) on a path): download, cut, store, done.
        let open = try makeSpool(for: node, download: size > 0)
        defer { open.discard() }
        try open.truncate(to: size)
        touch(node.inode)
        try commit(open)
    }

    /// Writes a node's stored attributes to the server, keeping every other header. Updates of one
    /// node are serialised and each sends the node's latest attributes, so two concurrent changes
    /// (rsync's generator and receiver) cannot store an older state last.
    func persistAttributes(of original: Node) throws(FSError) {
        try attributeLock(original.inode).withLock { () throws(FSError) in
            guard let node = names.withLock({ $0.inodes[original.inode] }) else { return }
            try persistAttributesLocked(node)
        }
    }

    func persistAttributesLocked(_ node: Node) throws(FSError) {
        namespace.forgetPrefetched(keys: [node.key])
        do {
            switch node.kind {
            case .file where now() - node.metadataKnownAt <= configuration.attributeCacheSeconds:
                // Just stored or confirmed (rsync's chmod and utimes right after writing): what
                // the POST must keep is known, no HEAD needed.
                try postHoldingUploads(node.inode) { () throws(ObjectStoreError) in
                    // An upload that ended while this waited stored another version: its
                    // manifest is the one to keep, which only a HEAD says for sure.
                    let current = names.withLock { $0.inodes[node.inode] } ?? node
                    let info = current.etag == node.etag ? nil : try store.head(key: node.key)
                    try store.setMetadata(
                        key: node.key,
                        contentType: info.map { storedForm(of: node, over: $0).contentType }
                            ?? node.stored.contentType(base: node.baseContentType),
                        metadata: info.map { storedForm(of: node, over: $0).metadata }
                            ?? node.stored.metadata(mergedInto: node.extraMetadata),
                        manifest: info.map(\.manifest) ?? node.manifest)
                }
            case .file, .symlink, .fifo, .socket:
                try postHoldingUploads(node.inode) { () throws(ObjectStoreError) in
                    let info = try store.head(key: node.key)
                    let (contentType, metadata) = storedForm(of: node, over: info)
                    try store.setMetadata(key: node.key, contentType: contentType, metadata: metadata, manifest: info.manifest)
                }
            case .directory:
                // The root of the mount has no object to keep attributes on.
                guard !node.key.isEmpty else { return }
                let marker = node.key
                let contentType = node.stored.contentType(base: ObjectKey.directoryContentType)
                do {
                    let info = try store.head(key: marker)
                    try store.setMetadata(
                        key: marker, contentType: contentType, metadata: node.stored.metadata(mergedInto: info.metadata),
                        manifest: nil)
                } catch where error.code == .notFound {
                    try store.put(
                        key: marker, body: .bytes([]), contentType: contentType,
                        metadata: node.stored.metadata(mergedInto: [:]))
                }
            }
        } catch {
            throw FSError(storeError: error, operation: "set attributes of", path: node.key)
        }
        let stored = storeClock.tick()
        names.withLock { s in
            let current = s.inodes.update(node.inode) {
                $0.acknowledge(at: stored, version: node.attributeVersion)
                $0.confirmedAt = now()
            }
            if node.kind != .directory, let current { namespace.updateListing(describing: current, in: &s) }
        }
    }

    // MARK: Recovery

    /// Stores what earlier processes owed, for as long as it takes (until `shutdown`): their
    /// journaled deletes first (their names are hidden from the start, `JournaledStore`), then
    /// their uploads and attribute changes, oldest first (`RecoveredWork`: their names are served
    /// only once stored), as conflict copies where another client changed the object meanwhile.
    /// Keeps data files without a note in `lost+found/`. A delete that fails stays queued and is
    /// retried; an upload of a key whose delete is still owed waits for it.
    public func recoverPendingUploads() {
        if !deletes.isEmpty && !deletes.flush(timeout: 60) {
            logger.warning("deletes an earlier mount owed are not all stored yet; retrying in the background")
        }
        for (path, upload) in spool.leftovers where upload == nil {
            let kept = Spool.keepLost(dataPath: path)
            let place = kept ?? path
            logger.warning(
                "bytes of an earlier mount that no close acknowledged as stored: not uploaded, kept in \(place) (delete it when it is not needed)")
        }
        for entry in recovered.entries {
            var pause = 1.0
            while true {
                do {
                    try recovered.store(entry)
                    break
                } catch {
                    if pause == 1.0 {
                        let failure = FSError(storeError: error, operation: "recover", path: entry.item.key)
                        logger.error(
                            "cannot store '\(entry.item.key)', owed by an earlier mount, yet: \(error); retrying (its name waits for it)",
                            metadata: logFields(failure, operation: "recover"))
                    }
                    guard recovered.pause(pause) else { return }
                    pause = min(pause * 2, 60)
                }
            }
        }
    }

    /// Stores one thing an earlier mount owed (`RecoveredWork`), through `recoveryStore`.
    func storeRecovered(_ item: RecoveredWork.Item) throws(ObjectStoreError) {
        switch item {
        case .upload(let path, let upload):
            var st = stat()
            guard stat(path, &st) == 0 else { return }
            let size = Int64(st.st_size)
            // A note without a base (written before bases were kept) is stored as it says.
            let check = upload.base.map { lostUpdateCheck(key: upload.key, base: $0, bytes: (path, size), store: recoveryStore) }
            let stored = try uploader(recoveryStore).upload(
                path: path, size: size, key: upload.key, contentType: upload.contentType, metadata: upload.metadata,
                check: check)
            if !stored.key.isSameKey(as: upload.key) { configuration.metrics.conflicts.add() }
            Spool.remove(dataPath: path)
            logger.notice("stored '\(stored.key)' from \(path), owed by an earlier mount")
        case .attributes(let note, let change):
            try recoverAttributes(note: note, change: change)
        }
    }
}
