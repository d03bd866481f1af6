import Foundation
import Logging
import ObjectStore
import ObjectStoreTesting
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// Writes through the filesystem core against the in-memory store: what gets stored, and what it costs.
struct FilesystemWriteTests {
    let caller = Caller(uid: 1000, gid: 100)

    func makeFilesystem(
        _ store: FakeObjectStore, threshold: Int64 = 1 << 20, partSize: Int64 = 256 << 10, attributeWriteDelay: Double = 1
    ) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.attributeWriteDelay = attributeWriteDelay
        configuration.spoolDirectory = TestScratch.directory + "cssp-unit-spool-" + UUID().uuidString
        configuration.multipartThreshold = threshold
        configuration.partSize = partSize
        configuration.pendingRetrySeconds = 0.05
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func write(_ fs: Filesystem, _ handle: UInt64, _ bytes: [UInt8], at offset: Int64 = 0) throws {
        try bytes.withUnsafeBytes { try fs.write(handle: handle, offset: offset, bytes: $0) }
    }

    /// Creates `name` at the root, writes `bytes` and closes it (stored at close), as `cp` would.
    @discardableResult
    func storeFile(_ fs: Filesystem, _ name: String, mode: UInt16 = 0o644, _ bytes: [UInt8]) throws -> Attributes {
        try fs.storeFile(Filesystem.rootInode, name, bytes, mode: mode, caller: caller)
    }

