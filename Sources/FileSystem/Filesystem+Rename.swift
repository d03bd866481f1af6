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

// rename: of a file (a COPY and a journaled delete, a Swift manifest moved whole), of a
// directory (every key below it), with the uploads of the files involved held.
extension Filesystem {
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
            namespace.forgetPrefetched(
                keys: [source.key, newKey, String(source.key.dropLast()), String(newKey.dropLast())],
                prefixes: source.kind == .directory ? [source.key, newKey] : [])
            let finish = { [self] (s: inout NamespaceTables) -> Void in
                namespace.updateListing(parent, name: name, entry: nil, in: &s)
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
                    entry = moved.kind == .directory ? DirectoryBuilder.directory(newName, key: newKey) : moved.listingEntry
                } else {
                    var renamed = source
                    renamed.name = newName
                    renamed.key = newKey
                    entry = source.kind == .directory ? DirectoryBuilder.directory(newName, key: newKey) : renamed.listingEntry
                }
                namespace.updateListing(newParent, name: newName, entry: entry, in: &s)
                s.sweep()
            }
            defer {
                // Again: a HEAD that started during the rename may have recorded the old objects.
                namespace.forgetPrefetched(
                    keys: [source.key, newKey, String(source.key.dropLast()), String(newKey.dropLast())],
                    prefixes: source.kind == .directory ? [source.key, newKey] : [])
            }
            if source.kind == .directory {
                let move = names.withLock { $0.beginMove(from: source.key, to: newKey) }
                defer { names.withLock { $0.endMove(move) } }
                try renameDirectory(source, to: newKey, replacing: existing, finish: finish)
            } else {
                try renameFile(source, to: newKey, replacing: existing, finish: finish)
            }
        }
    }

    func renameFile(
        _ source: Node, to key: String, replacing existing: Node?, finish: (inout NamespaceTables) -> Void
    ) throws(FSError) {
        let (sourceSpool, replacedSpool) = files.withLock { s in
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
    func renameQueued(
        _ source: Node, _ spool: SpoolFile, replacing existing: Node?, replacedSpool: SpoolFile?,
        finish: (inout NamespaceTables) -> Void
    ) -> Bool {
        // Nothing stored at the source's key either (a queued file renamed over a stored one
        // replaces it only at its upload: its old name still holds that object).
        guard configuration.writeBack, replacedSpool == nil,
            spool.state.withLock({ $0.isQueued && $0.baseETag.isEmpty }),
            names.withLock({ $0.inodes[source.inode]?.etag.isEmpty }) == true
        else { return false }
        if let existing {
            // The replaced object stays until the upload overwrites it: the upload checks it is
            // still that version (a zero-byte object may be a manifest: the usual way then).
            guard existing.manifest == nil, existing.size > 0, !existing.etag.isEmpty else { return false }
            spool.state.withLock { $0.baseETag = existing.etag }
        }
        names.withLock { s in finish(&s) }
        // Not synced: a rename is durable at the next fsync of its directory (as on a local
        // disk), or the next synced note (WriteBack subtlety 5).
        journal(spool, sync: false)
        if let node = names.withLock({ $0.inodes[source.inode] }) { transfers.move(source.inode, to: node.key) }
        return true
    }

    func renameFileHeld(
        _ source: Node, to key: String, replacing existing: Node?, sourceSpool: SpoolFile?, replacedSpool: SpoolFile?,
        finish: (inout NamespaceTables) -> Void
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
        let current = names.withLock { $0.inodes[source.inode] } ?? source
        var newManifest: String? = nil
        // Owed attributes ride on the copy (which then stores them); otherwise it keeps the source's own.
        // An object without a stored mtime (another tool's) keeps the time it showed, not the
        // copy's new one (issue 38): the copy stores it, the object is csspfs's own from then on.
        // So does its mode with `foreign_attrs=listing`: the other tool's `mode` header was never
        // shown, and the copy, csspfs's own, would show it (core model seed 80207: 644 became
        // 600). (With `head` the header is what the mount shows, and the copy keeps it.)
        var shown = current
        if !current.attributesOwed && current.stored.mtime == nil && current.kind == .file {
            shown.stored.mtime = current.lastModified.roundedUpToSecond
            if configuration.foreignAttributes == .listing {
                shown.stored.mode = current.stored.mode ?? attributes(of: current).permissions
            }
        }
        let keepsTime = shown.stored != current.stored
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
                    names.withLock { s in _ = s.inodes.update(source.inode) { namespace.apply(info, askedAt: askedAt, to: &$0) } }
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
        names.withLock { s in
            if let newManifest { s.inodes.update(source.inode) { $0.manifest = newManifest } }
            if keepsTime, form != nil {
                s.inodes.update(source.inode) { node in
                    node.stored.mtime = node.stored.mtime ?? shown.stored.mtime
                    node.stored.mode = node.stored.mode ?? shown.stored.mode
                }
            }
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
    func deleteMovedLater(_ key: String, version: String) throws(ObjectStoreError) {
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
    func moveParts(from prefix: String) throws(ObjectStoreError) -> String {
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
    func renameDirectory(
        _ directory: Node, to destination: String, replacing existing: Node?, finish: (inout NamespaceTables) -> Void
    ) throws(FSError) {
        let source = directory.key
        // Owed attributes below go first: the copies below keep what the server has.
        if let failed = storeOwedAttributes(below: source).first {
            throw FSError(.ioError, "rename '\(source)': the attributes of '\(failed)' cannot be stored now; try again")
        }
        let spools: [SpoolFile] = withTables { s, f in
            f.openFiles.values.filter { open in s.inodes[open.inode].map { $0.key.utf8.starts(with: source.utf8) } ?? false }
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
                try Namespace.requireStorable(destination, suffix: longest - source.utf8.count)
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
            names.withLock { finish(&$0) }
        }
    }
}
