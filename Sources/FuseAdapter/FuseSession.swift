import CFuse3
import CSupervisor
import FileSystem
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A FUSE session, in one of two roles (issue 40, docs/restart-design.md):
/// - the **holder** (`init(mountpoint:options:debug:)`): mounts, detaches, and becomes the
///   supervisor, which holds /dev/fuse for the mount's life and serves nothing;
/// - a **worker's** session (`init(serving:for:options:debug:)`), made in each worker after the
///   fork: it reads and writes the holder's descriptor and serves until the mount ends.
public final class FuseSession {
    public struct MountError: Error, CustomStringConvertible {
        public var description: String
    }

    private let adapter: FuseAdapter?
    private let operations: UnsafeMutablePointer<fuse_lowlevel_ops>
    private let session: OpaquePointer
    private let mountpoint: String
    private var mounted = false
    /// In a worker: this holder's copy belongs to the supervisor (never unmounted or destroyed
    /// here), or this is the worker's own session.
    private var inWorker = false

    /// The holder: `options` are kernel/libfuse mount options (`fsname=…`, `allow_other`, …).
    public convenience init(mountpoint: String, options: [String], debug: Bool) throws(MountError) {
        try self.init(adapter: nil, mountpoint: mountpoint, options: options, debug: debug)
    }

    /// The holder of a worker the supervisor started from the installed binary (`--restart`):
    /// the mount is the supervisor's (`attachToSupervisor` took its descriptor); this process
    /// only serves it, as a forked worker does.
    public convenience init(inheritedMountpoint mountpoint: String, options: [String]) throws(MountError) {
        try self.init(adapter: nil, mountpoint: mountpoint, options: options, debug: false)
        inWorker = true
    }

    /// What `attachToSupervisor` found.
    public enum Attachment {
        /// This process was not started by a supervisor as a worker: it mounts.
        case none
        /// It was, and took over the supervisor's descriptor and shared memory.
        case attached
        /// It was, but cannot serve (a binary of another shared layout).
        case failed
    }

    /// In a process the supervisor started from the installed binary (`--restart`): takes the
    /// mount's descriptor and the supervisor's shared memory over. Call before anything else.
    public static func attachToSupervisor() -> Attachment {
        switch cssp_worker_attach() {
        case 0: return .attached
        case 1: return .none
        default: return .failed
        }
    }

    /// Whether the supervisor logs to syslog (it was detached).
    public static var supervisorUsesSyslog: Bool { cssp_worker_uses_syslog() != 0 }

    /// Set once this worker was asked to make way for the installed binary (`--restart`).
    public static var restartRequested: Bool { restarting.load(ordering: .acquiring) }
    private static let restarting = Atomic(false)

    /// Asks the supervisor to start the installed binary in place of this worker once it ends,
    /// and ends it: the session leaves its loop after answering the requests under way (the
    /// ones the kernel has queued wait for the next worker). False outside a worker.
    public static func requestRestart() -> Bool {
        guard cssp_worker_request_restart() == 0 else { return false }
        restarting.store(true, ordering: .releasing)
        kill(getpid(), SIGTERM)
        return true
    }

    /// A worker's session, serving `adapter` on what `holder` mounted. Call in the worker
    /// (after `holder.superviseWorkers` returned).
    public convenience init(serving adapter: FuseAdapter, for holder: FuseSession, options: [String], debug: Bool)
        throws(MountError)
    {
        try self.init(adapter: adapter, mountpoint: holder.mountpoint, options: options, debug: debug)
        inWorker = true
    }

