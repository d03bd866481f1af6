/// Where a worker records which node numbers the kernel holds and what they name (issue 40,
/// docs/restart-design.md): a worker that replaces a dead one adopts them (`AdoptedNode`), so
/// the numbers the kernel still holds name the same files, directories and symlinks: `stat`
/// keeps its `st_ino`, a directory a process works in keeps working, readdir's d_ino agrees.
/// Written under the namespace room's lock, before the reply that makes a number known.
public protocol NodeLog: AnyObject, Sendable {
    /// The kernel holds `inode`, which `name` in `parent` leads to (also after a rename).
    /// Returns false when the log is full: the caller writes it again from what it knows
    /// (`restart`, then `named` for each node, then `commit`).
    func named(_ inode: InodeNumber, parent: InodeNumber, name: String, kind: NodeKind) -> Bool
    /// No name leads to `inode` any more, or the kernel no longer holds it.
    func unnamed(_ inode: InodeNumber)
    /// Begins writing the log again whole: what is written from now on replaces the log at
    /// `commit(true)` (a worker that dies before leaves the old log whole); `commit(false)`
    /// gives up and keeps the old one.
    func restart()
    func commit(_ complete: Bool)
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
    /// The kernel holds `handle`, as `record` describes it (the latest record of a number wins).
    /// Returns false when the log is full: the caller writes it again whole (`restart`, then
    /// `opened` for each handle, then `commit`).
    func opened(_ handle: UInt64, _ record: AdoptedHandle) -> Bool
    /// The kernel released `handle`, or it is not one a successor can take over.
    func released(_ handle: UInt64)
    /// Begins writing the log again whole, as `NodeLog.restart`; `commit` ends it.
    func restart()
    func commit(_ complete: Bool)
}

/// A file handle open when the previous worker died: the object version it reads, or the spool
/// it reads and writes.
public struct AdoptedHandle: Sendable, Equatable {
    public var inode: InodeNumber
    public var key: String
    public var size: Int64
    /// The version read; for a handle on a spool, the ETag the spool's bytes replace.
    public var etag: String
    /// A DLO's manifest (`container/prefix`), whose parts the reader reads.
    public var manifest: String?
    /// The spool the handle is attached to (nil: it reads the stored version `etag`).
    public var spool: AdoptedSpool?
    /// An empty ETag and no spool: the handle read bytes only a spool held, which a successor
    /// cannot serve.
    public var isLost: Bool { spool == nil && etag.isEmpty }

    public init(inode: InodeNumber, key: String, size: Int64, etag: String, manifest: String?, spool: AdoptedSpool? = nil) {
        self.inode = inode
        self.key = key
        self.size = size
        self.etag = etag
        self.manifest = manifest
        self.spool = spool
    }
}

/// The spool a handle was attached to, and what its file's upload would store: a successor
/// attaches the handle to the same spool file (its bytes are on disk) and stores it as this
/// worker would have.
public struct AdoptedSpool: Sendable, Equatable {
    /// The spool's data file.
    public var path: String
    /// The handle writes.
    public var writable: Bool
    /// Whether the spool's bytes were not all stored when recorded (a writer's always count
    /// as such: its writes are not recorded one by one).
    public var dirty: Bool
    /// The node's attributes in the form an upload stores them (content type with csspfs's
    /// parameters, metadata headers).
    public var contentType: String
    public var metadata: [String: String]
    /// When this was recorded: a spool file changed later was written later, and its time is
    /// the file's modification time.
    public var recordedAt: Timestamp

    public init(
        path: String, writable: Bool, dirty: Bool, contentType: String, metadata: [String: String], recordedAt: Timestamp
    ) {
        self.path = path
        self.writable = writable
        self.dirty = dirty
        self.contentType = contentType
        self.metadata = metadata
        self.recordedAt = recordedAt
    }
}
