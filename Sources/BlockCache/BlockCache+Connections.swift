import CSQLite
import Dispatch
import Locking
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// The SQLite connections of a block cache: readers (one thread each at a time) and the one
// writer, with their prepared statements.
extension BlockCache {
    /// A connection for reads, with its statements. Used by one thread at a time (taken from `readers`).
    final class ReadConnection: @unchecked Sendable {
        let db: SQLiteConnection
        let findRow: SQLiteStatement
        let rowExists: SQLiteStatement
        let count: SQLiteStatement

        init(path: String) throws(SQLiteError) {
            db = try SQLiteConnection(path: path)
            try db.execute("PRAGMA busy_timeout=5000; PRAGMA cache_size=-1024")
            findRow = try db.prepare("SELECT id, etag, size, used, slot FROM blocks WHERE name=?1 AND idx=?2")
            rowExists = try db.prepare("SELECT 1 FROM blocks WHERE id=?1 AND size>=0")
            count = try db.prepare("SELECT count(*), coalesce(sum(size), 0) FROM blocks WHERE size>=0")
        }

        /// The row of a block of the right version holding at least `upTo` bytes.
        func find(_ object: Object, index: Int64, upTo: Int) throws(SQLiteError) -> (row: Int64, used: Int64, slot: Int64)? {
            defer { findRow.reset() }
            findRow.bind(1, object.name)
            findRow.bind(2, index)
            guard try findRow.step(), findRow.text(1) == object.etag, findRow.integer(2) >= Int64(upTo),
                findRow.integer(2) >= 0
            else { return nil }
            return (findRow.integer(0), findRow.integer(3), findRow.integer(4))
        }

        func exists(_ row: Int64) throws(SQLiteError) -> Bool {
            defer { rowExists.reset() }
            rowExists.bind(1, row)
            return try rowExists.step()
        }

        func statistics() throws(SQLiteError) -> (Int64, Int64) {
            defer { count.reset() }
            guard try count.step() else { return (0, 0) }
            return (count.integer(0), count.integer(1))
        }
    }

    /// The one connection that writes, with its statements. Used only on `writerQueue`.
    final class WriteConnection: @unchecked Sendable {
        let db: SQLiteConnection
        let setting: SQLiteStatement
        let setSetting: SQLiteStatement
        let existing: SQLiteStatement
        let deleteRow: SQLiteStatement
        let deleteOtherVersions: SQLiteStatement
        let oldest: SQLiteStatement
        let takeFree: SQLiteStatement
        let addFree: SQLiteStatement
        let insert: SQLiteStatement
        let finishRow: SQLiteStatement
        let touch: SQLiteStatement
        /// This boot, recorded with every change.
        var boot = ""

        init(_ db: SQLiteConnection) throws(SQLiteError) {
            self.db = db
            setting = try db.prepare("SELECT value FROM settings WHERE name=?1")
            setSetting = try db.prepare("UPDATE settings SET value=?2 WHERE name=?1")
            existing = try db.prepare("SELECT id, etag, size, used, slot FROM blocks WHERE name=?1 AND idx=?2")
            deleteRow = try db.prepare("DELETE FROM blocks WHERE id=?1 RETURNING slot")
            deleteOtherVersions = try db.prepare(
                "DELETE FROM blocks WHERE name=?1 AND etag<>?2 AND (size>=0 OR used<?3) RETURNING slot")
            oldest = try db.prepare("SELECT id FROM blocks WHERE size>=0 OR used<?1 ORDER BY used LIMIT 1")
            takeFree = try db.prepare("DELETE FROM free WHERE slot=(SELECT min(slot) FROM free) RETURNING slot")
            addFree = try db.prepare("INSERT OR IGNORE INTO free(slot) VALUES(?1)")
            insert = try db.prepare("INSERT INTO blocks(name, idx, etag, size, used, slot) VALUES(?1, ?2, ?3, -1, ?4, ?5)")
            finishRow = try db.prepare("UPDATE blocks SET size=?2 WHERE id=?1")
            touch = try db.prepare("UPDATE blocks SET used=?2 WHERE id=?1")
        }

        func integerSetting(_ name: String) throws(SQLiteError) -> Int64 {
            defer { setting.reset() }
            setting.bind(1, name)
            return try setting.step() ? setting.integer(0) : 0
        }

        func textSetting(_ name: String) throws(SQLiteError) -> String {
            defer { setting.reset() }
            setting.bind(1, name)
            return try setting.step() ? setting.text(0) : ""
        }

        func set(_ name: String, _ value: Int64) throws(SQLiteError) {
            setSetting.bind(1, name)
            setSetting.bind(2, value)
            try setSetting.run()
        }

        func set(_ name: String, _ value: String) throws(SQLiteError) {
            setSetting.bind(1, name)
            setSetting.bind(2, value)
            try setSetting.run()
        }

        func transaction<T>(_ body: () throws(SQLiteError) -> T) throws(SQLiteError) -> T {
            try db.execute("BEGIN IMMEDIATE")
            do throws(SQLiteError) {
                let result = try body()
                try db.execute("COMMIT")
                return result
            } catch {
                for statement in [setting, existing, deleteRow, deleteOtherVersions, oldest, takeFree] { statement.reset() }
                try? db.execute("ROLLBACK")
                throw error
            }
        }

