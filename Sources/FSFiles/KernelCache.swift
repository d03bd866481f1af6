import FSCore
import FSJournal
import Locking
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A way to put fetched bytes into the kernel's page cache before anyone reads them, installed
/// by the FUSE layer (FileSystem knows no FUSE). Used for random readers: the 4 MiB fetched
/// around a random read is stored in the kernel too, so the next reads in it are page-cache hits
/// and never reach the daemon.
///
/// The bytes offered must be exactly the object's content at the ETag the open confirmed, and the
/// file must have no spool (a writer's bytes must never be covered by older ones): `Filesystem`
/// checks that as a store starts and once it is done, and drops the kernel's pages if a writer
/// came in between. An open that tells the kernel to drop the pages of an older version first
/// waits for the stores under way: the bytes of one that landed after it would be what its reads
/// get.
public final class KernelCache: Sendable {
    public typealias Store = @Sendable (InodeNumber, Int64, UnsafeRawBufferPointer) -> Void
    /// Drops the kernel's attributes of the inode and, if the flag is set, its pages.
    public typealias Invalidate = @Sendable (InodeNumber, Bool) -> Void
    /// Asks the kernel to drop its entry for a name in a directory (parent, name): once nothing
    /// uses the inode, the kernel forgets it (`Filesystem.forget`). Never called on a request's
    /// own thread: the kernel takes the directory's lock, which a lookup in it may hold.
    public typealias ForgetEntry = @Sendable (InodeNumber, String) -> Void

    /// Protects the installed functions (never held while one runs: a store can wait for pages
    /// the kernel has locked for a read not answered yet).
    private let functions = Locked<(store: Store, invalidate: Invalidate)?>(nil)
    /// Installed apart (the reference model's kernel drops entries and keeps no pages).
    private let entryForgetter = Locked<ForgetEntry?>(nil)
    private let installed = Atomic<Bool>(false)
    /// Calls into the session under way (`uninstall` waits for them).
    private let running = Atomic<Int>(0)
    /// Stores readers queued and not done (`reserveQueuedStore`).
    private let queuedStores = Atomic<Int>(0)
    /// The most stores readers may have queued at once: each holds its fetch's buffer.
    package static let queuedStoreLimit = 2
    /// Stores under way, per inode (`store(_:at:_:while:)`).
    private let storing = ConditionLocked<[InodeNumber: Int]>([:])

    public init() {}

    public func install(store: @escaping Store, invalidate: @escaping Invalidate) {
        functions.withLock { $0 = (store, invalidate) }
        installed.store(true, ordering: .sequentiallyConsistent)
    }

    /// Lets the filesystem ask the kernel to forget names (`meta_max_entries`, see
    /// `Filesystem+Bound`). Stopped by `uninstall` with the rest.
    public func install(forgetEntry: @escaping ForgetEntry) {
        entryForgetter.withLock { $0 = forgetEntry }
    }

    /// Whether names can be handed to the kernel to forget.
    package var forgetsEntries: Bool { entryForgetter.withLock { $0 != nil } }

    /// Stops further calls and waits (up to 2 s) for running ones, so that the session can be
    /// destroyed. Called after the unmount, when the kernel fails any store at once.
    public func uninstall() {
        installed.store(false, ordering: .sequentiallyConsistent)
        functions.withLock { $0 = nil }
        entryForgetter.withLock { $0 = nil }
        var waited = 0
        while running.load(ordering: .sequentiallyConsistent) > 0 && waited < 2000 {
            usleep(1000)
            waited += 1
        }
    }

    package var isInstalled: Bool { installed.load(ordering: .sequentiallyConsistent) }

    /// Runs `body` with what `installed` holds, counted in `running`; `installed` is read again
    /// after counting, so that `uninstall` either waits for this call or stops it.
    private func counted<T>(_ installed: () -> T?, _ body: (T) -> Void) {
        guard let value = installed() else { return }
        running.add(1, ordering: .sequentiallyConsistent)
        defer { running.subtract(1, ordering: .sequentiallyConsistent) }
        guard installed() != nil else { return }
        body(value)
    }

    private func call(_ body: ((store: Store, invalidate: Invalidate)) -> Void) {
        counted({ isInstalled ? functions.withLock { $0 } : nil }, body)
    }

    /// Asks the kernel to drop its entry for `name` in `parent` (see `ForgetEntry`).
    package func forgetEntry(_ parent: InodeNumber, _ name: String) {
        counted({ entryForgetter.withLock { $0 } }) { $0(parent, name) }
    }

    /// Counts a store a reader is about to queue; false (nothing counted) when
    /// `queuedStoreLimit` are queued already. `endQueuedStore` once it ran or was not queued.
    package func reserveQueuedStore() -> Bool {
        if queuedStores.add(1, ordering: .relaxed).newValue <= Self.queuedStoreLimit { return true }
        queuedStores.subtract(1, ordering: .relaxed)
        return false
    }

    package func endQueuedStore() { queuedStores.subtract(1, ordering: .relaxed) }

    /// Stores `bytes` at `offset` of `inode` if `holds` (the bytes are still the version the
    /// kernel may keep pages of, and no writer has the file), checked when the store starts; a
    /// store under way is counted, so that `waitForStores` can wait for it. If `holds` is false
    /// once stored (a writer came in, or a wait for it gave up), the pages are dropped again.
    /// `holds` runs under this cache's lock: it may take the filesystem's, never the other way.
    package func store(_ inode: InodeNumber, at offset: Int64, _ bytes: UnsafeRawBufferPointer, while holds: () -> Bool) {
        let started = storing.withLock { s in
            guard holds() else { return false }
            s[inode, default: 0] += 1
            return true
        }
        guard started else { return }
        call { $0.store(inode, offset, bytes) }
        storing.withLock { s in
            if let count = s[inode], count > 1 { s[inode] = count - 1 } else { s[inode] = nil }
        }
        if !holds() { invalidate(inode) }
    }

    /// Waits until no store of `inode` is under way: called once the bytes those stores carry
    /// may no longer be kept (an open that finds another version, whose answer makes the kernel
    /// drop the pages), so that none lands after that answer. A store waits for pages a pending
    /// read holds locked, which needs a FUSE thread: at most `storeWait` seconds, after which
    /// the store drops its pages itself once done (`store(_:at:_:while:)`).
    package func waitForStores(of inode: InodeNumber) {
        _ = storing.withLock(when: { $0[inode] == nil }, timeout: Self.storeWait) { _ in }
    }

    package static let storeWait: Double = 2

    /// Drops the kernel's pages and attributes of `inode`; with `pages` false only its
    /// attributes, which never waits for a read under way (dropping pages waits for the pages
    /// a read has locked until it is answered, so that is never done on a read's own thread).
    package func invalidate(_ inode: InodeNumber, pages: Bool = true) {
        call { $0.invalidate(inode, pages) }
    }
}
