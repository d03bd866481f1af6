import FSCore
import FSFiles
import FSJournal
import FSNamespace
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

/// Owed attributes: a chmod, chown or utimes of a closed file is not POSTed at once. The change
/// is in the node (`stored`), journaled in the spool directory, and stored by whichever comes
/// first:
/// 1. the rename of the file, whose server-side COPY carries it (rsync sets mode and times on
///    its temporary file and renames it: PUT, COPY, DELETE instead of PUT, POST, POST, HEAD,
///    COPY, DELETE);
/// 2. an upload of the file (its PUT carries the node's attributes);
/// 3. an fsync on a handle of the file, the drain at unmount, or `attributeWriteDelay` seconds.
///
/// Subtleties:
/// 1. While attributes are owed, the node is pinned and nothing the server says overwrites
///    `stored` (`Node.apply`, `Node.merge`).
/// 2. Whatever stores the node's attributes settles them only if the node's `attributeVersion`
///    is still the one it stored; a later change stays owed.
/// 3. The note (`Spool.attributeNotePath`) follows the owed flag: written or removed under the
///    node's attribute lock (`syncAttributeNote`), never under the state lock. It is not fsynced:
///    it survives the process (kill -9), not a power cut. A later mount stores it only if the
///    object still has the ETag the change was made on, and drops it when an upload of the same
///    name is owed too: that upload is newer and carries it (`RecoveredWork.owed`).
/// 4. Unlink and a rename over the node settle it without storing: the object is gone.
extension Filesystem {
    /// Whether a change of `node`'s attributes waits (see above) instead of a POST now.
    func defersAttributes(of node: Node) -> Bool {
        configuration.attributeWriteDelay > 0 && node.kind == .file && node.linked && !node.etag.isEmpty
    }

    /// Marks `inode`'s attributes owed, journals them and schedules their store.
    func oweAttributes(_ inode: InodeNumber) {
        withAttributeLock(inode) {
            names.withLock { $0.inodes.oweAttributes(inode) }
            syncAttributeNoteLocked(inode)
        }
        scheduleOwedAttributes(inode, tries: 0)
    }

    private func scheduleOwedAttributes(_ inode: InodeNumber, tries: Int) {
        let delay = min(60, configuration.attributeWriteDelay * Double(1 << min(tries, 10)))
        pool.submit(after: delay) { [self] in
            do throws(FSError) {
                try storeOwedAttributes(inode)
            } catch {
                logger.warning(
                    "storing owed attributes failed, retried later: \(error.message)", metadata: logFields(error, operation: "setattr"))
                if names.withLock({ $0.inodes[inode]?.attributesOwed ?? false }) {
                    scheduleOwedAttributes(inode, tries: tries + 1)
                }
            }
        }
    }

    /// Stores `inode`'s owed attributes now (a POST), if any are owed. A HEAD first checks that the
    /// object is still the version they were made on (else they are void: see
    /// `Node.voidOwedAttributes`), even when the node's metadata was confirmed within
    /// `attr_timeout`: Swift ignores `If-Match` on a POST, and a POST replaces all the object's
    /// metadata, so without it another client's object written since would take this change and
    /// lose its own content type and metadata. The store runs in the background, the drain or an
    /// fsync, never in a chmod, so the HEAD costs no chmod a round trip.
    func storeOwedAttributes(_ inode: InodeNumber) throws(FSError) {
        try attributeLock(inode).withLock { () throws(FSError) in
            defer { syncAttributeNoteLocked(inode) }
            guard let node = names.withLock({ $0.inodes[inode] }), node.attributesOwed else { return }
            guard node.linked else {
                // No name leads here any more (deleted, or replaced by a node made here): the key
                // is another object's now, even one with the same ETag (two empty files).
                settleAttributes(inode, storedAt: node.attributeVersion)
                return
            }
            // A background HEAD's answer from before would describe a new node (the kernel may
            // forget this one once it is settled) with the old attributes.
            namespace.forgetPrefetched(keys: [node.key])
            do throws(ObjectStoreError) {
                try postHoldingUploads(inode) { () throws(ObjectStoreError) in
                    let askedAt = storeClock.tick()
                    let info = try store.head(key: node.key)
                    guard info.etag == node.etag else {
                        // Another client's version: the rule voids what is owed on the old one.
                        names.withLock { s in _ = s.inodes.update(inode) { namespace.apply(info, askedAt: askedAt, to: &$0) } }
                        return
                    }
                    let (contentType, metadata) = storedForm(of: node, over: info)
                    try store.setMetadata(key: node.key, contentType: contentType, metadata: metadata, manifest: info.manifest)
                }
            } catch where error.code == .notFound {
                // Deleted by another client: nothing to store them on, and the name is gone (not
                // journaled as this mount's entry, which later listings would show again).
                names.withLock { s in
                    guard s.inodes.child(node.parent, node.name)?.inode == inode, s.spools[inode] == nil else { return }
                    s.inodes.unhook(parent: node.parent, name: node.name)
                    s.directories.forget(node.name, in: node.parent)
                }
            } catch {
                throw FSError(storeError: error, operation: "set attributes of", path: node.key)
            }
            settleAttributes(inode, storedAt: node.attributeVersion)
        }
    }

