import FSCore
import FSFiles
import FSJournal
import FSNamespace
import ObjectStore

// The filesystem as the host of the namespace room's poller (`Poller` in FSNamespace: change
// notification, issue 22, `poll_s`): which files are open, which deletes are owed, and what a
// poll drops from the kernel; the rest the namespace room answers.
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
        namespace.takePollListing(reader, entries, listed, confirmed: confirmed, madeAgain: madeAgain, of: directory)
    }

    package func makeDirectoryReader(_ directory: Node, startedAt: UInt64?, pagesAhead: Bool) -> DirectoryReader {
        namespace.makeDirectoryReader(directory, startedAt: startedAt, pagesAhead: pagesAhead)
    }

    package func hiddenName(in directory: Node) -> String? { namespace.hiddenName(in: directory) }

    package func readWhole(_ reader: DirectoryReader, limit: Int) throws(FSError) -> PackedEntries? {
        try namespace.readWhole(reader, limit: limit)
    }

    package func dropListingsAhead(of keys: [String]?) { namespace.dropListingsAhead(of: keys) }

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
