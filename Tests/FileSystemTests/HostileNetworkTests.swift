import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Logging
import ObjectStore
import ObjectStoreTesting
import Testing

@testable import FileSystem

/// Regression tests of the hostile-network issue (issue 10) at the filesystem core.
struct HostileNetworkTests {
    let root = Filesystem.rootInode

    func makeFilesystem(_ store: any ObjectStore, spool: String) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = spool
        configuration.pendingRetrySeconds = 3600
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func write(_ fs: Filesystem, _ handle: UInt64, _ text: String, at offset: Int64 = 0) throws {
        try Array(text.utf8).withUnsafeBytes { try fs.write(handle: handle, offset: offset, bytes: $0) }
    }

    /// Item 2: once a write into the spool failed (a full `cache_dir`), close must not store the
    /// bytes written so far as the whole file. Close reports the error, the previous version
    /// stays, and the bytes are kept in `lost+found/`, not uploaded later.
    @Test func aFileWhoseWriteFailedIsNotStoredAtClose() throws {
        let store = FakeObjectStore()
        let spool = NSTemporaryDirectory() + "cssp-hostile-spool-" + UUID().uuidString
        let fs = makeFilesystem(store, spool: spool)
        defer { fs.shutdown() }
        let f = try fs.storeFile(root, "f", Array("the previous version".utf8))
        let opened = try fs.open(f.inode, writable: true, truncate: true)
        try write(fs, opened.handle, "a new beginning")
        // From now on the spool's writes fail as on a full disk (/dev/full answers ENOSPC).
        let spoolDescriptor = try #require(fs.state.withLock { $0.openFiles[f.inode]?.fd })
        let full = Glibc.open("/dev/full", O_WRONLY)
        #expect(dup2(full, spoolDescriptor) == spoolDescriptor)
        Glibc.close(full)
        let writeError = #expect(throws: FSError.self) { try write(fs, opened.handle, ", and the rest", at: 15) }
        #expect(writeError?.code == .noSpace)
        let closeError = #expect(throws: FSError.self) { try fs.flush(handle: opened.handle) }
        #expect(closeError?.code == .noSpace)
        fs.release(handle: opened.handle)
        #expect(store.object("f")?.bytes == Array("the previous version".utf8))
        #expect(fs.state.withLock { $0.openFiles[f.inode] } == nil, "the spool is kept for an upload")
        let kept = (try? FileManager.default.contentsOfDirectory(atPath: spool + "/lost+found")) ?? []
        #expect(kept.count == 1, "the bytes written are not kept aside")
        #expect(!((try? FileManager.default.contentsOfDirectory(atPath: spool)) ?? []).contains { $0.hasSuffix(".pending") })
    }
}