    /// Runs `post` (a HEAD of `inode`'s object and a POST over what it said) with no upload of
    /// the same file under way or starting: a POST replaces the object's manifest too (Swift
    /// drops one it does not repeat), so one sent over a DLO stored after the HEAD would leave an
    /// empty object. Every upload (`commit`) counts itself under the file's attribute lock, which
    /// the caller holds (lock 1): the uploads counted before are waited for, and none starts
    /// until `post` returns.
    func postHoldingUploads(_ inode: InodeNumber, _ post: () throws(ObjectStoreError) -> Void) throws(ObjectStoreError) {
        files.withLock { $0.uploading[inode]?.done }?.wait()
        try post()
    }

    /// Stores every owed attribute change below `prefix` (before a directory rename) or all of
    /// them (drain); returns the keys that failed.
    @discardableResult
    func storeOwedAttributes(below prefix: String? = nil) -> [String] {
        let owing = names.withLock { $0.inodes.nodesOwingAttributes }
        var failed: [String] = []
        for node in owing where prefix.map({ node.key.utf8.starts(with: $0.utf8) }) ?? true {
            do {
                try storeOwedAttributes(node.inode)
            } catch {
                failed.append(node.key)
            }
        }
        return failed
    }

    /// The store acknowledged `inode`'s attributes as of `version` (or the object is gone): owed
    /// ones are settled unless the node changed since, and every answer asked before is refused
    /// from now on (the attribute rule), the remembered listing's entry included.
    func settleAttributes(_ inode: InodeNumber, storedAt version: UInt64) {
        let tick = storeClock.tick()
        names.withLock { s in
            guard let node = s.inodes.update(inode, { $0.acknowledge(at: tick, version: version) }) else { return }
            if node.attributesOwed && node.attributeVersion == version {
                // The listing first: settling unpins the node, which goes if the kernel forgot it,
                // and the next lookup makes a new node from the remembered entry.
                if node.kind != .directory, s.spools[inode] == nil { namespace.updateListing(describing: node, in: &s) }
                s.inodes.settleAttributes(inode)
            }
            s.sweep()
        }
    }

    /// Brings `inode`'s attribute note in line with the node: written while attributes are owed,
    /// removed once they are not.
    func syncAttributeNote(_ inode: InodeNumber) {
        withAttributeLock(inode) { syncAttributeNoteLocked(inode) }
    }

    private func syncAttributeNoteLocked(_ inode: InodeNumber) {
        let path = spool.attributeNotePath(inode)
        guard let node = names.withLock({ $0.inodes[inode] }), node.attributesOwed else {
            Glibc.unlink(path)
            return
        }
        let (contentType, metadata) = storedForm(of: node)
        let change = Spool.PendingUpload(key: node.key, contentType: contentType, metadata: metadata, base: node.etag)
        if !Spool.writeNote(path, change, sync: false) {
            logger.warning("cannot journal the attributes of '\(node.key)' in \(path): they are stored at the next chance only")
        }
    }

    private func withAttributeLock(_ inode: InodeNumber, _ body: () -> Void) {
        attributeLock(inode).withLock(body)
    }

    /// The attribute lock (stripe) of `inode`: lock 1 of the LOCKING block in Filesystem.swift.
    func attributeLock(_ inode: InodeNumber) -> SerialLock { attributeLocks[Int(inode % UInt64(attributeLocks.count))] }

    /// Runs `body` holding the attribute locks of `inodes` (in stripe order, each stripe once).
    func withAttributesHeld<T>(_ inodes: [InodeNumber], _ body: () throws(FSError) -> T) throws(FSError) -> T {
        let stripes = Set(inodes.map { Int($0 % UInt64(attributeLocks.count)) }).sorted()
        return try holdingAttributes(stripes[...], body)
    }

    private func holdingAttributes<T>(_ stripes: ArraySlice<Int>, _ body: () throws(FSError) -> T) throws(FSError) -> T {
        guard let first = stripes.first else { return try body() }
        return try attributeLocks[first].withLock { () throws(FSError) -> T in
            try holdingAttributes(stripes.dropFirst(), body)
        }
    }

    /// Stores the attribute change an earlier mount noted (`storeRecovered`): dropped when
    /// another client changed the object since, or deleted it.
    func recoverAttributes(note: String, change: Spool.PendingUpload) throws(ObjectStoreError) {
        let info: ObjectInfo
        do {
            info = try recoveryStore.head(key: change.key)
        } catch where error.code == .notFound {
            Glibc.unlink(note)
            return
        }
        guard info.etag == change.base else {
            logger.warning(
                "attributes of '\(change.key)' owed by an earlier mount are dropped: another client changed the object since")
            Glibc.unlink(note)
            return
        }
        var metadata = info.metadata.filter { !Node.ownMetadataNames.contains($0.key) }
        for (name, value) in change.metadata where Node.ownMetadataNames.contains(name) { metadata[name] = value }
        do {
            try recoveryStore.setMetadata(key: change.key, contentType: change.contentType, metadata: metadata, manifest: info.manifest)
        } catch where error.code == .notFound {
            Glibc.unlink(note)
            return
        }
        Glibc.unlink(note)
        logger.notice("stored the attributes of '\(change.key)', owed by an earlier mount")
    }
}
