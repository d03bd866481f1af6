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

/// One flat listing of a subtree once a walk is evident (`WalkListing`, FSNamespace).
struct WalkListingTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode

    func makeFilesystem(
        _ store: any ObjectStore, listAhead: Int = 8, pageSize: Int = 10_000, lanes: Int? = nil,
        clock: ManualClock = ManualClock()
    ) -> Filesystem {
        var configuration = FilesystemConfiguration()
        // (The seeds are other tools' objects, described here by their listings: with a HEAD per
        // file, a walk under ThreadSanitizer outlasts dir_timeout; this suite is about walk listings.)
        configuration.foreignAttributes = .listing
        configuration.listAhead = listAhead
        if let lanes { configuration.walkLanes = lanes }
        // (On a clock that stands still unless the test moves it: under ThreadSanitizer or on a
        // machine busy with other tests a walk of this tree outlasts dir_timeout, its listings
        // ahead expire, and each directory is listed by itself.)
        configuration.clock = { clock.now }
        configuration.listPageSize = pageSize
        configuration.metadataPrefetchLimit = 0
        configuration.spoolDirectory = TestScratch.directory + "cssp-walklisting-spool-" + UUID().uuidString
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    /// A tree with what listings make hard: nested directories, a directory marker with
    /// attributes, a zero-byte file beside a directory of its name, a name that sorts between a
    /// directory and its keys (`d305.txt` before `d305/`), two spellings of one name (files, and
    /// directories), an empty
    /// directory that exists only as a marker; all past the directories listed one by one.
    /// (More directories than are listed ahead one by one: `listAheadWindow`.)
    static let directories = FilesystemConfiguration().listAheadWindow + 60

    func seedTree(_ fake: FakeObjectStore) {
        for n in 1...Self.directories {
            let d = String(format: "t/d%03d", n)
            for f in n % 10 == 0 ? ["a", "b", "c"] : ["a"] { fake.seed("\(d)/\(f)", text: "\(d)/\(f)") }
        }
        fake.seed("t/d305.txt", text: "beside d05")
        fake.seed("t/d307/deep/er/leaf", text: "leaf")
        fake.seed("t/d307/deep/x", text: "x")
        fake.seed("t/d309/", [], contentType: StoredAttributes(mode: 0o700).contentType(base: ObjectKey.directoryContentType))
        fake.seed("t/d311/clash", [])
        fake.seed("t/d311/clash/inside", text: "inside")
        fake.seed("t/d313/caf\u{E9}", text: "nfc")
        fake.seed("t/d313/cafe\u{301}", text: "nfd")
        fake.seed("t/d317/caf\u{E9}/in", text: "nfc directory")
        fake.seed("t/d317/cafe\u{301}/in", text: "nfd directory")
        fake.seed("t/d315/empty/", [], contentType: StoredAttributes(mode: 0o755).contentType(base: ObjectKey.directoryContentType))
    }

    /// What `find` sees: every directory's names and each file's size, depth first.
    func walk(_ fs: Filesystem, _ inode: InodeNumber, _ path: String, into seen: inout [String], settle: Bool) throws {
        if settle { fs.namespace.waitForListingsAhead() }
        for name in try fs.names(in: inode) {
            let attributes = try fs.lookup(parent: inode, name: name)
            seen.append("\(path)/\(name) \(attributes.kind) \(attributes.kind == .directory ? 0 : attributes.size) \(String(attributes.permissions, radix: 8))")
            if attributes.kind == .directory { try walk(fs, attributes.inode, path + "/" + name, into: &seen, settle: settle) }
        }
    }

    /// Walks the tree in `fake` with listings ahead (and walk listings) and checks that it
    /// shows exactly what a mount without any shows; returns that and the prefixes listed.
    func walkAsWithoutListingsAhead(
        _ fake: FakeObjectStore, pageSize: Int = 10_000, lanes: Int? = nil
    ) throws -> (expected: [String], listed: [String]) {
        let reference = makeFilesystem(fake, listAhead: 0)
        defer { reference.shutdown() }
        var expected: [String] = []
        try walk(reference, root, "", into: &expected, settle: false)
        let (store, lists) = recordingCalls(of: .list, in: fake)
        let fs = makeFilesystem(store, pageSize: pageSize, lanes: lanes)
        defer { fs.shutdown() }
        var seen: [String] = []
        try walk(fs, root, "", into: &seen, settle: true)
        // (The same names; their order may differ, as it may between any two listings.)
        #expect(seen.sorted() == expected.sorted())
        return (expected, lists.withLock { $0 })
    }

    /// The walk shows exactly what a mount without any listing ahead shows, with a few flat
    /// pages instead of a listing per directory; in pages of 7 keys too.
    @Test(arguments: [10_000, 7])
    func aWalkListingShowsWhatEachDirectorysListingShows(pageSize: Int) throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        let (expected, listed) = try walkAsWithoutListingsAhead(fake, pageSize: pageSize)
        #expect(expected.count > 2 * Self.directories)
        let perDirectory = listed.filter { $0.hasPrefix("t/d") }
        // The first directories of t/ are listed ahead one by one, then t/ is listed whole.
        #expect(listed.filter { $0 == "t/" }.count >= 2)
        #expect(perDirectory.count <= FilesystemConfiguration().listAheadWindow + 12, "\(perDirectory.count) directories listed one by one")
    }

    /// A change made here while the walk listing is under way: the directories it made before
    /// are not used (as any listing ahead), and the walk shows the change.
    @Test func aChangeDuringTheWalkShowsInTheWalk() throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        let fs = makeFilesystem(fake)
        defer { fs.shutdown() }
        let t = try fs.lookup(parent: root, name: "t")
        #expect(try fs.names(in: t.inode).count == Self.directories + 2, "d305.txt and d317 besides")
        for n in 1...6 {
            fs.namespace.waitForListingsAhead()
            let d = try fs.lookup(parent: t.inode, name: String(format: "d%03d", n))
            _ = try fs.names(in: d.inode)
        }
        fs.namespace.waitForListingsAhead()
        let last = Self.directories / 10 * 10
        let changed = try fs.lookup(parent: t.inode, name: String(format: "d%03d", last))
        _ = try fs.storeFile(changed.inode, "new", Array("new".utf8))
        let removed = try fs.lookup(parent: t.inode, name: String(format: "d%03d", last - 10))
        try fs.unlink(parent: removed.inode, name: "b")
        #expect(try fs.names(in: changed.inode) == ["a", "b", "c", "new"])
        #expect(try fs.names(in: removed.inode) == ["a", "c"])
    }
}