        /// At open: blocks of another size, a cache changed in an earlier boot and not synced
        /// since, and slots beyond this cap go (subtleties 4 and 5).
        func open(slots: Int64, blockSize: Int64, data: Int32, boot: String, logger: Logger, path: String)
            throws(SQLiteError)
        {
            self.boot = boot
            try transaction { () throws(SQLiteError) in
                let previousBoot = try textSetting("boot")
                let clean = try integerSetting("clean")
                let unsynced = previousBoot != boot && clean == 0
                if try integerSetting("block_size") != blockSize || unsynced {
                    if unsynced {
                        logger.notice("block cache \(path) was changed before a restart and not synced since: starting empty")
                    }
                    try db.execute("DELETE FROM blocks; DELETE FROM free; UPDATE settings SET value=0 WHERE name='slots'")
                    try set("block_size", blockSize)
                    try set("clean", 1)
                }
                if try integerSetting("slots") > slots {
                    try db.execute("DELETE FROM blocks WHERE slot>=\(slots); DELETE FROM free WHERE slot>=\(slots)")
                    try set("slots", slots)
                }
            }
            var st = stat()
            if fstat(data, &st) == 0 && Int64(st.st_size) > slots * blockSize { ftruncate(data, off_t(slots * blockSize)) }
        }

        /// The changes counter (see `markClean`).
        func changes() throws(SQLiteError) -> Int64 { try integerSetting("changes") }

        func markClean(ifChanges changes: Int64) throws(SQLiteError) {
            try transaction { () throws(SQLiteError) in
                if try integerSetting("changes") == changes { try set("clean", 1) }
            }
        }

        /// Every change that makes bytes readable marks the cache unsynced, in this boot.
        func changed() throws(SQLiteError) {
            try set("changes", try integerSetting("changes") + 1)
            try set("clean", 0)
            try set("boot", boot)
        }

        /// Transaction one of subtlety 2: frees what must go and records a pending row and slot for
        /// each block not cached yet. Returns (position in `blocks`, row, slot) of each.
        func reserve(
            _ blocks: [(name: String, index: Int64, etag: String, size: Int)], touches: Set<Int64>, slots: Int64, now: Int64
        ) throws(SQLiteError) -> [(Int, Int64, Int64)] {
            try transaction { () throws(SQLiteError) -> [(Int, Int64, Int64)] in
                var highWater = try integerSetting("slots")
                let abandoned = now - BlockCache.abandonedAfter
                var planned: [(Int, Int64, Int64)] = []
                var purged: Set<String> = []
                func free(_ statement: SQLiteStatement) throws(SQLiteError) {
                    defer { statement.reset() }
                    while try statement.step() {
                        addFree.bind(1, statement.integer(0))
                        try addFree.run()
                    }
                }
                for (position, block) in blocks.enumerated() {
                    existing.bind(1, block.name)
                    existing.bind(2, block.index)
                    let found = try existing.step()
                        ? (row: existing.integer(0), etag: existing.text(1), size: existing.integer(2), used: existing.integer(3))
                        : nil
                    existing.reset()
                    if let found {
                        if found.etag == block.etag && found.size >= Int64(block.size) { continue }
                        // Another writer (another mount) is storing it right now.
                        if found.size < 0 && found.used >= abandoned { continue }
                        deleteRow.bind(1, found.row)
                        try free(deleteRow)
                    }
                    if purged.insert(block.name + "\n" + block.etag).inserted {
                        deleteOtherVersions.bind(1, block.name)
                        deleteOtherVersions.bind(2, block.etag)
                        deleteOtherVersions.bind(3, abandoned)
                        try free(deleteOtherVersions)
                    }
                    var slot: Int64? = nil
                    if try takeFree.step() { slot = takeFree.integer(0) }
                    takeFree.reset()
                    if slot == nil && highWater < slots {
                        slot = highWater
                        highWater += 1
                    }
                    if slot == nil {
                        // Full: the least recently used block gives up its slot.
                        oldest.bind(1, abandoned)
                        let victim = try oldest.step() ? oldest.integer(0) : nil
                        oldest.reset()
                        guard let victim else { continue }
                        deleteRow.bind(1, victim)
                        defer { deleteRow.reset() }
                        if try deleteRow.step() { slot = deleteRow.integer(0) }
                    }
                    guard let slot else { continue }
                    insert.bind(1, block.name)
                    insert.bind(2, block.index)
                    insert.bind(3, block.etag)
                    insert.bind(4, now)
                    insert.bind(5, slot)
                    try insert.run()
                    planned.append((position, sqlite3_last_insert_rowid(db.handle), slot))
                }
                for row in touches {
                    touch.bind(1, row)
                    touch.bind(2, now)
                    try touch.run()
                }
                try set("slots", highWater)
                return planned
            }
        }

        /// Transaction two of subtlety 2: the written blocks become readable; the rest go.
        func finish(_ written: [(row: Int64, size: Int)], lost: [Int64]) throws(SQLiteError) {
            try transaction { () throws(SQLiteError) in
                for (row, size) in written {
                    finishRow.bind(1, row)
                    finishRow.bind(2, Int64(size))
                    try finishRow.run()
                }
                for row in lost {
                    deleteRow.bind(1, row)
                    defer { deleteRow.reset() }
                    while try deleteRow.step() {
                        addFree.bind(1, deleteRow.integer(0))
                        try addFree.run()
                    }
                }
                try changed()
            }
        }
    }
}
