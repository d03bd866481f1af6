import Dispatch
import Foundation
import Locking
import Logging
import ObjectStore
import ObjectStoreTesting
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// Attribute changes of closed files wait (owed) for a rename or an upload to carry them
/// (`Filesystem+Attributes`): what rsync's chmod, utimes and rename of its temporary file cost,
/// what a listing or another client's change does to an owed change, and how a later mount
/// stores one from its note.
struct OwedAttributesTests {
    let root = Filesystem.rootInode
    let clock = ManualClock()
    let temporary = TemporaryDirectory("cssp-owed")
    var spool: String { temporary.path + "/spool" }

    func makeFilesystem(_ store: any ObjectStore, writeBack: Bool = false) -> Filesystem {
        var configuration = FilesystemConfiguration()
        if writeBack {
            // Queued uploads wait an hour: a mount that ends leaves them to the next.
            configuration.writeBack = true
            configuration.writeBackDelay = 3600
        }
        configuration.spoolDirectory = spool
        configuration.pendingRetrySeconds = 3600
        // No timer fires during a test: `storeOwedAttributes()` stands for the delay passing.
        configuration.attributeWriteDelay = 3600
        let clock = self.clock
        configuration.clock = { clock.now }
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    let mtime = Timestamp(seconds: 1_500_000_000, nanoseconds: 7)

    /// A file "f" stored, then chmod 600 (owed).
    func fileWithAnOwedChmod(_ fs: Filesystem) throws -> Attributes {
        let file = try fs.storeFile(root, "f", Array("x".utf8))
        _ = try fs.setattr(file.inode, AttributeChanges(mode: 0o600))
        return file
    }

    @Test func rsyncsChmodUtimesAndRenameCostACopyAndADelete() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let temporary = try fs.storeFile(root, ".f.Ab12Cd", Array("rsync".utf8), mode: 0o600)
        // rsync has looked at the destination directory: its listing answers the lookup of "f".
        let listed = try fs.opendir(root)
        try fs.readdirplus(root, handle: listed, offset: 0) { _, _, _, _, _ in true }
        fs.releasedir(handle: listed)
        store.resetCounts()
        _ = try fs.setattr(temporary.inode, AttributeChanges(mode: 0o640))
        _ = try fs.setattr(temporary.inode, AttributeChanges(modified: mtime))
        try fs.rename(parent: root, name: ".f.Ab12Cd", newParent: root, newName: "f", noReplace: false)
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.counts.copy == 1)
        // The rename waited for the COPY; the old name's DELETE goes from the delete queue
        // (issue 20, part 2), which an fsync of the directory waits for.
        try fs.fsyncDirectory()
        #expect(store.counts.delete == 1)
        #expect(store.counts.post == 0)
        #expect(store.counts.head == 0)
        let stored = try #require(store.object("f"))
        #expect(stored.bytes == Array("rsync".utf8))
        #expect(stored.metadata["mode"] == "0640")
        #expect(stored.metadata["mtime"] == "1500000000.000000007")
        #expect(StoredAttributes.parse(contentType: stored.contentType).attributes.mode == 0o640)
        #expect(store.object(".f.Ab12Cd") == nil)
        let shown = try fs.lookup(parent: root, name: "f")
        #expect(shown.permissions == 0o640 && shown.modified == mtime)
    }

    @Test func anOwedChangeWithNoRenameIsStoredInOneHeadAndOnePost() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let file = try fs.storeFile(root, "r", Array("data".utf8))
        store.resetCounts()
        _ = try fs.setattr(file.inode, AttributeChanges(mode: 0o600))
        _ = try fs.setattr(file.inode, AttributeChanges(modified: mtime))
        #expect(store.counts.post == 0)
        #expect(try fs.getattr(file.inode).permissions == 0o600)
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.counts.post == 1)
        #expect(store.counts.head == 1, "the object may have been replaced since it was confirmed")
        let stored = try #require(store.object("r"))
        #expect(stored.metadata["mode"] == "0600" && stored.metadata["mtime"] == "1500000000.000000007")
        #expect(stored.bytes == Array("data".utf8))
        // Stored once: nothing is owed any more.
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.counts.post == 1)
    }

    /// The POST of owed attributes replaces the object's manifest too (Swift drops one a POST
    /// does not repeat): a rewrite of the file stored between its HEAD and its POST, here as a
    /// DLO, must keep its manifest and bytes (core model seed 63: the queued upload's DLO lost
    /// its manifest to the POST, and its next upload became a conflict copy).
    @Test func anUploadBetweenTheHeadAndThePostOfOwedAttributesKeepsItsBytes() throws {
        let fake = FakeObjectStore()
        let rewrite = Locked<(@Sendable () -> Void)?>(nil)
        let manifestStored = DispatchSemaphore(value: 0)
        let rewritten = DispatchGroup()
        let store = FaultInjectingStore(fake) { call in
            // Another process rewrites the file after the HEAD, before the POST is sent. The POST
            // gives its upload a second to store the manifest first (it did, before uploads
            // waited for an attribute POST under way: the POST then dropped the manifest).
            if call.operation == .post, let run = rewrite.withLock({ r in defer { r = nil }; return r }) {
                rewritten.enter()
                Thread.detachNewThread { run(); rewritten.leave() }
                _ = manifestStored.wait(timeout: .now() + 1)
            }
            if call.operation == .putManifest { manifestStored.signal() }
            return .none
        }
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = spool
        configuration.attributeWriteDelay = 3600
        configuration.multipartThreshold = 16
        configuration.partSize = 8
        let fs = try Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
        defer { fs.shutdown() }
        let file = try fileWithAnOwedChmod(fs)
        let bytes = Array("forty bytes, stored as five parts of 8.".utf8)
        rewrite.withLock { $0 = { try? fs.overwrite(file.inode, bytes) } }
        #expect(fs.storeOwedAttributes().isEmpty)
        rewritten.wait()
        #expect(rewrite.withLock { $0 == nil }, "the POST ran the rewrite")
        #expect(fake.object("f")?.bytes == bytes)
        #expect(fake.object("f")?.metadata["mode"] == "0600")
        #expect(try fs.readWhole(file.inode, chunk: 64) == bytes)
    }

    @Test func aHeadOrAListingDoesNotUndoAnOwedChange() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let file = try fileWithAnOwedChmod(fs)
        clock.advance(60)
        #expect(try fs.getattr(file.inode).permissions == 0o600)  // a HEAD
        let listed = try fs.opendir(root)
        try fs.readdirplus(root, handle: listed, offset: 0) { _, _, _, _, _ in true }
        fs.releasedir(handle: listed)
        #expect(try fs.lookup(parent: root, name: "f").permissions == 0o600)
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.object("f")?.metadata["mode"] == "0600")
    }

    @Test func anotherClientsNewVersionVoidsTheOwedChange() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let file = try fs.storeFile(root, "f", Array("mine".utf8))
        _ = try fs.setattr(file.inode, AttributeChanges(mode: 0o600))
        store.seed("f", text: "theirs")
        clock.advance(60)
        store.resetCounts()
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.counts.post == 0)
        #expect(store.object("f")?.metadata["mode"] == nil)
        #expect(try fs.getattr(file.inode).permissions == 0o644)
    }

    /// Reference model seed 1189: the owed chmod of a file another client deleted found no
    /// object, and settling it journaled the file's entry as this mount's: listings within the
    /// journal's time showed the deleted name again.
    @Test func anOwedChangeOfAFileDeletedElsewhereDoesNotBringItsNameBack() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let file = try fs.storeFile(root, "f", Array("mine".utf8))
        _ = try fs.setattr(file.inode, AttributeChanges(mode: 0o600))
        try store.delete(key: "f")
        clock.advance(10)
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.object("f") == nil)
        var names: [String] = []
        let handle = try fs.opendir(root)
        defer { fs.releasedir(handle: handle) }
        try fs.readdir(root, handle: handle, offset: 0) { name, _, _, _ in
            names.append(name)
            return true
        }
        #expect(names.filter { $0 != "." && $0 != ".." } == [])
        #expect(throws: FSError.self) { try fs.lookup(parent: root, name: "f") }
    }

    @Test func aLaterMountStoresTheOwedChangeFromItsNote() throws {
        let store = FakeObjectStore()
        let first = makeFilesystem(store)
        let file = try first.storeFile(root, "f", Array("x".utf8))
        _ = try first.setattr(file.inode, AttributeChanges(mode: 0o600, modified: mtime))
        // The process ends without storing it (killed): only the note is left.
        first.shutdown()
        #expect(store.object("f")?.metadata["mode"] == "0644")
        let second = makeFilesystem(store)
        defer { second.shutdown() }
        second.recoverPendingUploads()
        #expect(store.object("f")?.metadata["mode"] == "0600")
        #expect(store.object("f")?.metadata["mtime"] == "1500000000.000000007")
        #expect(try FileManager.default.contentsOfDirectory(atPath: spool).filter { $0.hasSuffix(".attributes") }.isEmpty)
    }

    /// A file with an owed chmod is written again with the same bytes (the same ETag) and its
    /// mtime set, and the mount ends before that upload is stored (queued by write-back, or
    /// refused by the store at close). The next mount stores the upload, which carries both
    /// changes; the chmod's note, older, must not be POSTed over it and put the old mtime back
    /// (core model seed 40061: the file then showed the time of the POST).
    @Test(arguments: [true, false], ["", "same"])
    func anUploadOwedBesideAnOlderNoteKeepsItsAttributes(writeBack: Bool, text: String) throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        let first = makeFilesystem(store, writeBack: writeBack)
        let file = try first.storeFile(root, "f", Array(text.utf8))
        #expect(first.drain(timeout: 10) { _ in }.isEmpty)
        // A reader holds the file open throughout, as in the seed.
        let reading = try first.open(file.inode, writable: false, truncate: false)
        _ = try first.setattr(file.inode, AttributeChanges(mode: 0o600))
        let opened = try first.open(file.inode, writable: true, truncate: true)
        if !text.isEmpty {
            try Array(text.utf8).withUnsafeBytes { try first.write(handle: opened.handle, offset: 0, bytes: $0) }
        }
        _ = try first.setattr(file.inode, AttributeChanges(modified: mtime))
        if !writeBack {
            store.inject { call in call.operation == .put ? .before(.transient) : .none }
            #expect(throws: FSError.self) { try first.flush(handle: opened.handle) }
        } else {
            try first.flush(handle: opened.handle)
        }
        first.release(handle: opened.handle)
        first.release(handle: reading.handle)
        first.shutdown()
        store.heal()
        #expect(fake.object("f")?.metadata["mtime"] != "1500000000.000000007")
        let second = makeFilesystem(store)
        defer { second.shutdown() }
        second.recoverPendingUploads()
        #expect(fake.object("f")?.metadata["mode"] == "0600")
        #expect(fake.object("f")?.metadata["mtime"] == "1500000000.000000007")
        #expect(try FileManager.default.contentsOfDirectory(atPath: spool).filter { $0.hasSuffix(".attributes") }.isEmpty)
    }

    /// Inode numbers repeat across processes: a note this process writes must not be the file
    /// of a leftover note, which the recovery removes once it stored it.
    @Test func aRecoveredNoteNeverTakesANoteOfThisProcessWithIt() throws {
        let store = FakeObjectStore()
        let first = makeFilesystem(store)
        let file = try fileWithAnOwedChmod(first)
        first.shutdown()
        let second = makeFilesystem(store)
        let other = try second.storeFile(root, "g", Array("y".utf8))
        #expect(other.inode == file.inode, "the test needs the same inode number")
        _ = try second.setattr(other.inode, AttributeChanges(mode: 0o640))
        second.recoverPendingUploads()
        #expect(store.object("f")?.metadata["mode"] == "0600")
        // The second process ends without storing its change either.
        second.shutdown()
        let third = makeFilesystem(store)
        defer { third.shutdown() }
        third.recoverPendingUploads()
        #expect(store.object("g")?.metadata["mode"] == "0640")
    }

    @Test func aLaterMountDropsANoteWhoseObjectWasReplaced() throws {
        let store = FakeObjectStore()
        let first = makeFilesystem(store)
        _ = try fileWithAnOwedChmod(first)
        first.shutdown()
        store.seed("f", text: "another client's")
        let second = makeFilesystem(store)
        defer { second.shutdown() }
        store.resetCounts()
        second.recoverPendingUploads()
        #expect(store.counts.post == 0)
        #expect(store.object("f")?.metadata["mode"] == nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: spool).filter { $0.hasSuffix(".attributes") }.isEmpty)
    }

    @Test func unlinkDropsTheOwedChange() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        _ = try fileWithAnOwedChmod(fs)
        try fs.unlink(parent: root, name: "f")
        store.resetCounts()
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.counts.post == 0 && store.counts.put == 0)
        #expect(store.object("f") == nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: spool).filter { $0.hasSuffix(".attributes") }.isEmpty)
    }

    @Test func aRenameOverAFileWithAnOwedChangeKeepsTheRenamedFilesAttributes() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let replaced = try fs.storeFile(root, "a", Array("old".utf8))
        _ = try fs.setattr(replaced.inode, AttributeChanges(mode: 0o600))
        try fs.storeFile(root, "b", Array("new".utf8), mode: 0o755)
        try fs.rename(parent: root, name: "b", newParent: root, newName: "a", noReplace: false)
        #expect(fs.storeOwedAttributes().isEmpty)
        let stored = try #require(store.object("a"))
        #expect(stored.bytes == Array("new".utf8))
        #expect(stored.metadata["mode"] == "0755")
        #expect(try fs.lookup(parent: root, name: "a").permissions == 0o755)
    }

    @Test func aDirectoryRenameStoresOwedChangesBelowItFirst() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let directory = try fs.mkdir(parent: root, name: "d", mode: 0o755, caller: Caller(uid: 0, gid: 0))
        let file = try fs.storeFile(directory.inode, "f", Array("x".utf8))
        _ = try fs.setattr(file.inode, AttributeChanges(mode: 0o600))
        try fs.rename(parent: root, name: "d", newParent: root, newName: "e", noReplace: false)
        #expect(store.object("e/f")?.metadata["mode"] == "0600")
        #expect(store.object("d/f") == nil)
    }

    @Test func fsyncOfAReadOnlyHandleStoresTheOwedChange() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let file = try fileWithAnOwedChmod(fs)
        let opened = try fs.open(file.inode, writable: false, truncate: false)
        defer { fs.release(handle: opened.handle) }
        try fs.fsync(handle: opened.handle)
        #expect(store.object("f")?.metadata["mode"] == "0600")
    }

    @Test func anOwedChangeWhosePostFailsStaysOwedAndIsStoredLater() throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let file = try fileWithAnOwedChmod(fs)
        store.failNext(.post)
        #expect(fs.storeOwedAttributes() == ["f"])
        #expect(try fs.getattr(file.inode).permissions == 0o600)
        #expect(fake.object("f")?.metadata["mode"] == "0644")
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(fake.object("f")?.metadata["mode"] == "0600")
    }
}
