import Foundation
import Logging
import ObjectStore
import ObjectStoreTesting
import Testing

@testable import FileSystem

/// POSIX details a conformance suite checks (items 11 and 12 of the integrity issue).
struct PosixTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode

    let temporary = TemporaryDirectory("cssp-posix-spool")

    func makeFilesystem(_ store: FakeObjectStore) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = temporary.child("spool")
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func createFile(_ fs: Filesystem, _ name: String, _ text: String) throws -> Attributes {
        try fs.storeFile(root, name, Array(text.utf8), caller: caller)
    }

    @Test func anOpenFileUnlinkedOrReplacedHasNoLinks() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let a = try createFile(fs, "a", "a")
        let opened = try fs.open(a.inode, writable: false, truncate: false)
        #expect(try fs.getattr(a.inode).links == 1)
        try fs.unlink(parent: root, name: "a")
        #expect(try fs.getattr(a.inode).links == 0)
        fs.release(handle: opened.handle)
        let b = try createFile(fs, "b", "b")
        _ = try createFile(fs, "c", "c")
        try fs.rename(parent: root, name: "c", newParent: root, newName: "b", noReplace: false)
        #expect(try fs.getattr(b.inode).links == 0)
        let d = try fs.mkdir(parent: root, name: "d", mode: 0o755, caller: caller)
        #expect(d.links == 2)
    }

    @Test func chmodAndUtimensMoveTheChangeTimeNotTheModificationTime() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let f = try createFile(fs, "f", "x")
        let past = Timestamp(seconds: 1_000_000_000, nanoseconds: 0)
        let set = try fs.setattr(f.inode, AttributeChanges(modified: past, accessed: Timestamp(seconds: 900_000_000, nanoseconds: 7)))
        #expect(set.modified == past)
        #expect(set.accessed == Timestamp(seconds: 900_000_000, nanoseconds: 7))
        #expect(set.changed > past, "utimens is a change of the file's status")
        let chmodded = try fs.setattr(f.inode, AttributeChanges(mode: 0o600))
        #expect(chmodded.modified == past)
        #expect(chmodded.changed >= set.changed)
    }

    @Test(arguments: [false, true]) func truncationMovesAndStoresTheModificationTime(throughAHandle: Bool) throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let f = try createFile(fs, "f", "some content")
        let past = Timestamp(seconds: 1_000_000_000, nanoseconds: 0)
        _ = try fs.setattr(f.inode, AttributeChanges(modified: past))
        var handle: UInt64? = nil
        if throughAHandle { handle = try fs.open(f.inode, writable: true, truncate: false).handle }
        let cut = try fs.setattr(f.inode, AttributeChanges(size: 4))
        if let handle {
            try fs.flush(handle: handle)
            fs.release(handle: handle)
        }
        #expect(cut.modified > past)
        #expect(store.object("f")?.bytes == Array("some".utf8))
        #expect(store.object("f")?.metadata["mtime"] != past.description)
    }

    @Test(arguments: [300, 4095]) func longSymlinkTargetsAreKeptInTheBody(length: Int) throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let target = String(repeating: "d/", count: length / 2) + String(repeating: "x", count: length % 2)
        let link = try fs.symlink(parent: root, name: "l", target: target, caller: caller)
        #expect(link.size == Int64(length))
        let fresh = makeFilesystem(store)
        let found = try fresh.lookup(parent: root, name: "l")
        #expect(try fresh.readlink(found.inode) == target)
    }

    @Test func keysLongerThanTheStoreTakesAreNameTooLong() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let name = String(repeating: "n", count: 250)
        var parent = root
        for _ in 0..<4 { parent = try fs.mkdir(parent: parent, name: name, mode: 0o755, caller: caller).inode }
        // 4 × 251 bytes of prefix: a 20-byte name is a 1024-byte key (fine), a 21-byte one is not.
        _ = try fs.create(parent: parent, name: String(repeating: "f", count: 20), mode: 0o644, caller: caller)
        #expect(throws: FSError.self) { _ = try fs.create(parent: parent, name: String(repeating: "f", count: 21), mode: 0o644, caller: caller) }
        do {
            _ = try fs.mkdir(parent: parent, name: String(repeating: "f", count: 20), mode: 0o755, caller: caller)
            Issue.record("a directory whose marker would be 1025 bytes was made")
        } catch {
            #expect(error.code == .nameTooLong)
        }
        do {
            _ = try fs.lookup(parent: parent, name: String(repeating: "g", count: 30))
            Issue.record("lookup of a too-long key succeeded")
        } catch {
            #expect(error.code == .nameTooLong)
        }
    }

    @Test func aSetgidDirectoryGivesItsGroupAndItsBit() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let shared = try fs.mkdir(parent: root, name: "shared", mode: 0o2775, caller: Caller(uid: 1, gid: 50))
        #expect(shared.permissions == 0o2775 && shared.gid == 50)
        let (file, opened) = try fs.create(parent: shared.inode, name: "f", mode: 0o644, caller: caller)
        fs.release(handle: opened.handle)
        #expect(file.gid == 50)
        let sub = try fs.mkdir(parent: shared.inode, name: "sub", mode: 0o755, caller: caller)
        #expect(sub.gid == 50 && sub.permissions == 0o2755)
        let plain = try fs.mkdir(parent: root, name: "plain", mode: 0o755, caller: caller)
        let inPlain = try fs.mkdir(parent: plain.inode, name: "x", mode: 0o755, caller: caller)
        #expect(inPlain.gid == caller.gid && inPlain.permissions == 0o755)
    }

    /// rewinddir shows what changed since opendir (it replayed the first listing).
    @Test func rewinddirShowsEntriesMadeSinceOpendir() throws {
        let store = FakeObjectStore()
        store.seed("a", text: "a")
        let fs = makeFilesystem(store)
        let handle = try fs.opendir(root)
        defer { fs.releasedir(handle: handle) }
        func readAll() throws -> [String] {
            var names: [String] = []
            var offset: Int64 = 0
            while true {
                var count = 0
                try fs.readdir(root, handle: handle, offset: offset) { name, _, _, next in
                    count += 1
                    offset = next
                    if name != "." && name != ".." { names.append(name) }
                    return true
                }
                if count == 0 { return names }
            }
        }
        #expect(try readAll() == ["a"])
        _ = try createFile(fs, "b", "b")
        try fs.unlink(parent: root, name: "a")
        #expect(try readAll() == ["b"])
    }
}
