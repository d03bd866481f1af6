import BlockCache
import Metrics
import ObjectStore

/// Inode numbers as the kernel sees them. 1 is the root.
public typealias InodeNumber = UInt64

public enum NodeKind: Sendable, Equatable {
    case file
    case directory
    case symlink
    /// A FIFO or a socket: an empty object that only records the name, type and mode (as s3fs
    /// stores them), so that tar and rsync -a of trees holding them work.
    case fifo
    case socket

    /// A number for the kind, where it is stored packed (`PackedEntries`, the node log).
    package var code: UInt8 {
        switch self {
        case .file: 0
        case .directory: 1
        case .symlink: 2
        case .fifo: 3
        case .socket: 4
        }
    }

    /// The kind of a `code`; nil for a number no kind has.
    package init?(code: UInt8) {
        switch code {
        case 0: self = .file
        case 1: self = .directory
        case 2: self = .symlink
        case 3: self = .fifo
        case 4: self = .socket
        default: return nil
        }
    }

    /// The content type (without parameters) that marks each kind that is not a plain file.
    package static func of(baseContentType base: String) -> NodeKind {
        switch base {
        case StoredAttributes.symlinkContentType: return .symlink
        case StoredAttributes.fifoContentType: return .fifo
        case StoredAttributes.socketContentType: return .socket
        default: return .file
        }
    }

    /// The kind of an object a HEAD describes: what its content type says, else what the
    /// file-type bits of a whole `st_mode` in its metadata say (how s3fs stores a symlink, a
    /// FIFO or a socket: no content type of its own).
    package static func of(_ info: ObjectInfo) -> NodeKind {
        let kind = of(baseContentType: StoredAttributes.parse(contentType: info.contentType).base)
        guard kind == .file, let mode = info.metadata["mode"], let type = StoredAttributes.fileType(mode) else { return kind }
        switch type {
        case 0o120000: return .symlink
        case 0o010000: return .fifo
        case 0o140000: return .socket
        default: return .file
        }
    }

    /// Kinds stored as one object whose attributes a HEAD and a POST handle (not directories).
    package var isObject: Bool { self != .directory }
}

/// What `stat` shows for a node.
public struct Attributes: Sendable, Equatable {
    public var inode: InodeNumber
    public var kind: NodeKind
    public var size: Int64
    public var modified: Timestamp
    /// ctime: the last change of data or attributes made through this mount (else `modified`).
    public var changed: Timestamp
    /// atime: as set by utimensat (else `modified`); reads do not move it (noatime).
    public var accessed: Timestamp
    /// Names leading to the node: 0 once unlinked or replaced while open.
    public var links: UInt32
    /// Permission bits only (no file-type bits).
    public var permissions: UInt16
    public var uid: UInt32
    public var gid: UInt32

    package init(inode: InodeNumber, kind: NodeKind, size: Int64, modified: Timestamp, changed: Timestamp, accessed: Timestamp, links: UInt32, permissions: UInt16, uid: UInt32, gid: UInt32) {
        self.inode = inode
        self.kind = kind
        self.size = size
        self.modified = modified
        self.changed = changed
        self.accessed = accessed
        self.links = links
        self.permissions = permissions
        self.uid = uid
        self.gid = gid
    }
}

/// Static statistics for `statfs`.
public struct FilesystemStatistics: Sendable, Equatable {
    public var blockSize: UInt64
    public var totalBlocks: UInt64
    public var freeBlocks: UInt64
    public var totalInodes: UInt64
    public var freeInodes: UInt64
    public var maximumNameLength: UInt64

    package init(blockSize: UInt64, totalBlocks: UInt64, freeBlocks: UInt64, totalInodes: UInt64, freeInodes: UInt64, maximumNameLength: UInt64) {
        self.blockSize = blockSize
        self.totalBlocks = totalBlocks
        self.freeBlocks = freeBlocks
        self.totalInodes = totalInodes
        self.freeInodes = freeInodes
        self.maximumNameLength = maximumNameLength
    }
}

/// Who is asking (from the FUSE request), for the owner of new files.
public struct Caller: Sendable, Equatable {
    public var uid: UInt32
    public var gid: UInt32
    public init(uid: UInt32, gid: UInt32) {
        self.uid = uid
        self.gid = gid
    }
}

/// Changes requested by `setattr`.
public struct AttributeChanges: Sendable, Equatable {
    public var mode: UInt16?
    public var uid: UInt32?
    public var gid: UInt32?
    public var size: Int64?
    public var modified: Timestamp?
    public var accessed: Timestamp?
    public init(
        mode: UInt16? = nil, uid: UInt32? = nil, gid: UInt32? = nil, size: Int64? = nil, modified: Timestamp? = nil,
        accessed: Timestamp? = nil
    ) {
        self.accessed = accessed
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.size = size
        self.modified = modified
    }
}

