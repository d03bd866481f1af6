import CFuse3
import FileSystem
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// A mounted FUSE session: mount, optionally detach, serve until unmounted or signalled.
public final class FuseSession {
    public struct MountError: Error, CustomStringConvertible {
        public var description: String
    }

    private let adapter: FuseAdapter
    private let operations: UnsafeMutablePointer<fuse_lowlevel_ops>
    private let session: OpaquePointer
    private let mountpoint: String
    private var mounted = false

    /// Creates the session; `options` are kernel/libfuse mount options (`fsname=…`, `allow_other`, …).
    public init(adapter: FuseAdapter, mountpoint: String, options: [String], debug: Bool) throws(MountError) {
        self.adapter = adapter
        self.mountpoint = mountpoint
        let table = UnsafeMutablePointer<fuse_lowlevel_ops>.allocate(capacity: 1)
        table.initialize(to: makeOperations())
        operations = table
        var argv = ["mount.cssp"]
        if !options.isEmpty { argv += ["-o", options.joined(separator: ",")] }
        if debug { argv.append("-d") }
        var cStrings = argv.map { strdup($0) }
        defer { cStrings.forEach { free($0) } }
        let created: OpaquePointer? = cStrings.withUnsafeMutableBufferPointer { buffer in
            var args = fuse_args(argc: Int32(buffer.count), argv: buffer.baseAddress, allocated: 0)
            defer { fuse_opt_free_args(&args) }
            let userdata = Unmanaged.passUnretained(adapter).toOpaque()
            return cssp_fuse_session_new(&args, table, userdata)
        }
        guard let created else {
            table.deallocate()
            throw MountError(description: "libfuse refused the mount options: \(options.joined(separator: ","))")
        }
        session = created
    }

    deinit {
        if mounted { fuse_session_unmount(session) }
        fuse_session_destroy(session)
        operations.deallocate()
    }

    /// Mounts on the mountpoint. Errors are reported by libfuse on stderr as well.
    public func mount() throws(MountError) {
        guard fuse_session_mount(session, mountpoint) == 0 else {
            throw MountError(description: "cannot mount on \(mountpoint) (is /dev/fuse available and fusermount3 installed?)")
        }
        mounted = true
    }

    /// Detaches from the terminal: the parent exits 0 once the child is ready.
    public func daemonize() {
        _ = fuse_daemonize(0)
    }

    /// Serves requests until unmounted or SIGINT/SIGTERM/SIGHUP; then unmounts. Returns libfuse's status.
    public func run() -> Int32 {
        _ = fuse_set_signal_handlers(session)
        _ = cssp_block_termination_signals(0)
        let rc = cssp_fuse_session_loop_mt(session, UInt32(adapter.configuration.maxThreads))
        _ = cssp_block_termination_signals(1)
        fuse_remove_signal_handlers(session)
        if mounted {
            fuse_session_unmount(session)
            mounted = false
        }
        return rc
    }
}

/// The low-level operation table. Built in a function (see FuseAdapter's notes).
private func makeOperations() -> fuse_lowlevel_ops {
    var ops = fuse_lowlevel_ops()
    ops.`init` = { userdata, connection in
        guard let connection else { return }
        // Kernel read-ahead hands us larger sequential reads; our own read-ahead does the rest.
        connection.pointee.max_readahead = 1 << 20
        connection.pointee.want |= UInt32(FUSE_CAP_ASYNC_READ)
        connection.pointee.want &= ~UInt32(FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO)
    }
    ops.lookup = { request, parent, name in
        let adapter = FuseAdapter.adapter(request)
        adapter.lookup(Reply(request!), parent: parent, name: String(cString: name!))
    }
    ops.forget = { request, inode, count in
        FuseAdapter.adapter(request).filesystem.forget(inode, count: count)
        Reply(request!).none()
    }
    ops.forget_multi = { request, count, forgets in
        let filesystem = FuseAdapter.adapter(request).filesystem
        for i in 0..<count {
            filesystem.forget(forgets![i].ino, count: forgets![i].nlookup)
        }
        Reply(request!).none()
    }
    ops.getattr = { request, inode, _ in
        FuseAdapter.adapter(request).getattr(Reply(request!), inode: inode)
    }
    ops.setattr = { request, _, _, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "setattr") }
    ops.mknod = { request, _, _, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "mknod") }
    ops.mkdir = { request, _, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "mkdir") }
    ops.unlink = { request, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "unlink") }
    ops.rmdir = { request, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "rmdir") }
    ops.symlink = { request, _, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "symlink") }
    ops.rename = { request, _, _, _, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "rename") }
    ops.link = { request, _, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "link") }
    ops.create = { request, _, _, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "create") }
    ops.write = { request, _, _, _, _, _ in FuseAdapter.adapter(request).readOnly(Reply(request!), "write") }
    ops.open = { request, inode, info in
        FuseAdapter.adapter(request).open(Reply(request!), inode: inode, info: info!)
    }
    ops.read = { request, _, size, offset, info in
        FuseAdapter.adapter(request).read(Reply(request!), handle: info!.pointee.fh, offset: Int64(offset), size: size)
    }
    ops.flush = { request, _, _ in Reply(request!).ok() }
    ops.fsync = { request, _, _, _ in Reply(request!).ok() }
    ops.release = { request, _, info in
        FuseAdapter.adapter(request).filesystem.release(handle: info!.pointee.fh)
        Reply(request!).ok()
    }
    ops.opendir = { request, inode, info in
        FuseAdapter.adapter(request).opendir(Reply(request!), inode: inode, info: info!)
    }
    ops.readdir = { request, inode, size, offset, info in
        FuseAdapter.adapter(request).readdir(
            Reply(request!), inode: inode, handle: info!.pointee.fh, offset: Int64(offset), size: size)
    }
    ops.releasedir = { request, _, info in
        FuseAdapter.adapter(request).filesystem.releasedir(handle: info!.pointee.fh)
        Reply(request!).ok()
    }
    ops.fsyncdir = { request, _, _, _ in Reply(request!).ok() }
    ops.statfs = { request, _ in FuseAdapter.adapter(request).statfs(Reply(request!)) }
    return ops
}
