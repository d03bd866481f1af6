import CSupervisor
import FileSystem

/// The node log kept in the supervisor's shared memory (issue 40): a worker appends what the
/// kernel's node numbers name (`NodeLog`), and the worker that replaces it after a death reads
/// it back (`recorded`) and takes those numbers over.
///
/// A record (`LogRecord`): kind of record (1 named, 2 unnamed), the node's kind, the node and its
/// parent, the name. The latest record of a number wins. Written under the namespace lock only
/// (one writer at a time).
public final class SupervisorNodeLog: NodeLog, @unchecked Sendable {
    public init() {}

    public func named(_ inode: InodeNumber, parent: InodeNumber, name: String, kind: NodeKind) -> Bool {
        var record = LogRecord(type: 1)
        record.byte(kind.code)
        record.word(inode)
        record.word(parent)
        record.text(name)
        return record.append(to: cssp_node_log_append)
    }

    public func unnamed(_ inode: InodeNumber) {
        var record = LogRecord(type: 2)
        record.byte(NodeKind.file.code)
        record.word(inode)
        record.word(0)
        record.text("")
        _ = record.append(to: cssp_node_log_append)
    }

    public func restart() { cssp_node_log_restart() }

    public func commit(_ complete: Bool) { cssp_node_log_commit(complete ? 1 : 0) }

    /// Whether the supervisor mapped the log (it says so in its log when it could not).
    public static var isAvailable: Bool { LogRecord.isAvailable(cssp_node_log_append) }

    /// The numbers the log says the kernel holds, with what each names.
    public static func recorded() -> [AdoptedNode] {
        var latest: [InodeNumber: AdoptedNode?] = [:]
        LogRecord.read(cssp_node_log_read) { type, fields in
            guard let kind = fields.byte().flatMap(NodeKind.init(code:)), let inode = fields.word(), let parent = fields.word(),
                let name = fields.text()
            else { return false }
            latest[inode] = type == 1 ? AdoptedNode(inode: inode, parent: parent, name: name, kind: kind) : .some(nil)
            return true
        }
        return latest.values.compactMap { $0 }
    }
}

/// The handle log kept in the supervisor's shared memory (issue 40): the file handles the
/// kernel holds (`HandleLog`), which the worker that replaces a dead one takes over
/// (`recorded`). A record: 1 (a reader of a stored version) with the handle, node, size, key,
/// ETag and manifest (empty: none); 3 (a handle on a spool) with the same, then whether it
/// writes, whether the spool was dirty, the spool's path, content type, the time recorded
/// (seconds, nanoseconds) and the metadata headers (a count, then name and value each); or 2
/// (released) with the handle. Written under the files lock only.
public final class SupervisorHandleLog: HandleLog, @unchecked Sendable {
    public init() {}

    public func opened(_ handle: UInt64, _ adopted: AdoptedHandle) -> Bool {
        var record = LogRecord(type: adopted.spool == nil ? 1 : 3)
        record.word(handle)
        record.word(adopted.inode)
        record.word(UInt64(bitPattern: adopted.size))
        record.text(adopted.key)
        record.text(adopted.etag)
        record.text(adopted.manifest ?? "")
        if let spool = adopted.spool {
            record.byte(spool.writable ? 1 : 0)
            record.byte(spool.dirty ? 1 : 0)
            record.text(spool.path)
            record.text(spool.contentType)
            record.word(UInt64(bitPattern: spool.recordedAt.seconds))
            record.word(UInt64(UInt32(bitPattern: spool.recordedAt.nanoseconds)))
            record.word(UInt64(spool.metadata.count))
            for (name, value) in spool.metadata.sorted(by: { $0.key < $1.key }) {
                record.text(name)
                record.text(value)
            }
        }
        return record.append(to: cssp_handle_log_append)
    }

    public func released(_ handle: UInt64) {
        var record = LogRecord(type: 2)
        record.word(handle)
        _ = record.append(to: cssp_handle_log_append)
    }

    public func restart() { cssp_handle_log_restart() }

    public func commit(_ complete: Bool) { cssp_handle_log_commit(complete ? 1 : 0) }

    /// Whether the supervisor mapped the log (it says so in its log when it could not).
    public static var isAvailable: Bool { LogRecord.isAvailable(cssp_handle_log_append) }

