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

/// What a mount that died left journaled (write-back files, failed uploads, attribute notes) is
/// stored before the next mount serves the names involved (`RecoveredWork`): these tests never
/// call `recoverPendingUploads` before they look, as a user of a freshly started mount would
/// not wait for it either.
struct RecoveryTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode
    let spool = TestScratch.directory + "cssp-recovery-spool-" + UUID().uuidString

    func makeFilesystem(
        _ store: any ObjectStore, writeBack: Bool = true, readOnly: Bool = false, multipartThreshold: Int64 = 64 << 20
    ) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.multipartThreshold = multipartThreshold
        configuration.partSize = 16
        configuration.writeBack = writeBack
        configuration.writeBackDelay = 3600
        configuration.pendingRetrySeconds = 3600
        configuration.readOnly = readOnly
        configuration.spoolDirectory = spool
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    /// A write-back mount that dies (no drain, no shutdown) with `files` queued, by path.
    func dieWithQueuedFiles(_ store: any ObjectStore, _ files: [(String, String)], multipartThreshold: Int64 = 64 << 20) throws {
        let died = makeFilesystem(store, multipartThreshold: multipartThreshold)
        for (path, text) in files {
            var parent = root
            let parts = path.split(separator: "/").map(String.init)
            for directory in parts.dropLast() {
                if let found = try? died.lookup(parent: parent, name: directory) {
                    parent = found.inode
                } else {
                    parent = try died.mkdir(parent: parent, name: directory, mode: 0o755, caller: caller).inode
                }
            }
            // As the kernel does it: a lookup first, and a name that exists is opened with O_TRUNC.
            guard let existing = try? died.lookup(parent: parent, name: parts.last!) else {
                try died.storeFile(parent, parts.last!, Array(text.utf8), caller: caller)
                continue
            }
            try died.overwrite(existing.inode, Array(text.utf8))
        }
        died.spool.unlock()
    }

    func names(_ fs: Filesystem, _ inode: InodeNumber) throws -> [String] { try fs.names(in: inode) }

    func text(_ fs: Filesystem, _ parent: InodeNumber, _ name: String) throws -> String {
        let node = try fs.lookup(parent: parent, name: name)
        return String(decoding: try fs.readWhole(node.inode, chunk: 1 << 16), as: UTF8.self)
    }

    /// A lookup and a read of a queued file that replaced a stored one show the journal's
    /// version, never the older one still on the server.
    @Test func aReplacedFileIsReadAsTheJournalHasIt() throws {
        let store = FakeObjectStore()
        store.seed("f", text: "version 1")
        try dieWithQueuedFiles(store, [("f", "version 2, queued")])
        #expect(store.object("f")?.bytes == Array("version 1".utf8))
        let next = makeFilesystem(store)
        defer { next.shutdown() }
        #expect(try text(next, root, "f") == "version 2, queued")
        #expect(try next.lookup(parent: root, name: "f").size == Int64("version 2, queued".utf8.count))
    }

    /// A listing shows the queued names, and the directories only queued files would create.
    @Test func listingsShowTheJournalsNames() throws {
        let store = FakeObjectStore()
        store.seed("old", text: "stored before")
        try dieWithQueuedFiles(store, [("new", "n"), ("d/e/deep", "deep"), ("d/e/deeper", "deeper")])
        let next = makeFilesystem(store)
        defer { next.shutdown() }
        #expect(try names(next, root).sorted() == ["d", "new", "old"])
        let d = try next.lookup(parent: root, name: "d")
        #expect(try names(next, d.inode) == ["e"])
        let e = try next.lookup(parent: d.inode, name: "e")
        #expect(try names(next, e.inode).sorted() == ["deep", "deeper"])
        #expect(try text(next, e.inode, "deeper") == "deeper")
    }

    /// Only what a name needs is stored before it is served: the rest waits for the
    /// background recovery.
    @Test func aLookupStoresOnlyWhatItsNameNeeds() throws {
        let store = FakeObjectStore()
        try dieWithQueuedFiles(store, [("a/one", "1"), ("b/two", "2"), ("b/three", "3")])
        let next = makeFilesystem(store)
        defer { next.shutdown() }
        let a = try next.lookup(parent: root, name: "a")
        #expect(try text(next, a.inode, "one") == "1")
        #expect(store.object("b/two") == nil && store.object("b/three") == nil)
        #expect(next.recovered.count == 2)
        #expect(next.statusReport().contains("owed by an earlier mount, not stored yet: 2"))
        next.recoverPendingUploads()
        #expect(!next.statusReport().contains("owed by an earlier mount"))
        #expect(store.object("b/two")?.bytes == Array("2".utf8))
        #expect(store.object("b/three")?.bytes == Array("3".utf8))
        #expect(next.recovered.count == 0)
    }

    /// Another client replaced the object after the dead mount read it: the name shows theirs,
    /// and the journal's bytes are in the conflict copy the listing shows beside it.
    @Test func aConflictIsDecidedBeforeTheNameIsServed() throws {
        let store = FakeObjectStore()
        store.seed("f", text: "version 1")
        try dieWithQueuedFiles(store, [("f", "ours")])
        store.seed("f", text: "theirs")
        let next = makeFilesystem(store)
        defer { next.shutdown() }
        #expect(try text(next, root, "f") == "theirs")
        let copies = try names(next, root).filter { $0.hasPrefix("f.cssp-conflict-") }
        #expect(copies.count == 1)
        #expect(try copies.first.map { try text(next, root, $0) } == "ours")
    }

    /// An attribute change a dead mount noted is what a stat of the next mount shows.
    @Test func anOwedChmodIsSeenAtOnce() throws {
        let store = FakeObjectStore()
        let first = makeFilesystem(store, writeBack: false)
        let file = try first.storeFile(root, "f", Array("x".utf8), caller: caller)
        _ = try first.setattr(file.inode, AttributeChanges(mode: 0o600))
        first.spool.unlock()  // killed: the note is all that is left
        #expect(store.object("f")?.metadata["mode"] == "0644")
        let next = makeFilesystem(store, writeBack: false)
        defer { next.shutdown() }
        #expect(try next.lookup(parent: root, name: "f").permissions == 0o600)
    }

    /// While the store refuses the upload a name needs, the name is an error (EIO), not the
    /// older version; once the store takes it, the name is served.
    @Test func aNameWaitsForItsUploadWhileTheStoreRefuses() throws {
        let fake = FakeObjectStore()
        fake.seed("f", text: "version 1")
        try dieWithQueuedFiles(fake, [("f", "version 2")])
        let store = FaultInjectingStore(fake)
        store.inject { $0.operation == .put ? .before(.transient) : .none }
        let next = makeFilesystem(store)
        defer { next.shutdown() }
        #expect(throws: FSError.self) { try next.lookup(parent: root, name: "f") }
        store.heal()
        #expect(try text(next, root, "f") == "version 2")
    }

    /// The background recovery retries a refused upload until it is stored.
    @Test func theBackgroundRecoveryRetriesUntilStored() throws {
        let fake = FakeObjectStore()
        try dieWithQueuedFiles(fake, [("f", "kept")])
        let store = FaultInjectingStore(fake)
        store.failNext(.put, count: 1)
        let next = makeFilesystem(store)
        defer { next.shutdown() }
        next.recoverPendingUploads()
        #expect(fake.object("f")?.bytes == Array("kept".utf8))
        #expect(store.injected.count == 1)
    }

    /// A write of this mount to a name an earlier mount owed lands after the owed version: the
    /// kernel's lookup before the open finds the owed version (stored first), which the write
    /// then replaces.
    @Test func aNewWriteLandsAfterTheOwedVersion() throws {
        let fake = FakeObjectStore()
        try dieWithQueuedFiles(fake, [("f", "owed")])
        let next = makeFilesystem(fake, writeBack: false)
        defer { next.shutdown() }
        let f = try next.lookup(parent: root, name: "f")
        let opened = try next.open(f.inode, writable: true, truncate: true)
        try Array("newer".utf8).withUnsafeBytes { try next.write(handle: opened.handle, offset: 0, bytes: $0) }
        try next.flush(handle: opened.handle)
        next.release(handle: opened.handle)
        next.recoverPendingUploads()
        #expect(fake.object("f")?.bytes == Array("newer".utf8))
    }

    /// The background recovery stores the journal oldest first (by when each note was written),
    /// whatever the spool files are called.
    @Test func theRecoveryStoresOldestFirst() throws {
        let fake = FakeObjectStore()
        let order = ["m", "b", "z", "a", "k", "c"]
        try dieWithQueuedFiles(fake, order.map { ($0, "file " + $0) })
        let (store, puts) = recordingCalls(of: .put, in: fake)
        let next = makeFilesystem(store)
        defer { next.shutdown() }
        next.recoverPendingUploads()
        #expect(puts.withLock { $0 } == order)
    }

    /// The server stores a recovered upload and its answer is lost: the retry finds this
    /// mount's own bytes there, not another client's version (no conflict copy), whether a
    /// plain object or a multipart upload (a DLO manifest over parts).
    @Test(arguments: [64 << 20, 8] as [Int64]) func aLostAnswerOfARecoveredUploadIsNotAConflict(threshold: Int64) throws {
        let fake = FakeObjectStore()
        fake.seed("f", text: "version 1")
        try dieWithQueuedFiles(fake, [("f", "version 2, a little longer than one part")], multipartThreshold: threshold)
        let store = FaultInjectingStore(fake)
        store.failNext(threshold > 100 ? .put : .putManifest, count: 1, with: .after(.transient))
        let next = makeFilesystem(store, multipartThreshold: threshold)
        defer { next.shutdown() }
        next.recoverPendingUploads()
        #expect(store.injected.count == 1)
        #expect(try next.text(root, "f") == "version 2, a little longer than one part")
        #expect(!fake.keys.contains { $0.contains("cssp-conflict") }, "\(fake.keys)")
    }

    /// A read-only mount stores nothing and so serves the store as it is.
    @Test func aReadOnlyMountServesTheStoreAsItIs() throws {
        let store = FakeObjectStore()
        store.seed("f", text: "version 1")
        try dieWithQueuedFiles(store, [("f", "version 2")])
        let next = makeFilesystem(store, readOnly: true)
        defer { next.shutdown() }
        #expect(try text(next, root, "f") == "version 1")
        #expect(store.object("f")?.bytes == Array("version 1".utf8))
    }

    /// Core model seed 531: a queued file renamed to the other Unicode normalisation of its name
    /// ("café" precomposed to "cafe" + U+0301) must be journaled under the new key. Swift's
    /// `String ==` calls the two equal, so the note "would say the same" and was not rewritten:
    /// the next mount stored the bytes under the old key (a conflict copy beside whatever was
    /// there).
    @Test func aRenameToTheOtherNormalisationIsJournaled() throws {
        let store = FakeObjectStore()
        let died = makeFilesystem(store)
        let nfc = "caf\u{E9}"
        let nfd = "cafe\u{301}"
        try died.storeFile(root, nfc, Array("queued".utf8), caller: caller)
        try died.rename(parent: root, name: nfc, newParent: root, newName: nfd, noReplace: false)
        died.spool.unlock()
        let next = makeFilesystem(store)
        defer { next.shutdown() }
        next.recoverPendingUploads()
        #expect(store.keys.map(\.unicodeScalars.count) == [nfd.unicodeScalars.count], "\(store.keys.map { Array($0.utf8) })")
        #expect(store.object(nfd)?.bytes == Array("queued".utf8))
    }
}
