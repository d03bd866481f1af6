import CSupervisor
import FileSystem

/// The node log kept in the supervisor's shared memory (issue 40): a worker appends what the
/// kernel's node numbers name (`NodeLog`), and the worker that replaces it after a death reads
/// it back (`recorded`) and takes those numbers over.
///
/// A record: kind of record (1 named, 2 unnamed), the node's kind, the name's length (2 bytes),
/// the node and its parent (8 bytes each), the name; little-endian. The latest record of a
/// number wins. Written under the namespace lock only (one writer at a time).
public final class SupervisorNodeLog: NodeLog, @unchecked Sendable {
    public init() {}

    public func named(_ inode: InodeNumber, parent: InodeNumber, name: String, kind: NodeKind) -> Bool {
        append(1, kind: kind, inode: inode, parent: parent, name: name)
    }

    public func unnamed(_ inode: InodeNumber) {
        _ = append(2, kind: .file, inode: inode, parent: 0, name: "")
    }

    public func restart() { cssp_node_log_restart() }

    private func append(_ type: UInt8, kind: NodeKind, inode: InodeNumber, parent: InodeNumber, name: String) -> Bool {
        var record: [UInt8] = [type, kind.code]
        let nameBytes = Array(name.utf8)
        let length = UInt16(clamping: nameBytes.count)
        record += [UInt8(length & 0xff), UInt8(length >> 8)]
        for value in [inode, parent] {
            for shift in stride(from: 0, to: 64, by: 8) { record.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
        }
        record += nameBytes.prefix(Int(length))
        return record.withUnsafeBytes { cssp_node_log_append($0.baseAddress, $0.count) } == 0
    }

    /// The numbers the log says the kernel holds, with what each names.
    public static func recorded() -> [AdoptedNode] {
        var start: UnsafePointer<UInt8>? = nil
        let count = cssp_node_log_read(&start)
        guard let start, count > 0 else { return [] }
        let bytes = UnsafeBufferPointer(start: start, count: count)
        var latest: [InodeNumber: AdoptedNode?] = [:]
        var offset = 0
        func word(_ at: Int) -> UInt64 {
            (0..<8).reduce(UInt64(0)) { $0 | UInt64(bytes[at + $1]) << UInt64(8 * $1) }
        }
        while offset + 20 <= count {
            let type = bytes[offset]
            let length = Int(bytes[offset + 2]) | Int(bytes[offset + 3]) << 8
            guard offset + 20 + length <= count, let kind = NodeKind(code: bytes[offset + 1]) else { break }
            let inode = word(offset + 4)
            let parent = word(offset + 12)
            let name = String(decoding: bytes[(offset + 20)..<(offset + 20 + length)], as: UTF8.self)
            latest[inode] = type == 1 ? AdoptedNode(inode: inode, parent: parent, name: name, kind: kind) : .some(nil)
            offset += 20 + length
        }
        return latest.values.compactMap { $0 }
    }
}