/// Where the attributes of an object other tools wrote come from: a file whose content type
/// lacks csspfs's `cssp-mtime` and whose mtime, mode and owner are `X-Object-Meta-*` headers
/// that no listing shows (issue 38). Either way, the attributes the mount first reports for a
/// version (ETag) of such an object are the ones it keeps reporting for that version.
public enum ForeignAttributes: String, Sendable {
    /// The headers, from a HEAD (or the metadata index) before the first report: the real mtime
    /// rsync and make need, a HEAD per object the first time.
    case head
    /// The listing's size and last-modified time (to the second), the default mode and owner:
    /// no HEAD, not the file's own mtime.
    case listing
}

/// How the mount behaves. Times are in seconds.
public struct FilesystemConfiguration: Sendable {
    /// Key prefix that the mount's root shows ("" for the whole container, else ending in "/").
    public var rootPrefix: String = ""
    /// Owner shown for objects without stored owner (the mounting user).
    public var uid: UInt32 = 0
    public var gid: UInt32 = 0
    /// When set (`-o uid=`/`gid=`), every node shows this owner, whatever is stored.
    public var forcedUID: UInt32? = nil
    public var forcedGID: UInt32? = nil
    /// Bits cleared from the default modes 0777 (directories) and 0666 (files).
    public var umask: UInt16 = 0o022
    public var readOnly = false
    /// How long a complete directory listing answers lookups in that directory.
    public var directoryCacheSeconds: Double = 5
    /// How long a file's size and ETag are trusted before open/getattr ask the server again.
    public var attributeCacheSeconds: Double = 1
    /// At most this many bytes are fetched by one GET of sequential read-ahead.
    public var readFetchSize: Int = 8 << 20
    /// The aligned piece a random read fetches around its block when the file fits the cache.
    public var randomFetchSize: Int = 4 << 20
    /// The largest read-ahead window of a sequential reader, in bytes (0: no read-ahead).
    public var readAheadWindow: Int = 32 << 20
    /// Bytes of fetched data all readers together hold in memory; read-ahead stops at it.
    public var memoryBudget = MemoryBudget(limit: 64 << 20)
    /// What the mount counts (`mount.cssp --stats`).
    public var metrics = MountMetrics()
    /// Where fetched blocks are kept (nil: not kept beyond the open handle).
    public var blockCache: BlockCache? = nil
    /// Names this mount's store in the block cache (URL and container), so that mounts of
    /// different containers can share one cache.
    public var cacheIdentity: String = ""
    /// Entries per listing request (the protocol allows at most 10 000).
    public var listPageSize: Int = 10_000
    /// The time shown for directories, which have none of their own (the mount's start).
    public var directoryTime = Timestamp.zero
    /// Where spool files of open-for-write files live (created if missing).
    public var spoolDirectory: String = "/tmp/csspfs-spool"
    /// Files larger than this are uploaded as a multipart (DLO) upload.
    public var multipartThreshold: Int64 = 64 << 20
    public var partSize: Int64 = 32 << 20
    /// Listed entries HEADed in the background per listing for what listings lack (0 = none;
    /// also no HEADs ahead of a program's lookups of foreign files).
    public var metadataPrefetchLimit: Int = 10_000
    /// Where the attributes of other tools' objects come from (`foreign_attrs`).
    public var foreignAttributes: ForeignAttributes = .head
    /// What HEADs said about other tools' objects, kept across mounts (nil: not kept).
    public var metadataIndex: MetadataIndex? = nil
    /// Listings of subdirectories fetched at once ahead of a walk (`list_ahead`; 0: none).
    public var listAhead: Int = 8
    /// Listings ahead running or fetched and not used yet, at most (`ListingsAhead`).
    public var listAheadWindow: Int = 256
    /// A walk is evident (`WalkListing`) once this many subdirectories of one
    /// directory were read from listings ahead and at least `walkListingMinimum` more wait.
    public var walkListingAfter: Int = 3
    public var walkListingMinimum: Int = 16
    /// A walk listing runs in up to this many lanes at once, each over a share of the
    /// subdirectories (`WalkListing`, subtlety 6).
    public var walkLanes: Int = 2
    /// At most this many nodes (names the kernel holds) and, apart, this many names in
    /// remembered listings (`meta_max_entries`; 0: no bound). See `Filesystem+Bound`.
    public var maximumEntries: Int = 250_000
    /// `excl_create=server`: an exclusive create stores its empty file with If-None-Match before
    /// the open returns (issue 22); false: the name is checked by this mount only.
    public var serverExclusiveCreates = false
    /// `poll_s`: seconds between the polls of `Poller` once `startPolling` is called;
    /// 0: none (tests call `pollOnce` themselves).
    public var pollSeconds: Double = 0
    /// Where the numbers the kernel holds are recorded for a successor (issue 40); nil: nowhere.
    public var nodeLog: (any NodeLog)? = nil
    /// The numbers a dead worker left the kernel holding, which this one takes over.
    public var adoptedNodes: [AdoptedNode] = []
    /// Where the file handles the kernel holds are recorded for a successor; nil: nowhere.
    public var handleLog: (any HandleLog)? = nil
    /// The handles open for reading a dead worker left the kernel holding, by number.
    public var adoptedHandles: [UInt64: AdoptedHandle] = [:]
    /// Parts uploaded at once.
    public var uploadConcurrency: Int = 4
    /// Threads of the background pool (read-ahead, early parts, retries, background HEADs).
    public var backgroundThreads: Int = 32
    /// Seconds a chmod, chown or utimes of a closed file waits for a rename or upload to carry it
    /// before it is POSTed on its own (0: POSTed at once). See `Filesystem+Attributes`.
    public var attributeWriteDelay: Double = 1
    /// Write-back (`-o writeback`): a close journals the file's bytes on the local disk and
    /// returns; a background queue stores them (docs/writeback-design.md). fsync still waits.
    public var writeBack = false
    /// Seconds a closed file waits in the write-back queue before its upload starts, so that a
    /// rename right after the close (rsync's temporary name) costs no request.
    public var writeBackDelay: Double = 1
    /// The most bytes of files owed (queued or failed) before a write-back close waits for room
    /// (`writeback_max_mb`; the mount's default is a quarter of the free space of `cache_dir`,
    /// at least 256 MiB).
    public var writeBackMaxBytes: Int64 = 1 << 30
    /// Seconds between retries of an upload that failed at close (doubling, capped at a minute).
    public var pendingRetrySeconds: Double = 2
    /// The clock cache ages are measured on, in seconds (nil: the monotonic clock). Tests set it
    /// to step over `dir_timeout` and `attr_timeout` without waiting.
    public var clock: (@Sendable () -> Double)? = nil