extension WalkListingTests {
    /// rsync's generator never reads the destination's directories: it looks up every
    /// subdirectory of a level first, then every name in each of them. Each subdirectory's
    /// attributes live on its marker, which a delimiter listing of the parent cannot show: a
    /// lookup that waits for a HEAD of each, one after another, was most of rsync -an's time with
    /// 20 ms a request (bench/RESULTS.md, "rsync -an at 20 ms"). The flat walk listing shows
    /// every marker (or its absence) as its pages pass, and then holds each directory's names.
    @Test func lookupsOfEverySubdirectoryThenOfTheirNamesListTheSubtreeWhole() throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        for n in 1...400 { fake.seed(String(format: "t/e%03d/a", n), text: "e") }
        let reference = makeFilesystem(fake, listAhead: 0)
        defer { reference.shutdown() }
        let t0 = try reference.lookup(parent: root, name: "t")
        let directories = try reference.names(in: t0.inode).filter { try reference.lookup(parent: t0.inode, name: $0).kind == .directory }
        var names: [String: [String]] = [:]
        var expected: [String] = []
        var expectedNames: [String] = []
        for directory in directories {
            let d = try reference.lookup(parent: t0.inode, name: directory)
            expected.append("\(directory) \(String(d.permissions, radix: 8))")
            names[directory] = try reference.names(in: d.inode)
            for name in names[directory]! {
                let a = try reference.lookup(parent: d.inode, name: name)
                expectedNames.append("\(directory)/\(name) \(a.kind) \(a.kind == .directory ? 0 : a.size)")
            }
        }
        expected += expectedNames
        #expect(directories.count > 700)

