import CFuse3
import CSupervisor
import FileSystem
import Logging
import Metrics
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Options of the kernel interface.
public struct FuseConfiguration: Sendable {
    public var entryTimeout: Double = 1
    public var attributeTimeout: Double = 1
    public var negativeTimeout: Double = 1
    public var maxThreads: Int = 16
    /// Log every operation (the `-d` flag).
    public var traceOperations = false
    /// Fault point (tests of issue 40): the worker kills itself (SIGKILL) once an operation of
    /// this name is done and before it is answered, so that the kernel sends it again to the
    /// worker that replaces this one.
    public var dieBeforeAnswering: String? = nil

    public init() {}
}

/// The only module that sees libfuse. It converts arguments, calls `Filesystem`, maps `FSError`
/// to errno (in `Errno.forFilesystemError`) and replies exactly once (`Reply`).
///
/// Subtleties:
/// 1. Callbacks run on libfuse's worker pthreads, not Swift tasks: no await, no task locals.
/// 2. Nothing may throw across the C boundary: each callback catches everything.
/// 3. The operation table is built inside a function, not top-level code: closures made in
///    main.swift are bound to the main actor and crash when a worker thread calls them.
public final class FuseAdapter: Sendable {
    public let filesystem: Filesystem
    public let configuration: FuseConfiguration
    let logger: Logger
    let metrics: MountMetrics
    /// The counter of each operation, looked up without a lock (the table never changes).
    private let operationCounters: [String: Counter]

    static let operationNames = [
        "lookup", "forget", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink", "rmdir", "symlink",
        "rename", "link", "create", "write", "open", "read", "flush", "fsync", "release", "opendir", "readdir",
        "readdirplus", "releasedir", "fsyncdir", "statfs",
    ]

    public init(filesystem: Filesystem, configuration: FuseConfiguration, logger: Logger, metrics: MountMetrics = MountMetrics()) {
        self.filesystem = filesystem
        self.configuration = configuration
        self.logger = logger
        self.metrics = metrics
        var counters: [String: Counter] = [:]
        for name in Self.operationNames { counters[name] = metrics.fuseOperations.labels(name) }
        operationCounters = counters
    }

    /// Counts one operation the kernel asked for (`cssp_fuse_ops_total`).
    func count(_ operation: String) {
        (operationCounters[operation] ?? metrics.fuseOperations.labels(operation)).add()
    }

    static func adapter(_ request: fuse_req_t?) -> FuseAdapter {
        Unmanaged<FuseAdapter>.fromOpaque(fuse_req_userdata(request)!).takeUnretainedValue()
    }

    /// Runs `body`, which answers by taking the reply out of its argument. If it throws before
    /// answering, the error is answered here with its errno (and logged when unexpected).
    func serve(
        _ operation: String, _ detail: @autoclosure () -> String, _ reply: consuming Reply,
        _ body: (inout Reply?) throws(FSError) -> Void
    ) {
        // -d, -o debug, or debug turned on at run time (SIGUSR1): every operation.
        if configuration.traceOperations || logger.logLevel <= .debug { logger.debug("\(operation) \(detail())") }
        count(operation)
        var pending: Reply? = consume reply
        do throws(FSError) {
            try body(&pending)
        } catch {
            let errno = Errno.forFilesystemError(error.code)
            metrics.errors.labels(operation, error.code.errnoName).add()
            switch error.code {
            case .notFound, .notADirectory, .isADirectory, .readOnly, .notEmpty, .nameTooLong, .invalidArgument,
                .notSupported, .notPermitted, .exists, .illegalByteSequence:
                if configuration.traceOperations || logger.logLevel <= .debug {
                    logger.debug("\(operation) -> \(errno): \(error.message)")
                }
            case .permissionDenied, .stale, .badHandle, .ioError, .noSpace:
                let fields = error.logMetadata(operation: operation, rootPrefix: filesystem.configuration.rootPrefix)
                logger.error("\(operation) failed: \(error.message)", metadata: fields.mapValues { .string($0) })
            }
            pending.take()?.error(errno)
        }
        // A body that returned without answering leaves the token to answer EIO from its deinit.
    }

    // MARK: A request sent again

    /// Whether the request being served is one the kernel sent again (FUSE_NOTIFY_RESEND): a
    /// dead worker had read it, and may have done it before it died. Read at the start of the
    /// callback, on its thread.
    static var isResent: Bool { cssp_request_is_resent() != 0 }

