import CSQLite
import Dispatch
import Locking
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Fixed-size blocks of objects, kept in one SQLite database that survives unmount.
///
/// A block is identified by the object's name (store identity and key), its ETag and its index
/// (offset / `blockSize`). A read asks for the ETag the filesystem just confirmed, so a changed
/// object never returns old bytes: blocks of an older ETag are simply not found, and are deleted
/// as soon as a block of the new ETag is stored.
///
/// Subtleties:
/// 1. Writes are asynchronous and batched: `store` queues a block (bounded; over the bound the
///    block is not cached) and one serial writer stores the queue in one transaction. A queued
///    block is already readable (`read` looks at the queue first).
/// 2. The size cap holds across threads and processes: the byte total is a row in the database,
///    read and updated inside the same `BEGIN IMMEDIATE` transaction that inserts and evicts.
///    Eviction removes the least recently used blocks (`used`, in microseconds; a hit refreshes
///    it at most once a second, in the writer's next batch).
/// 3. A read holds its statement open while it reads the blob, so a concurrent eviction in
///    another process cannot swap the row under it (WAL gives the read a snapshot).
/// 4. A file that is not our database (damaged, foreign, or an older schema) is deleted and
///    rebuilt with a warning. Damage found later disables the cache for this mount and deletes
///    the file so that the next mount starts clean. The cache never fails a read: a problem is a miss.
/// 5. Lock order: `pending`, then `readers`; neither is held during SQLite I/O, except that the
///    writer connection is only ever used on `writerQueue`.
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
    private let logger: Logger

    static let applicationID: Int64 = 0x4353_5046  // "CSPF"
    static let schemaVersion: Int64 = 1
    /// Queued bytes beyond which new blocks are not cached (bounds memory when the disk is slow).
    public static let maximumQueuedBytes = 16 << 20

    private struct BlockID: Hashable {
        var name: String
        var index: Int64
    }

    private struct Queued {
        var etag: String
        var bytes: ByteBuffer
        var range: Range<Int>
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

    // MARK: Opening

    /// Opens (or creates, or rebuilds) the cache at `path`; nil, with a warning, if it cannot be used.
    /// `clock` (microseconds) orders blocks for eviction; tests inject one.
    public static func open(
        path: String, capacity: Int64, blockSize: Int, logger: Logger,
        clock: @escaping @Sendable () -> Int64 = BlockCache.now
    ) -> BlockCache? {
        guard capacity >= Int64(blockSize) else { return nil }
        let directory = path.split(separator: "/", omittingEmptySubsequences: false).dropLast()
        var current = ""
        for component in directory where !component.isEmpty {
            current += "/" + component
            if mkdir(current, 0o700) != 0 && errno != EEXIST {
                logger.warning("block cache directory \(current) cannot be created (\(String(cString: strerror(errno)))): reads will not be cached")
                return nil
            }
        }
        do {
            return try BlockCache(path: path, capacity: capacity, blockSize: blockSize, logger: logger, clock: clock)
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
            return try BlockCache(path: path, capacity: capacity, blockSize: blockSize, logger: logger, clock: clock)
        } catch {
            logger.warning("block cache \(path) cannot be rebuilt, reads will not be cached: \(error)")
            return nil
        }
    }

    struct Unusable: Error {
        var reason: String
    }

    private init(
        path: String, capacity: Int64, blockSize: Int, logger: Logger, clock: @escaping @Sendable () -> Int64
    ) throws {
        self.path = path
        self.clock = clock
        self.capacity = capacity
        self.blockSize = blockSize
        self.logger = logger
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
        writer = try WriteConnection(connection)
    }

    /// Creates the schema in a new file, or checks that an existing file is ours.
    private static func prepareSchema(_ db: SQLiteConnection, blockSize: Int) throws {
        let application = try db.integer("PRAGMA application_id") ?? 0
        if application == 0 {
            guard try db.integer("SELECT count(*) FROM sqlite_master") == 0 else {
                throw Unusable(reason: "is some other program's database")
            }
            // Large pages keep a block's overflow chain short; both must precede the first table.
            try db.execute("PRAGMA page_size=65536; PRAGMA journal_mode=WAL")
            try db.execute("BEGIN IMMEDIATE")
            if try db.integer("PRAGMA application_id") == 0 {
                try db.execute(
                    """
                    CREATE TABLE blocks(
                        name TEXT NOT NULL, idx INTEGER NOT NULL, etag TEXT NOT NULL,
                        size INTEGER NOT NULL, used INTEGER NOT NULL, data BLOB NOT NULL,
                        UNIQUE(name, idx));
                    CREATE INDEX blocks_by_use ON blocks(used);
                    CREATE TABLE settings(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
                    INSERT INTO settings VALUES('block_size', \(blockSize)), ('bytes', 0);
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
        try db.execute("PRAGMA journal_mode=WAL; PRAGMA journal_size_limit=\(16 << 20); PRAGMA wal_autocheckpoint=256")
        if try db.integer("SELECT value FROM settings WHERE name='block_size'") != Int64(blockSize) {
            // Blocks of another size cannot answer reads: start over, keeping the file.
            try db.execute(
                """
                BEGIN IMMEDIATE; DELETE FROM blocks; UPDATE settings SET value=0 WHERE name='bytes';
                UPDATE settings SET value=\(blockSize) WHERE name='block_size'; COMMIT
                """)
        }
    }

    static func removeFiles(_ path: String) {
        for suffix in ["", "-wal", "-shm", "-journal"] { unlink(path + suffix) }
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
            try reader.read(object, index: index, range: range, into: destination, now: now)
        } ?? false
    }

    /// Whether block `index` of `object` is cached whole (or up to the object's end).
    public func contains(_ object: Object, block index: Int64) -> Bool {
        guard !disabled.load(ordering: .relaxed) else { return false }
        let queued = pending.withLock { p in p.blocks[BlockID(name: object.name, index: index)]?.etag == object.etag }
        if queued { return true }
        return withReader { (reader) throws(SQLiteError) in try reader.contains(object, index: index) } ?? false
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
    /// blocks until the writer has made room; for background work only).
    public func store(
        _ object: Object, block index: Int64, bytes: ByteBuffer, range: Range<Int>, waitForRoom: Bool = false
    ) {
        guard !object.etag.isEmpty, range.count > 0 else { return }
        while !disabled.load(ordering: .relaxed) {
            let (queued, schedule): (Bool, Bool) = pending.withLock { p in
                let id = BlockID(name: object.name, index: index)
                p.remove(id)
                let growth = p.buffers[ObjectIdentifier(bytes)] == nil ? bytes.capacity : 0
                guard p.bytes + growth <= Self.maximumQueuedBytes || p.blocks.isEmpty else { return (false, false) }
                p.add(id, Queued(etag: object.etag, bytes: bytes, range: range))
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

    /// Runs on `writerQueue`: writes what is queued in one transaction.
    private func drain() {
        let (blocks, touches): ([(BlockID, Queued)], Set<Int64>) = pending.withLock { p in
            p.scheduled = false
            defer { p.touches = [] }
            return (Array(p.blocks), p.touches)
        }
        if !disabled.load(ordering: .relaxed) {
            do {
                try writer.write(
                    blocks.map { ($0.0.name, $0.0.index, $0.1) }, touches: touches, capacity: capacity, now: clock())
            } catch {
                failed(error, during: "write")
            }
        }
        pending.withLock { p in
            for (id, block) in blocks { p.remove(id, only: block.bytes) }
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

    /// Blocks and bytes held (the byte total is the one the cap is enforced on).
    public func statistics() -> (blocks: Int64, bytes: Int64, recordedBytes: Int64) {
        waitUntilWritten()
        return withReader { (reader) throws(SQLiteError) in (try reader.statistics(), nil) } ?? (0, 0, 0)
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

    /// A connection for reads, with its statements. Used by one thread at a time (taken from `readers`).
    private final class ReadConnection: @unchecked Sendable {
        let db: SQLiteConnection
        let find: SQLiteStatement
        let count: SQLiteStatement

        init(path: String) throws(SQLiteError) {
            db = try SQLiteConnection(path: path)
            try db.execute("PRAGMA busy_timeout=5000; PRAGMA cache_size=-1024")
            find = try db.prepare("SELECT rowid, etag, size, used FROM blocks WHERE name=?1 AND idx=?2")
            count = try db.prepare("SELECT count(*), coalesce(sum(size), 0), (SELECT value FROM settings WHERE name='bytes') FROM blocks")
        }

        /// Finds the row of a block of the right version holding at least `upTo` bytes.
        private func row(_ object: Object, index: Int64, upTo: Int) throws(SQLiteError) -> (row: Int64, used: Int64)? {
            find.bind(1, object.name)
            find.bind(2, index)
            guard try find.step(), find.text(1) == object.etag, find.integer(2) >= Int64(upTo) else { return nil }
            return (find.integer(0), find.integer(3))
        }

        func read(
            _ object: Object, index: Int64, range: Range<Int>, into destination: UnsafeMutableRawPointer, now: Int64
        ) throws(SQLiteError) -> (Bool, touch: Int64?) {
            defer { find.reset() }
            guard let (row, used) = try row(object, index: index, upTo: range.upperBound) else { return (false, nil) }
            var blob: OpaquePointer? = nil
            var rc = sqlite3_blob_open(db.handle, "main", "blocks", "data", row, 0, &blob)
            guard rc == SQLITE_OK else {
                sqlite3_blob_close(blob)
                throw db.error(rc, "open block blob")
            }
            rc = sqlite3_blob_read(blob, destination, Int32(range.count), Int32(range.lowerBound))
            sqlite3_blob_close(blob)
            guard rc == SQLITE_OK else { throw db.error(rc, "read block blob") }
            return (true, used < now - 1_000_000 ? row : nil)
        }

        func contains(_ object: Object, index: Int64) throws(SQLiteError) -> (Bool, touch: Int64?) {
            defer { find.reset() }
            return (try row(object, index: index, upTo: 0) != nil, nil)
        }

        func statistics() throws(SQLiteError) -> (Int64, Int64, Int64) {
            defer { count.reset() }
            guard try count.step() else { return (0, 0, 0) }
            return (count.integer(0), count.integer(1), count.integer(2))
        }
    }

    /// The one connection that writes, with its statements. Used only on `writerQueue`.
    private final class WriteConnection: @unchecked Sendable {
        let db: SQLiteConnection
        let total: SQLiteStatement
        let setTotal: SQLiteStatement
        let existing: SQLiteStatement
        let deleteRow: SQLiteStatement
        let deleteOtherVersions: SQLiteStatement
        let oldest: SQLiteStatement
        let insert: SQLiteStatement
        let touch: SQLiteStatement

        init(_ db: SQLiteConnection) throws(SQLiteError) {
            self.db = db
            total = try db.prepare("SELECT value FROM settings WHERE name='bytes'")
            setTotal = try db.prepare("UPDATE settings SET value=?1 WHERE name='bytes'")
            existing = try db.prepare("SELECT rowid, etag, size FROM blocks WHERE name=?1 AND idx=?2")
            deleteRow = try db.prepare("DELETE FROM blocks WHERE rowid=?1")
            deleteOtherVersions = try db.prepare("DELETE FROM blocks WHERE name=?1 AND etag<>?2 RETURNING size")
            oldest = try db.prepare("SELECT rowid, size FROM blocks ORDER BY used LIMIT 64")
            insert = try db.prepare("INSERT INTO blocks(name, idx, etag, size, used, data) VALUES(?1, ?2, ?3, ?4, ?5, ?6)")
            touch = try db.prepare("UPDATE blocks SET used=?2 WHERE rowid=?1")
        }

        func write(_ blocks: [(String, Int64, Queued)], touches: Set<Int64>, capacity: Int64, now: Int64)
            throws(SQLiteError)
        {
            try db.execute("BEGIN IMMEDIATE")
            do throws(SQLiteError) {
                _ = try total.step()
                var bytes = total.integer(0)
                total.reset()
                var purged: Set<String> = []
                for (name, index, block) in blocks {
                    let size = Int64(block.range.count)
                    existing.bind(1, name)
                    existing.bind(2, index)
                    let found = try existing.step() ? (existing.integer(0), existing.text(1), existing.integer(2)) : nil
                    existing.reset()
                    if let found {
                        if found.1 == block.etag && found.2 >= size { continue }
                        deleteRow.bind(1, found.0)
                        try deleteRow.run()
                        bytes -= found.2
                    }
                    if purged.insert(name + "\n" + block.etag).inserted {
                        deleteOtherVersions.bind(1, name)
                        deleteOtherVersions.bind(2, block.etag)
                        defer { deleteOtherVersions.reset() }
                        while try deleteOtherVersions.step() { bytes -= deleteOtherVersions.integer(0) }
                    }
                    bytes -= try evict(toFit: size, holding: bytes, capacity: capacity)
                    guard bytes + size <= capacity else { continue }
                    insert.bind(1, name)
                    insert.bind(2, index)
                    insert.bind(3, block.etag)
                    insert.bind(4, size)
                    insert.bind(5, now)
                    try block.bytes.withBytes(block.range) { (data) throws(SQLiteError) in
                        insert.bind(6, bytes: data)
                        try insert.run()
                    }
                    bytes += size
                }
                for row in touches {
                    touch.bind(1, row)
                    touch.bind(2, now)
                    try touch.run()
                }
                setTotal.bind(1, bytes)
                try setTotal.run()
                try db.execute("COMMIT")
            } catch {
                for statement in [total, existing, deleteOtherVersions, oldest] { statement.reset() }
                try? db.execute("ROLLBACK")
                throw error
            }
        }

        /// Deletes least recently used blocks until `size` more bytes fit; returns the bytes freed.
        private func evict(toFit size: Int64, holding bytes: Int64, capacity: Int64) throws(SQLiteError) -> Int64 {
            var freed: Int64 = 0
            while bytes - freed + size > capacity {
                var victims: [(Int64, Int64)] = []
                while try oldest.step() { victims.append((oldest.integer(0), oldest.integer(1))) }
                oldest.reset()
                if victims.isEmpty { break }
                for (row, rowSize) in victims where bytes - freed + size > capacity {
                    deleteRow.bind(1, row)
                    try deleteRow.run()
                    freed += rowSize
                }
            }
            return freed
        }
    }
}
