import Testing

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
}

struct DirectoryCacheTests {
    func entry(_ name: String) -> DirectoryEntry {
        DirectoryEntry(name: name, kind: .file, key: name, size: 1, etag: "e", lastModified: .zero, contentType: "")
    }

    @Test func aListingThatStartedBeforeAChangeIsNotRemembered() {
        var cache = DirectoryCache()
        let started = cache.changeCount(7)
        cache.record(7, name: "new", entry: entry("new"))
        let refused = !cache.remember(EntryTable([entry("old")]), for: 7, now: 10, startedAt: started, askedAt: 1)
        #expect(refused)
        #expect(cache.listing(7, now: 10, maximumAge: 5) == nil)
        let current = cache.changeCount(7)
        let accepted = cache.remember(EntryTable([entry("old")]), for: 7, now: 10, startedAt: current, askedAt: 1)
        #expect(accepted)
        #expect(cache.listing(7, now: 12, maximumAge: 5)?.entries.sorted.map(\.name) == ["old"])
        #expect(cache.listing(7, now: 16, maximumAge: 5) == nil)
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
        cache.remember(EntryTable([entry("a")]), for: 3, now: 0, startedAt: 0, askedAt: 1)
        cache.record(3, name: "b", entry: entry("b"))
        cache.record(3, name: "a", entry: nil)
        #expect(cache.listing(3, now: 1, maximumAge: 5)?.entries.sorted.map(\.name) == ["b"])
        cache.drop(3)
        #expect(cache.anyListing(3) == nil)
    }
}
