import FSCore
import Logging
import ObjectStore

/// What every subsystem of the namespace room needs of the filesystem around it: the store (as
/// the journal shows it) and its clock, the configuration, the time, the pool and the log. The
/// filesystem conforms and passes itself with each call; no subsystem keeps a reference to it.
package protocol NamespaceHost: Sendable {
    var store: any ObjectStore { get }
    var storeClock: StoreClock { get }
    var configuration: FilesystemConfiguration { get }
    var pool: BackgroundPool { get }
    var logger: Logger { get }
    func now() -> Double
}

/// The namespace room's tables: which names exist (the inode table), what listings said (the
/// directory cache), the listings readdirs are reading, the open directory handles and the
/// bound's passes. A value type with no I/O, held behind the facade's `names` lock (lock 3 of the
/// LOCKING block in `Sources/FileSystem/Filesystem.swift`); the files room's tables are behind
/// their own lock, taken inside this one when one look needs both.
package struct NamespaceTables {
    package var inodes: InodeTable
    package var directories: DirectoryCache
    /// The listing a readdir reads from the server, by directory, and when a readdir or a
    /// lookup last used it, until its handle is closed or another readdir replaces it: a
    /// lookup of a name it showed takes the entry from it while it is in use, up to
    /// `dir_timeout` after the last use, when no remembered listing is fresh. `ls -l` of
    /// 200 000 names stats each as it reads, 6 000 names a getdents, and stats the last
    /// 6 000 after the listing is complete and remembered: longer than `dir_timeout` when
    /// each needs a HEAD.
    package var readers: [InodeNumber: (reader: DirectoryReader, at: Double)] = [:]
    package var directoryHandles = Handles<OpenDirectory>()
    /// The files being written here, by inode: the files room's spools (`FileTables.openFiles`),
    /// added and removed together with them (both locks held, `Filesystem.withTables`), so that
    /// this room knows which nodes a spool describes without the files room's lock.
    package var spools: [InodeNumber: any Spooled] = [:]
    /// Passes asking the kernel to forget names (`Filesystem+Bound`).
    package var bound = BoundState()
    /// The last `statfs` answer and when it was asked.
    package var statistics: (value: FilesystemStatistics, at: Double)?

    /// The keys of directories being renamed, old and new, by move: the store holds some
    /// of the tree at each until the rename ends, so no listing of them, below them or of a
    /// directory above them is remembered meanwhile (`isMoving`).
    private var moves: [UInt64: [String]] = [:]
    private var movesBegun: UInt64 = 0

    package init(inodes: InodeTable, directories: DirectoryCache) {
        self.inodes = inodes
        self.directories = directories
    }

    /// A directory's keys start moving from `source` to `destination` (both end in `/`);
    /// returns what `endMove` takes once the tables say where they are.
    package mutating func beginMove(from source: String, to destination: String) -> UInt64 {
        movesBegun += 1
        moves[movesBegun] = [source, destination]
        return movesBegun
    }

    package mutating func endMove(_ move: UInt64) { moves[move] = nil }

    /// Whether a listing of the directory keyed `prefix` may be caught half-way through a
    /// move: the directory is, or is above or below, one being moved.
    package func isMoving(_ prefix: String) -> Bool {
        moves.values.contains { keys in
            keys.contains { $0.utf8.starts(with: prefix.utf8) || prefix.utf8.starts(with: $0.utf8) }
        }
    }

    /// Drops the listings of directories the inode table no longer holds, and keeps the
    /// numbers of names whose nodes the kernel forgot for their next nodes (readdir may have
    /// shown them: d_ino = st_ino).
    package mutating func sweep() {
        for directory in inodes.takeRemovedDirectories() { directories.remove(directory) }
        for (parent, name, inode) in inodes.takeForgottenNames() { directories.reserveForgotten(parent, name, inode) }
    }
}