    /// The fault point `FuseConfiguration.dieBeforeAnswering`.
    func faultPoint(_ operation: String) {
        if configuration.dieBeforeAnswering == operation { kill(getpid(), SIGKILL) }
    }

    /// A resent request to make `name` in `parent` (mkdir, mknod, symlink, create) found it made:
    /// the dead worker made it before it died if it is of the `kind` asked for, and the request
    /// is answered with it, as the first answer would have been (docs/restart-design.md, "A
    /// request delivered twice"). Else `error` stands.
    func madeBefore(_ kind: NodeKind, _ operation: String, parent: InodeNumber, name: String, else error: FSError)
        throws(FSError) -> Attributes
    {
        let found = try filesystem.lookup(parent: parent, name: name)
        guard found.kind == kind else {
            filesystem.forget(found.inode, count: 1)
            throw error
        }
        doneBefore(operation, "\(parent)/\(name)")
        return found
    }

    /// Counts and logs a resent request whose work its dead worker had done.
    func doneBefore(_ operation: String, _ detail: String) {
        metrics.resentDone.add()
        logger.notice("\(operation) \(detail), sent again after its worker died, was done by that worker: answered as done")
    }

    // MARK: Names

    /// A name the kernel passed, nil when its bytes are not UTF-8 (object keys are UTF-8: such a
    /// name is refused, never decoded with replacement characters into another name's key).
    static func decode(_ name: UnsafePointer<CChar>) -> String? {
        String(validatingCString: name)
    }

    /// A name that must exist: one that is not UTF-8 cannot.
    static func existing(_ name: String?) throws(FSError) -> String {
        guard let name else { throw FSError(.notFound, "a name that is not UTF-8 names no object") }
        return name
    }

    /// A name to create (or a symlink target): one that is not UTF-8 is EILSEQ.
    static func new(_ name: String?) throws(FSError) -> String {
        guard let name else {
            throw FSError(.illegalByteSequence, "the name is not UTF-8: object keys are UTF-8 (convert it, e.g. convmv)")
        }
        return name
    }

    static func shown(_ name: String?) -> String { name ?? "<not UTF-8>" }

    // MARK: Operations

    func lookup(_ reply: consuming Reply, parent: InodeNumber, name raw: String?) {
        let negative = configuration.negativeTimeout
        serve("lookup", "\(parent)/\(Self.shown(raw))", reply) { (r: inout Reply?) throws(FSError) in
            do throws(FSError) {
                let name = try Self.existing(raw)
                let attributes = try filesystem.lookup(parent: parent, name: name)
                r.take()!.entry(
                    attributes, entryTimeout: configuration.entryTimeout,
                    attributeTimeout: configuration.attributeTimeout)
            } catch where error.code == .notFound && negative > 0 {
                r.take()!.negativeEntry(timeout: negative)
            }
        }
    }

    func getattr(_ reply: consuming Reply, inode: InodeNumber) {
        serve("getattr", "\(inode)", reply) { (r: inout Reply?) throws(FSError) in
            let attributes = try filesystem.getattr(inode)
            r.take()!.attributes(attributes, timeout: configuration.attributeTimeout)
        }
    }

    func open(_ reply: consuming Reply, inode: InodeNumber, info: UnsafeMutablePointer<fuse_file_info>) {
        let flags = info.pointee.flags
        let writable = (flags & O_ACCMODE) != O_RDONLY
        serve("open", "\(inode) flags=\(flags)", reply) { (r: inout Reply?) throws(FSError) in
            let result = try filesystem.open(inode, writable: writable, truncate: (flags & O_TRUNC) != 0)
            r.take()!.open(handle: result.handle, keepCache: result.keepCache, info: info)
        }
    }

    func read(_ reply: consuming Reply, handle: UInt64, offset: Int64, size: Int) {
        serve("read", "fh=\(handle) off=\(offset) size=\(size)", reply) { (r: inout Reply?) throws(FSError) in
            try filesystem.read(handle: handle, offset: offset, length: size) { bytes in
                r.take()?.buffer(bytes)
            }
        }
    }

    func opendir(_ reply: consuming Reply, inode: InodeNumber, info: UnsafeMutablePointer<fuse_file_info>) {
        serve("opendir", "\(inode)", reply) { (r: inout Reply?) throws(FSError) in
            let handle = try filesystem.opendir(inode)
            r.take()!.open(handle: handle, keepCache: false, info: info)
        }
    }