    /// The handles the log says the kernel holds, by number.
    public static func recorded() -> [UInt64: AdoptedHandle] {
        var latest: [UInt64: AdoptedHandle] = [:]
        LogRecord.read(cssp_handle_log_read) { type, fields in
            guard let handle = fields.word() else { return false }
            if type == 2 {
                latest[handle] = nil
                return true
            }
            guard let inode = fields.word(), let size = fields.word(), let key = fields.text(), let etag = fields.text(),
                let manifest = fields.text()
            else { return false }
            var adopted = AdoptedHandle(
                inode: inode, key: key, size: Int64(bitPattern: size), etag: etag, manifest: manifest.isEmpty ? nil : manifest)
            if type == 3 {
                guard let writable = fields.byte(), let dirty = fields.byte(), let path = fields.text(),
                    let contentType = fields.text(), let seconds = fields.word(), let nanoseconds = fields.word(),
                    let count = fields.word()
                else { return false }
                var metadata: [String: String] = [:]
                for _ in 0..<count {
                    guard let name = fields.text(), let value = fields.text() else { return false }
                    metadata[name] = value
                }
                adopted.spool = AdoptedSpool(
                    path: path, writable: writable != 0, dirty: dirty != 0, contentType: contentType, metadata: metadata,
                    recordedAt: Timestamp(seconds: Int64(bitPattern: seconds), nanoseconds: Int32(truncatingIfNeeded: nanoseconds)))
            }
            latest[handle] = adopted
            return true
        }
        return latest
    }
}

/// The supervisor's two logs as a whole.
public enum SupervisorLogs {
    /// Maps the logs in this process, as the supervisor does before its first worker (unit
    /// tests of the logs). Whether they are mapped.
    public static func mapForTesting() -> Bool { cssp_logs_map_for_testing() == 0 }

    /// What the supervisor does before it starts a worker: appends go to the log a successor
    /// reads (the dead worker may have died in the middle of a rewrite).
    public static func settle() { cssp_logs_settle() }
}

/// One record of a shared log: its length (4 bytes), its type (1 byte), then fields: bytes,
/// words (8 bytes) and texts (length in 2 bytes, then UTF-8); little-endian.
struct LogRecord {
    private var bytes: [UInt8] = [0, 0, 0, 0]

    init(type: UInt8) { bytes.append(type) }

    /// Whether the log `append` writes to exists (appending nothing changes nothing).
    static func isAvailable(_ append: (UnsafeRawPointer?, Int) -> Int32) -> Bool {
        var none: UInt8 = 0
        return append(&none, 0) == 0
    }

    mutating func byte(_ value: UInt8) { bytes.append(value) }

    mutating func word(_ value: UInt64) {
        for shift in stride(from: 0, to: 64, by: 8) { bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }

    mutating func text(_ value: String) {
        let utf8 = Array(value.utf8.prefix(Int(UInt16.max)))
        bytes += [UInt8(utf8.count & 0xff), UInt8(utf8.count >> 8)]
        bytes += utf8
    }

    /// Appends the record with `append` (a `cssp_*_log_append`): whether there was room.
    mutating func append(to append: (UnsafeRawPointer?, Int) -> Int32) -> Bool {
        let count = UInt32(bytes.count)
        for i in 0..<4 { bytes[i] = UInt8(truncatingIfNeeded: count >> UInt32(8 * i)) }
        return bytes.withUnsafeBytes { append($0.baseAddress, $0.count) } == 0
    }

    /// The fields of one record, read in the order they were written (nil past its end).
    struct Fields {
        let bytes: UnsafeBufferPointer<UInt8>
        var offset: Int
        let end: Int

        mutating func byte() -> UInt8? {
            guard offset < end else { return nil }
            defer { offset += 1 }
            return bytes[offset]
        }

        mutating func word() -> UInt64? {
            guard offset + 8 <= end else { return nil }
            defer { offset += 8 }
            return (0..<8).reduce(UInt64(0)) { $0 | UInt64(bytes[offset + $1]) << UInt64(8 * $1) }
        }

        mutating func text() -> String? {
            guard offset + 2 <= end else { return nil }
            let length = Int(bytes[offset]) | Int(bytes[offset + 1]) << 8
            guard offset + 2 + length <= end else { return nil }
            defer { offset += 2 + length }
            return String(decoding: bytes[(offset + 2)..<(offset + 2 + length)], as: UTF8.self)
        }
    }

    /// Hands each record of the log `read` (a `cssp_*_log_read`) to `body` with its type, oldest
    /// first, until `body` returns false (a record it cannot read) or the log ends.
    static func read(
        _ read: (UnsafeMutablePointer<UnsafePointer<UInt8>?>?) -> Int, _ body: (UInt8, inout Fields) -> Bool
    ) {
        var start: UnsafePointer<UInt8>? = nil
        let count = read(&start)
        guard let start, count > 0 else { return }
        let bytes = UnsafeBufferPointer(start: start, count: count)
        var offset = 0
        while offset + 5 <= count {
            let length = (0..<4).reduce(0) { $0 | Int(bytes[offset + $1]) << (8 * $1) }
            guard length >= 5, offset + length <= count else { return }
            var fields = Fields(bytes: bytes, offset: offset + 5, end: offset + length)
            guard body(bytes[offset + 4], &fields) else { return }
            offset += length
        }
    }
}
