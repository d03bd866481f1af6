import ObjectStore
import ObjectStoreTesting
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// The inode table's rules, without I/O: who keeps a node alive, what a rename re-keys.
struct InodeTableTests {
    func table() -> InodeTable { InodeTable(rootKey: "", rootTime: .zero) }

    func file(_ parent: InodeNumber, _ name: String, key: String) -> Node {
        Node(inode: 0, parent: parent, name: name, kind: .file, key: key)
    }

    func directory(_ parent: InodeNumber, _ name: String, key: String) -> Node {
        Node(inode: 0, parent: parent, name: name, kind: .directory, key: key)
    }

    @Test func aNodeLivesWhileLookedUpOrPinned() {
        var t = table()
        let f = t.insert(file(1, "f", key: "f"))
        t.pin(f.inode)
        t.forget(f.inode, count: 1)
        #expect(t[f.inode] != nil, "a spool keeps the node")
        #expect(t.child(1, "f")?.inode == f.inode)
        t.unpin(f.inode)
        #expect(t[f.inode] == nil)
        #expect(t.child(1, "f") == nil)
    }

    @Test func aPinnedFileKeepsItsDirectoryAndTheDirectoryGoesWithIt() {
        var t = table()
        let d = t.insert(directory(1, "d", key: "d/"))
        let f = t.insert(file(d.inode, "f", key: "d/f"))
        t.pin(f.inode)
        t.forget(f.inode, count: 1)
        t.forget(d.inode, count: 1)
        #expect(t[d.inode] != nil, "the directory of an unstored file stays")
        t.unpin(f.inode)
        #expect(t[f.inode] == nil && t[d.inode] == nil)
        #expect(t.takeRemovedDirectories() == [d.inode])
    }

    @Test func linkKeepsANodeOfTheSameKindAndReplacesAnother() {
        var t = table()
        let first = t.link(parent: 1, name: "x", kind: .file, key: "x", lookups: 1)
        let again = t.link(parent: 1, name: "x", kind: .file, key: "x", lookups: 1)
        #expect(again.inode == first.inode && t[first.inode]?.lookups == 2)
        let directory = t.link(parent: 1, name: "x", kind: .directory, key: "x/", lookups: 1)
        #expect(directory.inode != first.inode)
        #expect(t.child(1, "x")?.inode == directory.inode)
        #expect(t[first.inode]?.linked == false, "the file lives on, unhooked, until forgotten")
        t.forget(first.inode, count: 2)
        #expect(t[first.inode] == nil)
        #expect(t.child(1, "x")?.inode == directory.inode)
    }

    @Test func moveReKeysEveryNodeBelowTheDirectoryLinkedOrNot() {
        var t = table()
        let d = t.insert(directory(1, "d", key: "d/"))
        let sub = t.insert(directory(d.inode, "s", key: "d/s/"))
        let f = t.insert(file(sub.inode, "f", key: "d/s/f"))
        let unlinked = t.insert(file(d.inode, "u", key: "d/u"))
        t.pin(unlinked.inode)
        t.unhook(parent: d.inode, name: "u")
        let other = t.insert(file(1, "dx", key: "dx"))
        let moved = t.move(d.inode, to: 1, name: "e", key: "e/")
        #expect(Set(moved) == [d.inode, sub.inode, f.inode, unlinked.inode])
        #expect(t[f.inode]?.key == "e/s/f" && t[sub.inode]?.key == "e/s/" && t[unlinked.inode]?.key == "e/u")
        #expect(t[other.inode]?.key == "dx")
        #expect(t.child(1, "e")?.inode == d.inode && t.child(1, "d") == nil)
    }

    @Test func moveOverANameUnhooksWhatItLedTo() {
        var t = table()
        let a = t.insert(file(1, "a", key: "a"))
        let b = t.insert(file(1, "b", key: "b"))
        t.pin(b.inode)
        t.move(a.inode, to: 1, name: "b", key: "b")
        #expect(t.child(1, "b")?.inode == a.inode)
        #expect(t[b.inode]?.linked == false)
        #expect(t[a.inode]?.linked == true)
    }

    @Test func updateNeverChangesIdentity() {
        var t = table()
        let f = t.insert(file(1, "f", key: "f"))
        let updated = t.update(f.inode) { node in
            node.key = "elsewhere"
            node.name = "g"
            node.size = 42
        }
        #expect(updated?.key == "f" && updated?.name == "f" && updated?.size == 42)
    }
}

