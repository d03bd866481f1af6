import Dispatch
import Foundation
import Locking
import Logging
import ObjectStore
import ObjectStoreTesting
import Synchronization
import Testing

@testable import FileSystem

/// Regression tests of the integrity issue: sequences of ordinary operations that lost track of
/// state. Each failed before its fix.
struct IntegrityTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode

    func makeFilesystem(_ store: any ObjectStore) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = NSTemporaryDirectory() + "cssp-integrity-spool-" + UUID().uuidString
        configuration.listPageSize = 2
        configuration.pendingRetrySeconds = 3600
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func write(_ fs: Filesystem, _ handle: UInt64, _ text: String, at offset: Int64 = 0) throws {
        try Array(text.utf8).withUnsafeBytes { try fs.write(handle: handle, offset: offset, bytes: $0) }
    }

    func close(_ fs: Filesystem, _ handle: UInt64) throws {
        try fs.flush(handle: handle)
        fs.release(handle: handle)
    }

    func createFile(_ fs: Filesystem, _ parent: InodeNumber, _ name: String, _ text: String) throws -> Attributes {
        let (attributes, opened) = try fs.create(parent: parent, name: name, mode: 0o644, caller: caller)
        try write(fs, opened.handle, text)
        try close(fs, opened.handle)
        return attributes
    }

    /// `ls` as the kernel does it: readdirplus to the end, every entry counted as a lookup.
    func list(_ fs: Filesystem, _ inode: InodeNumber) throws -> [String] {
        let handle = try fs.opendir(inode)
        defer { fs.releasedir(handle: handle) }
        var names: [String] = []
        var offset: Int64 = 0
        while true {
            var count = 0
            try fs.readdirplus(inode, handle: handle, offset: offset) { name, _, _, _, next in
                count += 1
                offset = next
                if name != "." && name != ".." { names.append(name) }
                return true
            }
            if count == 0 { return names }
        }
    }

    func read(_ fs: Filesystem, _ inode: InodeNumber) throws -> String {
        String(decoding: try fs.readWhole(inode, chunk: 4096), as: UTF8.self)
    }

    /// mkdir d; echo x > d/f; mv d e; ls e; chmod 600 e/f; echo more >> e/f
    @Test func aRenamedDirectoryKeepsItsChildrenReachable() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let d = try fs.mkdir(parent: root, name: "d", mode: 0o755, caller: caller)
        _ = try createFile(fs, d.inode, "f", "x\n")
        try fs.rename(parent: root, name: "d", newParent: root, newName: "e", noReplace: false)
        #expect(try list(fs, d.inode) == ["f"])
        let f = try fs.lookup(parent: d.inode, name: "f")
        let changed = try fs.setattr(f.inode, AttributeChanges(mode: 0o600))
        #expect(changed.permissions == 0o600)
        let opened = try fs.open(f.inode, writable: true, truncate: false)
        try write(fs, opened.handle, "more\n", at: 2)
        try close(fs, opened.handle)
        #expect(store.object("e/f")?.bytes == Array("x\nmore\n".utf8))
        #expect(store.object("e/f")?.metadata["mode"] == "0600")
        #expect(!store.keys.contains { $0.hasPrefix("d/") })
    }

    /// Item 1: a marker `x/` beside a regular object `x`: rmdir x removes the directory only.
    @Test func rmdirLeavesAFileOfTheSameName() throws {
        let store = FakeObjectStore()
        store.seed("x", text: "a file")
        store.seed("x/", contentType: "application/directory")
        let fs = makeFilesystem(store)
        #expect(try list(fs, root).sorted() == ["x", "x~object"])
        try fs.rmdir(parent: root, name: "x")
        #expect(store.object("x")?.bytes == Array("a file".utf8))
        #expect(!store.keys.contains("x/"))
    }

    /// Item 1, `mv -T dir x` onto an empty directory `x` that has a file `x` beside its marker.
    @Test func renamingOverAnEmptyDirectoryLeavesAFileOfItsName() throws {
        let store = FakeObjectStore()
        store.seed("x", text: "a file")
        store.seed("x/", contentType: "application/directory")
        let fs = makeFilesystem(store)
        _ = try fs.mkdir(parent: root, name: "dir", mode: 0o700, caller: caller)
        try fs.rename(parent: root, name: "dir", newParent: root, newName: "x", noReplace: false)
        #expect(store.object("x")?.bytes == Array("a file".utf8))
    }

    /// Item 2: a directory renamed over an empty one keeps its marker (and so its mode).
    @Test func aDirectoryRenamedOverAnEmptyOneKeepsItsMarker() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        _ = try fs.mkdir(parent: root, name: "a", mode: 0o700, caller: caller)
        _ = try fs.mkdir(parent: root, name: "b", mode: 0o755, caller: caller)
        try fs.rename(parent: root, name: "a", newParent: root, newName: "b", noReplace: false)
        #expect(store.keys == ["b/"])
        #expect(store.object("b/")?.metadata["mode"] == "0700")
        let fresh = makeFilesystem(store)
        #expect(try fresh.lookup(parent: root, name: "b").permissions == 0o700)
    }

    /// Item 3: rename(tmp, f) while f is open for writing: closing the old handle later must not
    /// store its bytes over the renamed content.
    @Test func renameOverAFileOpenForWritingKeepsTheRenamedContent() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let (f, old) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(fs, old.handle, "old content")
        try fs.flush(handle: old.handle)
        try write(fs, old.handle, "OLD CONTENT, written after the flush")
        _ = try createFile(fs, root, "tmp", "new content")
        try fs.rename(parent: root, name: "tmp", newParent: root, newName: "f", noReplace: false)
        try fs.flush(handle: old.handle)
        fs.release(handle: old.handle)
        #expect(store.object("f")?.bytes == Array("new content".utf8))
        let now = try fs.lookup(parent: root, name: "f")
        #expect(now.inode != f.inode)
        #expect(try read(fs, now.inode) == "new content")
    }

    /// Item 4: unlink while an upload of the file is under way: the object must not come back.
    @Test func unlinkDuringAnUploadRemovesTheFileForGood() throws {
        let fake = FakeObjectStore()
        let inPut = DispatchSemaphore(value: 0)
        let gate = DispatchSemaphore(value: 0)
        let armed = Locked(true)
        let store = FaultInjectingStore(fake) { call in
            if call.operation == .put, call.key == "f", armed.withLock({ let was = $0; $0 = false; return was }) {
                inPut.signal()
                gate.wait()
            }
            return .none
        }
        let fs = makeFilesystem(store)
        let (_, opened) = try fs.create(parent: root, name: "f", mode: 0o644, caller: caller)
        try write(fs, opened.handle, "bytes")
        let uploads = DispatchGroup()
        DispatchQueue.global().async(group: uploads) { _ = try? fs.flush(handle: opened.handle) }
        inPut.wait()  // the PUT is under way, held at the gate
        let unlinking = DispatchGroup()
        DispatchQueue.global().async(group: unlinking) { try? fs.unlink(parent: root, name: "f") }
        // The unlink either waits for the upload (then the gate must open for it to finish) or
        // has already deleted (the bug): either way the gate opens after at most a second.
        _ = unlinking.wait(timeout: .now() + 1)
        gate.signal()
        uploads.wait()
        unlinking.wait()
        fs.release(handle: opened.handle)
        #expect(fake.object("f") == nil, "the object came back after rm returned")
    }

    /// Item 12: a listing that started before our own change must not undo it afterwards.
    @Test func aListingOlderThanAChangeDoesNotHideIt() throws {
        let store = FakeObjectStore()
        for name in ["a", "b", "c", "d", "e", "f"] { store.seed(name, text: name) }
        let fs = makeFilesystem(store)
        let handle = try fs.opendir(root)
        var offset: Int64 = 0
        var seen = 0
        // The first page (two names) of a listing...
        try fs.readdir(root, handle: handle, offset: 0) { name, _, _, next in
            offset = next
            seen += 1
            return seen < 3
        }
        // ...then a file is created and stored, with a name the listing has passed...
        _ = try createFile(fs, root, "0new", "n")
        // ...then the listing runs to its end and is remembered.
        while true {
            var count = 0
            try fs.readdir(root, handle: handle, offset: offset) { _, _, _, next in
                count += 1
                offset = next
                return true
            }
            if count == 0 { break }
        }
        fs.releasedir(handle: handle)
        let found = try fs.lookup(parent: root, name: "0new")
        #expect(found.size == 1)
    }

    /// Renaming a name to itself (after the kernel forgot it) changes nothing on the server.
    @Test func renameToItselfAfterAForgetKeepsTheDirectory() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        let g = try fs.mkdir(parent: root, name: "g", mode: 0o755, caller: caller)
        _ = try createFile(fs, g.inode, "f", "content")
        fs.forget(g.inode, count: 1)
        try fs.rename(parent: root, name: "g", newParent: root, newName: "g", noReplace: false)
        #expect(store.keys == ["g/", "g/f"])
    }
}
