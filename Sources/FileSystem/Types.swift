/// Inode numbers as the kernel sees them. 1 is the root.
public typealias InodeNumber = UInt64

public enum NodeKind: Sendable, Equatable {
    case file
    case directory
}

/// What `stat` shows for a node.
public struct Attributes: Sendable, Equatable {
    public var inode: InodeNumber
    public var kind: NodeKind
    public var size: Int64
    /// Seconds since the epoch.
    public var modified: Double
    /// Permission bits only (no file-type bits).
    public var permissions: UInt16
    public var uid: UInt32
    public var gid: UInt32
}

/// Static statistics for `statfs`.
public struct FilesystemStatistics: Sendable, Equatable {
    public var blockSize: UInt64
    public var totalBlocks: UInt64
    public var freeBlocks: UInt64
    public var totalInodes: UInt64
    public var freeInodes: UInt64
    public var maximumNameLength: UInt64
}

/// How the mount behaves. Times are in seconds.
public struct FilesystemConfiguration: Sendable {
    /// Key prefix that the mount's root shows ("" for the whole container, else ending in "/").
    public var rootPrefix: String = ""
    public var uid: UInt32 = 0
    public var gid: UInt32 = 0
    /// Bits cleared from the default modes 0777 (directories) and 0666 (files).
    public var umask: UInt16 = 0o022
    /// How long a complete directory listing answers lookups in that directory.
    public var directoryCacheSeconds: Double = 5
    /// How long a file's size and ETag are trusted before open/getattr ask the server again.
    public var attributeCacheSeconds: Double = 1
    /// Bytes fetched by one GET of sequential read-ahead.
    public var readChunkSize: Int = 8 << 20
    /// Chunks fetched ahead of a sequential reader.
    public var readAheadChunks: Int = 3
    /// Entries per listing request (the protocol allows at most 10 000).
    public var listPageSize: Int = 10_000
    /// The time shown for directories, which have none of their own (the mount's start).
    public var directoryTime: Double = 0

    public init() {}
}

/// One name in a directory, as the listing showed it.
struct DirectoryEntry: Sendable, Equatable {
    var name: String
    var kind: NodeKind
    /// The object behind a file (usually prefix + name; differs for an aliased shadowed file).
    var key: String
    var size: Int64
    var etag: String
    var modified: Double
    var contentType: String
}
