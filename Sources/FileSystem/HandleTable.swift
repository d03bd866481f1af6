import FSCore
import FSFiles
import FSJournal
import FSNamespace

/// The open file and directory handles, numbered as FUSE hands them to the kernel. A value type
/// with no I/O and no lock, held in `Filesystem.State`; nothing else writes its tables. Numbers
/// are never reused, so a late call with a closed handle finds nothing instead of another file.
struct HandleTable {
    private var files: [UInt64: Filesystem.Handle] = [:]
    private var directories: [UInt64: Filesystem.OpenDirectory] = [:]
    private var next: UInt64 = 1

    private mutating func number() -> UInt64 {
        defer { next += 1 }
        return next
    }

    mutating func open(_ handle: Filesystem.Handle) -> UInt64 {
        let number = number()
        files[number] = handle
        return number
    }

    mutating func open(_ directory: Filesystem.OpenDirectory) -> UInt64 {
        let number = number()
        directories[number] = directory
        return number
    }

    func file(_ number: UInt64) -> Filesystem.Handle? { files[number] }

    /// Replaces an open handle's reader (a newer version to read); nothing once it is closed.
    mutating func replace(_ number: UInt64, with handle: Filesystem.Handle) {
        if files[number] != nil { files[number] = handle }
    }

    mutating func closeFile(_ number: UInt64) -> Filesystem.Handle? { files.removeValue(forKey: number) }

    /// The inodes of files open for reading from the store (a spool's are `State.openFiles`).
    var remoteInodes: Set<InodeNumber> {
        Set(files.values.compactMap { handle in
            if case .remote(_, let inode, _) = handle { return inode }
            return nil
        })
    }

    /// Per inode of `inodes` open for reading from the store, when its youngest handle opened.
    func latestOpen(of inodes: Set<InodeNumber>) -> [InodeNumber: Double] {
        var latest: [InodeNumber: Double] = [:]
        for handle in files.values {
            guard case .remote(let reader, let inode, _) = handle, inodes.contains(inode) else { continue }
            latest[inode] = max(latest[inode] ?? -.infinity, reader.openedAt)
        }
        return latest
    }

    func directory(_ number: UInt64) -> Filesystem.OpenDirectory? { directories[number] }

    mutating func update(_ number: UInt64, _ directory: Filesystem.OpenDirectory) {
        if directories[number] != nil { directories[number] = directory }
    }

    mutating func closeDirectory(_ number: UInt64) { directories[number] = nil }
}
