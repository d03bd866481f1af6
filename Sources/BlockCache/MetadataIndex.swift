import CSQLite
import Locking
import Logging
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

/// What HEADs said about objects other tools wrote, kept across mounts (issue 38): a SQLite
/// table in `cache_dir` (`meta.db`), one row per key, with the version (ETag and listed time)
/// the answer belongs to. A mount asks it before it HEADs such an object, so an unchanged
/// object needs no HEAD again after a remount or a crash.
///
/// Subtleties:
/// 1. The index never decides what is current: a row is an answer for one version, and the
///    caller uses it only when a listing shows that same ETag and time. A stale row is
///    harmless, and a row of another store never matches (rows are per `identity`).
/// 2. Writes are batched: `record` and `forget` go to a table in memory, which `flush` (the
///    filesystem calls it a second after the first change, and at unmount) writes in one
///    transaction. `lookup` sees them at once. A crash loses at most the unflushed answers,
///    which cost a HEAD again.
/// 3. Bounded: past `rowLimit` rows at open, the index starts empty (a few hundred bytes a row).
/// 4. A file that is not our index (damaged, another layout) is deleted and made again with a
///    warning; any later SQLite failure disables the index for this mount (a miss, never an
///    error a program sees). Only the mounting user may read it (mode 0600: it holds names).
/// 5. Two connections: lookups read with one (under `state`), a flush writes with the other
///    (under `writer`), so a flush never holds up a lookup. SQLite's own locking (WAL,
///    busy_timeout) lets two mounts share a cache directory.
public final class MetadataIndex: Sendable {
    /// A HEAD's answer about one version of an object, and the time the listing showed when
    /// it was taken (ns since the epoch; the HEAD's own whole-second time when no listing was at
    /// hand). The version is `info.etag`.
    public struct Record: Sendable, Equatable {
        public var info: ObjectInfo
        public var listed: Int64

        public init(_ info: ObjectInfo, listed: Int64) {
            self.info = info
            self.listed = listed
        }
    }

    static let rowLimit: Int64 = 1_000_000
    static let schemaVersion: Int64 = 1

    /// Changes by the key's bytes: a record, or nil for a key forgotten.
    typealias Changes = [[UInt8]: Record?]

    private struct State {
        /// The connection `lookup` reads with (nil once the index failed) and its statement.
        var reader: SQLiteConnection?
        var select: SQLiteStatement?
        var store: Int64 = 0
        /// Changes not written yet, and prefixes forgotten (their bytes).
        var pending: Changes = [:]
        var forgottenPrefixes: [[UInt8]] = []
        /// Changes a flush is writing now (seen by `lookup` until they are committed).
        var writing: Changes = [:]
        var writingPrefixes: [[UInt8]] = []
        /// Whether the caller was told to flush and the flush has not started yet.
        var flushDue = false

        /// A change was kept: whether the caller is to schedule a flush (once per batch).
        mutating func due() -> Bool {
            defer { flushDue = true }
            return !flushDue
        }

        /// What the changes not committed yet say of `key` (`.some(nil)`: forgotten), newest
        /// first; nil when they say nothing.
        func unwritten(_ key: [UInt8]) -> Record?? {
            if let change = pending[key] { return change }
            if forgottenPrefixes.contains(where: { key.starts(with: $0) }) { return .some(nil) }
            if let change = writing[key] { return change }
            if writingPrefixes.contains(where: { key.starts(with: $0) }) { return .some(nil) }
            return nil
        }
    }

    /// Guards the reading connection (a point SELECT runs under it), its statement and the
    /// changes not committed yet. Never held while the writer writes.
    private let state: Locked<State>
    /// The writing connection, used by one flush at a time under this lock (subtlety 2).
    private let writer: Locked<SQLiteConnection?>
    private let logger: Logger
    private let path: String

    /// Opens (or makes) the index at `path` for the store named `identity`; nil, with a warning,
    /// if it cannot be used (the mount then HEADs as if it were empty).
    public static func open(path: String, identity: String, logger: Logger) -> MetadataIndex? {
        if let problem = BlockCache.makeDirectories(holding: path) {
            logger.warning("metadata index directory \(problem): other tools' objects are HEADed at every mount")
            return nil
        }
        do {
            return try MetadataIndex(path: path, identity: identity, logger: logger)
        } catch where error.isDamage || error.code == SQLITE_SCHEMA {
            logger.warning("metadata index \(path) is damaged (\(error)): making it again")
        } catch {
            logger.warning("metadata index \(path) cannot be used, other tools' objects are HEADed again: \(error)")
            return nil
        }
        BlockCache.removeFiles(path)
        do {
            return try MetadataIndex(path: path, identity: identity, logger: logger)
        } catch {
            logger.warning("metadata index \(path) cannot be made again: \(error)")
            return nil
        }
    }

