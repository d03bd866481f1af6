import CSQLite
import Dispatch
import Locking
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Fixed-size blocks of objects, kept across mounts: the bytes in a data file of block-sized
/// slots (`PATH-data`), and what they are in a SQLite database (`PATH`): which object, which
/// version, how many bytes, which slot, when last used.
///
/// A block is identified by the object's name (store identity and key), its ETag and its index
/// (offset / `blockSize`). A read asks for the ETag the filesystem just confirmed, so a changed
/// object never returns old bytes: blocks of an older ETag are simply not found, and are deleted
/// as soon as a block of the new ETag is stored.
///
/// Subtleties:
/// 1. Writes are asynchronous and batched: `store` queues a block (bounded; over the bound the
///    block is not cached, so a slow disk never slows a reader) and one serial writer stores
///    the queue. A queued block is already readable (`read` looks at the queue first).
/// 2. A batch is three steps: one transaction evicts what must go, takes slots for the new
///    blocks and records them as pending (size -1, never read); then the bytes are written
///    into the slots with `pwrite`, outside any transaction; then a second transaction records
///    their sizes. SQLite never copies block bytes (before, it wrote each block twice: WAL,
///    then checkpoint), and whole page-aligned blocks of a sequential reader bypass the page
///    cache (O_DIRECT), which made caching a cold read cost nothing measurable.
/// 3. A slot is written only after the transaction that freed it committed, and a read checks
///    after its `pread` that the row it read is still there. A read whose bytes a new block
///    overwrote therefore finds its row gone, and is a miss. This holds across processes (two
///    mounts sharing a cache directory), as the transactions are SQLite's.
/// 4. The size cap is in slots: the data file never grows beyond `capacity / blockSize` slots.
///    Mounts sharing a cache directory should give the same `cache_size`: a smaller one cuts
///    the file to its own size (the other mount's blocks beyond it become misses).
/// 5. Crashes. A pending row of a killed writer is never read, and is evicted like any block
///    once it is ten minutes old (a live writer finishes in far less). A killed mount leaves
///    the data file's bytes in the page cache, so the next mount of the same boot trusts every
///    recorded block. A power cut may lose data pages whose rows survived: the database records
///    the boot of its last change and whether the data file was synced since (`markClean`, at
///    unmount), and a cache changed in an earlier boot and not synced starts empty.
/// 6. A file that is not our database (damaged, foreign, or an older layout) is deleted and
///    rebuilt with a warning. Damage found later disables the cache for this mount and deletes
///    the files so that the next mount starts clean. The cache never fails a read: a problem
///    is a miss.
/// 7. Lock order: `pending`, then `readers`; neither is held during SQLite or file I/O, except
///    that the writer connection is only ever used on `writerQueue`.
public final class BlockCache: Sendable {
    /// Which object's bytes: `name` = store identity + key, `etag` = the version.
    public struct Object: Sendable, Hashable {
        public var name: String
        public var etag: String
        public init(name: String, etag: String) {
            self.name = name
            self.etag = etag
        }
    }

    public let blockSize: Int
    public let capacity: Int64
    public let path: String
    /// The block bytes: slot `n` at offset `n * blockSize`.
    public var dataPath: String { path + "-data" }
    private let logger: Logger

    static let applicationID: Int64 = 0x4353_5046  // "CSPF"
    /// 2: block bytes in the data file (1 kept them in the database).
    static let schemaVersion: Int64 = 2
    /// Queued bytes beyond which new blocks are not cached (bounds memory when the disk is slow).
    public static let maximumQueuedBytes = 16 << 20
    /// A pending row older than this (microseconds) belongs to a writer that died.
    static let abandonedAfter: Int64 = 600_000_000

    private struct BlockID: Hashable {
        var name: String
        var index: Int64
    }

    private struct Queued {
        var etag: String
        var bytes: ByteBuffer
        var range: Range<Int>
        var streaming: Bool
    }