    func readdir(_ reply: consuming Reply, inode: InodeNumber, handle: UInt64, offset: Int64, size: Int) {
        fillDirectory("readdir", reply, inode: inode, offset: offset, size: size) { (request, buffer, used) throws(FSError) in
            try filesystem.readdir(inode, handle: handle, offset: offset) { name, kind, entryInode, next in
                var st = Glibc.stat()
                st.st_ino = ino_t(entryInode)
                st.st_mode = Reply.fileType(kind)
                let needed = fuse_add_direntry(request, buffer.baseAddress! + used, buffer.count - used, name, &st, off_t(next))
                guard used + needed <= buffer.count else { return false }
                used += needed
                return true
            }
        }
    }

    /// readdir with attributes: `ls -l` then needs no lookup or getattr per entry.
    func readdirplus(_ reply: consuming Reply, inode: InodeNumber, handle: UInt64, offset: Int64, size: Int) {
        fillDirectory("readdirplus", reply, inode: inode, offset: offset, size: size) { (request, buffer, used) throws(FSError) in
            try filesystem.readdirplus(inode, handle: handle, offset: offset) { name, kind, entryInode, attributes, next in
                var entry = fuse_entry_param()
                if let attributes {
                    entry.ino = fuse_ino_t(attributes.inode)
                    entry.attr = Reply.stat(attributes)
                    entry.attr_timeout = configuration.attributeTimeout
                    entry.entry_timeout = configuration.entryTimeout
                } else {
                    // Inode 0: a name only; the kernel looks it up when it needs more.
                    entry.attr.st_ino = ino_t(entryInode)
                    entry.attr.st_mode = Reply.fileType(kind)
                }
                let needed = fuse_add_direntry_plus(
                    request, buffer.baseAddress! + used, buffer.count - used, name, &entry, off_t(next))
                guard used + needed <= buffer.count else { return false }
                used += needed
                return true
            }
        }
    }