    private init(path: String, identity: String, logger: Logger) throws(SQLiteError) {
        self.path = path
        self.logger = logger
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        if fd >= 0 {
            fchmod(fd, 0o600)
            close(fd)
        }
        let connection = try SQLiteConnection(path: path)
        try connection.execute("PRAGMA busy_timeout=5000")
        let version = try connection.integer("PRAGMA user_version") ?? 0
        let tables = try connection.integer("SELECT count(*) FROM sqlite_master WHERE type = 'table'") ?? 0
        if tables > 0 && version != Self.schemaVersion {
            throw SQLiteError(code: SQLITE_SCHEMA, message: "another layout (version \(version))")
        }
        try connection.execute(
            """
            PRAGMA journal_mode=WAL;
            PRAGMA synchronous=NORMAL;
            CREATE TABLE IF NOT EXISTS stores(id INTEGER PRIMARY KEY, identity BLOB UNIQUE NOT NULL);
            CREATE TABLE IF NOT EXISTS heads(
                store INTEGER NOT NULL, key BLOB NOT NULL, etag TEXT NOT NULL, listed INTEGER NOT NULL,
                size INTEGER NOT NULL, content_type TEXT NOT NULL, modified REAL NOT NULL,
                metadata BLOB NOT NULL, manifest TEXT,
                PRIMARY KEY(store, key)) WITHOUT ROWID;
            PRAGMA user_version=\(Self.schemaVersion);
            """)
        if let rows = try connection.integer("SELECT count(*) FROM heads"), rows > Self.rowLimit {
            logger.notice("metadata index \(path) holds \(rows) answers: starting it empty")
            try connection.execute("DELETE FROM heads")
        }
        let insert = try connection.prepare("INSERT OR IGNORE INTO stores(identity) VALUES(?)")
        insert.bind(1, blob: identity)
        try insert.run()
        let find = try connection.prepare("SELECT id FROM stores WHERE identity = ?")
        find.bind(1, blob: identity)
        guard try find.step() else { throw SQLiteError(code: SQLITE_ERROR, message: "no id for the store") }
        var initial = State(reader: connection)
        initial.store = find.integer(0)
        find.reset()
        initial.select = try connection.prepare(
            "SELECT etag, listed, size, content_type, modified, metadata, manifest FROM heads WHERE store = ? AND key = ?")
        state = Locked(initial)
        let writing = try SQLiteConnection(path: path)
        try writing.execute("PRAGMA busy_timeout=5000; PRAGMA synchronous=NORMAL")
        writer = Locked(writing)
    }

    /// Keeps `record` as the answer for its key (written by the next `flush`). Returns whether
    /// the caller is to schedule a flush (the first change since the last flush began).
    @discardableResult
    public func record(_ record: Record) -> Bool {
        state.withLock { s in
            guard s.reader != nil else { return false }
            s.pending[Array(record.info.key.utf8)] = .some(record)
            return s.due()
        }
    }

    /// Forgets what was recorded for `keys` and for every key below `prefixes`.
    @discardableResult
    public func forget(keys: [String], prefixes: [String]) -> Bool {
        state.withLock { s in
            guard s.reader != nil, !(keys.isEmpty && prefixes.isEmpty) else { return false }
            for key in keys { s.pending[Array(key.utf8)] = .some(nil) }
            for prefix in prefixes {
                let bytes = Array(prefix.utf8)
                s.pending = s.pending.filter { !$0.key.starts(with: bytes) }
                s.forgottenPrefixes.append(bytes)
            }
            return s.due()
        }
    }

    /// What is recorded for each of `keys`, in their order (nil: nothing).
    public func lookup(_ keys: [String]) -> [Record?] {
        state.withLock { s in
            guard let select = s.select else { return keys.map { _ in nil } }
            var found: [Record?] = []
            found.reserveCapacity(keys.count)
            for key in keys {
                if let change = s.unwritten(Array(key.utf8)) {
                    found.append(change)
                    continue
                }
                do throws(SQLiteError) {
                    defer { select.reset() }
                    select.bind(1, s.store)
                    select.bind(2, blob: key)
                    guard try select.step() else {
                        found.append(nil)
                        continue
                    }
                    let info = ObjectInfo(
                        key: key, size: select.integer(2), etag: select.text(0), contentType: select.text(3),
                        lastModified: select.double(4), metadata: Self.decode(select.blobText(5)),
                        manifest: select.isNull(6) ? nil : select.text(6))
                    found.append(Record(info, listed: select.integer(1)))
                } catch {
                    disable(&s, error)
                    return keys.map { _ in nil }
                }
            }
            return found
        }
    }