    private struct Pending {
        var blocks: [BlockID: Queued] = [:]
        /// Memory the queue keeps alive: each distinct buffer counted once, whole (a block is
        /// often a slice of a larger GET buffer, which lives as long as any of its blocks is queued).
        var bytes = 0
        var buffers: [ObjectIdentifier: Int] = [:]

        mutating func add(_ id: BlockID, _ block: Queued) {
            remove(id)
            blocks[id] = block
            let key = ObjectIdentifier(block.bytes)
            if buffers[key, default: 0] == 0 { bytes += block.bytes.capacity }
            buffers[key, default: 0] += 1
        }

        /// Removes `id` (if `only` is given, only when it still holds that buffer).
        mutating func remove(_ id: BlockID, only: ByteBuffer? = nil) {
            guard let old = blocks[id], only == nil || old.bytes === only else { return }
            blocks[id] = nil
            let key = ObjectIdentifier(old.bytes)
            buffers[key, default: 1] -= 1
            if buffers[key] == 0 {
                buffers[key] = nil
                bytes -= old.bytes.capacity
            }
        }
        var touches: Set<Int64> = []
        var scheduled = false
    }

    /// Protects the write queue.
    private let pending = Locked(Pending())
    /// Idle read connections; a reader takes one (or opens one) and gives it back.
    private let readers = Locked<[ReadConnection]>([])
    private let writer: WriteConnection
    private let writerQueue = DispatchQueue(label: "csspfs.block-cache.writer")
    private let disabled = Atomic<Bool>(false)
    private let clock: @Sendable () -> Int64
    /// The data file, shared by readers (`pread`) and the writer (`pwrite`).
    private let data: Int32
    /// The data file opened with O_DIRECT for writing whole page-aligned blocks (-1 where the
    /// file system has no O_DIRECT, such as tmpfs): no copy into the page cache, no writeback.
    private let directData: Int32
    private let slots: Int64
    /// Tests only: runs between a read's lookup of its row and its `pread` (subtlety 3).
    let afterLookup = Locked<(@Sendable () -> Void)?>(nil)

    // MARK: Opening

    /// Opens (or creates, or rebuilds) the cache at `path`; nil, with a warning, if it cannot be used.
    /// `clock` (microseconds) orders blocks for eviction and `boot` names this boot (subtlety 5);
    /// tests inject both.
    public static func open(
        path: String, capacity: Int64, blockSize: Int, logger: Logger,
        clock: @escaping @Sendable () -> Int64 = BlockCache.now, boot: String = BlockCache.currentBoot()
    ) -> BlockCache? {
        guard capacity >= Int64(blockSize) else { return nil }
        if let problem = makeDirectories(holding: path) {
            logger.warning("block cache directory \(problem): reads will not be cached")
            return nil
        }
        do {
            return try BlockCache(path: path, capacity: capacity, blockSize: blockSize, logger: logger, clock: clock, boot: boot)
        } catch let error as Unusable {
            logger.warning("block cache \(path) \(error.reason): rebuilding it")
        } catch let error as SQLiteError where error.isDamage {
            logger.warning("block cache \(path) is damaged (\(error)): rebuilding it")
        } catch {
            logger.warning("block cache \(path) cannot be used, reads will not be cached: \(error)")
            return nil
        }
        removeFiles(path)
        do {
            return try BlockCache(path: path, capacity: capacity, blockSize: blockSize, logger: logger, clock: clock, boot: boot)
        } catch {
            logger.warning("block cache \(path) cannot be rebuilt, reads will not be cached: \(error)")
            return nil
        }
    }

    /// Makes the directories above `path` (mode 0700 where new); what failed, or nil.
    static func makeDirectories(holding path: String) -> String? {
        var current = ""
        for component in path.split(separator: "/", omittingEmptySubsequences: false).dropLast() where !component.isEmpty {
            current += "/" + component
            if mkdir(current, 0o700) != 0 && errno != EEXIST {
                return "\(current) cannot be created (\(String(cString: strerror(errno))))"
            }
        }
        return nil
    }

    struct Unusable: Error {
        var reason: String
    }

