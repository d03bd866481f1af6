import CFuse3
import FileSystem
import Logging
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The obligation to answer one FUSE request exactly once. Each answer consumes the token, so a
/// second answer does not compile; a token dropped unanswered answers EIO from its deinit.
struct Reply: ~Copyable {
    let request: fuse_req_t

    init(_ request: fuse_req_t) { self.request = request }

    deinit {
        fuse_reply_err(request, EIO)
    }

    consuming func error(_ errno: Errno) {
        fuse_reply_err(request, errno.rawValue)
        discard self
    }

    consuming func ok() {
        fuse_reply_err(request, 0)
        discard self
    }

    consuming func none() {
        fuse_reply_none(request)
        discard self
    }

    consuming func entry(_ attributes: Attributes, entryTimeout: Double, attributeTimeout: Double) {
        var entry = fuse_entry_param()
        entry.ino = fuse_ino_t(attributes.inode)
        entry.generation = 0
        entry.attr = Reply.stat(attributes)
        entry.attr_timeout = attributeTimeout
        entry.entry_timeout = entryTimeout
        fuse_reply_entry(request, &entry)
        discard self
    }

    /// ENOENT that the kernel may cache for `timeout` seconds (an entry with inode 0).
    consuming func negativeEntry(timeout: Double) {
        var entry = fuse_entry_param()
        entry.ino = 0
        entry.entry_timeout = timeout
        fuse_reply_entry(request, &entry)
        discard self
    }

    consuming func attributes(_ attributes: Attributes, timeout: Double) {
        var st = Reply.stat(attributes)
        fuse_reply_attr(request, &st, timeout)
        discard self
    }

    consuming func open(handle: UInt64, keepCache: Bool, info: UnsafeMutablePointer<fuse_file_info>) {
        info.pointee.fh = handle
        info.pointee.keep_cache = keepCache ? 1 : 0
        fuse_reply_open(request, info)
        discard self
    }

    consuming func create(_ attributes: Attributes, handle: UInt64, timeouts: (entry: Double, attribute: Double),
        info: UnsafeMutablePointer<fuse_file_info>)
    {
        var entry = fuse_entry_param()
        entry.ino = fuse_ino_t(attributes.inode)
        entry.attr = Reply.stat(attributes)
        entry.attr_timeout = timeouts.attribute
        entry.entry_timeout = timeouts.entry
        info.pointee.fh = handle
        fuse_reply_create(request, &entry, info)
        discard self
    }

    consuming func readlink(_ target: String) {
        fuse_reply_readlink(request, target)
        discard self
    }

    consuming func written(_ count: Int) {
        fuse_reply_write(request, count)
        discard self
    }

    consuming func buffer(_ bytes: UnsafeRawBufferPointer) {
        fuse_reply_buf(request, bytes.baseAddress?.assumingMemoryBound(to: CChar.self), bytes.count)
        discard self
    }

    consuming func statfs(_ s: FilesystemStatistics) {
        var st = statvfs()
        st.f_bsize = UInt(s.blockSize)
        st.f_frsize = UInt(s.blockSize)
        st.f_blocks = fsblkcnt_t(s.totalBlocks)
        st.f_bfree = fsblkcnt_t(s.freeBlocks)
        st.f_bavail = fsblkcnt_t(s.freeBlocks)
        st.f_files = fsfilcnt_t(s.totalInodes)
        st.f_ffree = fsfilcnt_t(s.freeInodes)
        st.f_favail = fsfilcnt_t(s.freeInodes)
        st.f_namemax = UInt(s.maximumNameLength)
        fuse_reply_statfs(request, &st)
        discard self
    }

    static func fileType(_ kind: NodeKind) -> mode_t {
        switch kind {
        case .directory: return S_IFDIR
        case .file: return S_IFREG
        case .symlink: return S_IFLNK
        case .fifo: return S_IFIFO
        case .socket: return S_IFSOCK
        }
    }

    static func stat(_ a: Attributes) -> Glibc.stat {
        var st = Glibc.stat()
        st.st_ino = ino_t(a.inode)
        st.st_mode = fileType(a.kind) | mode_t(a.permissions)
        st.st_nlink = nlink_t(a.links)
        st.st_uid = a.uid
        st.st_gid = a.gid
        st.st_size = off_t(a.size)
        st.st_blksize = 1 << 20
        st.st_blocks = blkcnt_t((a.size + 511) / 512)
        func spec(_ t: Timestamp) -> timespec { timespec(tv_sec: Int(t.seconds), tv_nsec: Int(t.nanoseconds)) }
        st.st_mtim = spec(a.modified)
        st.st_ctim = spec(a.changed)
        st.st_atim = spec(a.accessed)
        return st
    }
}
