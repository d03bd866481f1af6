import BlockCache
import Dispatch
import FSCore
import ObjectStore

// The filesystem as the host of the namespace room's background HEADs (`BackgroundHeads` in
// FSNamespace): the node tables under `names` they read and write, and the calls the rest of the
// facade makes, with `self` as the host.
extension Namespace {
    var metadataIndex: MetadataIndex? { configuration.metadataIndex }

    package func nodes(of entries: [DirectoryEntry], in parent: InodeNumber) -> [ExactString: InodeNumber] {
        names.withLock { s in
            var targets: [ExactString: InodeNumber] = [:]
            for entry in entries {
                if let node = s.inodes.child(parent, entry.name), node.kind == entry.kind { targets[entry.name.exact] = node.inode }
            }
            return targets
        }
    }

    /// Hands a recorded answer to the node it was asked for. This runs after `recordPrefetched`,
    /// in a critical section of its own: a rename, mkdir or rmdir may run in between, and its
    /// `forgetPrefetched` finds the answer recorded, not running, so nothing marks it stale.
    /// Hence the check that the name still leads to the same node.
    package func applyPrefetched(_ job: PrefetchJob, answer: HeadAnswer) {
        let entry = job.entry
        names.withLock { s in
            // The node the listed name leads to now, if it is the node the HEAD was asked for
            // and still describes the listed object.
            guard let node = s.inodes.child(job.parent, entry.name), node.inode == job.inode, node.kind == entry.kind,
                node.key.isSameKey(as: entry.key), s.spools[node.inode] == nil
            else { return }
            s.inodes.update(node.inode) { node in
                switch entry.kind {
                case .directory:
                    node.merge(entry, listedAt: 0, head: answer, fresh: false, now: now(), foreign: configuration.foreignAttributes)
                case .file, .symlink, .fifo, .socket:
                    guard let info = answer.info, info.etag == node.etag else { return }
                    apply(info, askedAt: answer.askedAt, to: &node)
                }
            }
        }
    }

    /// Whether the attributes of `entry` need a HEAD's answer before the mount reports them:
    /// a foreign file with `foreign_attrs=head`.
    package func awaitsHead(_ entry: DirectoryEntry) -> Bool {
        configuration.foreignAttributes == .head && BackgroundHeads.isForeign(entry)
    }

    /// `prefetchedMetadata(entry, wait: true)` for a lookup: a directory's marker may come from
    /// a walk listing under way (or one its lookup starts) instead of a HEAD of its own.
    package func prefetchedMetadataForLookup(_ entry: DirectoryEntry) -> PrefetchResult {
        if entry.kind == .directory {
            if case .known(let answer) = prefetchedMetadata(entry, wait: false) { return .known(answer) }
            listingsAhead.awaitMarkerFromWalk(entry, self)
        }
        return prefetchedMetadata(entry, wait: true)
    }

    package func forgetPrefetched(keys: [String], prefixes: [String] = []) {
        backgroundHeads.forgetPrefetched(keys: keys, prefixes: prefixes, self)
    }

    package func prefetchMetadata(of entries: PackedEntries, in parent: InodeNumber) {
        backgroundHeads.prefetchMetadata(of: entries, in: parent, self)
    }

    package func prefetchAhead(of key: String, in parent: InodeNumber, listedAt: UInt64, following: (Int) -> [DirectoryEntry]) {
        backgroundHeads.prefetchAhead(of: key, in: parent, listedAt: listedAt, following: following, self)
    }

    @discardableResult
    package func recordPrefetched(_ entry: DirectoryEntry, answer: ObjectInfo??, askedAt: UInt64) -> Bool {
        backgroundHeads.recordPrefetched(entry, answer: answer, askedAt: askedAt, self)
    }

    package func prefetchedMetadata(_ entry: DirectoryEntry, wait: Bool, listedAt: UInt64? = nil) -> PrefetchResult {
        backgroundHeads.prefetchedMetadata(entry, wait: wait, listedAt: listedAt, self)
    }

    package func forgetQueuedMarkerHeads(coveredBy lanes: [WalkListing]) {
        backgroundHeads.forgetQueuedMarkerHeads(coveredBy: lanes)
    }

    /// Returns when every background HEAD queued so far has ended (tests).
    package func waitForPrefetch() { backgroundHeads.waitUntilIdle() }

    /// Drops queued HEADs and queues no more (unmount).
    package func stopPrefetching() { backgroundHeads.stop() }
}