/// Nodes in one array with a table of slots: a removed node's slot serves the next one, and
/// every node is found and iterated once.
struct NodeStoreTests {
    func node(_ inode: InodeNumber) -> Node {
        Node(inode: inode, parent: 1, name: "n\(inode)", kind: .file, key: "n\(inode)")
    }

    @Test func slotsAreReusedAndEveryNodeIsFound() {
        var store = NodeStore()
        for inode: InodeNumber in 2...6 { store[inode] = node(inode) }
        store[3] = nil
        store[5] = nil
        store[7] = node(7)
        store[8] = node(8)
        store[9] = node(9)
        store[4]?.size = 42
        #expect(store.count == 6)
        #expect(store[3] == nil && store[5] == nil && store[4]?.size == 42 && store[9]?.name == "n9")
        #expect(store.map(\.key).sorted() == [2, 4, 6, 7, 8, 9])
        #expect(store.allSatisfy { $0.value.inode == $0.key })
    }

    /// Every field, for comparing two nodes.
    /// `counts`: the lookups, pins and link to show instead of the node's (which only a table sets).
    func fields(_ n: Node, counts: (lookups: UInt64, pins: Int32, linked: Bool)? = nil) -> String {
        let (lookups, pins, linked) = counts ?? (n.lookups, n.pins, n.linked)
        return "\(n.inode) \(n.parent) \(n.name) \(n.kind) \(n.key) \(n.size) \(n.etag) \(n.lastModified) \(n.stored) "
            + "\(n.baseContentType) \(n.confirmedAt) \(lookups) \(pins) \(n.attributesOwed) \(linked) "
            + "\(n.metadataKnownAt) \(n.describedAsOf) \(n.manifest ?? "-") \(n.localVersion) \(String(describing: n.changedAt)) "
            + "\(String(describing: n.accessedAt)) \(n.cachedEtag ?? "-") \(n.symlinkTarget ?? "-") \(n.extraMetadata) "
            + "\(n.attributeVersion) \(n.acknowledgedVersion) \(n.acknowledgedTime)"
    }

    /// A node as a listing makes it (an MD5 ETag, mode and owners, a content type, the kernel's
    /// one lookup) is kept thin, in 80 bytes (issue 21: 200 bytes an entry in all; it was 104).
    @Test func aListedFileIsKeptInEightyBytes() {
        var table = InodeTable(rootKey: "", rootTime: .zero)
        let directory = table.link(parent: 1, name: "dir", kind: .directory, key: "dir/", lookups: 1)
        var inodes: [InodeNumber] = []
        for number in 0..<100 {
            let inode = table.link(parent: directory.inode, name: "f\(number)", kind: .file, key: "dir/f\(number)", lookups: 1).inode
            table.update(inode) { node in
                node.size = 1
                node.etag = "0123456789abcdef0123456789abcdef"
                node.lastModified = Timestamp(seconds: 1_700_000_000, nanoseconds: 123_000)
                node.stored = StoredAttributes(mode: 0o644, uid: 1000, gid: 1000, mtime: Timestamp(seconds: 1_700_000_000, nanoseconds: 0))
                node.baseContentType = "application/octet-stream"
                node.confirmedAt = 12.5
                node.describedAsOf = 40 + UInt64(number)
            }
            inodes.append(inode)
        }
        var store = NodeStore()
        for inode in [1, directory.inode] + inodes { store[inode] = table[inode] }
        #expect(store.thinCount >= inodes.count)
        #expect(NodeStore.slotBytes <= 80)
    }