    private init(adapter: FuseAdapter?, mountpoint: String, options: [String], debug: Bool) throws(MountError) {
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
            // The holder never dispatches a request: no adapter behind it.
            let userdata = adapter.map { Unmanaged.passUnretained($0).toOpaque() }
            return cssp_fuse_session_new(&args, table, userdata)
        }
        guard let created else {
            table.deallocate()
            throw MountError(description: "libfuse refused the mount options: \(options.joined(separator: ","))")
        }
        session = created
    }

    deinit {
        // A worker's copy of the holder is the supervisor's; both sessions of a worker read the
        // one descriptor, which the process's end closes.
        guard !inWorker else { return }
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

    /// Detaches from the terminal. The parent exits 0 only once the mount answers: it stats the
    /// mountpoint, which the child must serve; if the child dies first, the parent exits 32. So
    /// `mount -a`, systemd and scripts see a mount that works, or a failure. Call before any
    /// thread is started (fork copies only the calling thread).
    public func daemonize() {
        let child = fork()
        if child < 0 { return }  // Cannot fork: keep serving in the foreground.
        if child > 0 {
            var st = stat()
            let answered = stat(mountpoint, &st) == 0
            var status: Int32 = 0
            let exited = waitpid(child, &status, WNOHANG) == child
            if answered && !exited { _exit(0) }
            let message = "mount.cssp: the daemon stopped before the mount answered; run with -f to see why\n"
            _ = message.withCString { write(2, $0, strlen($0)) }
            _exit(32)
        }
        _ = setsid()
        _ = chdir("/")
        let null = open("/dev/null", O_RDWR)
        if null >= 0 {
            for fd: Int32 in 0...2 { _ = dup2(null, fd) }
            if null > 2 { close(null) }
        }
    }

    /// The holder becomes the supervisor of the mount: this process holds /dev/fuse for the
    /// mount's life, serves nothing, and forks a worker, and another when one dies. Returns
    /// only in a worker, which makes its own session (`init(serving:for:…)`) and serves with
    /// `run`; the supervisor exits with the last worker's status once the mount ends. Call once
    /// mounted (and detached), before any thread is started: a worker is a fork, which keeps
    /// only the calling thread. Nothing that holds files or locks (the spool, the block cache)
    /// may be open yet: the supervisor would hold them for ever.
    public func superviseWorkers(useSyslog: Bool) {
        _ = cssp_supervise(session, useSyslog ? 1 : 0)
        // The supervisor unmounts (at SIGTERM, SIGINT or SIGHUP); a worker never does.
        inWorker = true
        mounted = false
    }

    /// Which worker this is: 0 for the first, n for the one started after n deaths.
    public var incarnation: UInt64 { cssp_worker_incarnation() }

    /// Requests this worker read that the kernel sent again after a worker's death.
    public static var resentRequests: UInt64 { cssp_resent_requests() }

    /// Whether the kernel sends a dead worker's requests again (FUSE_HAS_RESEND).
    public static var kernelResends: Bool { cssp_kernel_resends() != 0 }

    /// The process that holds the mount: the supervisor (this one before `superviseWorkers`).
    public var holderPID: pid_t { inWorker ? pid_t(cssp_supervisor_pid()) : getpid() }

    /// Lets `filesystem` put bytes into the kernel's page cache (see `KernelCache`).
    public func installKernelCache(on filesystem: Filesystem) {
        struct SessionPointer: @unchecked Sendable {  // libfuse's notify calls are thread-safe.
            let raw: OpaquePointer
        }
        let session = SessionPointer(raw: self.session)
        filesystem.kernelCache.install(
            store: { inode, offset, bytes in
                guard let base = bytes.baseAddress else { return }
                _ = cssp_notify_store(session.raw, fuse_ino_t(inode), off_t(offset), base, bytes.count)
            },
            invalidate: { inode, pages in
                // A negative offset: only the attributes.
                _ = fuse_lowlevel_notify_inval_inode(session.raw, fuse_ino_t(inode), pages ? 0 : -1, 0)
            })
        filesystem.kernelCache.install(forgetEntry: { parent, name in
            // ENOENT (the kernel holds no such entry) is as good as done.
            // (libfuse sends the terminating NUL too.)
            _ = name.withCString { fuse_lowlevel_notify_inval_entry(session.raw, fuse_ino_t(parent), $0, name.utf8.count) }
        })
    }

    /// A worker's session: replays the kernel's INIT, asks for the dead worker's requests again
    /// (a replacement), and serves until the kernel ends the connection (unmounted). The
    /// supervisor takes the signals. Returns libfuse's status, -1 when the session could not
    /// start. The filesystem stays up: the caller drains it (`Filesystem.drain`) and shuts it down.
    public func run() -> Int32 {
        guard let adapter, inWorker else { return -1 }
        guard cssp_worker_start(session) == 0 else { return -1 }
        // SIGTERM, SIGINT, SIGHUP end the loop: the supervisor sends SIGTERM once it unmounted.
        _ = fuse_set_signal_handlers(session)
        _ = cssp_block_termination_signals(0)
        let rc = cssp_fuse_session_loop_mt(session, UInt32(adapter.configuration.maxThreads))
        _ = cssp_block_termination_signals(1)
        fuse_remove_signal_handlers(session)
        // Page-cache stores must be over before the session is destroyed.
        adapter.filesystem.kernelCache.uninstall()
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
        // 1 MiB writes instead of 128 KiB ones: a quarter of the round trips into the spool.
        // (libfuse 3.14's buffer holds 1 MiB; more kills the session, see FUSE-SWIFT-NOTES.)
        connection.pointee.max_write = 1 << 20
        connection.pointee.want |= UInt32(FUSE_CAP_ASYNC_READ)
        // readdirplus always: attributes come from the listing anyway, so sending them costs nothing.
        connection.pointee.want |= UInt32(FUSE_CAP_READDIRPLUS)
        connection.pointee.want &= ~UInt32(FUSE_CAP_READDIRPLUS_AUTO)
    }
    ops.lookup = { request, parent, name in
        let adapter = FuseAdapter.adapter(request)
        adapter.lookup(Reply(request!), parent: parent, name: FuseAdapter.decode(name!))
    }
    ops.forget = { request, inode, count in
        let adapter = FuseAdapter.adapter(request)
        adapter.count("forget")
        adapter.filesystem.forget(inode, count: count)
        Reply(request!).none()
    }
    ops.forget_multi = { request, count, forgets in
        let adapter = FuseAdapter.adapter(request)
        adapter.count("forget")
        let filesystem = adapter.filesystem
        for i in 0..<count {
            filesystem.forget(forgets![i].ino, count: forgets![i].nlookup)
        }
        Reply(request!).none()
    }
    ops.getattr = { request, inode, _ in
        FuseAdapter.adapter(request).getattr(Reply(request!), inode: inode)
    }
    ops.setattr = { request, inode, attributes, toSet, _ in
        FuseAdapter.adapter(request).setattr(Reply(request!), inode: inode, attributes: attributes!.pointee, toSet: toSet)
    }
    ops.readlink = { request, inode in FuseAdapter.adapter(request).readlink(Reply(request!), inode: inode) }
    ops.mknod = { request, parent, name, mode, _ in
        FuseAdapter.adapter(request).mknod(Reply(request!), parent: parent, name: FuseAdapter.decode(name!), mode: mode)
    }
    ops.mkdir = { request, parent, name, mode in
        FuseAdapter.adapter(request).mkdir(Reply(request!), parent: parent, name: FuseAdapter.decode(name!), mode: mode)
    }
    ops.unlink = { request, parent, name in
        FuseAdapter.adapter(request).unlink(Reply(request!), parent: parent, name: FuseAdapter.decode(name!))
    }
    ops.rmdir = { request, parent, name in
        FuseAdapter.adapter(request).rmdir(Reply(request!), parent: parent, name: FuseAdapter.decode(name!))
    }
    ops.symlink = { request, target, parent, name in
        FuseAdapter.adapter(request).symlink(
            Reply(request!), target: FuseAdapter.decode(target!), parent: parent, name: FuseAdapter.decode(name!))
    }
    ops.rename = { request, parent, name, newParent, newName, flags in
        FuseAdapter.adapter(request).rename(
            Reply(request!), parent: parent, name: FuseAdapter.decode(name!), newParent: newParent,
            newName: FuseAdapter.decode(newName!), flags: UInt32(flags))
    }
    ops.link = { request, _, _, _ in FuseAdapter.adapter(request).link(Reply(request!)) }
    ops.create = { request, parent, name, mode, info in
        FuseAdapter.adapter(request).create(
            Reply(request!), parent: parent, name: FuseAdapter.decode(name!), mode: mode, info: info!)
    }
    ops.write = { request, _, buffer, size, offset, info in
        FuseAdapter.adapter(request).write(
            Reply(request!), handle: info!.pointee.fh, offset: Int64(offset),
            bytes: UnsafeRawBufferPointer(start: buffer, count: size))
    }
    ops.open = { request, inode, info in
        FuseAdapter.adapter(request).open(Reply(request!), inode: inode, info: info!)
    }
    ops.read = { request, _, size, offset, info in
        FuseAdapter.adapter(request).read(Reply(request!), handle: info!.pointee.fh, offset: Int64(offset), size: size)
    }
    ops.flush = { request, _, info in
        FuseAdapter.adapter(request).flush(Reply(request!), handle: info!.pointee.fh, operation: "flush")
    }
    ops.fsync = { request, _, _, info in
        FuseAdapter.adapter(request).flush(Reply(request!), handle: info!.pointee.fh, operation: "fsync")
    }
    ops.release = { request, _, info in
        let adapter = FuseAdapter.adapter(request)
        adapter.count("release")
        adapter.filesystem.release(handle: info!.pointee.fh)
        Reply(request!).ok()
    }
    ops.opendir = { request, inode, info in
        FuseAdapter.adapter(request).opendir(Reply(request!), inode: inode, info: info!)
    }
    ops.readdir = { request, inode, size, offset, info in
        FuseAdapter.adapter(request).readdir(
            Reply(request!), inode: inode, handle: info!.pointee.fh, offset: Int64(offset), size: size)
    }
    ops.readdirplus = { request, inode, size, offset, info in
        FuseAdapter.adapter(request).readdirplus(
            Reply(request!), inode: inode, handle: info!.pointee.fh, offset: Int64(offset), size: size)
    }
    ops.releasedir = { request, _, info in
        let adapter = FuseAdapter.adapter(request)
        adapter.count("releasedir")
        adapter.filesystem.releasedir(handle: info!.pointee.fh)
        Reply(request!).ok()
    }
    ops.fsyncdir = { request, inode, _, _ in
        FuseAdapter.adapter(request).fsyncDirectory(Reply(request!), inode: inode)
    }
    ops.statfs = { request, _ in FuseAdapter.adapter(request).statfs(Reply(request!)) }
    return ops
}
