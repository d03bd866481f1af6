import CSQLite

/// A failed SQLite call: the result code and SQLite's message.
public struct SQLiteError: Error, CustomStringConvertible {
    public var code: Int32
    public var message: String

    /// The file is not a database or is damaged: the cache must be rebuilt, not retried.
    var isDamage: Bool {
        let primary = code & 0xFF
        return primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB || primary == SQLITE_FORMAT
    }

    public var description: String { "\(message) (SQLite error \(code))" }
}

/// One SQLite connection. Not thread-safe: its owner serialises every use (see `BlockCache`).
final class SQLiteConnection {
    let handle: OpaquePointer

    init(path: String) throws(SQLiteError) {
        var db: OpaquePointer? = nil
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(db)
            throw SQLiteError(code: rc, message: "open \(path): \(message)")
        }
        sqlite3_extended_result_codes(db, 1)
        handle = db
    }

    deinit { sqlite3_close_v2(handle) }

    func error(_ rc: Int32, _ what: String) -> SQLiteError {
        SQLiteError(code: rc, message: "\(what): \(String(cString: sqlite3_errmsg(handle)))")
    }

    /// Runs statements that return no rows we need.
    func execute(_ sql: String) throws(SQLiteError) {
        let rc = sqlite3_exec(handle, sql, nil, nil, nil)
        guard rc == SQLITE_OK else { throw error(rc, sql) }
    }

    /// The first column of the first row of `sql`, as an integer (nil: no row).
    func integer(_ sql: String) throws(SQLiteError) -> Int64? {
        let statement = try prepare(sql)
        guard try statement.step() else { return nil }
        return statement.integer(0)
    }

    func prepare(_ sql: String) throws(SQLiteError) -> SQLiteStatement {
        var statement: OpaquePointer? = nil
        let rc = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard rc == SQLITE_OK, let statement else { throw error(rc, "prepare \(sql)") }
        return SQLiteStatement(statement, connection: self)
    }
}

/// A prepared statement, reused: `reset` after each use.
final class SQLiteStatement {
    let handle: OpaquePointer
    unowned let connection: SQLiteConnection

    init(_ handle: OpaquePointer, connection: SQLiteConnection) {
        self.handle = handle
        self.connection = connection
    }

    deinit { sqlite3_finalize(handle) }

    func bind(_ index: Int32, _ value: Int64) {
        sqlite3_bind_int64(handle, index, value)
    }

    func bind(_ index: Int32, _ value: String) {
        cssp_sqlite3_bind_text_transient(handle, index, value, -1)
    }

    /// Binds a copy of `value`'s UTF-8 bytes as a blob (compared byte for byte).
    func bind(_ index: Int32, blob value: String) {
        var value = value
        value.withUTF8 { bytes in _ = cssp_sqlite3_bind_blob_transient(handle, index, bytes.baseAddress, Int32(bytes.count)) }
    }

    /// Binds a copy of `bytes` as a blob.
    func bind(_ index: Int32, blob bytes: [UInt8]) {
        bytes.withUnsafeBytes { _ = cssp_sqlite3_bind_blob_transient(handle, index, $0.baseAddress, Int32($0.count)) }
    }

    func bind(_ index: Int32, _ value: Double) {
        sqlite3_bind_double(handle, index, value)
    }

    func bindNull(_ index: Int32) {
        sqlite3_bind_null(handle, index)
    }

    /// Binds bytes that stay valid until the statement is reset (no copy).
    func bind(_ index: Int32, bytes: UnsafeRawBufferPointer) {
        sqlite3_bind_blob(handle, index, bytes.baseAddress, Int32(bytes.count), nil)
    }

    /// Advances; true when a row is available.
    func step() throws(SQLiteError) -> Bool {
        let rc = sqlite3_step(handle)
        switch rc {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default: throw connection.error(rc, "step \(String(cString: sqlite3_sql(handle)))")
        }
    }

    /// Steps to completion, then resets.
    func run() throws(SQLiteError) {
        defer { reset() }
        while try step() {}
    }

    func reset() {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    func integer(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }

    func double(_ column: Int32) -> Double { sqlite3_column_double(handle, column) }

    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(handle, column) == SQLITE_NULL }

    /// A blob or text column's bytes as UTF-8 text.
    func blobText(_ column: Int32) -> String {
        let count = Int(sqlite3_column_bytes(handle, column))
        guard count > 0, let pointer = sqlite3_column_blob(handle, column) else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: count), as: UTF8.self)
    }

    func text(_ column: Int32) -> String {
        guard let pointer = sqlite3_column_text(handle, column) else { return "" }
        return String(cString: pointer)
    }
}