    @Test func createWriteCloseIsOnePutWithAttributesInTheListing() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let attributes = try storeFile(fs, "new.txt", mode: 0o640, Array("hello".utf8))
        #expect(store.counts.put == 1)
        let stored = try #require(store.object("new.txt"))
        #expect(stored.bytes == Array("hello".utf8))
        #expect(stored.metadata["mode"] == "0640" && stored.metadata["uid"] == "1000" && stored.metadata["gid"] == "100")
        #expect(stored.contentType.hasPrefix("application/octet-stream;cssp-mtime="))
        // A fresh mount sees mode and owner from the listing alone.
        let fresh = makeFilesystem(store)
        let handle = try fresh.opendir(Filesystem.rootInode)
        try fresh.readdir(Filesystem.rootInode, handle: handle, offset: 0) { _, _, _, _ in true }
        store.resetCounts()
        let seen = try fresh.lookup(parent: Filesystem.rootInode, name: "new.txt")
        #expect(store.counts.head == 0)
        #expect(seen.permissions == 0o640 && seen.uid == 1000 && seen.gid == 100 && seen.size == 5)
        #expect(seen.modified == attributes.modified || seen.modified > attributes.modified)
    }

    @Test func largeFilesAreStoredInHiddenPartsAndOldPartsAreDeleted() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let content = (0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        for round in 0..<2 {
            let opened: Filesystem.OpenResult
            if round == 0 {
                opened = try fs.create(parent: Filesystem.rootInode, name: "big", mode: 0o644, caller: caller).1
            } else {
                let inode = try fs.lookup(parent: Filesystem.rootInode, name: "big").inode
                opened = try fs.open(inode, writable: true, truncate: true)
            }
            try write(fs, opened.handle, content)
            try fs.flush(handle: opened.handle)
            fs.release(handle: opened.handle)
            let parts = store.keys.filter { $0.hasPrefix(".cssp-parts/") }
            #expect(parts.count == 12, "round \(round): \(parts)")
        }
        #expect(store.object("big")?.bytes == content)
        let handle = try fs.opendir(Filesystem.rootInode)
        var names: [String] = []
        try fs.readdir(Filesystem.rootInode, handle: handle, offset: 0) { name, _, _, _ in
            names.append(name)
            return true
        }
        #expect(names == [".", "..", "big"])
        try fs.unlink(parent: Filesystem.rootInode, name: "big")
        #expect(store.keys.isEmpty)
    }

    @Test func partsSentWhileWritingAreReusedUnlessRewrittenAndDroppedWhenTheFileShrinks() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let part = 256 << 10
        var expected = (0..<(8 * part + 100)).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ ($0 >> 9)) }
        let (attributes, opened) = try fs.create(parent: Filesystem.rootInode, name: "big", mode: 0o644, caller: caller)
        for offset in stride(from: 0, to: expected.count, by: 64 << 10) {
            try write(fs, opened.handle, Array(expected[offset..<min(expected.count, offset + (64 << 10))]), at: Int64(offset))
        }
        // Rewrite the middle of part 2, which may have been sent already.
        let patch = [UInt8](repeating: 0xEE, count: 1000)
        try write(fs, opened.handle, patch, at: Int64(2 * part + 10))
        expected.replaceSubrange((2 * part + 10)..<(2 * part + 1010), with: patch)
        try fs.flush(handle: opened.handle)
        #expect(store.object("big")?.bytes == expected)
        #expect(store.keys.filter { $0.hasPrefix(".cssp-parts/") }.count == 9)
        // Each whole part at most once early, part 2 perhaps again, the tail, the manifest.
        #expect(store.counts.put <= 11, "\(store.counts.put) PUTs")

        // Shrink to 5½ parts: the parts past the end must not stay under the manifest's prefix.
        _ = try fs.setattr(attributes.inode, AttributeChanges(size: Int64(5 * part + part / 2)))
        try fs.flush(handle: opened.handle)
        fs.release(handle: opened.handle)
        #expect(store.object("big")?.bytes == Array(expected[0..<(5 * part + part / 2)]))
        #expect(store.keys.filter { $0.hasPrefix(".cssp-parts/") }.count == 6)
    }

    @Test func failedUploadIsReportedAndRetriedUntilStored() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let (_, opened) = try fs.create(parent: Filesystem.rootInode, name: "f", mode: 0o644, caller: caller)
        try write(fs, opened.handle, Array("keep me".utf8))
        store.failNextPuts(3)
        #expect(throws: FSError.self) { try fs.flush(handle: opened.handle) }
        fs.release(handle: opened.handle)
        // The background retry stores it (bounded wait on the store, not a fixed sleep).
        let deadline = Date().addingTimeInterval(10)
        while store.object("f") == nil && Date() < deadline { usleep(10_000) }
        #expect(store.object("f")?.bytes == Array("keep me".utf8))
    }

    @Test func aLaterMountStoresAPendingUploadWithItsAttributes() throws {
        let store = FakeObjectStore()
        let directory = TestScratch.directory + "cssp-unit-spool-" + UUID().uuidString
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = directory
        configuration.pendingRetrySeconds = 3600  // this process never retries: a later one must
        let fs = try Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
        let (attributes, opened) = try fs.create(parent: Filesystem.rootInode, name: "kept", mode: 0o640, caller: caller)
        try write(fs, opened.handle, Array("survives a restart".utf8))
        _ = try fs.setattr(attributes.inode, AttributeChanges(modified: Timestamp(seconds: 1_400_000_000, nanoseconds: 5)))
        store.failNextPuts(1000)
        #expect(throws: FSError.self) { try fs.flush(handle: opened.handle) }
        fs.release(handle: opened.handle)
        #expect(store.object("kept") == nil)

        // The next process (its own spool directory, holding what this one left behind).
        let later = directory + "-later"
        let fm = FileManager.default
        try fm.createDirectory(atPath: later, withIntermediateDirectories: true)
        for name in try fm.contentsOfDirectory(atPath: directory) where name.hasSuffix(".data") || name == "uploads.journal" {
            try fm.copyItem(atPath: directory + "/" + name, toPath: later + "/" + name)
        }
        store.failNextPuts(0)
        configuration.spoolDirectory = later
        let next = try Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
        next.recoverPendingUploads()
        let stored = try #require(store.object("kept"))
        #expect(stored.bytes == Array("survives a restart".utf8))
        #expect(stored.metadata["mode"] == "0640" && stored.metadata["uid"] == "1000" && stored.metadata["gid"] == "100")
        #expect(stored.metadata["mtime"] == "1400000000.000000005")
        #expect(stored.contentType.hasPrefix("application/octet-stream;cssp-mtime=1400000000.000000005;cssp-mode=0640"))
        #expect(try fm.contentsOfDirectory(atPath: later).filter { $0.hasSuffix(".data") || $0.hasSuffix(".pending") } == [])
    }

    @Test func pendingNotesWrittenBeforeAttributesWereKeptStillName() {
        let old = Spool.PendingUpload(decoding: "dir/only-a-key")
        #expect(old == Spool.PendingUpload(key: "dir/only-a-key", contentType: "application/octet-stream", metadata: [:], base: nil))
        let upload = Spool.PendingUpload(key: "k", contentType: "text/plain;cssp-mode=0600", metadata: ["mode": "0600", "x": "a=b"], base: "etag1")
        #expect(Spool.PendingUpload(decoding: String(decoding: upload.encoded, as: UTF8.self)) == upload)
        #expect(Spool.PendingUpload(decoding: "") == nil)
    }

    @Test func renameOfAMultipartFileMovesOnlyItsManifest() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        try storeFile(fs, "a", Array(repeating: 7, count: 2 << 20))
        let parts = store.keys.filter { $0.hasPrefix(".cssp-parts/") }
        store.resetCounts()
        try fs.rename(parent: Filesystem.rootInode, name: "a", newParent: Filesystem.rootInode, newName: "b", noReplace: false)
        #expect(store.counts.copy == 0)
        #expect(store.keys.filter { $0.hasPrefix(".cssp-parts/") } == parts)
        #expect(store.object("b")?.bytes.count == 2 << 20)
        #expect(store.object("a") == nil)
    }

    @Test func chmodAndUtimesRightAfterWritingNeedNoHead() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store, attributeWriteDelay: 0)
        let attributes = try storeFile(fs, "r", Array("rsync".utf8))
        store.resetCounts()
        _ = try fs.setattr(attributes.inode, AttributeChanges(mode: 0o600))
        _ = try fs.setattr(attributes.inode, AttributeChanges(modified: Timestamp(seconds: 1_500_000_000, nanoseconds: 7)))
        #expect(store.counts.head == 0)
        #expect(store.counts.post == 2)
        let stored = try #require(store.object("r"))
        #expect(stored.metadata["mode"] == "0600" && stored.metadata["mtime"] == "1500000000.000000007")
        #expect(stored.bytes == Array("rsync".utf8))
    }

    @Test(arguments: [
        ("0640", UInt16(0o640)), ("755", 0o755), ("100644", 0o644), ("40755", 0o755), ("120777", 0o777),
        ("33261", 0o755), ("16877", 0o755), ("16420", 0o44), ("41471", 0o777), ("0", 0), ("banana", nil),
        ("99999999", nil),
    ])
    func modesWrittenByOtherToolsAreRead(text: String, permissions: UInt16?) {
        // csspfs (octal permissions), rclone (octal st_mode), s3fs (decimal st_mode).
        #expect(StoredAttributes.permissions(text) == permissions)
    }

    @Test(arguments: [
        ("41471", "", NodeKind.symlink), ("120777", "", .symlink), ("4516", "", .fifo), ("49645", "", .socket),
        ("33188", "", .file), ("16877", "", .file), ("0777", "", .file), ("41471", "binary/octet-stream", .symlink),
        ("33188", "application/link", .symlink), ("banana", "", .file),
    ])
    func aHeadTellsTheKindS3fsStoredInTheMode(mode: String, contentType: String, kind: NodeKind) {
        // s3fs stores a symlink, FIFO or socket with its type only in a decimal st_mode.
        let info = ObjectInfo(key: "k", size: 1, etag: "e", contentType: contentType, lastModified: 0, metadata: ["mode": mode])
        #expect(NodeKind.of(info) == kind)
    }

    @Test func chmodKeepsForeignMetadata() throws {
        let store = FakeObjectStore()
        store.seed("f", text: "x")
        _ = try store.post(key: "f", contentType: "text/plain", metadata: ["color": "blue"], manifest: nil)
        let fs = makeFilesystem(store)
        let inode = try fs.lookup(parent: Filesystem.rootInode, name: "f").inode
        let attributes = try fs.setattr(inode, AttributeChanges(mode: 0o600, modified: Timestamp(seconds: 1_000_000_000, nanoseconds: 5)))
        #expect(attributes.permissions == 0o600)
        #expect(fs.storeOwedAttributes().isEmpty)
        let stored = try #require(store.object("f"))
        #expect(stored.metadata["color"] == "blue")
        #expect(stored.metadata["mode"] == "0600")
        #expect(stored.metadata["mtime"] == "1000000000.000000005")
        #expect(stored.contentType.hasPrefix("text/plain;"))
    }

    @Test func rmdirOfANonEmptyDirectoryIsENOTEMPTY() throws {
        let store = FakeObjectStore()
        store.seed("d/child", text: "x")
        let fs = makeFilesystem(store)
        do {
            try fs.rmdir(parent: Filesystem.rootInode, name: "d")
            Issue.record("rmdir of a non-empty directory succeeded")
        } catch {
            #expect(error.code == .notEmpty)
        }
        let made = try fs.mkdir(parent: Filesystem.rootInode, name: "e", mode: 0o750, caller: caller)
        #expect(made.kind == .directory && made.permissions == 0o750)
        #expect(store.keys.contains("e/"))
        try fs.rmdir(parent: Filesystem.rootInode, name: "e")
        #expect(!store.keys.contains("e/"))
    }

    @Test func timestampsRoundTripExactly() {
        let t = Timestamp(parsing: "1700000000.123456789")
        #expect(t == Timestamp(seconds: 1_700_000_000, nanoseconds: 123_456_789))
        #expect(t?.description == "1700000000.123456789")
        #expect(Timestamp(parsing: "1700000000.5") == Timestamp(seconds: 1_700_000_000, nanoseconds: 500_000_000))
        #expect(Timestamp(parsing: "12") == Timestamp(seconds: 12, nanoseconds: 0))
        #expect(Timestamp(parsing: "x.5") == nil)
        // As swiftclient (six decimals) and past nanoseconds (the rest ignored); not numbers.
        #expect(Timestamp(parsing: "1700000000.000001") == Timestamp(seconds: 1_700_000_000, nanoseconds: 1000))
        #expect(Timestamp(parsing: "1.1234567891234") == Timestamp(seconds: 1, nanoseconds: 123_456_789))
        #expect(Timestamp(parsing: "+7") == Timestamp(seconds: 7, nanoseconds: 0))
        for bad in ["", "-", "1.", ".5", "1.x", "1 ", "1e9", "99999999999999999999"] { #expect(Timestamp(parsing: bad) == nil, "\(bad)") }
        let parsed = StoredAttributes.parse(contentType: "text/plain; charset=utf-8;cssp-mode=0640;cssp-mtime=5.000000001")
        #expect(parsed.base == "text/plain; charset=utf-8")
        #expect(parsed.attributes.mode == 0o640)
        #expect(parsed.attributes.mtime == Timestamp(seconds: 5, nanoseconds: 1))
    }
}

/// The pipeline of parts sent while a file is written (`EarlyParts`).
struct EarlyPartsTests {
    /// Once the upload at close took the parts over, a writer that still holds the pipeline
    /// starts no part below its prefix: the manifest names that prefix, and a part added or
    /// replaced there afterwards changed the stored object (core model seed 9213: a conflict copy
    /// of a file nobody else touched).
    @Test func aFinishedPipelineStartsNothing() throws {
        let store = FakeObjectStore()
        let pool = BackgroundPool(width: 2)
        let path = TestScratch.directory + "cssp-early-parts-" + UUID().uuidString
        defer { unlink(path) }
        #expect(FileManager.default.createFile(atPath: path, contents: Data(repeating: 7, count: 64)))
        let parts = EarlyParts(store: store, session: try store.beginUpload(key: "f"), partSize: 16, concurrency: 4, pool: pool, transfers: Transfers())
        parts.advance(path: path, writtenEnd: 32) { _ in 1 }
        #expect(parts.finish().count == 2)
        parts.advance(path: path, writtenEnd: 64) { _ in 2 }
        #expect(parts.finish().count == 2)
        #expect(try store.listAll(prefix: parts.session.id, delimiter: nil).count == 2)
    }
}
