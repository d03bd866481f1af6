import FSCore
import ObjectStore

// The filesystem as the host of the namespace room's listings ahead and walk listings
// (`ListingsAhead`, `WalkListing` in FSNamespace): what they read of the tables under `names`,
// and the background HEADs of directory markers. The calls the rest of the facade makes pass
// `self` as the host.
extension Namespace {
    package func withoutFreshListings(_ directories: [DirectoryEntry], in parent: InodeNumber, now: Double)
        -> [DirectoryEntry]
    {
        names.withLock { s in
            directories.filter { directory in
                guard let node = s.inodes.child(parent, directory.name), node.kind == .directory else { return true }
                return s.directories.listing(node.inode, now: now, maximumAge: configuration.directoryCacheSeconds) == nil
            }
        }
    }

    package func namespaceGeneration() -> (generation: UInt64, now: Double) {
        names.withLock { s in (s.directories.generation, now()) }
    }

    package func reader(over listing: AheadListing, of directory: Node) -> DirectoryReader? {
        names.withLock { s in
            guard listing.generation == s.directories.generation,
                now() - listing.startedAt <= configuration.directoryCacheSeconds
            else { return nil }
            return DirectoryReader(
                prefix: directory.key, fetched: listing.entries,
                removedHere: s.directories.removedHere(directory.inode, now: now()),
                startedAt: s.directories.changeCount(directory.inode), askedAt: listing.askedAt)
        }
    }

    package func recordNoMarker(_ directory: DirectoryEntry, askedAt: UInt64) {
        recordPrefetched(directory, answer: .some(nil), askedAt: askedAt)
    }

    package func listAhead(subdirectoriesOf entries: some Collection<DirectoryEntry>, in parent: InodeNumber) {
        listingsAhead.listAhead(subdirectoriesOf: entries, in: parent, self)
    }

    package func readerFromListingAhead(_ directory: Node, dropQueued: Bool = true) -> DirectoryReader? {
        listingsAhead.readerFromListingAhead(directory, dropQueued: dropQueued, self)
    }

    package func noteReaddir(of directory: Node) { listingsAhead.noteReaddir(of: directory, self) }

    package func dropListingsAhead(of keys: [String]?) { listingsAhead.dropListingsAhead(of: keys) }

    /// Waits until no listing ahead is queued or running (tests).
    package func waitForListingsAhead() { listingsAhead.waitForListingsAhead() }
}