    /// Writes the changes kept since the last flush, in one transaction, on the writing
    /// connection: lookups meanwhile read the committed rows and the changes being written.
    public func flush() {
        writer.withLock { connection in
            guard let writing = connection else { return }
            let batch: (changes: Changes, prefixes: [[UInt8]], store: Int64)? = state.withLock { s in
                s.flushDue = false
                guard s.reader != nil, !(s.pending.isEmpty && s.forgottenPrefixes.isEmpty) else { return nil }
                (s.writing, s.writingPrefixes) = (s.pending, s.forgottenPrefixes)
                (s.pending, s.forgottenPrefixes) = ([:], [])
                return (s.writing, s.writingPrefixes, s.store)
            }
            guard let batch else { return }
            do throws(SQLiteError) {
                try Self.write(batch.changes, forgetting: batch.prefixes, store: batch.store, on: writing)
                state.withLock { s in (s.writing, s.writingPrefixes) = ([:], []) }
            } catch where [SQLITE_BUSY, SQLITE_LOCKED].contains(error.code & 0xFF) {
                // Another mount sharing cache_dir writes: the batch waits for the next flush.
                state.withLock { s in
                    s.pending.merge(s.writing) { newer, _ in newer }
                    s.forgottenPrefixes = s.writingPrefixes + s.forgottenPrefixes
                    (s.writing, s.writingPrefixes) = ([:], [])
                }
            } catch {
                connection = nil
                state.withLock { disable(&$0, error) }
            }
        }
    }

    private static func write(
        _ changes: Changes, forgetting prefixes: [[UInt8]], store: Int64, on connection: SQLiteConnection
    ) throws(SQLiteError) {
        try connection.execute("BEGIN IMMEDIATE")
        do throws(SQLiteError) {
            let upsert = try connection.prepare(
                """
                INSERT OR REPLACE INTO heads(store, key, etag, listed, size, content_type, modified, metadata, manifest)
                VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)
                """)
            let delete = try connection.prepare("DELETE FROM heads WHERE store = ? AND key = ?")
            let deleteBelow = try connection.prepare("DELETE FROM heads WHERE store = ? AND key >= ? AND key < ?")
            for prefix in prefixes {
                deleteBelow.bind(1, store)
                deleteBelow.bind(2, blob: prefix)
                deleteBelow.bind(3, blob: prefix + [0xFF])  // no UTF-8 key holds the byte 0xFF
                try deleteBelow.run()
            }
            for (key, change) in changes {
                guard let record = change else {
                    delete.bind(1, store)
                    delete.bind(2, blob: key)
                    try delete.run()
                    continue
                }
                upsert.bind(1, store)
                upsert.bind(2, blob: key)
                upsert.bind(3, record.info.etag)
                upsert.bind(4, record.listed)
                upsert.bind(5, record.info.size)
                upsert.bind(6, record.info.contentType)
                upsert.bind(7, record.info.lastModified)
                upsert.bind(8, blob: encode(record.info.metadata))
                if let manifest = record.info.manifest { upsert.bind(9, manifest) } else { upsert.bindNull(9) }
                try upsert.run()
            }
            try connection.execute("COMMIT")
        } catch {
            try? connection.execute("ROLLBACK")
            throw error
        }
    }

    /// Rows kept for this store (tests, `--stats`).
    public func count() -> Int {
        flush()
        return state.withLock { s in
            guard let connection = s.reader else { return 0 }
            let statement = try? connection.prepare("SELECT count(*) FROM heads WHERE store = \(s.store)")
            guard let statement, (try? statement.step()) == true else { return 0 }
            return Int(statement.integer(0))
        }
    }

    private func disable(_ s: inout State, _ error: SQLiteError) {
        logger.warning("metadata index \(path) failed (\(error)): other tools' objects are HEADed again for this mount")
        s.select = nil
        s.reader = nil
        (s.pending, s.forgottenPrefixes, s.writing, s.writingPrefixes) = ([:], [], [:], [])
        if error.isDamage { BlockCache.removeFiles(path) }
    }

    /// Metadata as `name NUL value NUL` pairs (header names and values hold no NUL).
    static func encode(_ metadata: [String: String]) -> String {
        metadata.sorted { $0.key < $1.key }.map { $0.key + "\u{0}" + $0.value + "\u{0}" }.joined()
    }

    static func decode(_ text: String) -> [String: String] {
        var metadata: [String: String] = [:]
        var name: Substring.UTF8View? = nil
        var start = text.utf8.startIndex
        for index in text.utf8.indices where text.utf8[index] == 0 {
            let part = text.utf8[start..<index]
            if let pending = name {
                metadata[String(Substring(pending))] = String(Substring(part))
                name = nil
            } else {
                name = part
            }
            start = text.utf8.index(after: index)
        }
        return metadata
    }
}
