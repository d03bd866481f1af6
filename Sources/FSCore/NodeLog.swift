/// Where a worker records which node numbers the kernel holds and what they name (issue 40,
/// docs/restart-design.md): a worker that replaces a dead one adopts them (`AdoptedNode`), so
/// the numbers the kernel still holds name the same files, directories and symlinks: `stat`
/// keeps its `st_ino`, a directory a process works in keeps working, readdir's d_ino agrees.
/// Written under the namespace room's lock, before the reply that makes a number known.
public protocol NodeLog: AnyObject, Sendable {
    /// The kernel holds `inode`, which `name` in `parent` leads to (also after a rename).
    /// Returns false when the log is full: the caller writes it again from what it knows
    /// (`restart`, then `named` for each node).
    func named(_ inode: InodeNumber, parent: InodeNumber, name: String, kind: NodeKind) -> Bool
    /// No name leads to `inode` any more, or the kernel no longer holds it.
    func unnamed(_ inode: InodeNumber)
    /// Empties the log, to write it again whole.
    func restart()
}

/// A number the kernel held when the previous worker died, and what it named.
public struct AdoptedNode: Sendable, Equatable {
    public var inode: InodeNumber
    public var parent: InodeNumber
    public var name: String
    public var kind: NodeKind

    public init(inode: InodeNumber, parent: InodeNumber, name: String, kind: NodeKind) {
        self.inode = inode
        self.parent = parent
        self.name = name
        self.kind = kind
    }
}

/// Where the files room records the file handles the kernel holds (issue 40), for a worker that
/// replaces this one. Written under the files room's lock only (one writer at a time).
public protocol HandleLog: AnyObject, Sendable {
    /// The kernel holds `handle`, a reader of the version `reader` names (the latest record of a
    /// number wins). Returns false when the log is full: the caller writes it again whole
    /// (`restart`, then `opened` for each handle).
    func opened(_ handle: UInt64, reader: AdoptedReader) -> Bool
    /// The kernel released `handle`, or it is not one a successor can take over.
    func released(_ handle: UInt64)
    /// Empties the log, to write it again whole.
    func restart()
}

/// A handle open for reading when the previous worker died: which object version it reads.
public struct AdoptedReader: Sendable, Equatable {
    public var inode: InodeNumber
    public var key: String
    public var size: Int64
    public var etag: String
    /// A DLO's manifest (`container/prefix`), whose parts the reader reads.
    public var manifest: String?
    /// An empty ETag: the handle read bytes only a spool held, which a successor cannot serve.
    public var isLost: Bool { etag.isEmpty }

    public init(inode: InodeNumber, key: String, size: Int64, etag: String, manifest: String?) {
        self.inode = inode
        self.key = key
        self.size = size
        self.etag = etag
        self.manifest = manifest
    }
}
