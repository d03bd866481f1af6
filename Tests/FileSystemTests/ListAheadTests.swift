import Foundation
#if canImport(Glibc)
import Glibc
#endif
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

/// Listings of subdirectories fetched ahead of a walk (`ListingsAhead`).
struct ListAheadTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode

    /// A store that logs the prefix of every listing.
    final class Listings: Sendable {
        let prefixes = Locked<[String]>([])
        func store(_ fake: FakeObjectStore, failing: Set<String> = []) -> FaultInjectingStore {
            FaultInjectingStore(fake) { [self] call in
                guard call.operation == .list else { return .none }
                prefixes.withLock { $0.append(call.key) }
                return failing.contains(call.key) ? .before(.transient) : .none
            }
        }
        func count(_ prefix: String) -> Int { prefixes.withLock { $0.filter { $0 == prefix }.count } }
    }

    func makeFilesystem(_ store: any ObjectStore, listAhead: Int = 8, clock: ManualClock? = nil) -> Filesystem {
        var configuration = FilesystemConfiguration()
        // (The seeds are other tools' objects, described here by their listings: this suite is about
        // the listings ahead, not where their attributes come from; PrefetchTests and ForeignAttributeTests are.)
        configuration.foreignAttributes = .listing
        configuration.listAhead = listAhead
        if let clock { configuration.clock = { clock.now } }
        configuration.metadataPrefetchLimit = 0
        configuration.spoolDirectory = TestScratch.directory + "cssp-listahead-spool-" + UUID().uuidString
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    /// A store that logs the prefix of every listing the calling thread (the walk) sends.
    func listingsByThisThread(_ fake: FakeObjectStore) -> (FaultInjectingStore, Locked<[String]>) {
        let walker = pthread_self()
        let byWalker = Locked<[String]>([])
        let store = FaultInjectingStore(fake) { call in
            if call.operation == .list, pthread_equal(pthread_self(), walker) != 0 { byWalker.withLock { $0.append(call.key) } }
            return .none
        }
        return (store, byWalker)
    }

    func seedTree(_ fake: FakeObjectStore) {
        for d in 1...5 {
            for f in ["a", "b"] { fake.seed("d\(d)/\(f)", text: "file \(d)\(f)") }
        }
    }

    /// A subdirectory larger than `listAheadEntryLimit` is left to its readdir after one page,
    /// its first (issue 21: the listing ahead of a directory of 200 000 names asked for three
    /// pages, the readdir then waited for it and listed from the start).
    @Test func aLargeSubdirectoryIsLeftToItsReaddirAfterOnePage() throws {
        let fake = FakeObjectStore()
        for i in 0..<(ListingsAhead.listAheadEntryLimit + 50) { fake.seed("big/f\(100_000 + i)", text: "") }
        fake.seed("small/a", text: "a")
        let listings = Listings()
        let fs = makeFilesystem(listings.store(fake))
        defer { fs.shutdown() }
        #expect(try fs.names(in: root) == ["big", "small"])
        fs.namespace.waitForListingsAhead()
        fs.pool.waitUntilIdle()
        #expect(listings.count("big/") == 1, "big/ listed ahead: \(listings.count("big/")) pages")
        #expect(listings.count("small/") == 1)
        let big = try fs.lookup(parent: root, name: "big")
        #expect(try fs.names(in: big.inode).count == ListingsAhead.listAheadEntryLimit + 50)
    }

    /// find: readdir of the root, then of each directory in it: each subdirectory is listed
    /// once, ahead, and its readdir asks nothing.
    @Test func aWalkReadsSubdirectoriesFromListingsFetchedAhead() throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        let listings = Listings()
        let fs = makeFilesystem(listings.store(fake))
        defer { fs.shutdown() }
        #expect(try fs.names(in: root) == ["d1", "d2", "d3", "d4", "d5"])
        fs.namespace.waitForListingsAhead()
        for d in 1...5 { #expect(listings.count("d\(d)/") == 1, "d\(d)/ listed ahead") }
        for d in 1...5 {
            let directory = try fs.lookup(parent: root, name: "d\(d)")
            let shown = try fs.names(in: directory.inode)
            #expect(shown == ["a", "b"], "d\(d): \(shown)")
        }
        for d in 1...5 { #expect(listings.count("d\(d)/") == 1, "d\(d)/ listed once") }
    }

    /// A walk of more directories than are listed ahead at once (`listAheadWindow`): the
    /// listings of the later ones go out as the walk uses the earlier ones, so no readdir of the
    /// walk waits for a listing of its own (1 000 directories at 20 ms a request: 744 did).
    @Test func aWalkOfManyDirectoriesKeepsTheListingsAheadComing() throws {
        let fake = FakeObjectStore()
        let count = FilesystemConfiguration().listAheadWindow + 40
        let names = (1...count).map { String(format: "d%04d", $0) }
        for name in names { fake.seed(name + "/f", text: name) }
        let (store, byWalker) = listingsByThisThread(fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        #expect(try fs.names(in: root) == names)
        for name in names {
            // The walk waits for nothing here; this makes the background's progress certain.
            fs.namespace.waitForListingsAhead()
            let directory = try fs.lookup(parent: root, name: name)
            #expect(try fs.names(in: directory.inode) == ["f"])
        }
        #expect(byWalker.withLock { $0 } == [""], "listed by the walk itself: \(byWalker.withLock { $0.count - 1 })")
    }

    /// A walk goes depth first: the subdirectories of the directory it just read come before
    /// the rest of that directory's siblings, even when listings of siblings it has not reached
    /// fill the window (they were listed while the walk read the first one).
    @Test func aWalkIntoADeepDirectoryIsNotStuckBehindItsSiblings() throws {
        let fake = FakeObjectStore()
        let children = (1...30).map { String(format: "c%02d", $0) }
        for child in children { fake.seed("a-big/\(child)/f", text: child) }
        for n in 1...(FilesystemConfiguration().listAheadWindow + 40) { fake.seed(String(format: "s%04d/f", n), text: "s") }
        let (store, byWalker) = listingsByThisThread(fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        _ = try fs.names(in: root)
        fs.namespace.waitForListingsAhead()
        let big = try fs.lookup(parent: root, name: "a-big")
        #expect(try fs.names(in: big.inode) == children)
        for child in children {
            fs.namespace.waitForListingsAhead()
            let directory = try fs.lookup(parent: big.inode, name: child)
            #expect(try fs.names(in: directory.inode) == ["f"])
        }
        let listed = byWalker.withLock { $0 }.filter { $0.hasPrefix("a-big/") }
        // The first one finds the window full of siblings' listings and makes room.
        #expect(listed.count <= 1, "listed by the walk itself: \(listed)")
    }

    /// rsync's generator never reads the destination's directories: it looks up each name.
    /// The listing a directory's lookups make sends its subdirectories' listings ahead too, and
    /// a lookup in one of them takes its listing: no HEAD for the first name of each directory.
    @Test func lookupsOfAWalkWithoutReaddirTakeTheListingsAhead() throws {
        let fake = FakeObjectStore()
        let directories = (1...20).map { String(format: "d%02d", $0) }
        for d in directories {
            for f in ["a", "b", "c"] { fake.seed("t/\(d)/\(f)", text: d + f) }
        }
        let (store, heads) = recordingCalls(of: .head, in: fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let t = try fs.lookup(parent: root, name: "t")
        for d in directories {
            fs.namespace.waitForListingsAhead()
            let directory = try fs.lookup(parent: t.inode, name: d)
            for f in ["a", "b", "c"] { #expect(try fs.lookup(parent: directory.inode, name: f).size == 4) }
        }
        let headed = heads.withLock { $0 }.filter { key in !directories.prefix(2).contains { key.hasPrefix("t/\($0)/") } }
        #expect(headed.filter { $0.hasPrefix("t/d") && $0.split(separator: "/").count == 3 } == [], "files HEADed one by one")
    }

    /// A listing fetched ahead that shows no `dir/` marker answers the marker's HEAD the
    /// lookup would send (subtlety 4); a directory with a marker still gets its attributes.
    @Test func aListingAheadWithoutAMarkerSavesTheLookupsHead() throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        fake.seed("d5/", [], contentType: StoredAttributes(mode: 0o700).contentType(base: ObjectKey.directoryContentType))
        let (store, heads) = recordingCalls(of: .head, in: fake)
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        _ = try fs.names(in: root)
        fs.namespace.waitForListingsAhead()
        heads.withLock { $0 = [] }
        for d in 1...4 { _ = try fs.lookup(parent: root, name: "d\(d)") }
        #expect(heads.withLock { $0 } == [])
        #expect(try fs.lookup(parent: root, name: "d5").permissions == 0o700)
    }

    /// A directory renamed away, and another renamed to its name, after their listings were
    /// fetched ahead: the name shows what it holds now, not what the listing said.
    @Test func aChangeMadeHereDropsTheListingsAhead() throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        fake.seed("e/x", text: "x")
        let fs = makeFilesystem(Listings().store(fake))
        defer { fs.shutdown() }
        _ = try fs.names(in: root)
        fs.namespace.waitForListingsAhead()
        try fs.rename(parent: root, name: "d1", newParent: root, newName: "moved", noReplace: false)
        try fs.rename(parent: root, name: "e", newParent: root, newName: "d1", noReplace: false)
        let replaced = try fs.lookup(parent: root, name: "d1")
        #expect(try fs.names(in: replaced.inode) == ["x"])
        let d2 = try fs.lookup(parent: root, name: "d2")
        try fs.storeFile(d2.inode, "new", Array("n".utf8), caller: caller)
        let shown = try fs.names(in: d2.inode)
        #expect(shown == ["a", "b", "new"], "\(shown)")
    }

    /// A listing ahead that fails is dropped: the readdir lists by itself.
    @Test func aFailedListingAheadLeavesTheReaddirToList() throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        let listings = Listings()
        let fs = makeFilesystem(listings.store(fake, failing: ["d3/"]))
        defer { fs.shutdown() }
        _ = try fs.names(in: root)
        fs.namespace.waitForListingsAhead()
        let d3 = try fs.lookup(parent: root, name: "d3")
        #expect(throws: FSError.self) { try fs.names(in: d3.inode) }
        #expect(listings.count("d3/") == 2, "ahead, then by the readdir itself")
    }

    /// list_ahead=0: nothing is listed before it is read.
    @Test func listAheadZeroListsNothingAhead() throws {
        let fake = FakeObjectStore()
        seedTree(fake)
        let listings = Listings()
        let fs = makeFilesystem(listings.store(fake), listAhead: 0)
        defer { fs.shutdown() }
        _ = try fs.names(in: root)
        fs.namespace.waitForListingsAhead()
        #expect(listings.prefixes.withLock { $0 } == [""])
    }

    /// rsync looks up the names of a directory's subdirectories longer than `dir_timeout`: the
    /// directory's own listing expires and is made again while the subdirectories it walked
    /// through are remembered, fresh. That listing queued every one of them to be listed ahead
    /// again (221 useless listings in an rsync -an of 1 000 directories at 20 ms); now only
    /// those whose listing is not fresh.
    @Test func aListingMadeAgainSendsNoListingAheadOfSubdirectoriesRememberedFresh() throws {
        let fake = FakeObjectStore()
        for n in 1...40 { fake.seed(String(format: "p/d%02d/f", n), text: "f") }
        let listings = Listings()
        let clock = ManualClock()
        let fs = makeFilesystem(listings.store(fake), clock: clock)
        defer { fs.shutdown() }
        let p = try fs.lookup(parent: root, name: "p")
        var directories: [InodeNumber] = []
        for n in 1...40 { directories.append(try fs.lookup(parent: p.inode, name: String(format: "d%02d", n)).inode) }
        fs.namespace.waitForListingsAhead()
        // Later, each subdirectory's names: their listings are remembered from then on.
        clock.advance(3)
        for d in directories { _ = try fs.lookup(parent: d, name: "f") }
        fs.namespace.waitForListingsAhead()
        let before = listings.prefixes.withLock { $0.count }
        // p's listing is past dir_timeout (5 s); theirs are not.
        clock.advance(3)
        #expect(throws: FSError.self) { try fs.lookup(parent: p.inode, name: "x") }
        #expect(throws: FSError.self) { try fs.lookup(parent: p.inode, name: "y") }
        fs.namespace.waitForListingsAhead()
        let after = listings.prefixes.withLock { Array($0[before...]) }
        #expect(after.filter { $0 == "p/" }.count >= 1, "\(after)")
        #expect(after.filter { $0.hasPrefix("p/d") }.isEmpty, "\(after)")
    }
}