/// An open directory: the listing its readdir reads, taken at offset 0 (the first readdir,
/// or after `rewinddir`, which must show the directory as it is then); nil before.
package struct OpenDirectory {
    package var reader: DirectoryReader? = nil
    package init(reader: DirectoryReader? = nil) { self.reader = reader }
}

/// Metadata in bounded memory (issue 21, `meta_max_entries`). A node is kept for every name the
/// kernel holds (InodeTable rule 1), and the kernel keeps what it looked up until memory runs
/// short, so without a bound a walk of a huge container keeps every name it passed.
///
/// The rules:
/// 1. Names in remembered listings: at most `maximumEntries` (DirectoryCache rule 5; the
///    listings remembered longest ago go, the newest stays).
/// 2. Nodes: past `maximumEntries`, the kernel is asked to forget names (the facade's `Filesystem+Bound`)
///    until nine tenths are left: the files, symlinks and special files of the directories used
///    longest ago first; never a directory, a file open here, or a node a spool or owed
///    attributes pin (`InodeTable.forgettable`). The kernel forgets (FORGET) each inode it no
///    longer uses, and rule 1 drops the node; one it still uses stays. A name forgotten is
///    looked up again when asked for, from a remembered listing or the store, and shows what
///    the store holds plus this mount's changes (DirectoryCache rules 2 and 4 hold whatever
///    node is gone).
/// 3. The kernel is asked from a pool thread, never a request's (it takes the directory's lock,
///    which a lookup there may hold), one pass at a time. A pass starts when the nodes exceed
///    the bound and a twentieth of the bound was added since the last pass began, or a second
///    went by (names the kernel keeps are not asked for again at every operation). A second
///    after a pass that asked for names, another runs if the nodes are still past the bound
///    but fewer than when it began (the kernel forgets as it can; an idle mount gets there
///    too). If none went, it is asked again after 2, 4, 8 and 16 s, then no more until the
///    next operation adds nodes: a name `ls -l` was still using when it was asked for stays
///    otherwise (an idle mount 50 names past a bound of 200, once in three runs of
///    BoundedMountTests), while names the kernel will not forget, such as a file mapped after
///    its close, are not asked for every second.
package struct BoundState {
    package var running = false
    /// The node count and the time when the last pass began.
    package var lastPass: (count: Int, at: Double) = (0, -.infinity)
    /// Passes in a row after which the kernel forgot nothing (rule 3).
    package var fruitless = 0
    package static let retries = 4

    package init(running: Bool = false, lastPass: (count: Int, at: Double) = (0, -.infinity), fruitless: Int = 0) {
        self.running = running
        self.lastPass = lastPass
        self.fruitless = fruitless
    }
}

extension NamespaceTables {
    /// Whether a pass of the bound starts now (rules 2 and 3; `followUp`: the check a second
    /// after a pass), marked running if so.
    package mutating func startBoundPass(limit: Int, now: Double, followUp: Bool) -> Bool {
        let count = inodes.nodes.count
        guard count > limit else { return false }
        var fruitless = 0
        let due: Bool
        if followUp {
            fruitless = count < bound.lastPass.count ? 0 : bound.fruitless + 1
            due = fruitless <= BoundState.retries
        } else {
            due = count >= bound.lastPass.count + max(1, limit / 20) || now - bound.lastPass.at >= 1
        }
        guard !bound.running, due else { return false }
        bound = BoundState(running: true, lastPass: (count, now), fruitless: fruitless)
        return true
    }

    /// The names a pass asks the kernel to forget so that nine tenths of `limit` are left (rule
    /// 2): never one of `held` (open here).
    package func namesToForget(limit: Int, held: Set<InodeNumber>) -> [(parent: InodeNumber, name: String)] {
        let excess = inodes.nodes.count - (limit - limit / 10)
        guard excess > 0 else { return [] }
        return inodes.forgettable(excess, in: directories.directoriesByUse, held: held)
    }

    /// Ends a pass; returns the passes in a row after which the kernel forgot nothing.
    package mutating func endBoundPass() -> Int {
        bound.running = false
        return bound.fruitless
    }
}
