import Synchronization

/// A way to put fetched bytes into the kernel's page cache before anyone reads them, installed
/// by the FUSE layer (FileSystem knows no FUSE). Used for random readers: the 8 MiB fetched
/// around a random read is stored in the kernel too, so the next reads in it are page-cache hits
/// and never reach the daemon.
///
/// The bytes offered must be exactly the object's content at the ETag the open confirmed, and the
/// file must have no spool (a writer's bytes must never be covered by older ones): `Filesystem`
/// checks that before and after storing, and drops the kernel's pages if a writer came in between.
public final class KernelCache: Sendable {
    public typealias Store = @Sendable (InodeNumber, Int64, UnsafeRawBufferPointer) -> Void
    public typealias Invalidate = @Sendable (InodeNumber) -> Void

    /// Protects the installed functions.
    private let functions = Mutex<(store: Store, invalidate: Invalidate)?>(nil)

    public init() {}

    public func install(store: @escaping Store, invalidate: @escaping Invalidate) {
        functions.withLock { $0 = (store, invalidate) }
    }

    var isInstalled: Bool { functions.withLock { $0 != nil } }

    func store(_ inode: InodeNumber, at offset: Int64, _ bytes: UnsafeRawBufferPointer) {
        functions.withLock { $0 }?.store(inode, offset, bytes)
    }

    func invalidate(_ inode: InodeNumber) {
        functions.withLock { $0 }?.invalidate(inode)
    }
}
