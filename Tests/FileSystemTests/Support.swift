import Foundation
import Locking
import ObjectStore
import ObjectStoreTesting

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// A directory below the system's temporary directory, removed with everything in it when the
/// test that made it ends (Swift Testing makes a new suite value per test).
final class TemporaryDirectory: Sendable {
    let path: String

    init(_ prefix: String) { path = TestScratch.directory + prefix + "-" + UUID().uuidString }

    /// A new path below it (not created).
    func child(_ name: String) -> String { path + "/" + name + "-" + UUID().uuidString }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

extension Filesystem {
    /// Opens `inode` read-only and reads it to the end in `chunk`-sized reads, as a program would.
    func readWhole(_ inode: InodeNumber, chunk: Int) throws -> [UInt8] {
        let opened = try open(inode, writable: false, truncate: false)
        defer { release(handle: opened.handle) }
        var bytes: [UInt8] = []
        while true {
            var got = 0
            try read(handle: opened.handle, offset: Int64(bytes.count), length: chunk) { piece in
                got = piece.count
                bytes.append(contentsOf: piece)
            }
            if got == 0 { return bytes }
        }
    }

    /// One read of an open handle: the bytes it answered (empty at EOF).
    func readBytes(_ handle: UInt64, offset: Int64, length: Int) throws -> [UInt8] {
        var bytes: [UInt8] = []
        try read(handle: handle, offset: offset, length: length) { bytes.append(contentsOf: $0) }
        return bytes
    }

    /// Every name readdir shows in `inode` (without . and ..), in the order shown, in batches
    /// of `batch` entries a call as the kernel asks.
    func names(in inode: InodeNumber, batch: Int = .max) throws -> [String] {
        let handle = try opendir(inode)
        defer { releasedir(handle: handle) }
        var result: [String] = []
        var offset: Int64 = 0
        while true {
            var count = 0
            try readdir(inode, handle: handle, offset: offset) { name, _, _, next in
                guard count < batch else { return false }
                count += 1
                offset = next
                if name != "." && name != ".." { result.append(name) }
                return true
            }
            if count == 0 { return result }
        }
    }

    /// Opens `inode` with O_TRUNC, writes `bytes` and closes it, as `cp` over a file would.
    func overwrite(_ inode: InodeNumber, _ bytes: [UInt8]) throws {
        let opened = try open(inode, writable: true, truncate: true)
        try bytes.withUnsafeBytes { try write(handle: opened.handle, offset: 0, bytes: $0) }
        try flush(handle: opened.handle)
        release(handle: opened.handle)
    }

    /// The content of `name` in `parent`, as text.
    func text(_ parent: InodeNumber, _ name: String) throws -> String {
        String(decoding: try readWhole(try lookup(parent: parent, name: name).inode, chunk: 1 << 16), as: UTF8.self)
    }

    /// Creates `name` in `parent`, writes `bytes` and closes it (stored at close), as `cp` would.
    @discardableResult
    func storeFile(
        _ parent: InodeNumber, _ name: String, _ bytes: [UInt8], mode: UInt16 = 0o644,
        caller: Caller = Caller(uid: 1000, gid: 100)
    ) throws -> Attributes {
        let (attributes, opened) = try create(parent: parent, name: name, mode: mode, caller: caller)
        try bytes.withUnsafeBytes { try write(handle: opened.handle, offset: 0, bytes: $0) }
        try flush(handle: opened.handle)
        release(handle: opened.handle)
        return attributes
    }
}

/// A store over `wrapped` that records the key of every call of `operation`, in order.
func recordingCalls(of operation: FaultInjectingStore.Call.Operation, in wrapped: any ManifestStore)
    -> (store: FaultInjectingStore, keys: Locked<[String]>)
{
    let keys = Locked<[String]>([])
    let store = FaultInjectingStore(wrapped) { call in
        if call.operation == operation { keys.withLock { $0.append(call.key) } }
        return .none
    }
    return (store, keys)
}

extension EntryTable {
    /// A table of these entries (keys of any prefix: they are kept whole where they differ).
    init(_ entries: [DirectoryEntry]) { self.init(PackedEntries(prefix: "", entries)) }
}
