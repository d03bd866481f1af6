import FSCore
import FSFiles
import FSJournal
import FSNamespace
import ObjectStore

// The filesystem as the host of the namespace room's poller (`Poller` in FSNamespace: change
// notification, issue 22, `poll_s`): what a poll's listing changes in both rooms' tables, and
// what it drops from the kernel.
extension Filesystem {
    /// Starts polling every `poll_s` seconds (the mount calls it once it serves); nothing when
    /// `pollSeconds` is 0.
    public func startPolling() { poller.start(self) }

    /// One tick: lists the directories in use polled longest ago, or HEADs the container.
    public func pollOnce() { poller.pollOnce(self) }

    package func openInodes() -> Set<InodeNumber> {
        files.withLock { f in Set(f.openFiles.keys).union(f.handles.remoteInodes) }
    }

    package func isDeletePending(_ key: String) -> Bool { deletes.isPending(key) }

    package func takePollListing(
        _ reader: DirectoryReader, _ entries: PackedEntries, _ listed: EntryTable, confirmed: Set<ExactString>,
        madeAgain: [ExactString: DirectoryEntry], of directory: Node
    ) -> (changed: [InodeNumber], names: [String]) {
        let inode = directory.inode
        var (listed, confirmed) = (listed, confirmed)
        for (name, entry) in madeAgain {
            listed[name] = entry
            confirmed.insert(name)
        }
        var changed: [InodeNumber] = []
        var names: [String] = []
        self.names.withLock { s in
            guard s.inodes[inode] != nil else { return }
            let before = s.directories.anyListing(inode)
            let children = s.inodes.children(of: inode)
            let table = rememberLocked(reader, listed, for: inode, confirmed: confirmed, in: &s)
            for (name, child) in children {
                guard let entry = table[name] else {
                    names.append(name.string)
                    continue
                }
                guard s.spools[child] == nil, let node = s.inodes[child], node.kind == .file, entry.kind == .file,
                    entry.etag != node.etag
                else { continue }
                if Self.describesWhole(entry) {
                    let updated = s.inodes.update(child) {
                        $0.merge(
                            entry, listedAt: reader.askedAt, head: nil, fresh: false, now: now(),
                            foreign: configuration.foreignAttributes)
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
            names += madeAgain.keys.map(\.string)
            if let before, !before.dropped {
                for position in entries.indices {
                    let name = entries[position].name
                    if before.entries[name.exact] == nil, s.inodes.child(inode, name) == nil { names.append(name) }
                }
            }
        }
        return (changed, names)
    }

    package func dropFromKernel(changed: [InodeNumber], names: [String], in inode: InodeNumber) {
        for name in names { kernelCache.forgetEntry(inode, name) }
        // A handle younger than attr_timeout reads on its version (Poller subtlety 4): the kernel
        // keeps that version's pages and size until the handle has aged past it (a shorter size
        // under a fresh mmap would be SIGBUS: ReplacedFileTests), then drops them.
        let noticedAt = now()
        let latest = files.withLock { $0.handles.latestOpen(of: Set(changed)) }
        for child in changed {
            let wait = (latest[child] ?? -.infinity) + configuration.attributeCacheSeconds + 0.05 - noticedAt
            if wait <= 0 {
                kernelCache.invalidate(child)
            } else {
                pool.submit(after: wait) { [kernelCache] in kernelCache.invalidate(child) }
            }
        }
    }
}
