import Dispatch
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Locking
import Logging
import ObjectStore
import ObjectStoreTesting
import Synchronization
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// Regression tests of the integrity issue: sequences of ordinary operations that lost track of
/// state. Each failed before its fix.
struct IntegrityTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode

    func makeFilesystem(_ store: any ObjectStore, attributeWriteDelay: Double = 1) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.attributeWriteDelay = attributeWriteDelay
        configuration.spoolDirectory = TestScratch.directory + "cssp-integrity-spool-" + UUID().uuidString
        configuration.listPageSize = 2
        configuration.pendingRetrySeconds = 3600
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func write(_ fs: Filesystem, _ handle: UInt64, _ text: String, at offset: Int64 = 0) throws {
        try Array(text.utf8).withUnsafeBytes { try fs.write(handle: handle, offset: offset, bytes: $0) }
    }

    /// Closes `handle` while the store refuses both uploads (the flush's and the last close's):
    /// close reports EIO and the upload is owed.
    func closeWhileUploadsFail(_ fs: Filesystem, _ handle: UInt64, _ store: FakeObjectStore) throws {
        store.failNextPuts(2)
        #expect(throws: FSError.self) { try fs.flush(handle: handle) }
        fs.release(handle: handle)
    }

    func close(_ fs: Filesystem, _ handle: UInt64) throws {
        try fs.flush(handle: handle)
        fs.release(handle: handle)
    }

    func createFile(_ fs: Filesystem, _ parent: InodeNumber, _ name: String, _ text: String) throws -> Attributes {
        try fs.storeFile(parent, name, Array(text.utf8), caller: caller)
    }

    /// `ls` as the kernel does it: readdirplus to the end, every entry counted as a lookup.
    func list(_ fs: Filesystem, _ inode: InodeNumber) throws -> [String] {
        let handle = try fs.opendir(inode)
        defer { fs.releasedir(handle: handle) }
        var names: [String] = []
        var offset: Int64 = 0
        while true {
            var count = 0
            try fs.readdirplus(inode, handle: handle, offset: offset) { name, _, _, _, next in
                count += 1
                offset = next
                if name != "." && name != ".." { names.append(name) }
                return true
            }
            if count == 0 { return names }
        }
    }

    func read(_ fs: Filesystem, _ inode: InodeNumber) throws -> String {
        String(decoding: try fs.readWhole(inode, chunk: 4096), as: UTF8.self)
    }

    /// mkdir d; echo x > d/f; mv d e; ls e; chmod 600 e/f; echo more >> e/f
    @Test func aRenamedDirectoryKeepsItsChildrenReachable() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let d = try fs.mkdir(parent: root, name: "d", mode: 0o755, caller: caller)
        _ = try createFile(fs, d.inode, "f", "x\n")
        try fs.rename(parent: root, name: "d", newParent: root, newName: "e", noReplace: false)
        #expect(try list(fs, d.inode) == ["f"])
        let f = try fs.lookup(parent: d.inode, name: "f")
        let changed = try fs.setattr(f.inode, AttributeChanges(mode: 0o600))
        #expect(changed.permissions == 0o600)
        let opened = try fs.open(f.inode, writable: true, truncate: false)
        try write(fs, opened.handle, "more\n", at: 2)
        try close(fs, opened.handle)
        #expect(store.object("e/f")?.bytes == Array("x\nmore\n".utf8))
        #expect(store.object("e/f")?.metadata["mode"] == "0600")
        #expect(!store.keys.contains { $0.hasPrefix("d/") })
    }

    /// Item 1: a marker `x/` beside a regular object `x`: rmdir x removes the directory only.
    @Test func rmdirLeavesAFileOfTheSameName() throws {
        let store = FakeObjectStore()
        store.seed("x", text: "a file")
        store.seed("x/", contentType: "application/directory")
        let fs = makeFilesystem(store)
        #expect(try list(fs, root).sorted() == ["x", "x~object"])
        try fs.rmdir(parent: root, name: "x")
        #expect(store.object("x")?.bytes == Array("a file".utf8))
        #expect(!store.keys.contains("x/"))
    }

    /// Item 1, `mv -T dir x` onto an empty directory `x` that has a file `x` beside its marker.
    @Test func renamingOverAnEmptyDirectoryLeavesAFileOfItsName() throws {
        let store = FakeObjectStore()
        store.seed("x", text: "a file")
        store.seed("x/", contentType: "application/directory")
        let fs = makeFilesystem(store)
        _ = try fs.mkdir(parent: root, name: "dir", mode: 0o700, caller: caller)
        try fs.rename(parent: root, name: "dir", newParent: root, newName: "x", noReplace: false)
        #expect(store.object("x")?.bytes == Array("a file".utf8))
    }

    /// Item 2: a directory renamed over an empty one keeps its marker (and so its mode).
    @Test func aDirectoryRenamedOverAnEmptyOneKeepsItsMarker() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        _ = try fs.mkdir(parent: root, name: "a", mode: 0o700, caller: caller)
        _ = try fs.mkdir(parent: root, name: "b", mode: 0o755, caller: caller)
        try fs.rename(parent: root, name: "a", newParent: root, newName: "b", noReplace: false)
        #expect(store.keys == ["b/"])
        #expect(store.object("b/")?.metadata["mode"] == "0700")
        let fresh = makeFilesystem(store)
        #expect(try fresh.lookup(parent: root, name: "b").permissions == 0o700)
    }

    /// Item 3: rename(tmp, f) while f is open for writing: closing the old handle later must not
    /// store its bytes over the renamed content.
    @Test func renameOverAFileOpenForWritingKeepsTheRenamedContent() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let (f, old) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(fs, old.handle, "old content")
        try fs.flush(handle: old.handle)
        try write(fs, old.handle, "OLD CONTENT, written after the flush")
        _ = try createFile(fs, root, "tmp", "new content")
        try fs.rename(parent: root, name: "tmp", newParent: root, newName: "f", noReplace: false)
        try fs.flush(handle: old.handle)
        fs.release(handle: old.handle)
        #expect(store.object("f")?.bytes == Array("new content".utf8))
        let now = try fs.lookup(parent: root, name: "f")
        #expect(now.inode != f.inode)
        #expect(try read(fs, now.inode) == "new content")
    }

    /// Item 4: unlink while an upload of the file is under way: the object must not come back.
    @Test func unlinkDuringAnUploadRemovesTheFileForGood() throws {
        let fake = FakeObjectStore()
        let inPut = DispatchSemaphore(value: 0)
        let gate = DispatchSemaphore(value: 0)
        let armed = Locked(true)
        let store = FaultInjectingStore(fake) { call in
            if call.operation == .put, call.key == "f", armed.withLock({ let was = $0; $0 = false; return was }) {
                inPut.signal()
                gate.wait()
            }
            return .none
        }
        let fs = makeFilesystem(store)
        let (_, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(fs, opened.handle, "bytes")
        let uploads = DispatchGroup()
        DispatchQueue.global().async(group: uploads) { _ = try? fs.flush(handle: opened.handle) }
        inPut.wait()  // the PUT is under way, held at the gate
        let unlinking = DispatchGroup()
        DispatchQueue.global().async(group: unlinking) { try? fs.unlink(parent: root, name: "f") }
        // The unlink either waits for the upload (then the gate must open for it to finish) or
        // has already deleted (the bug): either way the gate opens after at most a second.
        _ = unlinking.wait(timeout: .now() + 1)
        gate.signal()
        uploads.wait()
        unlinking.wait()
        fs.release(handle: opened.handle)
        #expect(fake.object("f") == nil, "the object came back after rm returned")
    }

    /// Item 12: a listing that started before our own change must not undo it afterwards.
    @Test func aListingOlderThanAChangeDoesNotHideIt() throws {
        let store = FakeObjectStore()
        for name in ["a", "b", "c", "d", "e", "f"] { store.seed(name, text: name) }
        let fs = makeFilesystem(store)
        let handle = try fs.opendir(root)
        var offset: Int64 = 0
        var seen = 0
        // The first page (two names) of a listing...
        try fs.readdir(root, handle: handle, offset: 0) { name, _, _, next in
            offset = next
            seen += 1
            return seen < 3
        }
        // ...then a file is created and stored, with a name the listing has passed...
        _ = try createFile(fs, root, "0new", "n")
        // ...then the listing runs to its end and is remembered.
        while true {
            var count = 0
            try fs.readdir(root, handle: handle, offset: offset) { _, _, _, next in
                count += 1
                offset = next
                return true
            }
            if count == 0 { break }
        }
        fs.releasedir(handle: handle)
        let found = try fs.lookup(parent: root, name: "0new")
        #expect(found.size == 1)
    }

    /// Renaming a name to itself (after the kernel forgot it) changes nothing on the server.
    @Test func renameToItselfAfterAForgetKeepsTheDirectory() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let g = try fs.mkdir(parent: root, name: "g", mode: 0o755, caller: caller)
        _ = try createFile(fs, g.inode, "f", "content")
        fs.forget(g.inode, count: 1)
        try fs.rename(parent: root, name: "g", newParent: root, newName: "g", noReplace: false)
        #expect(store.keys == ["g/", "g/f"])
    }

    func makeFilesystem(_ store: any ObjectStore, spool: String) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = spool
        configuration.pendingRetrySeconds = 3600
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func spoolFiles(_ directory: String) -> [String] {
        ((try? FileManager.default.subpathsOfDirectory(atPath: directory)) ?? []).filter { $0.hasSuffix(".data") }.sorted()
    }

    /// A handle open for reading keeps reading a file renamed (or moved with its directory).
    @Test func aReadHandleFollowsItsFileThroughRenames() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let d = try fs.mkdir(parent: root, name: "d", mode: 0o755, caller: caller)
        let f = try createFile(fs, d.inode, "f", "the content")
        let reader = try fs.open(f.inode, writable: false, truncate: false)
        try fs.rename(parent: d.inode, name: "f", newParent: d.inode, newName: "g", noReplace: false)
        try fs.rename(parent: root, name: "d", newParent: root, newName: "e", noReplace: false)
        var bytes: [UInt8] = []
        try fs.read(handle: reader.handle, offset: 0, length: 100) { bytes.append(contentsOf: $0) }
        fs.release(handle: reader.handle)
        #expect(String(decoding: bytes, as: UTF8.self) == "the content")
    }

    /// Item 9: attributes set while a failed upload is owed are stored by the next mount too.
    @Test func attributesSetWhileAnUploadIsOwedSurviveARemount() throws {
        let store = FakeObjectStore()
        let spool = TestScratch.directory + "cssp-integrity-spool-" + UUID().uuidString
        let fs = makeFilesystem(store, spool: spool)
        let (f, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(fs, opened.handle, "owed bytes")
        try closeWhileUploadsFail(fs, opened.handle, store)
        #expect(store.object("f") == nil)
        _ = try fs.setattr(f.inode, AttributeChanges(mode: 0o600, modified: Timestamp(seconds: 1_234_567_890, nanoseconds: 5)))
        fs.shutdown()
        let next = makeFilesystem(store, spool: spool)
        next.recoverPendingUploads()
        #expect(store.object("f")?.bytes == Array("owed bytes".utf8))
        #expect(store.object("f")?.metadata["mode"] == "0600")
        #expect(store.object("f")?.metadata["mtime"] == "1234567890.000000005")
        next.shutdown()
    }

    /// Item 9: an owed upload never overwrites what another client wrote meanwhile, nor brings
    /// back what it deleted: both versions are kept, ours as a conflict copy.
    @Test(arguments: [true, false]) func anOwedUploadKeepsAnotherClientsChange(deleted: Bool) throws {
        let store = FakeObjectStore()
        store.seed("f", text: "version 1")
        let spool = TestScratch.directory + "cssp-integrity-spool-" + UUID().uuidString
        let fs = makeFilesystem(store, spool: spool)
        let f = try fs.lookup(parent: root, name: "f")
        let opened = try fs.open(f.inode, writable: true, truncate: true)
        try write(fs, opened.handle, "ours")
        try closeWhileUploadsFail(fs, opened.handle, store)
        if deleted { try store.delete(key: "f") } else { store.seed("f", text: "theirs, newer") }
        fs.shutdown()
        let next = makeFilesystem(store, spool: spool)
        next.recoverPendingUploads()
        #expect(store.object("f")?.bytes == (deleted ? nil : Array("theirs, newer".utf8)))
        let copies = store.keys.filter { $0.hasPrefix("f.cssp-conflict-") }
        #expect(copies.count == 1)
        #expect(copies.first.flatMap { store.object($0)?.bytes } == Array("ours".utf8))
        #expect(spoolFiles(spool).isEmpty)
        next.shutdown()
    }

    /// Item 9: what a crashed mount wrote without any close acknowledging it is neither uploaded
    /// nor deleted: it is kept aside.
    @Test func unacknowledgedSpoolFilesAreKeptAsideNotDeleted() throws {
        let store = FakeObjectStore()
        let spool = TestScratch.directory + "cssp-integrity-spool-" + UUID().uuidString
        let crashed = makeFilesystem(store, spool: spool)
        let (_, opened) = try crashed.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(crashed, opened.handle, "never closed")
        crashed.spool.unlock()  // the process died: its lock is gone, nothing else happened
        let next = makeFilesystem(store, spool: spool)
        next.recoverPendingUploads()
        #expect(store.keys.isEmpty)
        let kept = spoolFiles(spool)
        #expect(kept.count == 1 && kept[0].hasPrefix("lost+found/"))
        next.shutdown()
    }

    /// A file created just after the mount started is not taken for a leftover of an earlier one.
    @Test func recoveryNeverTouchesFilesOfThisMount() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let (_, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(fs, opened.handle, "mine")
        fs.recoverPendingUploads()
        try close(fs, opened.handle)
        #expect(store.object("f")?.bytes == Array("mine".utf8))
    }

    /// Item 9: a second live mount of the same URL spools in `directory.PID`; once it is gone, a
    /// later mount stores what it owed.
    @Test func aSecondMountsSpoolIsRecoveredLater() throws {
        let store = FakeObjectStore()
        let spool = TestScratch.directory + "cssp-integrity-spool-" + UUID().uuidString
        let first = makeFilesystem(store, spool: spool)
        let second = makeFilesystem(store, spool: spool)
        let (_, opened) = try second.create(parent: root, name: "g", mode: 0o644, caller: caller)
        try write(second, opened.handle, "from the second mount")
        try closeWhileUploadsFail(second, opened.handle, store)
        second.shutdown()
        first.shutdown()
        let later = makeFilesystem(store, spool: spool)
        later.recoverPendingUploads()
        #expect(store.object("g")?.bytes == Array("from the second mount".utf8))
        later.shutdown()
    }

    /// Item 8: a multipart upload whose parts do not check out leaves the previous version; the
    /// manifest is written only after the parts are verified.
    @Test func aMultipartUploadThatFailsItsChecksLeavesThePreviousVersion() throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = TestScratch.directory + "cssp-integrity-spool-" + UUID().uuidString
        configuration.multipartThreshold = 64 << 10
        configuration.partSize = 16 << 10
        configuration.pendingRetrySeconds = 3600
        let fs = try Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
        let first = (0..<(100 << 10)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let (f, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try first.withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        try close(fs, opened.handle)
        #expect(fake.object("f")?.bytes == first)
        // Every check of the new upload fails: its parts never list, the key never answers.
        store.inject { call in
            (call.operation == .list && call.key.hasPrefix(Filesystem.partsPrefix)) || (call.operation == .head && call.key == "f")
                ? .before(.transient) : .none
        }
        let again = try fs.open(f.inode, writable: true, truncate: true)
        let second = (0..<(100 << 10)).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        try second.withUnsafeBytes { try fs.write(handle: again.handle, offset: 0, bytes: $0) }
        #expect(throws: FSError.self) { try fs.flush(handle: again.handle) }
        fs.release(handle: again.handle)
        store.heal()
        #expect(fake.object("f")?.bytes == first, "the previous version must survive a failed upload")
    }

    @Test func partsGrowSoThatNoUploadNeedsMoreThanOneListingPage() {
        let maximum = Int64(FakeObjectStore().maximumParts)
        #expect(maximum < 10_000)
        #expect(Uploader.partSize(for: 1 << 30, configured: 32 << 20, maximumParts: maximum) == 32 << 20)
        let huge: Int64 = 500 << 30
        let grown = Uploader.partSize(for: huge, configured: 32 << 20, maximumParts: maximum)
        #expect((huge + grown - 1) / grown <= maximum)
        #expect(grown % (1 << 20) == 0)
    }

    /// Item 10: opening for writing without O_TRUNC never trusts a cached size of 0: appending
    /// to what another client wrote meanwhile keeps its bytes.
    @Test func appendingNeverTrustsACachedEmptySize() throws {
        let store = FakeObjectStore()
        store.seed("f", [])
        let fs = makeFilesystem(store)
        let f = try fs.lookup(parent: root, name: "f")
        #expect(f.size == 0)
        store.seed("f", text: "real content")  // another client, within attr_timeout
        let opened = try fs.open(f.inode, writable: true, truncate: false)
        try write(fs, opened.handle, "X", at: 12)
        try close(fs, opened.handle)
        #expect(store.object("f")?.bytes == Array("real contentX".utf8))
    }

    /// Item 6: "café" precomposed and decomposed are two keys and two files: reading, removing or
    /// renaming one never acts on the other.
    @Test func namesThatDifferOnlyInNormalisationAreTwoFiles() throws {
        let nfc = "caf\u{E9}"
        let nfd = "cafe\u{301}"
        let store = FakeObjectStore()
        store.seed(nfc, text: "precomposed")
        store.seed(nfd, text: "decomposed")
        func keys() -> [[UInt8]] { store.keys.map { Array($0.utf8) } }
        #expect(keys().count == 2)
        let fs = makeFilesystem(store)
        #expect(try list(fs, root).map { Array($0.utf8) }.sorted { $0.lexicographicallyPrecedes($1) } == keys())
        let a = try fs.lookup(parent: root, name: nfc)
        let b = try fs.lookup(parent: root, name: nfd)
        #expect(a.inode != b.inode)
        #expect(try read(fs, a.inode) == "precomposed")
        #expect(try read(fs, b.inode) == "decomposed")
        try fs.unlink(parent: root, name: nfd)
        #expect(keys() == [Array(nfc.utf8)])
        try fs.rename(parent: root, name: nfc, newParent: root, newName: nfd, noReplace: false)
        try fs.fsyncDirectory()  // the old name's delete follows the rename's COPY
        #expect(keys() == [Array(nfd.utf8)])
        #expect(store.object(nfd)?.bytes == Array("precomposed".utf8))
    }

    /// Item 4: a directory renamed while files in it are being written: every one of them is
    /// stored under the new name, none under the old.
    @Test func aDirectoryRenamedWhileFilesInItAreWrittenTakesThemAll() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let d = try fs.mkdir(parent: root, name: "d", mode: 0o755, caller: caller)
        let (_, one) = try fs.create(parent: d.inode, name: "one", mode: 0o644, caller: caller)
        let (_, two) = try fs.create(parent: d.inode, name: "two", mode: 0o644, caller: caller)
        try write(fs, one.handle, "1")
        try write(fs, two.handle, "2")
        try fs.rename(parent: root, name: "d", newParent: root, newName: "e", noReplace: false)
        try write(fs, two.handle, "2b", at: 1)
        try close(fs, one.handle)
        try close(fs, two.handle)
        #expect(store.keys == ["e/", "e/one", "e/two"])
        #expect(store.object("e/two")?.bytes == Array("22b".utf8))
    }

    /// Item 9: a file whose upload is owed, in a directory renamed once the store answers again,
    /// is stored under the new name; no note is left naming the old one.
    @Test func anOwedFileMovesWithItsDirectory() throws {
        let store = FakeObjectStore()
        let spool = TestScratch.directory + "cssp-integrity-spool-" + UUID().uuidString
        let fs = makeFilesystem(store, spool: spool)
        let d = try fs.mkdir(parent: root, name: "d", mode: 0o755, caller: caller)
        let (_, opened) = try fs.create(parent: d.inode, name: "f", mode: 0o644, caller: caller)
        try write(fs, opened.handle, "owed")
        try closeWhileUploadsFail(fs, opened.handle, store)
        try fs.rename(parent: root, name: "d", newParent: root, newName: "e", noReplace: false)
        #expect(store.keys == ["e/", "e/f"])
        fs.shutdown()
        let next = makeFilesystem(store, spool: spool)
        next.recoverPendingUploads()
        #expect(store.keys == ["e/", "e/f"], "a later mount must not bring d/f back")
        next.shutdown()
    }

    /// Item 6: an object really named `x~object` beside a file `x` shadowed by a directory `x`:
    /// one name, one object, each reachable.
    @Test func theShadowAliasNeverCollidesWithARealKey() throws {
        let store = FakeObjectStore()
        store.seed("x", text: "shadowed file")
        store.seed("x/child", text: "child")
        store.seed("x~object", text: "a real object")
        let fs = makeFilesystem(store)
        let names = try list(fs, root)
        #expect(names.count == Set(names).count, "\(names)")
        let real = try fs.lookup(parent: root, name: "x~object")
        #expect(try read(fs, real.inode) == "a real object")
    }

    /// Item 7: a directory rename keeps an SDK-layout DLO (parts below its own key) whole: the
    /// parts move with the directory and the new manifest points at them.
    @Test func aDirectoryRenameKeepsAnSDKLayoutDLOWhole() throws {
        let store = FakeObjectStore()
        store.seed("d/f/up1/00000001", text: "first part, ")
        store.seed("d/f/up1/00000002", text: "second part")
        store.seed("d/f", manifest: store.containerName + "/d/f/up1/")
        let fs = makeFilesystem(store)
        let d = try fs.lookup(parent: root, name: "d")
        #expect(try list(fs, d.inode) == ["f"])
        try fs.rename(parent: root, name: "d", newParent: root, newName: "e", noReplace: false)
        #expect(store.object("e/f")?.bytes == Array("first part, second part".utf8))
        #expect(!store.keys.contains { $0.hasPrefix("d/") })
        let fresh = makeFilesystem(store)
        let e = try fresh.lookup(parent: root, name: "e")
        #expect(try list(fresh, e.inode) == ["f"])
    }

    /// Item 7: a manifest whose parts are in another container (the swift CLI's `_segments`) is
    /// renamed pointing at the same parts, and nothing of ours is taken for its parts.
    @Test func aDLOWithPartsElsewhereIsRenamedWithoutTouchingOtherKeys() throws {
        let store = FakeObjectStore()
        let elsewhere = store.containerName + "_segments/f/1/"
        store.seed("f", manifest: elsewhere)
        store.seed("segments/f/1/x", text: "not a part of f")  // what a misparsed prefix would name
        let fs = makeFilesystem(store)
        _ = try fs.lookup(parent: root, name: "f")
        try fs.rename(parent: root, name: "f", newParent: root, newName: "g", noReplace: false)
        #expect(try store.head(key: "g").manifest == elsewhere)
        #expect(store.object("segments/f/1/x")?.bytes == Array("not a part of f".utf8))
        #expect(store.keys == ["g", "segments/f/1/x"])
    }

    /// Item 7: overwriting a multipart file deletes the parts of the manifest at its key now, not
    /// of a manifest remembered from before: another mount renamed the file meanwhile. (Since
    /// issue 22 the new bytes go to a conflict copy: the version they replace left the name.)
    @Test func anOverwriteNeverDeletesPartsAnotherMountsRenameKept() throws {
        let store = FakeObjectStore()
        func mount() -> Filesystem {
            var configuration = FilesystemConfiguration()
            configuration.spoolDirectory = TestScratch.directory + "cssp-integrity-spool-" + UUID().uuidString
            configuration.multipartThreshold = 64 << 10
            configuration.partSize = 16 << 10
            return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
        }
        let a = mount()
        let content = (0..<(100 << 10)).map { UInt8(truncatingIfNeeded: $0 &* 3) }
        let (f, opened) = try a.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try content.withUnsafeBytes { try a.write(handle: opened.handle, offset: 0, bytes: $0) }
        try close(a, opened.handle)
        let b = mount()
        _ = try b.lookup(parent: root, name: "f")
        try b.rename(parent: root, name: "f", newParent: root, newName: "g", noReplace: false)
        // Mount a still believes f is its multipart file, and writes f anew.
        let again = try a.open(f.inode, writable: true, truncate: true)
        try write(a, again.handle, "a new, small f")
        try close(a, again.handle)
        #expect(store.object("g")?.bytes == content, "g lost its parts")
        #expect(store.object("f") == nil)
        let copies = store.keys.filter { $0.hasPrefix("f.cssp-conflict-") }
        #expect(copies.count == 1)
        #expect(store.object(copies.first ?? "")?.bytes == Array("a new, small f".utf8))
    }

    /// Item 5: an O_TRUNC open that attaches to a spool and then fails to truncate it gives its
    /// handle count back: the spool still retires when the other handle closes.
    @Test func aFailedTruncateOnOpenDoesNotKeepTheSpoolForever() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let f = try createFile(fs, root, "f", "stored")
        let first = try fs.open(f.inode, writable: true, truncate: false)
        // The spool's descriptor fails to truncate from now on, as on a disk error: it is made a
        // read-only /dev/null in place (never closed: another test may reuse a closed number).
        let spoolDescriptor = try #require(fs.files.withLock { $0.openFiles[f.inode]?.fd })
        let null = Glibc.open("/dev/null", O_RDONLY)
        #expect(dup2(null, spoolDescriptor) == spoolDescriptor)
        Glibc.close(null)
        #expect(throws: FSError.self) { _ = try fs.open(f.inode, writable: true, truncate: true) }
        fs.release(handle: first.handle)
        #expect(fs.files.withLock { $0.openFiles[f.inode] } == nil, "the spool is held by a handle that does not exist")
    }

    // MARK: Namespace operations under store failures (found by the reference model's faults)

    /// A reader of a file another client replaced with a shorter one gets ESTALE (the man page's
    /// CONSISTENCY), not EIO: the server's 416 says the version that was opened is gone.
    @Test func aReaderOfAFileReplacedByAShorterOneGetsStale() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let f = try createFile(fs, root, "f", String(repeating: "x", count: 3 << 20))
        let opened = try fs.open(f.inode, writable: false, truncate: false)
        defer { fs.release(handle: opened.handle) }
        #expect(try fs.readBytes(opened.handle, offset: 0, length: 10) == Array(repeating: UInt8(ascii: "x"), count: 10))
        store.seed("f", [1, 2])
        let error = #expect(throws: FSError.self) { try fs.read(handle: opened.handle, offset: 5 << 19, length: 10) { _ in } }
        #expect(error?.code == .stale)
    }

    /// Issue 23: a handle that has answered no read yet reads the version another client stored
    /// after the open (shorter, longer), whole, never ESTALE; the node shows it too.
    @Test(arguments: [[UInt8](repeating: 7, count: 3), [UInt8](repeating: 9, count: 5000)])
    func aHandleThatReadNothingYetReadsAnotherClientsNewVersion(replacement: [UInt8]) throws {
        let store = FakeObjectStore()
        store.seed("f", Array(repeating: UInt8(ascii: "x"), count: 100))
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let f = try fs.lookup(parent: root, name: "f")
        let opened = try fs.open(f.inode, writable: false, truncate: false)
        #expect(!opened.keepCache)
        defer { fs.release(handle: opened.handle) }
        store.seed("f", replacement)
        var read: [UInt8] = []
        while true {
            let bytes = try fs.readBytes(opened.handle, offset: Int64(read.count), length: 4096)
            if bytes.isEmpty { break }
            read += bytes
        }
        #expect(read == replacement)
        #expect(try fs.getattr(f.inode).size == Int64(replacement.count))
    }

    /// Issue 23: a handle opened with the kernel's pages kept (the file was written or read
    /// here) may have been served some of the old version by the kernel without a read reaching
    /// the daemon: it keeps ESTALE rather than mix versions. The next open reads the new version
    /// and does not keep the kernel's pages.
    @Test func aHandleOpenedWithTheKernelsPagesKeptFailsAndTheNextOpenReadsTheNewVersion() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let f = try createFile(fs, root, "f", String(repeating: "x", count: 100))
        let kept = try fs.open(f.inode, writable: false, truncate: false)
        #expect(kept.keepCache)
        store.seed("f", [1, 2, 3])
        let error = #expect(throws: FSError.self) { try fs.read(handle: kept.handle, offset: 0, length: 10) { _ in } }
        #expect(error?.code == .stale)
        fs.release(handle: kept.handle)
        let next = try fs.open(f.inode, writable: false, truncate: false)
        defer { fs.release(handle: next.handle) }
        #expect(!next.keepCache)
        #expect(try fs.readBytes(next.handle, offset: 0, length: 10) == [1, 2, 3])
    }

    /// mkdir whose PUT reached the server but whose answer was lost returns EIO; the directory
    /// exists on the server, and `ls` of the parent shows it at once (no stale listing).
    @Test func aMkdirWhoseAnswerWasLostShowsWhatTheServerHolds() throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        #expect(try list(fs, root) == [])
        store.failNext(.put, with: .after(.transient))
        let error = #expect(throws: FSError.self) { _ = try fs.mkdir(parent: root, name: "d", mode: 0o755, caller: caller) }
        #expect(error?.code == .ioError)
        #expect(fake.object("d/") != nil)
        #expect(try list(fs, root) == ["d"])
    }

    /// A directory rename that fails half-way leaves both names as directories with the
    /// directory's attributes (markers move first and go last), and every file under one of them.
    @Test func aDirectoryRenameFailingHalfWayLeavesTwoRealDirectories() throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let d = try fs.mkdir(parent: root, name: "d", mode: 0o700, caller: caller)
        let sub = try fs.mkdir(parent: d.inode, name: "sub", mode: 0o750, caller: caller)
        for name in ["a", "b", "c"] { _ = try createFile(fs, sub.inode, name, name) }
        // Every DELETE of b fails: the other files move, b is copied and stays.
        store.inject { call in call.operation == .delete && call.key == "d/sub/b" ? .before(.transient) : .none }
        #expect(throws: FSError.self) { try fs.rename(parent: root, name: "d", newParent: root, newName: "e", noReplace: false) }
        store.heal()
        for marker in ["d/", "d/sub/", "e/", "e/sub/"] {
            #expect(fake.object(marker) != nil, "\(marker) is missing: the directory is only implied by its keys")
        }
        #expect(fake.object("e/sub/")?.metadata["mode"] == fake.object("d/sub/")?.metadata["mode"])
        let files = ["a", "b", "c"].filter { fake.object("d/sub/" + $0) != nil || fake.object("e/sub/" + $0) != nil }
        #expect(files == ["a", "b", "c"])
        #expect(try list(fs, root) == ["d", "e"])
    }

    /// chmod whose POST fails returns EIO and the file keeps its mode, here and on the server
    /// (when attribute changes are stored at once; owed ones: `OwedAttributesTests`).
    @Test func aFailedChmodKeepsTheOldMode() throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        let fs = makeFilesystem(store, attributeWriteDelay: 0)
        defer { fs.shutdown() }
        let f = try createFile(fs, root, "f", "text")
        store.failNext(.post)
        #expect(throws: FSError.self) { _ = try fs.setattr(f.inode, AttributeChanges(mode: 0o600)) }
        #expect(try fs.getattr(f.inode).permissions == 0o644)
        #expect(try fs.lookup(parent: root, name: "f").permissions == 0o644)
    }

    /// ln -s t s; echo x > b; mv s b, whose COPY reached the server but whose answer was lost:
    /// EIO, and `b` is now the symlink on the server. Looked up again (or listed), it shows the
    /// symlink's owner and time: the attributes are not refused because the file node that held
    /// the name before had local changes (a new node of another kind has none).
    @Test(arguments: [false, true]) func aRenameWhoseCopyAnswerWasLostShowsTheCopysOwner(listing: Bool) throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let owner = Caller(uid: 1000, gid: 100)
        let link = try fs.symlink(parent: root, name: "s", target: "../t", caller: owner)
        let file = try createFile(fs, root, "b", "text")
        _ = try fs.setattr(file.inode, AttributeChanges(mode: 0o640))
        store.failNext(.copy, with: .after(.transient))
        let error = #expect(throws: FSError.self) {
            try fs.rename(parent: root, name: "s", newParent: root, newName: "b", noReplace: false)
        }
        #expect(error?.code == .ioError)
        #expect(fake.object("b")?.contentType.hasPrefix(StoredAttributes.symlinkContentType) == true)
        var shown: Attributes? = nil
        if listing {
            let handle = try fs.opendir(root)
            defer { fs.releasedir(handle: handle) }
            try fs.readdirplus(root, handle: handle, offset: 0) { name, _, _, attributes, _ in
                if name == "b" { shown = attributes }
                return true
            }
        } else {
            shown = try fs.lookup(parent: root, name: "b")
        }
        #expect(shown?.kind == .symlink)
        #expect(shown?.uid == 1000 && shown?.gid == 100)
        #expect(shown?.modified == link.modified)
        let b = try fs.lookup(parent: root, name: "b")
        #expect(try fs.readlink(b.inode) == "../t")
        #expect(try fs.getattr(b.inode).uid == 1000)
    }

    /// Files over 16 bytes are stored as multipart uploads of 8-byte parts.
    func multipartConfiguration() -> FilesystemConfiguration {
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = TestScratch.directory + "cssp-integrity-spool-" + UUID().uuidString
        configuration.multipartThreshold = 16
        configuration.partSize = 8
        return configuration
    }

    /// A multipart file's rename writes a manifest at the new name and deletes the old one. When
    /// the manifest PUT's answer is lost, a HEAD shows it was stored: the rename completes.
    @Test func aMultipartRenameWhoseManifestAnswerWasLostCompletes() throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        let configuration = multipartConfiguration()
        let fs = try Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
        defer { fs.shutdown() }
        let content = String(repeating: "0123456789", count: 5)
        _ = try createFile(fs, root, "f", content)
        store.failNext(.putManifest, with: .after(.transient))
        try fs.rename(parent: root, name: "f", newParent: root, newName: "g", noReplace: false)
        #expect(fake.object("f") == nil)
        #expect(try fs.readWhole(try fs.lookup(parent: root, name: "g").inode, chunk: 7) == Array(content.utf8))
    }

    /// When neither the manifest PUT nor the HEAD checking it answers, both names may point at the
    /// same parts. Overwriting one (even from a later mount) must not delete the other's bytes.
    @Test func aMultipartRenameCutOffKeepsThePartsOfBothNames() throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        let configuration = multipartConfiguration()
        let content = Array(String(repeating: "0123456789", count: 5).utf8)
        do {
            let fs = try Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
            defer { fs.shutdown() }
            _ = try createFile(fs, root, "f", String(decoding: content, as: UTF8.self))
            let stored = Locked(false)
            store.inject { call in
                switch call.operation {
                case .putManifest where call.key == "g":
                    stored.withLock { $0 = true }
                    return .after(.transient)
                case .head where call.key == "g" && stored.withLock({ $0 }): return .before(.transient)
                default: return .none
                }
            }
            #expect(throws: FSError.self) { try fs.rename(parent: root, name: "f", newParent: root, newName: "g", noReplace: false) }
            store.heal()
        }
        #expect(fake.object("f") != nil && fake.object("g") != nil)
        let fs = try Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
        defer { fs.shutdown() }
        let f = try fs.lookup(parent: root, name: "f")
        let opened = try fs.open(f.inode, writable: true, truncate: true)
        try write(fs, opened.handle, "small")
        try close(fs, opened.handle)
        #expect(try fs.readWhole(try fs.lookup(parent: root, name: "g").inode, chunk: 7) == content)
    }
}
