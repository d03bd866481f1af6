import FSCore

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
    /// Passes asking the kernel to forget names (`Filesystem+Bound`).
    package var bound = BoundState()
    /// The last `statfs` answer and when it was asked.
    package var statistics: (value: FilesystemStatistics, at: Double)?

    package init(inodes: InodeTable, directories: DirectoryCache) {
        self.inodes = inodes
        self.directories = directories
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

/// The bound's passes (`Filesystem+Bound`, rules 2 and 3 there).
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