    /// Most nodes are kept thin (issue 21), a file's key made from its directory's: whatever
    /// the node holds (rare fields, an ETag that is not an MD5, times out of the nanosecond range,
    /// a key elsewhere, any kind, counts), it reads back field for field as it was stored.
    @Test func everyNodeReadsBackAsItWasStored() {
        var random = SeededGenerator(seed: 21)
        // Nodes made by a table (its counts and links are its own to set), stored again here.
        var table = InodeTable(rootKey: "", rootTime: .zero)
        let directory = table.link(parent: 1, name: "dir", kind: .directory, key: "some/dir/", lookups: 1)
        var made: [InodeNumber] = [directory.inode]
        for number in 0..<2_000 {
            let kinds: [NodeKind] = [.file, .directory, .symlink, .fifo, .socket]
            let kind = kinds[Int.random(in: 0..<kinds.count, using: &random)]
            let name = ["f", "a longer name than fifteen bytes ", "caf\u{E9}", ""][Int.random(in: 0..<4, using: &random)] + "\(number)"
            let parent = Bool.random(using: &random) ? directory.inode : 1
            var key = (parent == directory.inode ? "some/dir/" : "") + name + (kind == .directory ? "/" : "")
            if Int.random(in: 0..<5, using: &random) == 0 { key = "elsewhere/" + name }
            let lookups: UInt64 = [1, 1, 1, 1, 65_535, 65_536, UInt64(UInt32.max) + 1][Int.random(in: 0..<7, using: &random)]
            let inode = table.link(parent: parent, name: name, kind: kind, key: key, lookups: lookups).inode
            // What the node is made to hold, apart from the table's counts.
            var reference = Node(inode: inode, parent: parent, name: name, kind: kind, key: key)
            reference.size = Int64.random(in: 0...1 << 40, using: &random)
            reference.etag = ["", "0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef", "not-an-md5", "0123456789ABCDEF0123456789ABCDEF"][
                Int.random(in: 0..<5, using: &random)]
            reference.lastModified =
                Int.random(in: 0..<5, using: &random) > 0
                ? Timestamp(seconds: Int64.random(in: 0...4_000_000_000, using: &random), nanoseconds: Int32.random(in: 0..<1_000_000_000, using: &random))
                : Timestamp(seconds: Int64.max / 2, nanoseconds: 5)
            reference.stored = StoredAttributes(
                mode: Bool.random(using: &random) ? UInt16.random(in: 0...0o7777, using: &random) : nil,
                uid: Bool.random(using: &random) ? UInt32.random(in: 0...UInt32.max, using: &random) : nil,
                gid: Bool.random(using: &random) ? 100 : nil,
                mtime: Bool.random(using: &random) ? Timestamp(seconds: 1_600_000_000, nanoseconds: 7) : nil)
            reference.baseContentType = ["", "application/octet-stream", "image/jpeg", "type \(number % 7)"][Int.random(in: 0..<4, using: &random)]
            reference.confirmedAt = Double.random(in: 0...1e6, using: &random)
            reference.metadataKnownAt = [0, reference.confirmedAt, 12.5][Int.random(in: 0..<3, using: &random)]
            reference.describedAsOf =
                Int.random(in: 0..<5, using: &random) > 0 ? UInt64.random(in: 0...UInt64(UInt32.max), using: &random) : UInt64(UInt32.max) + 1
            switch Int.random(in: 0..<8, using: &random) {
            case 0: reference.manifest = "c/prefix"
            case 1: reference.localVersion = 3
            case 2: reference.changedAt = Timestamp(seconds: 5, nanoseconds: 6)
            case 3: reference.extraMetadata = ["x": "y"]
            case 4: reference.symlinkTarget = "../t"
            default: break
            }
            table.update(inode) { [reference] node in node = reference }
            var pins = Int32([0, 0, 0, 1, 14, 15, 300][Int.random(in: 0..<7, using: &random)])
            for _ in 0..<pins { table.pin(inode) }
            if Bool.random(using: &random) {
                table.oweAttributes(inode)
                reference.attributesOwed = true
                pins += 1
            }
            var linked = true
            if Int.random(in: 0..<4, using: &random) == 0 {
                table.unhook(parent: parent, name: name)
                linked = false
            }
            guard let node = table[inode] else { continue }
            #expect(fields(node) == fields(reference, counts: (lookups, pins, linked)), "inode \(inode) in the table")
            made.append(inode)
        }
        var store = NodeStore()
        var expected: [InodeNumber: String] = [:]
        for inode in made {
            let node = table[inode]!
            store[inode] = node
            expected[inode] = fields(node)
        }
        #expect(made.count > 1_000)
        #expect(store.thinCount > made.count / 25 && store.thinCount < made.count, "\(store.thinCount) of \(made.count) thin")
        for (inode, node) in store { #expect(fields(node) == expected[inode], "inode \(inode)") }
        for inode in made { #expect(store[inode].map { fields($0) } == expected[inode], "inode \(inode)") }
    }
}

struct DirectoryCacheTests {
    func entry(_ name: String) -> DirectoryEntry {
        DirectoryEntry(name: name, kind: .file, key: name, size: 1, etag: "e", lastModified: .zero, contentType: "")
    }

    /// Rule 5: past `nameLimit` names, the listings remembered longest ago are dropped down to
    /// nine tenths of it, never the newest (even alone past the limit); a dropped listing
    /// answers nothing and keeps what was recorded in it (a reader still reading it adds that).
    @Test func pastTheNameLimitTheListingsRememberedLongestAgoGo() {
        var cache = DirectoryCache(journalSeconds: 5, nameLimit: 20)
        func names(_ prefix: String, _ count: Int) -> EntryTable { EntryTable((0..<count).map { entry("\(prefix)\($0)") }) }
        for directory: InodeNumber in [11, 12, 13] {
            #expect(cache.remember(names("n", 6), for: directory, now: 1, startedAt: 0, askedAt: 1).remembered)
        }
        #expect(cache.rememberedNames == 18)
        cache.record(11, name: "made", entry: entry("made"), now: 1)
        // The fourth makes 24 names: 11 goes (18), then 12 would leave 12 but one is enough.
        #expect(cache.remember(names("m", 6), for: 14, now: 2, startedAt: 0, askedAt: 2).remembered)
        #expect(cache.rememberedNames == 18)
        #expect(cache.listing(11, now: 2, maximumAge: 5) == nil)
        #expect(cache.anyListing(11)?.entries.addedHere.map(\.name) == ["made"])
        for directory: InodeNumber in [12, 13, 14] { #expect(cache.listing(directory, now: 2, maximumAge: 5)?.entries.count == 6) }
        // A listing of 30 names alone is past the limit and stays; every other goes.
        #expect(cache.remember(names("big", 30), for: 15, now: 3, startedAt: 0, askedAt: 3).remembered)
        #expect(cache.rememberedNames == 30)
        #expect(cache.listing(15, now: 3, maximumAge: 5)?.entries.count == 30)
        for directory: InodeNumber in [12, 13, 14] { #expect(cache.listing(directory, now: 3, maximumAge: 5) == nil) }
        // A dropped listing is replaced by the next one of its directory.
        #expect(cache.remember(names("n", 2), for: 11, now: 4, startedAt: cache.changeCount(11), askedAt: 4).remembered)
        #expect(cache.listing(11, now: 4, maximumAge: 5)?.entries.sorted.map(\.name) == ["made", "n0", "n1"])
    }

    /// Rule 2: a listing that started before a change made here is remembered with the change
    /// applied (it was refused, and creates from several processes listed the directory again
    /// for every name); one that started before a change no longer journaled is refused.
    @Test func aListingThatStartedBeforeAChangeIsRememberedWithIt() {
        var cache = DirectoryCache(journalSeconds: 5)
        let started = cache.changeCount(7)
        cache.record(7, name: "new", entry: entry("new"), now: 10)
        cache.record(7, name: "gone", entry: nil, now: 10)
        let (table, remembered) = cache.remember(
            EntryTable([entry("gone"), entry("old")]), for: 7, now: 11, startedAt: started, askedAt: 1)
        #expect(remembered)
        #expect(table.sorted.map(\.name) == ["new", "old"])
        #expect(cache.listing(7, now: 12, maximumAge: 5)?.entries.sorted.map(\.name) == ["new", "old"])
        #expect(cache.listing(7, now: 17, maximumAge: 5) == nil)
        // 20 s later the change is no longer journaled: a listing that started before it (a
        // slow one) cannot be made current, and is refused.
        cache.record(7, name: "later", entry: entry("later"), now: 30)
        let slow = cache.remember(EntryTable([entry("old")]), for: 7, now: 31, startedAt: started, askedAt: 2)
        #expect(!slow.remembered)
        #expect(cache.listing(7, now: 31, maximumAge: 5) == nil)
    }

    /// A container listing lags behind the writes it follows: a listing that started after this
    /// mount created a name, and does not show it yet, is remembered with the name.
    @Test func aLaggingListingKeepsWhatWasMadeHereJustBefore() {
        var cache = DirectoryCache(journalSeconds: 5)
        cache.record(7, name: "made", entry: entry("made"), now: 10)
        let started = cache.changeCount(7)
        let (table, remembered) = cache.remember(EntryTable([entry("old")]), for: 7, now: 11, startedAt: started, askedAt: 2)
        #expect(remembered && table["made".exact] != nil)
        // An older listing does not replace a newer one.
        let older = cache.remember(EntryTable([]), for: 7, now: 12, startedAt: started, askedAt: 1)
        #expect(!older.remembered)
        #expect(cache.listing(7, now: 12, maximumAge: 5)?.entries.sorted.map(\.name) == ["made", "old"])
        // A name made and then removed here before the listing started stays removed (the
        // core model, seed 4).
        cache.record(7, name: "brief", entry: entry("brief"), now: 12)
        cache.record(7, name: "brief", entry: nil, now: 12)
        let afterRemoval = cache.remember(
            EntryTable([entry("old")]), for: 7, now: 12, startedAt: cache.changeCount(7), askedAt: 4)
        #expect(afterRemoval.remembered && afterRemoval.entries["brief".exact] == nil)
        // Beyond the journal's time the listing is believed.
        let much = cache.remember(EntryTable([entry("old")]), for: 7, now: 20, startedAt: cache.changeCount(7), askedAt: 5)
        #expect(much.remembered && much.entries["made".exact] == nil)
    }

    /// A change made before a listing started does not replace what the listing shows of the
    /// name: that may be another client's newer version (mount model, seed 3: a renamed file
    /// another client then replaced showed the renamed version's owner again).
    @Test func aListingNewerThanAChangeKeepsItsVersionOfTheName() {
        var cache = DirectoryCache(journalSeconds: 5)
        var mine = entry("f")
        mine.etag = "mine"
        cache.record(7, name: "f", entry: mine, now: 10)
        var theirs = entry("f")
        theirs.etag = "theirs"
        let started = cache.changeCount(7)
        let (table, remembered) = cache.remember(EntryTable([theirs]), for: 7, now: 11, startedAt: started, askedAt: 2)
        #expect(remembered && table["f".exact]?.etag == "theirs")
    }

    /// A change a listing already shows is not applied again: a later listing without the name
    /// shows another client's delete (reference model seed 1189), not a listing that lags.
    @Test func aChangeTheListingShowsLeavesTheJournal() {
        var cache = DirectoryCache(journalSeconds: 5)
        cache.record(7, name: "f", entry: entry("f"), now: 10)
        let shown = cache.remember(EntryTable([entry("f")]), for: 7, now: 11, startedAt: cache.changeCount(7), askedAt: 1)
        #expect(shown.remembered && shown.entries["f".exact] != nil)
        let later = cache.remember(EntryTable([]), for: 7, now: 12, startedAt: cache.changeCount(7), askedAt: 2)
        #expect(later.remembered && later.entries["f".exact] == nil)
        // One that lags still gets the name made here.
        cache.record(7, name: "g", entry: entry("g"), now: 13)
        let lagging = cache.remember(EntryTable([]), for: 7, now: 13, startedAt: cache.changeCount(7), askedAt: 3)
        #expect(lagging.entries["g".exact] != nil)
    }

    /// A removal stays journaled while the store still lists the name, even when the reader
    /// skipped it: else the next lagging listing shows the removed file again.
    @Test func aRemovalTheStoreStillListsStaysJournaled() {
        var cache = DirectoryCache(journalSeconds: 5)
        cache.record(7, name: "g", entry: entry("g"), now: 10)
        cache.record(7, name: "g", entry: nil, now: 10)
        // The reader skipped g (removed here) though the store listed it.
        let first = cache.remember(EntryTable([]), for: 7, now: 11, startedAt: cache.changeCount(7), askedAt: 1, stillListed: ["g".exact])
        #expect(first.remembered && first.entries["g".exact] == nil)
        let second = cache.remember(EntryTable([entry("g")]), for: 7, now: 12, startedAt: cache.changeCount(7), askedAt: 2)
        #expect(second.entries["g".exact] == nil)
    }

    /// A failed operation on one name forgets the listing and that name's changes, not the
    /// others' (they keep lagging listings honest), and refuses listings under way.
    @Test func aFailureForgetsOnlyTheNamesItTouched() {
        var cache = DirectoryCache(journalSeconds: 5)
        let started = cache.changeCount(7)
        cache.record(7, name: "made", entry: entry("made"), now: 10)
        cache.record(7, name: "failed", entry: entry("failed"), now: 10)
        cache.forget("failed", in: 7)
        #expect(!cache.remember(EntryTable([]), for: 7, now: 11, startedAt: started, askedAt: 1).remembered)
        let (table, remembered) = cache.remember(EntryTable([]), for: 7, now: 11, startedAt: cache.changeCount(7), askedAt: 2)
        #expect(remembered && table["made".exact] != nil && table["failed".exact] == nil)
        // A name removed here that a lagging listing still shows is taken out.
        cache.record(7, name: "gone", entry: nil, now: 12)
        let lagging = cache.remember(EntryTable([entry("gone")]), for: 7, now: 12, startedAt: cache.changeCount(7), askedAt: 3)
        #expect(lagging.remembered && lagging.entries["gone".exact] == nil)
        #expect(cache.removedHere(7, now: 12) == ["gone".exact])
        #expect(cache.removedHere(7, now: 20).isEmpty, "beyond journalSeconds")
    }

    /// Rule 4: what this mount made of a name after an answer's change count, also once a
    /// later listing showed it; `unknown` once it is no longer journaled.
    @Test func changeSinceAnAnswerIsKnownUntilTheJournalForgetsIt() {
        var cache = DirectoryCache(journalSeconds: 5)
        let answered = cache.changeCount(7)
        #expect(cache.changeSince(7, "f", count: answered) == .nothing)
        var stored = entry("f")
        stored.size = 43
        cache.record(7, name: "f", entry: entry("f"), now: 10)
        cache.record(7, name: "f", entry: stored, now: 10)
        cache.record(7, name: "g", entry: nil, now: 10)
        #expect(cache.changeSince(7, "f", count: answered) == .changed(stored))
        #expect(cache.changeSince(7, "g", count: answered) == .changed(nil))
        #expect(cache.changeSince(7, "h", count: answered) == .nothing)
        #expect(cache.changeSince(7, "f", count: cache.changeCount(7)) == .nothing)
        #expect(cache.changeSince(8, "f", count: answered) == .nothing, "another directory")
        // A listing that started after the changes shows them: they are not applied to later
        // listings, but an answer from before still learns of them.
        let shown = cache.remember(EntryTable([stored]), for: 7, now: 11, startedAt: cache.changeCount(7), askedAt: 5)
        #expect(shown.remembered)
        #expect(cache.changeSince(7, "f", count: answered) == .changed(stored))
        // Beyond journalSeconds they are forgotten: an answer from before cannot be trusted.
        cache.record(7, name: "later", entry: entry("later"), now: 30)
        #expect(cache.changeSince(7, "f", count: answered) == .unknown)
        #expect(cache.changeSince(7, "later", count: cache.changeCount(7) - 1) == .changed(entry("later")))
    }

    /// `forget` of one name keeps the other names' changes; pruning those later must not lower
    /// the count below which answers are `unknown` (the forgotten name's change would be lost).
    @Test func pruningAfterAForgetKeepsWhatTheForgetForgot() {
        var cache = DirectoryCache(journalSeconds: 5)
        cache.record(7, name: "x", entry: entry("x"), now: 10)
        let answered = cache.changeCount(7)
        cache.record(7, name: "y", entry: entry("y"), now: 10)
        cache.forget("y", in: 7)
        #expect(cache.changeSince(7, "y", count: answered) == .unknown)
        cache.record(7, name: "z", entry: entry("z"), now: 30)
        #expect(cache.changeSince(7, "y", count: answered) == .unknown)
        #expect(!cache.remember(EntryTable([]), for: 7, now: 30, startedAt: answered, askedAt: 1).remembered)
    }

    /// A journal is kept for `journalSeconds`, also in a directory nobody changes or lists
    /// again: changes elsewhere prune it (an rsync of many directories holds no journal of them
    /// all).
    @Test func journalsOfIdleDirectoriesArePrunedByChangesElsewhere() {
        var cache = DirectoryCache(journalSeconds: 5)
        for directory in InodeNumber(10)..<20 { cache.record(directory, name: "f", entry: entry("f"), now: 0) }
        #expect(cache.journaledChanges == 10)
        for i in 0..<1_000 { cache.record(7, name: "n\(i)", entry: entry("n\(i)"), now: 10) }
        #expect(cache.journaledChanges == 1_000)
    }

    /// A remembered listing keeps the reader's array and a table of positions; our changes go
    /// to an overlay. Lookups and the sorted view see both, a later entry of a name wins.
    @Test func anEntryTableAnswersByNameWithOurChangesOnTop() {
        var replaced = entry("a")
        replaced.size = 7
        var table = EntryTable([entry("b"), entry("a"), replaced])
        #expect(table["a".exact]?.size == 7)
        table["b".exact] = nil
        table["d".exact] = entry("d")
        table["a".exact] = entry("a")
        #expect(table["b".exact] == nil && table["d".exact] != nil && table["a".exact]?.size == 1)
        #expect(table.sorted.map(\.name) == ["a", "d"])
        let unicode = EntryTable([entry("ce\u{301}"), entry("c\u{E9}"), entry("c")])
        #expect(unicode.sorted.map { Array($0.name.utf8) } == [Array("c".utf8), Array("ce\u{301}".utf8), Array("c\u{E9}".utf8)])
        #expect(unicode["c\u{E9}".exact] != nil && unicode["e".exact] == nil)
    }

    @Test func ourChangesUpdateARememberedListingAndDropForgetsIt() {
        var cache = DirectoryCache()
        _ = cache.remember(EntryTable([entry("a")]), for: 3, now: 0, startedAt: 0, askedAt: 1)
        cache.record(3, name: "b", entry: entry("b"), now: 0)
        cache.record(3, name: "a", entry: nil, now: 0)
        #expect(cache.listing(3, now: 1, maximumAge: 5)?.entries.sorted.map(\.name) == ["b"])
        cache.drop(3)
        #expect(cache.anyListing(3) == nil)
    }
}

/// A directory's names as an open-addressing table over the nodes' own names: random sets,
/// replacements and removals in a few directories, every name looked up and every listing
/// compared with a dictionary after each (removals shift names back into the freed slot).
struct ChildIndexTests {
    @Test func namesAreFoundAsADictionaryFindsThem() {
        var random = SeededGenerator(seed: 22)
        var nodes = NodeStore()
        var index = ChildIndex()
        var reference: [InodeNumber: [ExactString: InodeNumber]] = [:]
        // "e\u{301}" and "\u{E9}" are two names, as they are two keys.
        let pool = (0..<300).map { "n\($0)" } + ["caf\u{E9}", "cafe\u{301}", "", "a longer name than fifteen bytes"]
        var next: InodeNumber = 10
        for step in 0..<20_000 {
            let parent = InodeNumber.random(in: 1...3, using: &random)
            let name = pool[Int.random(in: 0..<pool.count, using: &random)]
            if Int.random(in: 0..<3, using: &random) == 0 {
                let removed = index.remove(parent, name, in: nodes)
                #expect(removed == reference[parent]?[name.exact], "step \(step)")
                if let removed { nodes[removed] = nil }
                reference[parent]?[name.exact] = nil
                if reference[parent]?.isEmpty == true { reference[parent] = nil }
            } else {
                let inode = next
                next += 1
                nodes[inode] = Node(inode: inode, parent: parent, name: name, kind: .file, key: name)
                let replaced = reference[parent]?[name.exact]
                index.set(parent, name, inode, in: nodes)
                if let replaced { nodes[replaced] = nil }
                reference[parent, default: [:]][name.exact] = inode
            }
            if step % 97 == 0 || step > 19_900 {
                for parent: InodeNumber in 1...3 {
                    for name in pool {
                        #expect(index.inode(parent, name, in: nodes) == reference[parent]?[name.exact], "step \(step)")
                    }
                    let listed = Dictionary(uniqueKeysWithValues: index.list(parent, in: nodes).map { ($0.name, $0.inode) })
                    #expect(listed == reference[parent] ?? [:], "step \(step)")
                    #expect(index.isEmpty(parent) == (reference[parent] == nil))
                }
            }
        }
    }
}

/// Inode numbers to slots as an open-addressing table: random sets and removals of numbers,
/// in runs (as inodes are handed out) and scattered, against a dictionary.
struct SlotIndexTests {
    @Test func slotsAreFoundAsADictionaryFindsThem() {
        var random = SeededGenerator(seed: 23)
        var index = SlotIndex()
        var reference: [InodeNumber: Int32] = [:]
        var next: InodeNumber = 2
        let wide = InodeNumber(UInt32.max) - 20
        for step in 0..<30_000 {
            var inode: InodeNumber =
                Bool.random(using: &random) ? next : InodeNumber.random(in: 1...(next + 10), using: &random)
            if inode == next { next += 1 }
            // Some numbers near and past 32 bits (kept apart).
            if Int.random(in: 0..<4, using: &random) == 0 { inode += wide }
            if Int.random(in: 0..<3, using: &random) == 0 {
                index[inode] = nil
                reference[inode] = nil
            } else {
                let slot = Int32.random(in: 0...Int32.max, using: &random)
                index[inode] = slot
                reference[inode] = slot
            }
            if step % 101 == 0 || step > 29_900 {
                #expect(index.count == reference.count, "step \(step)")
                for probe in Array(1...(next + 10)) + (1...(next + 10)).map({ $0 + wide }) {
                    #expect(index[probe] == reference[probe], "step \(step), inode \(probe)")
                }
                #expect(Dictionary(uniqueKeysWithValues: index.map { ($0.0, $0.1) }) == reference, "step \(step)")
            }
        }
    }
}

/// Random sequences of the table's operations (names made, linked, unhooked, moved, forgotten,
/// pinned): after each, every name in a directory leads to a living node that says it is there,
/// and every linked node is found by its name.
struct InodeTableSequenceTests {
    @Test(arguments: [31, 32, 33, 34] as [UInt64]) func everyNameLeadsToALivingNodeThatHasIt(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        var table = InodeTable(rootKey: "", rootTime: .zero)
        let names = ["a", "b", "c", "caf\u{E9}", "cafe\u{301}", "a longer name than fifteen bytes"]
        var pinned: [InodeNumber] = []
        for step in 0..<1_500 {
            let known = table.nodes.map(\.value)
            let directories = known.filter { $0.kind == .directory && ($0.linked || $0.inode == InodeTable.root) }
            let parent = directories.randomElement(using: &random)!
            let name = names.randomElement(using: &random)!
            let key = parent.key + name
            switch Int.random(in: 0..<8, using: &random) {
            case 0:
                _ = table.insert(Node(inode: 0, parent: parent.inode, name: name, kind: .file, key: key))
            case 1:
                _ = table.insert(Node(inode: 0, parent: parent.inode, name: name, kind: .directory, key: key + "/"))
            case 2:
                let kind: NodeKind = Bool.random(using: &random) ? .file : .directory
                _ = table.link(parent: parent.inode, name: name, kind: kind, key: kind == .directory ? key + "/" : key,
                    lookups: UInt64.random(in: 0...1, using: &random))
            case 3:
                table.unhook(parent: parent.inode, name: name)
            case 4:
                guard let node = known.filter({ $0.linked && $0.inode != InodeTable.root }).randomElement(using: &random),
                    !(node.kind == .directory && parent.key.utf8.starts(with: node.key.utf8))
                else { break }
                table.move(node.inode, to: parent.inode, name: name, key: node.kind == .directory ? key + "/" : key)
            case 5:
                guard let node = known.filter({ $0.lookups > 0 && $0.inode != InodeTable.root }).randomElement(using: &random)
                else { break }
                table.forget(node.inode, count: node.lookups)
            case 6:
                guard let node = known.filter({ $0.inode != InodeTable.root }).randomElement(using: &random) else { break }
                table.pin(node.inode)
                pinned.append(node.inode)
            default:
                guard !pinned.isEmpty else { break }
                table.unpin(pinned.remove(at: Int.random(in: 0..<pinned.count, using: &random)))
            }
            for (inode, node) in table.nodes {
                for child in table.children(of: inode) {
                    let held = table[child.inode]
                    #expect(held?.parent == inode && held?.name.exact == child.name && held?.linked == true, "step \(step)")
                }
                if node.linked && inode != InodeTable.root {
                    #expect(table.child(node.parent, node.name)?.inode == inode, "step \(step): inode \(inode)")
                    #expect(table[node.parent] != nil, "step \(step): the directory of inode \(inode)")
                }
            }
        }
    }
}
