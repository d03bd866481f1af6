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

/// Write-back (`-o writeback`, docs/writeback-design.md step 1): a close journals the file and
/// returns; the queue stores it. `writeBackDelay` is an hour here, so that nothing is stored
/// until a test lets the queue run (`drain`, as an unmount does) or calls fsync.
struct WriteBackTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode

    func makeFilesystem(
        _ store: any ObjectStore, spool: String? = nil, maxBytes: Int64 = 1 << 30, retrySeconds: Double = 3600,
        multipartThreshold: Int64? = nil, clock: ManualClock? = nil
    ) -> Filesystem {
        var configuration = FilesystemConfiguration()
        if let clock { configuration.clock = { clock.now } }
        if let multipartThreshold {
            configuration.multipartThreshold = multipartThreshold
            configuration.partSize = 4
        }
        configuration.writeBack = true
        configuration.writeBackDelay = 3600
        configuration.writeBackMaxBytes = maxBytes
        configuration.pendingRetrySeconds = retrySeconds
        configuration.spoolDirectory = spool ?? TestScratch.directory + "cssp-writeback-spool-" + UUID().uuidString
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    /// create, write, close (flush and release): returns with nothing sent.
    func writeFile(_ fs: Filesystem, _ parent: InodeNumber, _ name: String, _ text: String) throws -> Attributes {
        let (attributes, opened) = try fs.create(parent: parent, name: name, mode: 0o644, caller: caller)
        try Array(text.utf8).withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        try fs.flush(handle: opened.handle)
        fs.release(handle: opened.handle)
        return attributes
    }

    func drain(_ fs: Filesystem) {
        #expect(fs.drain(timeout: 10) { _ in }.isEmpty)
    }

    /// The drain at unmount stores the queue `upload_parallel` files at once, not one after
    /// another (1000 queued files took 10 s to drain, twice what the queue takes).
    @Test func theDrainStoresTheQueueInParallel() throws {
        let fake = FakeObjectStore()
        // Each PUT waits (at most 2 s) for a second one to be under way too.
        let inFlight = ConditionLocked((now: 0, most: 0))
        let store = FaultInjectingStore(fake) { call in
            guard call.operation == .put else { return .none }
            inFlight.withLock { $0.now += 1; $0.most = max($0.most, $0.now) }
            _ = inFlight.withLock(when: { $0.most >= 2 }, timeout: 2) { _ in }
            inFlight.withLock { $0.now -= 1 }
            return .none
        }
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        for n in 0..<4 { _ = try writeFile(fs, root, "f\(n)", "bytes \(n)") }
        drain(fs)
        #expect(fake.keys == ["f0", "f1", "f2", "f3"])
        #expect(inFlight.withLock { $0.most } >= 2)
    }

    @Test func aCloseReturnsBeforeTheUploadAndTheMountShowsTheFile() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let f = try writeFile(fs, root, "f", "queued bytes")
        #expect(store.counts.put == 0)
        #expect(try fs.getattr(f.inode).size == 12)
        #expect(try fs.lookup(parent: root, name: "f").inode == f.inode)
        let opened = try fs.open(f.inode, writable: false, truncate: false)
        #expect(try fs.readBytes(opened.handle, offset: 0, length: 100) == Array("queued bytes".utf8))
        fs.release(handle: opened.handle)
        #expect(fs.transfers.report().contains("f: 12 B, queued (write-back)"))
        drain(fs)
        #expect(store.object("f")?.bytes == Array("queued bytes".utf8))
        #expect(store.counts.put == 1)
        #expect(fs.transfers.owed.isEmpty)
    }

    /// rsync's pattern: a temporary name, written, closed, renamed over the final one. Stored once,
    /// under the final name: one PUT, no COPY, no DELETE.
    @Test func aQueuedFileRenamedBeforeItsTurnIsStoredOnceUnderItsLastName() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let temporary = try writeFile(fs, root, ".f.XXXXXX", "rsync's bytes")
        _ = try fs.setattr(temporary.inode, AttributeChanges(mode: 0o600))
        try fs.rename(parent: root, name: ".f.XXXXXX", newParent: root, newName: "f", noReplace: false)
        #expect(store.counts.put == 0 && store.counts.copy == 0, "nothing sent for the close and the rename")
        drain(fs)
        #expect(store.keys == ["f"])
        #expect(store.object("f")?.metadata["mode"] == "0600")
        let counts = store.counts
        #expect(counts.put == 1 && counts.copy == 0 && counts.delete == 0 && counts.post == 0, "\(counts)")
    }

    /// A file created and removed before its turn costs nothing.
    @Test func aQueuedFileUnlinkedBeforeItsTurnIsNeverSent() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        _ = try writeFile(fs, root, "scratch", "gone soon")
        try fs.unlink(parent: root, name: "scratch")
        drain(fs)
        #expect(store.keys.isEmpty)
        let counts = store.counts
        #expect(counts.put == 0 && counts.delete == 0 && counts.post == 0, "\(counts)")
    }

    /// rsync's way over a stored "f": ".f.tmp" written (queued), then renamed over "f".
    func renameQueuedFileOverStoredOne(_ store: FakeObjectStore) throws -> Filesystem {
        store.seed("f", text: "the old version")
        let fs = makeFilesystem(store)
        _ = try fs.lookup(parent: root, name: "f")
        _ = try writeFile(fs, root, ".f.tmp", "the new one")
        try fs.rename(parent: root, name: ".f.tmp", newParent: root, newName: "f", noReplace: false)
        return fs
    }

    /// A queued file renamed over a stored one replaces it, at the upload, with no conflict copy.
    @Test func aQueuedFileRenamedOverAStoredOneReplacesIt() throws {
        let store = FakeObjectStore()
        let fs = try renameQueuedFileOverStoredOne(store)
        defer { fs.shutdown() }
        #expect(store.object("f")?.bytes == Array("the old version".utf8), "until its turn")
        drain(fs)
        #expect(store.keys == ["f"])
        #expect(store.object("f")?.bytes == Array("the new one".utf8))
    }

    /// A queued file renamed over a symlink: until its upload the store still lists the symlink
    /// there, and a listing must show the file, with its number (core model seed 8366: a
    /// readdirplus made a symlink node of the name, and the next open met a symlink).
    @Test func aQueuedFileRenamedOverASymlinkIsTheFileInListings() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        _ = try fs.symlink(parent: root, name: "s", target: "../t", caller: caller)
        let file = try writeFile(fs, root, ".s.tmp", "the file")
        try fs.rename(parent: root, name: ".s.tmp", newParent: root, newName: "s", noReplace: false)
        #expect(store.object("s")?.contentType.hasPrefix("application/link") == true, "until its turn")
        for plus in [false, true] {
            var shown: [String: (NodeKind, InodeNumber)] = [:]
            let handle = try fs.opendir(root)
            if plus {
                try fs.readdirplus(root, handle: handle, offset: 0) { name, kind, inode, _, _ in
                    shown[name] = (kind, inode)
                    return true
                }
            } else {
                try fs.readdir(root, handle: handle, offset: 0) { name, kind, inode, _ in
                    shown[name] = (kind, inode)
                    return true
                }
            }
            fs.releasedir(handle: handle)
            #expect(shown["s"]?.0 == .file && shown["s"]?.1 == file.inode, "readdirplus: \(plus)")
        }
        #expect(try fs.lookup(parent: root, name: "s").kind == .file)
        drain(fs)
        #expect(store.object("s")?.bytes == Array("the file".utf8))
    }

    /// A queued file renamed over a stored one, then unlinked or renamed on: the object it was
    /// to replace goes too (the core model, seed 36: the old object stayed under the name).
    @Test func aQueuedFileThatReplacedAStoredOneTakesItAlongWhenItGoes() throws {
        for renamedOn in [false, true] {
            let store = FakeObjectStore()
            let fs = try renameQueuedFileOverStoredOne(store)
            defer { fs.shutdown() }
            if renamedOn {
                try fs.rename(parent: root, name: "f", newParent: root, newName: "h", noReplace: false)
            } else {
                try fs.unlink(parent: root, name: "f")
            }
            drain(fs)
            #expect(store.keys == (renamedOn ? ["h"] : []), "renamed on: \(renamedOn)")
        }
    }

    /// A queued overwrite whose base another client deleted meanwhile goes to a conflict copy:
    /// neither the deletion nor these bytes are lost.
    @Test func aQueuedOverwriteOfAnObjectAnotherClientDeletedIsAConflictCopy() throws {
        let store = FakeObjectStore()
        store.seed("f", text: "theirs")
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        try fs.overwrite(try fs.lookup(parent: root, name: "f").inode, Array("mine".utf8))
        try store.delete(key: "f")
        drain(fs)
        #expect(store.keys.count == 1 && store.keys[0].hasPrefix("f.cssp-conflict-"), "\(store.keys)")
    }

    /// A queued file unlinked while a reader holds it owes nothing: `--status` lists nothing and
    /// the drain does not wait for it (mount model, seed 5).
    @Test func aQueuedFileUnlinkedWhileReadIsNoLongerOwed() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let f = try writeFile(fs, root, "f", "read and removed")
        let reader = try fs.open(f.inode, writable: false, truncate: false)
        try fs.unlink(parent: root, name: "f")
        #expect(fs.transfers.owed.isEmpty)
        drain(fs)
        fs.release(handle: reader.handle)
        #expect(store.keys.isEmpty)
    }

    /// fsync is the barrier: stored when it returns.
    @Test func fsyncStoresAQueuedFileAtOnce() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let (_, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try Array("synced".utf8).withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        try fs.flush(handle: opened.handle)
        #expect(store.keys.isEmpty)
        try fs.fsync(handle: opened.handle)
        #expect(store.object("f")?.bytes == Array("synced".utf8))
        fs.release(handle: opened.handle)
        drain(fs)
        #expect(store.counts.put == 1)
    }

    /// Bytes written and flushed again after the first flush are what is stored.
    @Test func aSecondFlushBeforeTheUploadStoresTheNewerBytes() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let (_, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try Array("first".utf8).withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        try fs.flush(handle: opened.handle)
        try Array(", second".utf8).withUnsafeBytes { try fs.write(handle: opened.handle, offset: 5, bytes: $0) }
        try fs.flush(handle: opened.handle)
        fs.release(handle: opened.handle)
        drain(fs)
        #expect(store.object("f")?.bytes == Array("first, second".utf8))
    }


    /// A readdir that took its listing before a queued upload was stored, continued after the
    /// upload and after the kernel forgot the file (its node goes with the spool), must not make
    /// a node from its old entry: the new node would describe the version before (core model
    /// seed 13, write-back: `g has size 7, expected 43`).
    /// (A DLO too: its own entry says size 0, only a HEAD describes it.)
    @Test(arguments: [nil, 8] as [Int64?])
    func aReaddirFromBeforeAStoredUploadDoesNotBringTheOldVersionBack(multipartThreshold: Int64?) throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store, multipartThreshold: multipartThreshold)
        defer { fs.shutdown() }
        let f = try writeFile(fs, root, "f", "v1")
        drain(fs)
        #expect(try fs.names(in: root) == ["f"])
        try fs.overwrite(f.inode, Array("version two".utf8))
        // ls -l takes its listing (it stops after "..", as when the kernel's buffer is full) ...
        let handle = try fs.opendir(root)
        defer { fs.releasedir(handle: handle) }
        try fs.readdirplus(root, handle: handle, offset: 0) { name, _, _, _, _ in name == "." }
        // ... the kernel forgets the file, its upload is stored, and ls -l goes on.
        fs.forget(f.inode, count: 1)
        drain(fs)
        var shown: [String: Attributes?] = [:]
        try fs.readdirplus(root, handle: handle, offset: 1) { name, _, _, attributes, _ in
            shown[name] = attributes
            return true
        }
        #expect(shown.keys.contains("f"))
        if let attributes = shown["f"] ?? nil {
            #expect(attributes.size == 11)
            #expect(try fs.getattr(attributes.inode).size == 11)
        }
        #expect(try fs.lookup(parent: root, name: "f").size == 11)
    }
    /// A readdir reading a remembered listing that lacks a file written here (queued, shown as
    /// this mount's own) goes on after the file's upload put it into that listing: the file is
    /// still shown, once (core model seed 7003: `ls` lost a file whose upload ended mid-walk).
    @Test func aFileStoredWhileAReaddirOfItsDirectoryRunsIsShown() throws {
        let store = FakeObjectStore()
        store.seed("a", Array("stored".utf8))
        let clock = ManualClock()
        let fs = makeFilesystem(store, clock: clock)
        defer { fs.shutdown() }
        _ = try writeFile(fs, root, "new", "queued")
        // Listed once its create is no longer journaled: remembered without it (the store does
        // not have it), shown as this mount's open file.
        clock.advance(60)
        #expect(try fs.names(in: root) == ["a", "new"])
        let handle = try fs.opendir(root)
        defer { fs.releasedir(handle: handle) }
        var names: [String] = []
        // The kernel's buffer is full after "." and "..".
        try fs.readdir(root, handle: handle, offset: 0) { name, _, _, _ in
            guard name == "." || name == ".." else { return false }
            names.append(name)
            return true
        }
        drain(fs)
        #expect(store.keys.contains("new"))
        try fs.readdir(root, handle: handle, offset: 2) { name, _, _, _ in
            names.append(name)
            return true
        }
        #expect(names == [".", "..", "a", "new"])
    }

    /// The daemon dies with files queued (renamed, too): the next mount of the same cache stores
    /// each under its last name, once.
    @Test func aMountThatDiedWithQueuedFilesLeavesThemToTheNext() throws {
        let store = FakeObjectStore()
        let spool = TestScratch.directory + "cssp-writeback-spool-" + UUID().uuidString
        let died = makeFilesystem(store, spool: spool)
        _ = try writeFile(died, root, "a", "queued a")
        _ = try writeFile(died, root, ".b.tmp", "queued b")
        try died.rename(parent: root, name: ".b.tmp", newParent: root, newName: "b", noReplace: false)
        died.spool.unlock()  // killed: no drain, no shutdown
        #expect(store.keys.isEmpty)
        let next = makeFilesystem(store, spool: spool)
        defer { next.shutdown() }
        next.recoverPendingUploads()
        #expect(store.keys == ["a", "b"])
        #expect(store.object("b")?.bytes == Array("queued b".utf8))
        #expect(store.counts.put == 2)
    }

    /// A failed upload of the queue is retried, not dropped (and reported as owed).
    @Test func aFailedQueuedUploadIsRetried() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        _ = try writeFile(fs, root, "f", "retry me")
        store.failNextPuts(1)
        drain(fs)
        #expect(store.object("f")?.bytes == Array("retry me".utf8))
    }

    /// The queue's upload of a file that replaced a stored one reaches the server and its
    /// answer is lost: the retry finds this mount's bytes there, not another client's version.
    @Test func aLostAnswerOfAQueuedUploadIsNotAConflict() throws {
        let fake = FakeObjectStore()
        fake.seed("f", text: "version 1")
        let store = FaultInjectingStore(fake)
        let fs = makeFilesystem(store, retrySeconds: 0)
        defer { fs.shutdown() }
        try fs.overwrite(try fs.lookup(parent: root, name: "f").inode, Array("version 2".utf8))
        store.failNext(.put, count: 1, with: .after(.transient))
        drain(fs)
        #expect(store.injected.count == 1)
        #expect(fake.object("f")?.bytes == Array("version 2".utf8))
        #expect(fake.keys == ["f"])
    }

    /// How many records the upload journal holds so far (every note written is one).
    func notesWritten(_ fs: Filesystem) -> UInt64 { fs.spool.uploads.appended }

    /// A close writes the note once: the close of a dup'ed descriptor (a second flush of the
    /// same bytes) and the release after it write nothing; a chmod after it writes it again.
    @Test func aNoteThatWouldSayTheSameIsNotWrittenAgain() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let (attributes, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try Array("bytes".utf8).withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        try fs.flush(handle: opened.handle)
        let first = notesWritten(fs)
        #expect(first > 0)
        try fs.flush(handle: opened.handle)
        fs.release(handle: opened.handle)
        #expect(notesWritten(fs) == first)
        _ = try fs.setattr(attributes.inode, AttributeChanges(mode: 0o600))
        let second = notesWritten(fs)
        #expect(second == first + 1)
        try fs.rename(parent: root, name: "f", newParent: root, newName: "g", noReplace: false)
        #expect(notesWritten(fs) == second + 1)
        try fs.fsyncDirectory()
        drain(fs)
        #expect(store.keys == ["g"])
        #expect(store.object("g")?.metadata["mode"] == "0600")
    }

    /// writeback_max_mb: a close that finds the journal full stores the oldest queued files
    /// itself until there is room; nothing waits for the queue's delay.
    @Test func aFullJournalMakesTheCloseStoreTheOldestFiles() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store, maxBytes: 20)
        defer { fs.shutdown() }
        for i in 1...5 {
            _ = try writeFile(fs, root, "f\(i)", "8 bytes\(i)")
            #expect(fs.transfers.owedBytes <= 20, "after f\(i): \(fs.transfers.owedBytes) bytes owed")
        }
        #expect(store.keys == ["f1", "f2", "f3"], "the oldest stored by the closes that found no room")
        #expect(fs.statusReport().contains("write-back journal: 16 B owed of 20 B"))
        drain(fs)
        #expect(store.keys == ["f1", "f2", "f3", "f4", "f5"])
    }

    /// With the server refusing uploads and the journal full, a close waits (no ENOSPC, nothing
    /// dropped) until retries make room.
    @Test func aCloseWaitsForRoomWhileTheServerRefusesUploads() throws {
        let fake = FakeObjectStore()
        let refusing = Locked(false)
        let refused = ConditionLocked(0)
        let store = FaultInjectingStore(fake) { call in
            guard call.operation == .put, refusing.withLock({ $0 }) else { return .none }
            refused.withLock { $0 += 1 }
            return .before(.transient)
        }
        let fs = makeFilesystem(store, maxBytes: 10, retrySeconds: 0.05)
        defer { fs.shutdown() }
        _ = try writeFile(fs, root, "a", "8 bytes!")
        refusing.withLock { $0 = true }
        let closed = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            _ = try? writeFile(fs, root, "b", "8 bytes?")
            closed.signal()
        }
        // The close tried (and the retries of "a" keep trying): it cannot have returned, since
        // nothing can be stored.
        _ = refused.withLock(when: { $0 >= 3 }) { _ in }
        #expect(closed.wait(timeout: .now()) == .timedOut, "the close returned with the journal full")
        refusing.withLock { $0 = false }
        closed.wait()
        drain(fs)
        #expect(fake.object("a")?.bytes == Array("8 bytes!".utf8))
        #expect(fake.object("b")?.bytes == Array("8 bytes?".utf8))
    }
}

