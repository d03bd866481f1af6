import Dispatch
import FSCore

/// An open file handle.
package enum FileHandle {
    /// A read-only handle on an object that nobody was writing through this mount at open.
    case remote(FileReader, InodeNumber, localVersion: UInt64)
    /// A handle on the spool of a file open for writing (or not yet stored).
    case spool(SpoolFile, writable: Bool)
    /// A handle taken over from a dead worker (issue 40) whose bytes this worker cannot serve
    /// (a reader recorded before handles on spools were, or a spool file someone removed):
    /// reads and writes fail with ESTALE; a writer's flush with EIO (what it wrote is lost), a
    /// reader's succeeds.
    case lost(InodeNumber, key: String, writable: Bool)
}

/// The files room's tables: open file handles, the spools by inode and the uploads under way.
/// A value type with no I/O, held behind the facade's `files` lock (lock 3b of the LOCKING block
/// in `Sources/FileSystem/Filesystem.swift`: taken alone, or inside the namespace room's).
package struct FileTables {
    package var handles = Handles<FileHandle>()
    /// Spools by inode: files open for writing, and closed files whose upload is pending.
    package var openFiles: [InodeNumber: SpoolFile] = [:]
    /// Uploads under way per inode, with a group left when the last ends (`commit`; an
    /// attribute POST waits for them, `postHoldingUploads`).
    package var uploading: [InodeNumber: (count: Int, done: DispatchGroup)] = [:]
    /// What the handle log holds for each handle (issue 40), as a successor takes it over. Kept
    /// only with a handle log.
    package var recordedHandles: [UInt64: AdoptedHandle] = [:]
    /// Records appended to the handle log since it was last written whole.
    package var handleLogRecords = 0

    package init() {}
}

extension Handles<FileHandle> {
    /// The inodes of files open for reading from the store (a spool's are `openFiles`).
    package var remoteInodes: Set<InodeNumber> {
        Set(open.values.compactMap { handle in
            if case .remote(_, let inode, _) = handle { return inode }
            return nil
        })
    }

    /// Per inode of `inodes` open for reading from the store, when its youngest handle opened.
    package func latestOpen(of inodes: Set<InodeNumber>) -> [InodeNumber: Double] {
        var latest: [InodeNumber: Double] = [:]
        for handle in open.values {
            guard case .remote(let reader, let inode, _) = handle, inodes.contains(inode) else { continue }
            latest[inode] = max(latest[inode] ?? -.infinity, reader.openedAt)
        }
        return latest
    }
}