    private init(
        path: String, capacity: Int64, blockSize: Int, logger: Logger, clock: @escaping @Sendable () -> Int64,
        boot: String
    ) throws {
        self.path = path
        self.clock = clock
        self.capacity = capacity
        self.blockSize = blockSize
        self.logger = logger
        slots = capacity / Int64(blockSize)
        // Cached bytes are as private as the container: only the mounting user may read them
        // (SQLite gives its -wal and -shm files the database file's mode).
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        if fd >= 0 {
            fchmod(fd, 0o600)
            close(fd)
        }
        let connection = try SQLiteConnection(path: path)
        try connection.execute("PRAGMA busy_timeout=5000")
        try Self.prepareSchema(connection, blockSize: blockSize)
        try connection.execute("PRAGMA synchronous=NORMAL; PRAGMA cache_size=-2048")
        data = Glibc.open(path + "-data", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard data >= 0 else {
            throw SQLiteError(code: SQLITE_CANTOPEN, message: "open \(path)-data: \(String(cString: strerror(errno)))")
        }
        fchmod(data, 0o600)
        directData = Glibc.open(path + "-data", O_WRONLY | cssp_o_direct() | O_CLOEXEC | O_NOFOLLOW)
        writer = try WriteConnection(connection)
        try writer.open(slots: slots, blockSize: Int64(blockSize), data: data, boot: boot, logger: logger, path: path)
    }

    deinit {
        close(data)
        if directData >= 0 { close(directData) }
    }

    /// Creates the schema in a new file, or checks that an existing file is ours.
    private static func prepareSchema(_ db: SQLiteConnection, blockSize: Int) throws {
        let application = try db.integer("PRAGMA application_id") ?? 0
        if application == 0 {
            guard try db.integer("SELECT count(*) FROM sqlite_master") == 0 else {
                throw Unusable(reason: "is some other program's database")
            }
            try db.execute("PRAGMA journal_mode=WAL")
            try db.execute("BEGIN IMMEDIATE")
            if try db.integer("PRAGMA application_id") == 0 {
                try db.execute(
                    """
                    CREATE TABLE blocks(
                        id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, idx INTEGER NOT NULL,
                        etag TEXT NOT NULL, size INTEGER NOT NULL, used INTEGER NOT NULL, slot INTEGER NOT NULL UNIQUE,
                        UNIQUE(name, idx));
                    CREATE INDEX blocks_by_use ON blocks(used);
                    CREATE TABLE free(slot INTEGER PRIMARY KEY);
                    CREATE TABLE settings(name TEXT PRIMARY KEY, value NOT NULL);
                    INSERT INTO settings VALUES('block_size', \(blockSize)), ('slots', 0), ('boot', ''), ('clean', 1),
                        ('changes', 0);
                    PRAGMA application_id=\(applicationID);
                    PRAGMA user_version=\(schemaVersion);
                    """)
            }
            try db.execute("COMMIT")
        } else if application != applicationID {
            throw Unusable(reason: "is some other program's database")
        }
        guard try db.integer("PRAGMA user_version") == schemaVersion else {
            throw Unusable(reason: "has an older layout")
        }
        try db.execute("PRAGMA journal_mode=WAL; PRAGMA journal_size_limit=\(4 << 20)")
    }

    static func removeFiles(_ path: String) {
        for suffix in ["", "-wal", "-shm", "-journal", "-data"] { unlink(path + suffix) }
    }

    /// This boot's identity (`/proc/sys/kernel/random/boot_id`).
    public static func currentBoot() -> String {
        let fd = Glibc.open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "unknown" }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 64)
        let n = Glibc.read(fd, &buffer, buffer.count)
        return n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self).trimmingSpaces : "unknown"
    }

    // MARK: Reading

    /// Copies bytes `range` of block `index` into `destination`; false if the cache does not hold them.
    public func read(
        _ object: Object, block index: Int64, range: Range<Int>, into destination: UnsafeMutableRawPointer
    ) -> Bool {
        guard !disabled.load(ordering: .relaxed) else { return false }
        let queued: Bool = pending.withLock { p in
            guard let block = p.blocks[BlockID(name: object.name, index: index)], block.etag == object.etag,
                range.upperBound <= block.range.count
            else { return false }
            block.bytes.withBytes((block.range.lowerBound + range.lowerBound)..<(block.range.lowerBound + range.upperBound)) {
                destination.copyMemory(from: $0.baseAddress!, byteCount: $0.count)
            }
            return true
        }
        if queued { return true }
        let now = clock()
        return withReader { (reader) throws(SQLiteError) in
            guard let found = try reader.find(object, index: index, upTo: range.upperBound) else { return (false, nil) }
            afterLookup.withLock { $0 }?()
            let offset = off_t(found.slot * Int64(blockSize) + Int64(range.lowerBound))
            var done = 0
            while done < range.count {
                let n = pread(data, destination + done, range.count - done, offset + off_t(done))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { return (false, nil) }
                done += n
            }
            // Subtlety 3: the row still there means its slot was not written over meanwhile.
            guard try reader.exists(found.row) else { return (false, nil) }
            return (true, found.used < now - 1_000_000 ? found.row : nil)
        } ?? false
    }

    /// Whether block `index` of `object` is cached whole (or up to the object's end).
    public func contains(_ object: Object, block index: Int64) -> Bool {
        guard !disabled.load(ordering: .relaxed) else { return false }
        let queued = pending.withLock { p in p.blocks[BlockID(name: object.name, index: index)]?.etag == object.etag }
        if queued { return true }
        return withReader { (reader) throws(SQLiteError) in (try reader.find(object, index: index, upTo: 0) != nil, nil) } ?? false
    }

    private func withReader<R>(_ body: (ReadConnection) throws(SQLiteError) -> (R, touch: Int64?)) -> R? {
        var reader = readers.withLock { $0.popLast() }
        do {
            if reader == nil { reader = try ReadConnection(path: path) }
            let (result, touch) = try body(reader!)
            readers.withLock { $0.append(reader!) }
            if let touch { queueTouch(touch) }
            return result
        } catch {
            failed(error, during: "read")
            return nil
        }
    }

    // MARK: Writing

    /// Queues bytes `range` of `bytes` as block `index` of `object` (a whole block, or the last one).
    /// When the queue is full the block is not cached, unless `waitForRoom` is set (then this
    /// blocks until the writer has made room; for background work only). `streaming`: bytes a
    /// sequential reader passed, unlikely to be read again soon, written past the page cache
    /// (O_DIRECT); others stay in the page cache too, for the reads that come back to them.
    public func store(
        _ object: Object, block index: Int64, bytes: ByteBuffer, range: Range<Int>, waitForRoom: Bool = false,
        streaming: Bool = false
    ) {
        guard !object.etag.isEmpty, range.count > 0 else { return }
        while !disabled.load(ordering: .relaxed) {
            let (queued, schedule): (Bool, Bool) = pending.withLock { p in
                let id = BlockID(name: object.name, index: index)
                p.remove(id)
                let growth = p.buffers[ObjectIdentifier(bytes)] == nil ? bytes.capacity : 0
                guard p.bytes + growth <= Self.maximumQueuedBytes || p.blocks.isEmpty else { return (false, false) }
                p.add(id, Queued(etag: object.etag, bytes: bytes, range: range, streaming: streaming))
                defer { p.scheduled = true }
                return (true, !p.scheduled)
            }
            if schedule { writerQueue.async { self.drain() } }
            if queued || !waitForRoom { return }
            waitUntilWritten()
        }
    }

    private func queueTouch(_ row: Int64) {
        let schedule: Bool = pending.withLock { p in
            p.touches.insert(row)
            defer { p.scheduled = true }
            return !p.scheduled
        }
        if schedule { writerQueue.async { self.drain() } }
    }

    /// Blocks until everything queued so far is written (tests, unmount).
    public func waitUntilWritten() {
        writerQueue.sync {}
    }

    /// At unmount: writes what is queued, syncs the data file, and records that it is synced
    /// (subtlety 5), unless another mount changed the cache meanwhile.
    public func markClean() {
        waitUntilWritten()
        writerQueue.sync {
            guard !disabled.load(ordering: .relaxed) else { return }
            do throws(SQLiteError) {
                let changes = try writer.changes()
                guard fdatasync(data) == 0 else { return }
                try writer.markClean(ifChanges: changes)
            } catch {
                failed(error, during: "mark clean")
            }
        }
    }

    /// Runs on `writerQueue`: stores what is queued (subtlety 2).
    private func drain() {
        let (blocks, touches): ([(BlockID, Queued)], Set<Int64>) = pending.withLock { p in
            p.scheduled = false
            defer { p.touches = [] }
            return (Array(p.blocks), p.touches)
        }
        if !disabled.load(ordering: .relaxed) {
            do {
                let planned = try writer.reserve(
                    blocks.map { ($0.0.name, $0.0.index, $0.1.etag, $0.1.range.count) }, touches: touches, slots: slots,
                    now: clock())
                var written: [(row: Int64, size: Int)] = []
                var lost: [Int64] = []
                for (position, row, slot) in planned {
                    let block = blocks[position].1
                    if write(block, at: slot) { written.append((row, block.range.count)) } else { lost.append(row) }
                }
                if !planned.isEmpty { try writer.finish(written, lost: lost) }
            } catch {
                failed(error, during: "write")
            }
        }
        pending.withLock { p in
            for (id, block) in blocks { p.remove(id, only: block.bytes) }
        }
    }

    /// Writes a block's bytes into its slot; false on a failure (a full disk: the block is not cached).
    private func write(_ block: Queued, at slot: Int64) -> Bool {
        let offset = off_t(slot * Int64(blockSize))
        return block.bytes.withBytes(block.range) { bytes in
            let aligned = Int(bitPattern: bytes.baseAddress!) % 4096 == 0 && bytes.count % 4096 == 0
            var fd = block.streaming && aligned && directData >= 0 ? directData : data
            var done = 0
            while done < bytes.count {
                let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, offset + off_t(done))
                if n < 0 && errno == EINTR { continue }
                // A file system whose O_DIRECT wants other alignment: this block goes buffered.
                if n < 0 && errno == EINVAL && fd == directData {
                    fd = data
                    continue
                }
                guard n > 0 else { return false }
                done += n
            }
            return true
        }
    }

    private func failed(_ error: SQLiteError, during operation: String) {
        guard error.isDamage else {
            // Busy beyond the timeout, disk full, I/O error: this block is simply not cached.
            logger.debug("block cache \(operation) failed: \(error)")
            return
        }
        guard !disabled.exchange(true, ordering: .relaxed) else { return }
        logger.warning("block cache \(path) is damaged (\(error)): not caching until the next mount, which rebuilds it")
        Self.removeFiles(path)
    }

    // MARK: Inspection

    /// Blocks and bytes held, and the bytes the data file takes on disk (what the cap bounds).
    public func statistics() -> (blocks: Int64, bytes: Int64, diskBytes: Int64) {
        waitUntilWritten()
        let (blocks, bytes) = withReader { (reader) throws(SQLiteError) in (try reader.statistics(), nil) } ?? (0, 0)
        var st = stat()
        let disk = fstat(data, &st) == 0 ? Int64(st.st_blocks) * 512 : 0
        return (blocks, bytes, disk)
    }

    /// Bytes held as stored so far (blocks still queued are not counted yet): a gauge for
    /// `mount.cssp --stats`, which must not wait for the writer.
    public func storedBytes() -> Int64 {
        withReader { (reader) throws(SQLiteError) in (try reader.statistics(), nil) }?.1 ?? 0
    }

    /// Wall-clock microseconds (shared by processes using the same file).
    public static func now() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
    }
}

extension String {
    fileprivate var trimmingSpaces: String {
        String(unicodeScalars.filter { !$0.properties.isWhitespace })
    }
}