    /// Fills one reply buffer of directory entries with `body(request, buffer, &used)`.
    private func fillDirectory(
        _ operation: String, _ reply: consuming Reply, inode: InodeNumber, offset: Int64, size: Int,
        _ body: (fuse_req_t, UnsafeMutableRawBufferPointer, inout Int) throws(FSError) -> Void
    ) {
        serve(operation, "\(inode) off=\(offset)", reply) { (r: inout Reply?) throws(FSError) in
            guard let request = r?.request else { return }
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 8)
            defer { buffer.deallocate() }
            var used = 0
            do throws(FSError) {
                try body(request, buffer, &used)
            } catch {
                // readdir reports an error only if no entry was added yet; else the partial buffer.
                if used == 0 { throw error }
                logger.error("\(operation) of inode \(inode) stopped early: \(error.message)")
            }
            r.take()!.buffer(UnsafeRawBufferPointer(rebasing: buffer[0..<used]))
        }
    }

    var timeouts: (entry: Double, attribute: Double) { (configuration.entryTimeout, configuration.attributeTimeout) }

    static func caller(_ request: fuse_req_t) -> Caller {
        let context = fuse_req_ctx(request)!.pointee
        return Caller(uid: context.uid, gid: context.gid)
    }

    func write(_ reply: consuming Reply, handle: UInt64, offset: Int64, bytes: UnsafeRawBufferPointer) {
        serve("write", "fh=\(handle) off=\(offset) size=\(bytes.count)", reply) { (r: inout Reply?) throws(FSError) in
            try filesystem.write(handle: handle, offset: offset, bytes: bytes)
            faultPoint("write")
            r.take()!.written(bytes.count)
        }
    }

    func flush(_ reply: consuming Reply, handle: UInt64, operation: String) {
        serve(operation, "fh=\(handle)", reply) { (r: inout Reply?) throws(FSError) in
            if operation == "fsync" { try filesystem.fsync(handle: handle) } else { try filesystem.flush(handle: handle) }
            r.take()!.ok()
        }
    }

    /// fsync of a directory: the deletes a write-back mount owes are stored first.
    func fsyncDirectory(_ reply: consuming Reply, inode: InodeNumber) {
        serve("fsyncdir", "\(inode)", reply) { (r: inout Reply?) throws(FSError) in
            try filesystem.fsyncDirectory()
            r.take()!.ok()
        }
    }

    func create(_ reply: consuming Reply, parent: InodeNumber, name raw: String?, mode: mode_t,
        info: UnsafeMutablePointer<fuse_file_info>)
    {
        let caller = Self.caller(reply.request)
        let resent = Self.isResent
        serve("create", "\(parent)/\(Self.shown(raw))", reply) { (r: inout Reply?) throws(FSError) in
            let name = try Self.new(raw)
            let attributes: Attributes
            let opened: Filesystem.OpenResult
            do throws(FSError) {
                (attributes, opened) = try filesystem.create(
                    parent: parent, name: name, mode: UInt16(truncatingIfNeeded: mode), caller: caller,
                    exclusive: info.pointee.flags & O_EXCL != 0)
            } catch where resent && error.code == .exists {
                attributes = try madeBefore(.file, "create", parent: parent, name: name, else: error)
                opened = try filesystem.open(attributes.inode, writable: info.pointee.flags & O_ACCMODE != O_RDONLY, truncate: false)
            }
            faultPoint("create")
            r.take()!.create(attributes, handle: opened.handle, timeouts: timeouts, info: info)
        }
    }

    func mknod(_ reply: consuming Reply, parent: InodeNumber, name raw: String?, mode: mode_t) {
        let caller = Self.caller(reply.request)
        let resent = Self.isResent
        serve("mknod", "\(parent)/\(Self.shown(raw))", reply) { (r: inout Reply?) throws(FSError) in
            let name = try Self.new(raw)
            let kind: NodeKind?
            switch mode & S_IFMT {
            case 0, S_IFREG: kind = .file
            case S_IFIFO: kind = .fifo
            case S_IFSOCK: kind = .socket
            default: kind = nil  // devices: EPERM
            }
            let attributes: Attributes
            do throws(FSError) {
                attributes = try filesystem.mknod(
                    parent: parent, name: name, mode: UInt16(truncatingIfNeeded: mode & 0o7777), kind: kind, caller: caller)
            } catch where resent && error.code == .exists && kind != nil {
                attributes = try madeBefore(kind!, "mknod", parent: parent, name: name, else: error)
            }
            faultPoint("mknod")
            r.take()!.entry(attributes, entryTimeout: timeouts.entry, attributeTimeout: timeouts.attribute)
        }
    }

    func mkdir(_ reply: consuming Reply, parent: InodeNumber, name raw: String?, mode: mode_t) {
        let caller = Self.caller(reply.request)
        let resent = Self.isResent
        serve("mkdir", "\(parent)/\(Self.shown(raw))", reply) { (r: inout Reply?) throws(FSError) in
            let name = try Self.new(raw)
            let attributes: Attributes
            do throws(FSError) {
                attributes = try filesystem.mkdir(parent: parent, name: name, mode: UInt16(truncatingIfNeeded: mode), caller: caller)
            } catch where resent && error.code == .exists {
                attributes = try madeBefore(.directory, "mkdir", parent: parent, name: name, else: error)
            }
            faultPoint("mkdir")
            r.take()!.entry(attributes, entryTimeout: timeouts.entry, attributeTimeout: timeouts.attribute)
        }
    }

    func symlink(_ reply: consuming Reply, target rawTarget: String?, parent: InodeNumber, name raw: String?) {
        let caller = Self.caller(reply.request)
        let resent = Self.isResent
        serve("symlink", "\(parent)/\(Self.shown(raw))", reply) { (r: inout Reply?) throws(FSError) in
            let name = try Self.new(raw)
            let target = try Self.new(rawTarget)
            let attributes: Attributes
            do throws(FSError) {
                attributes = try filesystem.symlink(parent: parent, name: name, target: target, caller: caller)
            } catch where resent && error.code == .exists {
                attributes = try madeBefore(.symlink, "symlink", parent: parent, name: name, else: error)
            }
            faultPoint("symlink")
            r.take()!.entry(attributes, entryTimeout: timeouts.entry, attributeTimeout: timeouts.attribute)
        }
    }

    func readlink(_ reply: consuming Reply, inode: InodeNumber) {
        serve("readlink", "\(inode)", reply) { (r: inout Reply?) throws(FSError) in
            r.take()!.readlink(try filesystem.readlink(inode))
        }
    }

    func unlink(_ reply: consuming Reply, parent: InodeNumber, name raw: String?) {
        let resent = Self.isResent
        serve("unlink", "\(parent)/\(Self.shown(raw))", reply) { (r: inout Reply?) throws(FSError) in
            do throws(FSError) {
                try filesystem.unlink(parent: parent, name: try Self.existing(raw))
            } catch where resent && error.code == .notFound {
                // Gone: the dead worker removed it (a name not UTF-8 was never there).
                doneBefore("unlink", "\(parent)/\(Self.shown(raw))")
            }
            faultPoint("unlink")
            r.take()!.ok()
        }
    }

    func rmdir(_ reply: consuming Reply, parent: InodeNumber, name raw: String?) {
        let resent = Self.isResent
        serve("rmdir", "\(parent)/\(Self.shown(raw))", reply) { (r: inout Reply?) throws(FSError) in
            do throws(FSError) {
                try filesystem.rmdir(parent: parent, name: try Self.existing(raw))
            } catch where resent && error.code == .notFound {
                doneBefore("rmdir", "\(parent)/\(Self.shown(raw))")
            }
            faultPoint("rmdir")
            r.take()!.ok()
        }
    }

    func rename(
        _ reply: consuming Reply, parent: InodeNumber, name raw: String?, newParent: InodeNumber, newName rawNew: String?,
        flags: UInt32
    ) {
        let resent = Self.isResent
        serve("rename", "\(parent)/\(Self.shown(raw)) -> \(newParent)/\(Self.shown(rawNew))", reply) {
            (r: inout Reply?) throws(FSError) in
            // RENAME_NOREPLACE (1) is done; RENAME_EXCHANGE (2) cannot be done on an object store,
            // and RENAME_WHITEOUT (4) is for overlay filesystems: EINVAL, as rename(2) says of
            // flags a filesystem does not implement, never a plain rename in their place.
            if flags & ~1 != 0 { throw FSError(.invalidArgument, "rename flags \(flags) are not supported") }
            let name = try Self.existing(raw)
            let newName = try Self.new(rawNew)
            do throws(FSError) {
                try filesystem.rename(
                    parent: parent, name: name, newParent: newParent, newName: newName, noReplace: flags & 1 != 0)
            } catch where resent && error.code == .notFound {
                // The source is gone: the dead worker moved it if the destination is there.
                let moved = try filesystem.lookup(parent: newParent, name: newName)
                filesystem.forget(moved.inode, count: 1)
                doneBefore("rename", "\(parent)/\(name) -> \(newParent)/\(newName)")
            }
            faultPoint("rename")
            r.take()!.ok()
        }
    }

    func link(_ reply: consuming Reply) {
        serve("link", "", reply) { (_: inout Reply?) throws(FSError) in try filesystem.link() }
    }

    func setattr(_ reply: consuming Reply, inode: InodeNumber, attributes st: stat, toSet: Int32) {
        serve("setattr", "\(inode) to_set=\(toSet)", reply) { (r: inout Reply?) throws(FSError) in
            var changes = AttributeChanges()
            if toSet & FUSE_SET_ATTR_MODE != 0 { changes.mode = UInt16(truncatingIfNeeded: st.st_mode & 0o7777) }
            if toSet & FUSE_SET_ATTR_UID != 0 { changes.uid = st.st_uid }
            if toSet & FUSE_SET_ATTR_GID != 0 { changes.gid = st.st_gid }
            if toSet & FUSE_SET_ATTR_SIZE != 0 { changes.size = Int64(st.st_size) }
            if toSet & FUSE_SET_ATTR_MTIME_NOW != 0 {
                changes.modified = Timestamp.now()
            } else if toSet & FUSE_SET_ATTR_MTIME != 0 {
                changes.modified = Timestamp(seconds: Int64(st.st_mtim.tv_sec), nanoseconds: Int32(st.st_mtim.tv_nsec))
            }
            if toSet & FUSE_SET_ATTR_ATIME_NOW != 0 {
                changes.accessed = Timestamp.now()
            } else if toSet & FUSE_SET_ATTR_ATIME != 0 {
                changes.accessed = Timestamp(seconds: Int64(st.st_atim.tv_sec), nanoseconds: Int32(st.st_atim.tv_nsec))
            }
            let attributes = try filesystem.setattr(inode, changes)
            faultPoint("setattr")
            r.take()!.attributes(attributes, timeout: configuration.attributeTimeout)
        }
    }

    func statfs(_ reply: consuming Reply) {
        count("statfs")
        reply.statfs(filesystem.statistics())
    }

}

extension Optional where Wrapped: ~Copyable {
    /// Moves the value out, leaving nil.
    mutating func take() -> Wrapped? {
        switch consume self {
        case .some(let value):
            self = nil
            return value
        case .none:
            self = nil
            return nil
        }
    }
}
