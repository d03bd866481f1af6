import BlockCache
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

/// Other tools' objects (issue 38): the mtime only in `X-Object-Meta-Mtime`, nothing in the
/// content type. The attributes the mount first reports for a version are the ones it keeps
/// reporting, from every path (readdirplus, lookup, getattr, a HEAD ahead, the index), in both
/// `foreign_attrs` modes; HEADs follow the program's lookups, never the listing; what they said
/// is kept across mounts.
struct ForeignAttributeTests {
    let root = Filesystem.rootInode
    let scratch = TemporaryDirectory("cssp-foreign")

    func makeFilesystem(
        _ store: any ObjectStore, _ foreign: ForeignAttributes = .head, index: String? = nil, clock: ManualClock? = nil,
        pageSize: Int = 10_000
    ) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.listPageSize = pageSize
        configuration.spoolDirectory = scratch.child("spool")
        configuration.foreignAttributes = foreign
        if let clock { configuration.clock = { clock.now } }
        if let index {
            configuration.metadataIndex = MetadataIndex.open(path: index, identity: "fake", logger: Logger(label: "test"))
        }
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    /// readdirplus of `inode`: the attributes sent per name (nil: the name alone).
    func plus(_ fs: Filesystem, _ inode: InodeNumber) throws -> [String: Attributes?] {
        let handle = try fs.opendir(inode)
        defer { fs.releasedir(handle: handle) }
        var sent: [String: Attributes?] = [:]
        try fs.readdirplus(inode, handle: handle, offset: 0) { name, _, _, attributes, _ in
            if name != "." && name != ".." { sent[name] = attributes }
            return true
        }
        return sent
    }

    static let headerTime = Timestamp(seconds: 1_500_000_000, nanoseconds: 250_000_000)

    /// An object as rclone writes it: mtime (nine decimals) and an octal st_mode in headers.
    func seedForeign(_ store: FakeObjectStore, _ key: String, _ text: String = "other tool's bytes") {
        store.seed(key, Array(text.utf8), metadata: ["mtime": Self.headerTime.description, "mode": "100600"])
    }

    /// The attributes the rule compares: what `ls -l` and rsync see.
    func shown(_ a: Attributes) -> [String] {
        ["\(a.size)", "\(a.modified)", String(a.permissions, radix: 8), "\(a.uid):\(a.gid)"]
    }

    @Test(arguments: [ForeignAttributes.head, .listing])
    func theAttributesFirstReportedForAVersionAreKept(_ mode: ForeignAttributes) throws {
        let store = FakeObjectStore()
        seedForeign(store, "d/f")
        seedForeign(store, "d/g")
        let clock = ManualClock()
        let fs = makeFilesystem(store, mode, clock: clock)
        defer { fs.shutdown() }
        let d = try fs.lookup(parent: root, name: "d").inode
        var seen: [[String]] = []
        // ls -l: readdirplus, then (for a name sent alone) the kernel's lookup.
        let first = try plus(fs, d)
        if let attributes = try #require(first["f"]) { seen.append(shown(attributes)) }
        let f = try fs.lookup(parent: d, name: "f")
        seen.append(shown(f))
        fs.waitForPrefetch()
        // The HEADs ahead have answered, attributes expired: getattr asks the server again.
        clock.advance(2)
        seen.append(shown(try fs.getattr(f.inode)))
        // A read sees the headers in its GET.
        _ = try fs.readWhole(f.inode, chunk: 4)
        seen.append(shown(try fs.getattr(f.inode)))
        // Listed again after dir_timeout, and looked up again.
        clock.advance(10)
        if let attributes = try #require(try plus(fs, d)["f"]) { seen.append(shown(attributes)) }
        seen.append(shown(try fs.lookup(parent: d, name: "f")))
        #expect(Set(seen).count == 1, "the attributes changed without a write: \(seen)")
        let expected: [String] =
            mode == .head
            ? ["18", Self.headerTime.description, "600", "0:0"]
            : ["18", f.modified.description, "644", "0:0"]
        #expect(seen.first == expected)
        if mode == .listing {
            // The listing's time, to the second (what a HEAD can say too).
            #expect(f.modified.nanoseconds == 0)
            #expect(first["f"]??.modified == f.modified)
        } else {
            #expect(first["f"]! == nil, "readdirplus sent attributes a HEAD would change")
        }
    }

