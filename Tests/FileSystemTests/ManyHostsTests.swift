import Foundation
import Logging
import Metrics
import ObjectStore
import ObjectStoreTesting
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// Issue 22: several hosts on one container. Every upload is checked against the version it
/// replaces, right before its last request, so that another client's version is never silently
/// overwritten: ours then goes to a conflict copy.
struct ManyHostsTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode

    func makeFilesystem(_ store: any ObjectStore, metrics: MountMetrics = MountMetrics()) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = TestScratch.directory + "cssp-hosts-spool-" + UUID().uuidString
        configuration.pendingRetrySeconds = 3600
        configuration.metrics = metrics
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func write(_ fs: Filesystem, _ handle: UInt64, _ text: String) throws {
        try Array(text.utf8).withUnsafeBytes { try fs.write(handle: handle, offset: 0, bytes: $0) }
    }

    func close(_ fs: Filesystem, _ handle: UInt64) throws {
        defer { fs.release(handle: handle) }
        try fs.flush(handle: handle)
    }

    func conflictCopies(_ store: FakeObjectStore, of key: String) -> [[UInt8]] {
        store.keys.filter { $0.hasPrefix(key + ".cssp-conflict-") }.compactMap { store.object($0)?.bytes }
    }

    /// What another client does to a file opened here before its close.
    enum Meanwhile: CaseIterable, Sendable { case nothing, replaced, deleted }

    /// A file opened here and closed: stored at its name after one HEAD when nobody else touched
    /// it; else the close stores ours as a conflict copy (counted) beside the other client's
    /// version, or its deletion: ours does not bring the name back.
    @Test(arguments: Meanwhile.allCases) func aCloseChecksTheVersionItReplaces(meanwhile: Meanwhile) throws {
        let store = FakeObjectStore()
        store.seed("f", text: "version 1")
        let metrics = MountMetrics()
        let fs = makeFilesystem(store, metrics: metrics)
        defer { fs.shutdown() }
        let f = try fs.lookup(parent: root, name: "f")
        let opened = try fs.open(f.inode, writable: true, truncate: true)
        try write(fs, opened.handle, "ours")
        switch meanwhile {
        case .nothing: break
        case .replaced: store.seed("f", text: "theirs")
        case .deleted: try store.delete(key: "f")
        }
        store.resetCounts()
        try close(fs, opened.handle)
        switch meanwhile {
        case .nothing:
            #expect(store.object("f")?.bytes == Array("ours".utf8))
            #expect(store.counts.head == 1 && store.counts.put == 1)
            #expect(conflictCopies(store, of: "f").isEmpty)
        case .replaced, .deleted:
            #expect(store.object("f")?.bytes == (meanwhile == .replaced ? Array("theirs".utf8) : nil))
            #expect(conflictCopies(store, of: "f") == [Array("ours".utf8)])
        }
        #expect(metrics.conflicts.value == (meanwhile == .nothing ? 0 : 1))
    }

    /// Two conflicts of one name within a second keep both copies (`-2` for the second): the
    /// two-mount model found the second overwriting the first.
    @Test func twoConflictsInOneSecondKeepBothCopies() throws {
        let store = FakeObjectStore()
        store.seed("f", text: "version 1")
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let f = try fs.lookup(parent: root, name: "f")
        for (n, text) in ["first", "second"].enumerated() {
            let opened = try fs.open(f.inode, writable: true, truncate: true)
            try write(fs, opened.handle, text)
            store.seed("f", text: "theirs \(n)")
            try close(fs, opened.handle)
        }
        #expect(Set(conflictCopies(store, of: "f")) == [Array("first".utf8), Array("second".utf8)])
    }

    /// A new name is stored with `If-None-Match: *`: no HEAD first; another client's file made
    /// under the same name meanwhile is kept, ours goes aside.
    @Test(arguments: [false, true]) func aNewNameIsStoredOnlyWhereNothingIs(anotherClientMadeIt: Bool) throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let (_, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(fs, opened.handle, "ours")
        if anotherClientMadeIt { store.seed("f", text: "theirs") }
        store.resetCounts()
        try close(fs, opened.handle)
        if anotherClientMadeIt {
            #expect(store.object("f")?.bytes == Array("theirs".utf8))
            #expect(conflictCopies(store, of: "f") == [Array("ours".utf8)])
        } else {
            #expect(store.object("f")?.bytes == Array("ours".utf8))
            #expect(store.counts.head == 0 && store.counts.put == 1)
        }
    }

    /// Where the server ignores `If-None-Match`, a new name's upload is checked by a HEAD first.
    @Test func aServerThatIgnoresIfNoneMatchGetsAHeadFirst() throws {
        let store = FakeObjectStore()
        store.honourIfNoneMatch(false)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let (_, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(fs, opened.handle, "ours")
        store.seed("f", text: "theirs")
        store.resetCounts()
        try close(fs, opened.handle)
        #expect(store.counts.head == 2, "the HEAD before the PUT, and one for a free conflict name")
        #expect(store.object("f")?.bytes == Array("theirs".utf8))
        #expect(conflictCopies(store, of: "f") == [Array("ours".utf8)])
    }

    /// A conditional PUT whose answer was lost, sent again, is refused by its own first try: that
    /// is this mount's version, not a conflict.
    @Test func aLostAnswerOfAConditionalPutIsNotAConflict() throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let (_, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(fs, opened.handle, "ours")
        store.failNext(.put, with: .after(.transient))
        #expect(throws: FSError.self) { try fs.flush(handle: opened.handle) }
        try close(fs, opened.handle)
        #expect(fake.object("f")?.bytes == Array("ours".utf8))
        #expect(conflictCopies(fake, of: "f").isEmpty)
    }

    /// A multipart upload checks right before its manifest, and a conflict copy's manifest names
    /// the parts already sent: nothing is sent twice.
    @Test func aMultipartConflictCopyReusesItsParts() throws {
        let store = FakeObjectStore()
        store.seed("f", text: "version 1")
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = TestScratch.directory + "cssp-hosts-spool-" + UUID().uuidString
        configuration.multipartThreshold = 64 << 10
        configuration.partSize = 16 << 10
        let fs = try Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
        defer { fs.shutdown() }
        let f = try fs.lookup(parent: root, name: "f")
        let opened = try fs.open(f.inode, writable: true, truncate: true)
        let content = (0..<(100 << 10)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        store.resetCounts()
        // Parts may go while the file is written (early parts) or at the close.
        try content.withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        store.seed("f", text: "theirs")
        try close(fs, opened.handle)
        #expect(store.object("f")?.bytes == Array("theirs".utf8))
        #expect(conflictCopies(store, of: "f") == [content])
        #expect(store.counts.put == 7 + 1, "7 parts and one manifest")
    }
}

/// Issue 22, item 2: `O_CREAT|O_EXCL` across hosts.
struct ExclusiveCreateTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode

    func makeFilesystem(_ store: any ObjectStore, server: Bool = true) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = TestScratch.directory + "cssp-excl-spool-" + UUID().uuidString
        configuration.pendingRetrySeconds = 3600
        configuration.serverExclusiveCreates = server
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    /// The empty file is stored before the open returns, with its mode; a close with nothing
    /// written sends nothing more, a close after writes stores them over it.
    @Test func anExclusiveCreateIsStoredBeforeTheOpenReturns() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let (_, lock) = try fs.create(parent: root, name: "lock", mode: 0o640, caller: caller, exclusive: true)
        #expect(store.object("lock")?.bytes == [])
        #expect(store.counts.put == 1)
        let mode = try fs.getattr(try fs.lookup(parent: root, name: "lock").inode).permissions
        #expect(mode == 0o640)
        #expect(store.counts.head == 1, "the create reads its object back")
        try fs.flush(handle: lock.handle)
        fs.release(handle: lock.handle)
        #expect(store.counts.put == 1 && store.counts.head == 1)

        let (_, data) = try fs.create(parent: root, name: "data", mode: 0o644, caller: caller, exclusive: true)
        try Array("bytes".utf8).withUnsafeBytes { try fs.write(handle: data.handle, offset: 0, bytes: $0) }
        try fs.flush(handle: data.handle)
        fs.release(handle: data.handle)
        #expect(store.object("data")?.bytes == Array("bytes".utf8))
        #expect(store.keys.filter { $0.contains("cssp-conflict") }.isEmpty)
    }

    /// Another client's object under the name, unknown here: EEXIST, its object untouched, and
    /// the name shows it at once.
    @Test func anExclusiveCreateOverAnotherClientsFileIsEEXIST() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        #expect(throws: FSError.self) { _ = try fs.lookup(parent: root, name: "lock") }
        store.seed("lock", text: "held by another host")
        do {
            _ = try fs.create(parent: root, name: "lock", mode: 0o644, caller: caller, exclusive: true)
            Issue.record("the exclusive create succeeded over another client's file")
        } catch {
            #expect(error.code == .exists)
        }
        #expect(store.object("lock")?.bytes == Array("held by another host".utf8))
        #expect(try fs.lookup(parent: root, name: "lock").size == Int64("held by another host".utf8.count))
    }

    /// Swift checks `If-None-Match` when a PUT starts: another client's PUT that started before
    /// ours was stored and ended after it passed the check too, and its object is the one kept.
    /// The create reads its object back and is EEXIST when the object is not its own.
    @Test func aCreateStoredOverByAnotherAtOnceIsEEXIST() throws {
        let fake = FakeObjectStore()
        let store = FaultInjectingStore(fake)
        store.afterEachAnswer { call in
            if call.operation == .put && call.key == "lock" { fake.seed("lock", text: "the other create") }
        }
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        do {
            _ = try fs.create(parent: root, name: "lock", mode: 0o644, caller: caller, exclusive: true)
            Issue.record("the exclusive create succeeded though another client's create was kept")
        } catch {
            #expect(error.code == .exists)
        }
        #expect(fake.object("lock")?.bytes == Array("the other create".utf8))
    }

    /// `excl_create=local` (the default): the create sends nothing, the close one conditional
    /// PUT, as for any new name.
    @Test func aLocalExclusiveCreateIsStoredAtTheClose() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store, server: false)
        defer { fs.shutdown() }
        let (_, lock) = try fs.create(parent: root, name: "lock", mode: 0o644, caller: caller, exclusive: true)
        #expect(store.counts.put == 0 && store.counts.head == 0)
        try fs.flush(handle: lock.handle)
        fs.release(handle: lock.handle)
        #expect(store.object("lock")?.bytes == [] && store.counts.put == 1 && store.counts.head == 0)
    }

    /// A server that ignores `If-None-Match`: the create sends nothing (the name was checked by
    /// this mount's lookup only), as before issue 22.
    @Test func aServerThatIgnoresIfNoneMatchGetsTheLocalCheck() throws {
        let store = FakeObjectStore()
        store.honourIfNoneMatch(false)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let (_, lock) = try fs.create(parent: root, name: "lock", mode: 0o644, caller: caller, exclusive: true)
        #expect(store.counts.put == 0)
        try fs.flush(handle: lock.handle)
        fs.release(handle: lock.handle)
        #expect(store.object("lock")?.bytes == [])
    }
}
