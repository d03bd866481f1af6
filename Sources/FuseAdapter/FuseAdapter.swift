import CFuse3
import FileSystem
import Logging
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

    public init(filesystem: Filesystem, configuration: FuseConfiguration, logger: Logger) {
        self.filesystem = filesystem
        self.configuration = configuration
        self.logger = logger
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
        if configuration.traceOperations { logger.debug("\(operation) \(detail())") }
        var pending: Reply? = consume reply
        do throws(FSError) {
            try body(&pending)
        } catch {
            let errno = Errno.forFilesystemError(error.code)
            switch error.code {
            case .notFound, .notADirectory, .isADirectory, .readOnly, .notEmpty, .nameTooLong, .invalidArgument,
                .notSupported:
                if configuration.traceOperations { logger.debug("\(operation) -> \(errno): \(error.message)") }
            case .permissionDenied, .stale, .ioError:
                logger.error("\(operation) failed: \(error.message)")
            }
            pending.take()?.error(errno)
        }
        // A body that returned without answering leaves the token to answer EIO from its deinit.
    }

    // MARK: Operations

    func lookup(_ reply: consuming Reply, parent: InodeNumber, name: String) {
        let negative = configuration.negativeTimeout
        serve("lookup", "\(parent)/\(name)", reply) { (r: inout Reply?) throws(FSError) in
            do throws(FSError) {
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
        let writable = (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC) != 0
        serve("open", "\(inode) flags=\(flags)", reply) { (r: inout Reply?) throws(FSError) in
            let result = try filesystem.open(inode, writable: writable)
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
        serve("readdir", "\(inode) off=\(offset)", reply) { (r: inout Reply?) throws(FSError) in
            guard let request = r?.request else { return }
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 8)
            defer { buffer.deallocate() }
            var used = 0
            do throws(FSError) {
                try filesystem.readdir(inode, handle: handle, offset: offset) { name, kind, entryInode, next in
                    var st = Glibc.stat()
                    st.st_ino = ino_t(entryInode)
                    st.st_mode = kind == .directory ? S_IFDIR : S_IFREG
                    let needed = fuse_add_direntry(
                        request, buffer.baseAddress! + used, size - used, name, &st, off_t(next))
                    guard used + needed <= size else { return false }
                    used += needed
                    return true
                }
            } catch {
                // readdir reports an error only if no entry was added yet; else the partial buffer.
                if used == 0 { throw error }
                logger.error("readdir of inode \(inode) stopped early: \(error.message)")
            }
            r.take()!.buffer(UnsafeRawBufferPointer(rebasing: buffer[0..<used]))
        }
    }

    func statfs(_ reply: consuming Reply) {
        reply.statfs(filesystem.statistics())
    }

    func readOnly(_ reply: consuming Reply, _ operation: String) {
        if configuration.traceOperations { logger.debug("\(operation) -> EROFS") }
        reply.error(.readOnlyFileSystem)
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