    @Test func aFailedHeadIsAnErrorNotTheListingsAttributes() throws {
        let fake = FakeObjectStore()
        seedForeign(fake, "d/f")
        let store = FaultInjectingStore(fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let d = try fs.lookup(parent: root, name: "d").inode
        _ = try plus(fs, d)
        store.inject { $0.operation == .head ? .before(.transient) : .none }
        #expect(throws: FSError.self) { _ = try fs.lookup(parent: d, name: "f") }
        store.heal()
        #expect(try fs.lookup(parent: d, name: "f").modified == Self.headerTime)
    }

    @Test func aNewVersionIsHeadedBeforeItIsReported() throws {
        let store = FakeObjectStore()
        seedForeign(store, "d/f")
        let clock = ManualClock()
        let fs = makeFilesystem(store, clock: clock)
        defer { fs.shutdown() }
        let d = try fs.lookup(parent: root, name: "d").inode
        let f = try fs.lookup(parent: d, name: "f")
        #expect(f.modified == Self.headerTime)
        // Another tool writes a new version with its own time.
        let later = Timestamp(seconds: 1_600_000_000, nanoseconds: 0)
        store.seed("d/f", Array("the new version".utf8), metadata: ["mtime": later.description])
        clock.advance(10)
        // The listing shows the new version: readdirplus sends the name alone, the node
        // (which the kernel still holds) asks a HEAD before getattr answers.
        let listed = try plus(fs, d)
        #expect(listed["f"]! == nil)
        let now = try fs.getattr(f.inode)
        #expect(now.modified == later && now.size == 15)
    }

    @Test func findSendsNoHeadAndLsSendsEachOnce() throws {
        let store = FakeObjectStore()
        for d in 0..<4 {
            store.seed("t/d\(d)/", contentType: "application/directory")
            for i in 0..<30 { seedForeign(store, String(format: "t/d%d/f%02d", d, i)) }
        }
        let (recorded, heads) = recordingCalls(of: .head, in: store)
        let fs = makeFilesystem(recorded)
        defer { fs.shutdown() }
        let t = try fs.lookup(parent: root, name: "t").inode
        // find: readdir and the directories' lookups only.
        for d in 0..<4 {
            let directory = try fs.lookup(parent: t, name: "d\(d)").inode
            #expect(try fs.names(in: directory).count == 30)
        }
        fs.waitForPrefetch()
        #expect(heads.withLock { $0 }.filter { $0.contains("/f") } == [], "find HEADed files")
        // ls -l of each: every file HEADed once, by the window ahead or by its own lookup.
        for d in 0..<4 {
            let directory = try fs.lookup(parent: t, name: "d\(d)").inode
            for (name, attributes) in try plus(fs, directory) where attributes == nil {
                #expect(try fs.lookup(parent: directory, name: name).modified == Self.headerTime)
            }
        }
        fs.waitForPrefetch()
        let files = heads.withLock { $0 }.filter { $0.contains("/f") }
        #expect(files.count == 120 && Set(files).count == 120)
    }

    @Test func aLookupInAnotherDirectoryDropsTheHeadsQueuedForTheLast() throws {
        let fake = FakeObjectStore()
        for i in 0..<100 { seedForeign(fake, String(format: "a/f%03d", i)) }
        for i in 0..<10 { seedForeign(fake, String(format: "b/f%03d", i)) }
        // The background HEADs of a/ wait until the program has moved to b/.
        let gate = DispatchSemaphore(value: 0)
        let program = pthread_self()
        let headed = Locked<[String]>([])
        let store = FaultInjectingStore(fake) { call in
            guard call.operation == .head else { return .none }
            headed.withLock { $0.append(call.key) }
            if call.key.hasPrefix("a/f"), pthread_equal(pthread_self(), program) == 0 {
                gate.wait()
                gate.signal()
            }
            return .none
        }
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let a = try fs.lookup(parent: root, name: "a").inode
        let b = try fs.lookup(parent: root, name: "b").inode
        _ = try plus(fs, a)
        _ = try plus(fs, b)
        _ = try fs.lookup(parent: a, name: "f000")
        _ = try fs.lookup(parent: b, name: "f000")
        gate.signal()
        fs.waitForPrefetch()
        let inA = headed.withLock { $0 }.filter { $0.hasPrefix("a/f") }
        // f000 by the program, at most one per worker that had started; not the window's 64.
        #expect(inA.count <= 1 + BackgroundHeads.prefetchConcurrency, "\(inA.count) HEADs in a/")
    }

    @Test func theIndexSparesTheNextMountItsHeads() throws {
        let fake = FakeObjectStore()
        for i in 0..<20 { seedForeign(fake, String(format: "d/f%02d", i), "bytes \(i)") }
        let (store, heads) = recordingCalls(of: .head, in: fake)
        func files() -> [String] { heads.withLock { $0 }.filter { $0.hasPrefix("d/f") } }
        let index = scratch.child("meta.db")
        let first = makeFilesystem(store, index: index)
        let d1 = try first.lookup(parent: root, name: "d").inode
        for (name, _) in try plus(first, d1) { _ = try first.lookup(parent: d1, name: name) }
        first.waitForPrefetch()
        first.shutdown()
        #expect(files().count == 20)
        // Another tool rewrites one; the next mount HEADs that one only.
        fake.seed("d/f07", Array("rewritten".utf8), metadata: ["mtime": "1600000000"])
        heads.withLock { $0 = [] }
        let second = makeFilesystem(store, index: index)
        defer { second.shutdown() }
        let d2 = try second.lookup(parent: root, name: "d").inode
        let listed = try plus(second, d2)
        #expect(listed.count == 20)
        for (name, attributes) in listed where name != "f07" {
            #expect(attributes?.modified == Self.headerTime && attributes?.permissions == 0o600, "\(name)")
        }
        #expect(listed["f07"]! == nil)
        #expect(try second.lookup(parent: d2, name: "f07").modified == Timestamp(seconds: 1_600_000_000, nanoseconds: 0))
        second.waitForPrefetch()
        #expect(files() == ["d/f07"])
    }

    /// du: readdirplus of a directory, a lookup of each subdirectory (its marker), then into
    /// each: the kernel looks it up again (its entry aged), readdirplus, a lookup of each file.
    /// Other tools write no markers. A walk much longer than dir_timeout, at the pace of the
    /// HEADs: each directory is listed at most three times (ahead, ahead again once that
    /// expired, by its readdir) and each marker HEADed at most twice. (`du` of 1 000 directories listed
    /// the tree's root again every 5 s, queued every subdirectory again each time, and listed
    /// some 6 times; 5 651 marker HEADs, issue 38.)
    @Test func duListsEachDirectoryAFewTimesAtMost() throws {
        let fake = FakeObjectStore()
        let (directories, files) = (30, 60)
        for d in 0..<directories {
            for f in 0..<files { seedForeign(fake, String(format: "t/d%03d/f%03d", d, f)) }
        }
        let clock = ManualClock()
        let calls = Locked<[(FaultInjectingStore.Call.Operation, String, Double)]>([])
        let store = FaultInjectingStore(fake) { call in
            calls.withLock { $0.append((call.operation, call.key, clock.now)) }
            return .none
        }
        let fs = makeFilesystem(store, clock: clock)
        defer { fs.shutdown() }
        let t = try fs.lookup(parent: root, name: "t").inode
        var inodes: [(String, InodeNumber)] = []
        for name in try plus(fs, t).keys.sorted() { inodes.append((name, try fs.lookup(parent: t, name: name).inode)) }
        for (name, inode) in inodes {
            #expect(try fs.lookup(parent: t, name: name).inode == inode)
            for file in try plus(fs, inode).keys.sorted() {
                #expect(try fs.lookup(parent: inode, name: file).modified == Self.headerTime)
                // (100 HEADs a second: the walk takes 18 s on this clock, dir_timeout 5 s.)
                clock.advance(1 / 100)
            }
        }
        fs.waitForPrefetch()
        fs.namespace.waitForListingsAhead()
        let recorded = calls.withLock { $0 }
        func most(_ operation: FaultInjectingStore.Call.Operation, _ isCounted: (String) -> Bool) -> (String, Int)? {
            Dictionary(grouping: recorded.filter { $0.0 == operation && isCounted($0.1) }, by: \.1).mapValues(\.count).max { $0.value < $1.value }
        }
        let listed = most(.list) { $0.hasPrefix("t/d") }
        let when = recorded.filter { $0.0 == .list && $0.1 == listed?.0 }.map { String(format: "%.2f", $0.2) }
        #expect(listed.map { $0.1 <= 3 } ?? false, "\(String(describing: listed)) at \(when)")
        let headed = most(.head) { $0.hasPrefix("t/d") && $0.hasSuffix("/") }
        #expect(headed.map { $0.1 <= 2 } ?? false, "\(String(describing: headed))")
        #expect(recorded.filter { $0.0 == .head && $0.1.contains("/f") }.count == directories * files)
    }

    @Test func anIndexAnswerDoesNotUndoANewerVersion() throws {
        let store = FakeObjectStore()
        seedForeign(store, "d/f")
        let clock = ManualClock()
        let fs = makeFilesystem(store, index: scratch.child("meta.db"), clock: clock)
        defer { fs.shutdown() }
        let d = try fs.lookup(parent: root, name: "d").inode
        #expect(try plus(fs, d)["f"]! == nil)
        let f = try fs.lookup(parent: d, name: "f")
        #expect(f.modified == Self.headerTime)
        // Another tool writes a new version; attributes expire, the listing is still remembered.
        let later = Timestamp(seconds: 1_600_000_000, nanoseconds: 0)
        store.seed("d/f", Array("the new version".utf8), metadata: ["mtime": later.description])
        clock.advance(2)
        #expect(try fs.getattr(f.inode).modified == later)
        // readdirplus of the remembered listing finds the old version's answer in the index
        // only (not in memory): it is as old as that listing, and must not bring it back.
        fs.namespace.backgroundHeads.heads.withLock { $0.foreignAnswers = [:] }
        _ = try plus(fs, d)
        let now = try fs.getattr(f.inode)
        #expect(now.modified == later && now.size == 15)
    }

    @Test(arguments: [ForeignAttributes.head, .listing])
    func aRenameKeepsTheTimeAnObjectWithoutOneShowed(_ mode: ForeignAttributes) throws {
        let store = FakeObjectStore()
        store.seed("d/f", Array("curl wrote this".utf8))
        let fs = makeFilesystem(store, mode)
        defer { fs.shutdown() }
        let d = try fs.lookup(parent: root, name: "d").inode
        let before = try fs.lookup(parent: d, name: "f")
        try fs.rename(parent: d, name: "f", newParent: d, newName: "g", noReplace: false)
        #expect(try fs.getattr(before.inode).modified == before.modified)
        let copied = try #require(store.object("d/g"))
        #expect(StoredAttributes.parse(contentType: copied.contentType).attributes.mtime == before.modified)
        let other = makeFilesystem(store, mode)
        defer { other.shutdown() }
        let d2 = try other.lookup(parent: root, name: "d").inode
        #expect(try other.lookup(parent: d2, name: "g").modified == before.modified)
    }

    @Test func anotherToolsSymlinkIsDescribedByItsHeadersFromTheStart() throws {
        let store = FakeObjectStore()
        store.seed(
            "d/l", [], contentType: StoredAttributes.symlinkContentType,
            metadata: ["symlink-target": "somewhere", "mtime": Self.headerTime.description])
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let d = try fs.lookup(parent: root, name: "d").inode
        #expect(try plus(fs, d)["l"]! == nil)
        let l = try fs.lookup(parent: d, name: "l")
        #expect(l.kind == .symlink && l.modified == Self.headerTime)
        #expect(try fs.readlink(l.inode) == "somewhere")
    }

    @Test func aReaderFindsNamesInItsListingsOrder() {
        // A listing sorts keys: a directory's has its "/", so "a.txt" comes before "a/".
        let entries = PackedEntries(
            prefix: "p/",
            [
                DirectoryEntry(name: "a.txt", kind: .file, key: "p/a.txt", size: 1, etag: "", lastModified: .zero, contentType: ""),
                DirectoryBuilder.directory("a", key: "p/a/"),
                DirectoryEntry(name: "a0", kind: .file, key: "p/a0", size: 1, etag: "", lastModified: .zero, contentType: ""),
                DirectoryBuilder.directory("b", key: "p/b/"),
            ])
        #expect(["a.txt", "a", "a0", "b", "c", "a/", ""].map(entries.sortedPosition) == [0, 1, 2, 3, nil, nil, nil])
    }

    /// ls -l: a batch of names (one getdents), their lookups, the next batch; its lookups
    /// outlast dir_timeout, those of the last batch after the listing is complete too (GNU ls
    /// stats as it reads: with 6 000 names a getdents and 400 HEADs a second, 15 s).
    @Test(arguments: [(20, 1.0), (100, 0.1)])
    func lsOfALongListingTakesEachNameFromTheReadersPagesHoweverLongItReads(batchSize: Int, secondsPerLookup: Double) throws {
        let fake = FakeObjectStore()
        for i in 0..<300 { seedForeign(fake, String(format: "d/f%03d", i)) }
        let (store, lists) = recordingCalls(of: .list, in: fake)
        let clock = ManualClock()
        let fs = makeFilesystem(store, clock: clock, pageSize: 50)
        defer { fs.shutdown() }
        let d = try fs.lookup(parent: root, name: "d").inode
        lists.withLock { $0 = [] }
        let handle = try fs.opendir(d)
        defer { fs.releasedir(handle: handle) }
        var offset: Int64 = 0
        var seen = 0
        while true {
            var batch: [String] = []
            try fs.readdirplus(d, handle: handle, offset: offset) { name, _, _, _, next in
                guard batch.count < batchSize else { return false }
                offset = next
                if name != "." && name != ".." { batch.append(name) }
                return true
            }
            if batch.isEmpty { break }
            for name in batch {
                #expect(try fs.lookup(parent: d, name: name).modified == Self.headerTime)
                clock.advance(secondsPerLookup)
            }
            seen += batch.count
        }
        fs.waitForPrefetch()
        #expect(seen == 300)
        // The readdir's own six pages (and the empty one after), no listing per lookup.
        #expect(lists.withLock { $0 }.count <= 7, "\(lists.withLock { $0 })")
    }
}
