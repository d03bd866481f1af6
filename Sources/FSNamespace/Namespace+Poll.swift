import FSCore
import ObjectStore

// What a poll's listing changes in the namespace room's tables (`Poller` subtlety 2).
extension Namespace {
    /// Takes a poll's listing of `directory` (`listed`, with the names `confirmed` and
    /// `madeAgain`): remembered as any listing, each node through the attribute rule. Returns
    /// the files whose version changed and the names that came or went.
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
            // A listing not remembered may describe the directory as it no longer is (a rename
            // of it finished or under way since it started): nothing is taken from it.
            let (table, remembered) = rememberLocked(reader, listed, for: inode, confirmed: confirmed, in: &s)
            guard remembered else { return }
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
}