        let calls = Locked<[(FaultInjectingStore.Call.Operation, String)]>([])
        let store = FaultInjectingStore(fake) { call in
            calls.withLock { $0.append((call.operation, call.key)) }
            return .none
        }
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let t = try fs.lookup(parent: root, name: "t")
        var seen: [String] = []
        var inodes: [String: InodeNumber] = [:]
        for directory in directories {
            let d = try fs.lookup(parent: t.inode, name: directory)
            seen.append("\(directory) \(String(d.permissions, radix: 8))")
            inodes[directory] = d.inode
        }
        for directory in directories {
            for name in names[directory]! {
                let a = try fs.lookup(parent: inodes[directory]!, name: name)
                seen.append("\(directory)/\(name) \(a.kind) \(a.kind == .directory ? 0 : a.size)")
            }
        }
        let differing = zip(seen, expected).filter { $0 != $1 }
        #expect(seen.count == expected.count && differing.isEmpty, "\(differing.prefix(5))")
        let recorded = calls.withLock { $0 }
        let markerHeads = recorded.filter { $0.0 == .head && $0.1.hasPrefix("t/") && $0.1.hasSuffix("/") }
        let perDirectory = recorded.filter { $0.0 == .list && $0.1.hasPrefix("t/") && $0.1 != "t/" }
        #expect(markerHeads.count <= 10, "\(markerHeads.count) markers HEADed one by one")
        #expect(perDirectory.count <= FilesystemConfiguration().listAheadWindow + 12, "\(perDirectory.count) directories listed one by one")
    }

    /// rsync reads no directory: the listings its lookups ask for are the walk's steps. When it
    /// is slower than the walk listing (listings expire unused), the window of listings ahead
    /// follows its pace, as it follows readdirs', instead of falling to 2 (rsync -an of other
    /// tools' objects with listing attributes: 6 s, then 15 s with the window at 2, issue 38).
    @Test func lookupsListingsPaceTheWindowAsReaddirsDo() throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        let clock = ManualClock()
        let fs = makeFilesystem(fake, clock: clock)
        defer { fs.shutdown() }
        let t = try fs.lookup(parent: root, name: "t")
        let names = try fs.names(in: t.inode)
        var directories: [InodeNumber] = []
        for name in names {
            let looked = try fs.lookup(parent: t.inode, name: name)
            if looked.kind == .directory { directories.append(looked.inode) }
        }
        fs.namespace.waitForListingsAhead()
        // 10 directories a second: 50 in dir_timeout; the walk listing's first ones expire.
        for directory in directories {
            // (Every directory but d317, which holds two others only, has an "a".)
            _ = try? fs.lookup(parent: directory, name: "a")
            clock.advance(0.1)
        }
        let window = fs.namespace.listingsAhead.ahead.withLock {
            $0.window(minimum: ListingsAhead.listAheadMinimumWindow, limit: FilesystemConfiguration().listAheadWindow, now: clock.now)
        }
        #expect(fs.namespace.listingsAhead.ahead.withLock { $0.expiredAt } > 0, "no listing expired: the walk was not slower")
        #expect(window >= 20, "window \(window)")
    }

    /// The walk listing runs in lanes, each a flat listing of a share of the subdirectories
    /// (from a directory's marker to the next lane's first): the same walk as with one, in
    /// one request a lane instead of one after another. Names that sort between a directory
    /// and its keys (`d305.txt`, `e100-1`) meet the lanes' ends for some number of lanes.
    @Test(arguments: [1, 2, 3, 4, 7])
    func aWalkListingInLanesShowsWhatOneShows(lanes: Int) throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        for n in 1...120 {
            fake.seed(String(format: "t/e%03d/a", n), text: "e")
            fake.seed(String(format: "t/e%03d-1/a", n), text: "e-1")
            fake.seed(String(format: "t/e%03d", n), text: "file beside")
        }
        let (_, listed) = try walkAsWithoutListingsAhead(fake, lanes: lanes)
        // One delimiter listing of t/, then one flat request a lane (10 000 keys a page is more
        // than any lane holds).
        #expect(listed.filter { $0 == "t/" }.count == 1 + lanes)
    }
}
