import FSCore
import Locking
import Logging
import ObjectStore

/// The namespace room: which names exist, with which attributes. It owns its tables
/// (`NamespaceTables`, behind `names`), the listings fetched ahead of walks (`ListingsAhead`) and
/// the background HEADs (`BackgroundHeads`), and answers lookups, readdirs and forgets from
/// listings, HEADs and this mount's own changes (`Namespace+Lookup`, `Namespace+Readdir`). It is
/// the host of its own subsystems (`Namespace+Hosts`).
///
/// What it knows of the files room is `NamespaceTables.spools` (which nodes a spool describes),
/// kept by the facade, which is the only code that takes both rooms' locks (`withTables`).
/// Locks: the facade's LOCKING block (`names` is lock 3).
package final class Namespace: Sendable, NamespaceHost, ListingsAheadHost, BackgroundHeadsHost {
    package static let rootInode: InodeNumber = 1
    /// The longest object key the store takes (Swift's default `max_object_name_length`).
    package static let maximumKeyLength = 1024

    /// The store as this mount sees it (the container, less the keys whose delete is owed).
    package let store: any ObjectStore
    package let storeClock: StoreClock
    package let configuration: FilesystemConfiguration
    package let pool: BackgroundPool
    package let logger: Logger
    /// The room's tables (lock 3 of the facade's LOCKING block).
    package let names: Locked<NamespaceTables>
    /// Listings of subdirectories fetched ahead of a walk, and walk listings (lock 6b).
    package let listingsAhead = ListingsAhead()
    /// Background HEADs after listings (lock 6).
    package let backgroundHeads = BackgroundHeads()

    package init(
        store: any ObjectStore, storeClock: StoreClock, configuration: FilesystemConfiguration, pool: BackgroundPool,
        logger: Logger
    ) {
        self.store = store
        self.storeClock = storeClock
        self.configuration = configuration
        self.pool = pool
        self.logger = logger
        var inodes = InodeTable(rootKey: configuration.rootPrefix, rootTime: configuration.directoryTime)
        inodes.log = configuration.nodeLog
        inodes.adopt(configuration.adoptedNodes)
        names = Locked(
            NamespaceTables(
                inodes: inodes,
                directories: DirectoryCache(
                    journalSeconds: Self.journalSeconds(directoryTimeout: configuration.directoryCacheSeconds),
                    nameLimit: configuration.maximumEntries)))
    }

    /// Seconds on the configuration's clock (monotonic by default): every cache age is measured here.
    package func now() -> Double { configuration.clock?() ?? monotonicNow() }

    /// ENAMETOOLONG for a key the store cannot hold (`maximumKeyLength` bytes).
    package static func requireStorable(_ key: String, suffix: Int = 0) throws(FSError) {
        guard key.utf8.count + suffix <= maximumKeyLength else {
            throw FSError(
                .nameTooLong, "the path is \(key.utf8.count + suffix) bytes as a key; the store takes at most \(maximumKeyLength)")
        }
    }

    package func attributes(of node: Node) -> Attributes { node.attributes(configuration) }

    package func node(_ inode: InodeNumber) throws(FSError) -> Node {
        guard let node = names.withLock({ $0.inodes[inode] }) else {
            throw FSError(.stale, "inode \(inode) is not known (forgotten by the kernel)")
        }
        return node
    }

    /// Whether `node` is another tool's file whose metadata headers no answer has shown for its
    /// version yet (a listing showed a new version of it), with `foreign_attrs=head`: its
    /// attributes are not reported before a HEAD.
    package func awaitsHead(_ node: Node) -> Bool {
        configuration.foreignAttributes == .head && (node.kind == .file && node.size > 0 || node.kind == .symlink)
            && node.metadataKnownAt == 0 && node.stored.mtime == nil && !node.hasUnacknowledgedChange
    }

    /// HEADs a file's object and stores what it says.
    package func refresh(_ node: Node) throws(FSError) -> Node {
        let askedAt = storeClock.tick()
        let info: ObjectInfo
        do {
            info = try store.head(key: node.key)
        } catch {
            throw FSError(storeError: error, operation: "stat", path: node.key)
        }
        return names.withLock { s in
            s.inodes.update(node.inode) { apply(info, askedAt: askedAt, to: &$0) } ?? node
        }
    }

    /// Takes what a HEAD asked at `askedAt` said, if the rule admits it (see `Node.apply`), at
    /// this room's time.
    package func apply(_ info: ObjectInfo, askedAt: UInt64, to node: inout Node) {
        node.apply(info, askedAt: askedAt, now: now(), foreign: configuration.foreignAttributes)
    }
}