    public init() {}
}

/// One name in a directory, as the listing showed it.
package struct DirectoryEntry: Sendable, Equatable {
    package var name: String
    package var kind: NodeKind
    /// The object behind a file (usually prefix + name; differs for an aliased shadowed file);
    /// for a directory its prefix, ending in "/".
    package var key: String
    package var size: Int64
    package var etag: String
    package var lastModified: Timestamp
    package var contentType: String
    /// `contentType` parsed, when whoever made the entry had the parts at hand (a packed
    /// listing stores them; parsing each entry again took a fifth of the daemon's time in a
    /// walk). Not part of equality.
    package var knownParse: (base: String, attributes: StoredAttributes)? = nil

    package init(
        name: String, kind: NodeKind, key: String, size: Int64, etag: String, lastModified: Timestamp,
        contentType: String, knownParse: (base: String, attributes: StoredAttributes)? = nil
    ) {
        self.name = name
        self.kind = kind
        self.key = key
        self.size = size
        self.etag = etag
        self.lastModified = lastModified
        self.contentType = contentType
        self.knownParse = knownParse
    }

    /// `StoredAttributes.parse(contentType:)` of the entry's content type.
    package var parsedContentType: (base: String, attributes: StoredAttributes) {
        knownParse ?? StoredAttributes.parse(contentType: contentType)
    }

    package static func == (a: DirectoryEntry, b: DirectoryEntry) -> Bool {
        // (Names and keys by their bytes: two spellings of "é" are two entries.)
        a.name.isSameKey(as: b.name) && a.kind == b.kind && a.key.isSameKey(as: b.key) && a.size == b.size && a.etag == b.etag
            && a.lastModified == b.lastModified && a.contentType == b.contentType
    }
}

extension DirectoryEntry {
    /// A listed object whose listing shows no content type (S3): a file, a symlink, a FIFO or a
    /// socket, which only a HEAD tells.
    package var kindUnknown: Bool { kind == .file && contentType.isEmpty }

    /// The entry a HEAD's answer describes, as a listing would show it.
    package init(name: String, info: ObjectInfo) {
        self.init(
            name: name, kind: NodeKind.of(info), key: info.key,
            size: info.size, etag: info.etag, lastModified: Timestamp(info.lastModified), contentType: info.contentType)
    }
}

/// A file being written here, as the namespace room sees it: its spool describes the file (size,
/// attributes not stored yet), not the store. The files room's `SpoolFile` is one.
package protocol Spooled: AnyObject, Sendable {
    var size: Int64 { get }
}
