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

/// The attribute rule (`Node+Merge`): an answer of the store asked before a node's latest local
/// change was acknowledged never changes the node, unless it shows a newer object version. Each
/// test holds an answer from before a change (a remembered listing, a readdir in progress) and
/// offers it to the node after the change is stored.
struct AttributeRuleTests {
    let root = Filesystem.rootInode
    let clock = ManualClock()
    let temporary = TemporaryDirectory("cssp-rule")

    func makeFilesystem(_ store: any ObjectStore, attributeWriteDelay: Double = 3600) -> Filesystem {
        var configuration = FilesystemConfiguration()
        // (The seeds are other tools' objects, described here by their listings: this suite is about
        // the attribute rule, not where their attributes come from; PrefetchTests and ForeignAttributeTests are.)
        configuration.foreignAttributes = .listing
        configuration.spoolDirectory = temporary.path + "/spool"
        configuration.pendingRetrySeconds = 3600
        // 3600: no timer fires during a test; `storeOwedAttributes()` stands for the delay passing.
        configuration.attributeWriteDelay = attributeWriteDelay
        let clock = self.clock
        configuration.clock = { clock.now }
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    /// An object an earlier mount stored with mode 0644.
    func seedStored(_ store: FakeObjectStore, _ key: String, _ text: String) {
        store.seed(key, Array(text.utf8), contentType: "text/plain;cssp-mode=0644;cssp-uid=1000;cssp-gid=100")
    }

    /// readdirplus of `directory` from `offset`, answering "full" at the first name in `stop`.
    /// Returns what was sent, by name, and the offset of the name it stopped at.
    @discardableResult
    func readdirplus(
        _ fs: Filesystem, _ directory: InodeNumber, handle: UInt64, from offset: Int64 = 0, stoppingAt stop: String? = nil
    ) throws -> (sent: [String: Attributes], stoppedAt: Int64?) {
        var sent: [String: Attributes] = [:]
        var stoppedAt: Int64? = nil
        var previous = offset
        try fs.readdirplus(directory, handle: handle, offset: offset) { name, _, _, attributes, next in
            if name == stop {
                stoppedAt = previous
                return false
            }
            previous = next
            if let attributes { sent[name] = attributes }
            return true
        }
        return (sent, stoppedAt)
    }

    /// The scenario: `ls -l`, chmod 600 (owed), the change stored, the kernel asks again
    /// within dir_timeout: the listing from before the change must not bring 0644 back.
    @Test func aStoredOwedChmodIsNotUndoneByTheListingFromBeforeIt() throws {
        let store = FakeObjectStore()
        seedStored(store, "f", "data")
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let listed = try fs.opendir(root)
        let before = try readdirplus(fs, root, handle: listed)
        fs.releasedir(handle: listed)
        let file = try #require(before.sent["f"])
        #expect(file.permissions == 0o644)
        _ = try fs.setattr(file.inode, AttributeChanges(mode: 0o600))
        #expect(try fs.lookup(parent: root, name: "f").permissions == 0o600, "while owed")
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.object("f")?.metadata["mode"] == "0600")
        clock.advance(2)  // beyond attr_timeout, within dir_timeout: the remembered listing answers
        #expect(try fs.lookup(parent: root, name: "f").permissions == 0o600, "a lookup after the store")
        #expect(try fs.getattr(file.inode).permissions == 0o600, "a stat after the store")
        let again = try fs.opendir(root)
        #expect(try readdirplus(fs, root, handle: again).sent["f"]?.permissions == 0o600, "ls -l after the store")
        fs.releasedir(handle: again)
    }

    /// The kernel forgot the file while its chmod was owed: once stored, the node goes, and the
    /// next lookup makes a new one from the remembered listing, whose entry must say 0600
    /// (the reference model, seed 7086, with an mtime).
    @Test func aForgottenFileIsDescribedByTheListingEntryItsStoredChangeUpdated() throws {
        let store = FakeObjectStore()
        seedStored(store, "f", "data")
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let listed = try fs.opendir(root)
        let file = try #require(try readdirplus(fs, root, handle: listed).sent["f"])
        fs.releasedir(handle: listed)
        // The background HEAD the listing queued (no mtime in it) has answered: 0644, remembered too.
        fs.waitForPrefetch()
        _ = try fs.setattr(file.inode, AttributeChanges(mode: 0o600))
        fs.forget(file.inode, count: 1)
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(fs.names.withLock { $0.inodes[file.inode] } == nil, "the node went with its last pin")
        clock.advance(2)
        #expect(try fs.lookup(parent: root, name: "f").permissions == 0o600)
    }

    /// The same for a chmod stored at once (`attr_write_delay=0`) while a readdir that had
    /// fetched its page before the chmod goes on: `ls -l` of a directory someone changes.
    @Test func aReaddirInProgressDoesNotUndoAChmodStoredAtOnce() throws {
        let store = FakeObjectStore()
        seedStored(store, "a", "one")
        seedStored(store, "b", "two")
        let fs = makeFilesystem(store, attributeWriteDelay: 0)
        defer { fs.shutdown() }
        let b = try fs.lookup(parent: root, name: "b")
        let handle = try fs.opendir(root)
        defer { fs.releasedir(handle: handle) }
        let first = try readdirplus(fs, root, handle: handle, stoppingAt: "b")
        let offset = try #require(first.stoppedAt)
        _ = try fs.setattr(b.inode, AttributeChanges(mode: 0o600))
        #expect(store.object("b")?.metadata["mode"] == "0600")
        let rest = try readdirplus(fs, root, handle: handle, from: offset)
        #expect(rest.sent["b"]?.permissions == 0o600)
        #expect(try fs.getattr(b.inode).permissions == 0o600)
    }

    /// A file renamed over a name that a readdir in progress already fetched: the listed entry
    /// describes the replaced object, not the renamed file.
    @Test func aReaddirInProgressDoesNotDescribeARenamedFileAsTheFileItReplaced() throws {
        let store = FakeObjectStore()
        seedStored(store, "d/a", "a")
        seedStored(store, "d/g", "the old g, ten")
        seedStored(store, "f", "new")
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let d = try fs.lookup(parent: root, name: "d")
        let f = try fs.lookup(parent: root, name: "f")
        _ = try fs.lookup(parent: d.inode, name: "g")
        let handle = try fs.opendir(d.inode)
        defer { fs.releasedir(handle: handle) }
        let first = try readdirplus(fs, d.inode, handle: handle, stoppingAt: "g")
        let offset = try #require(first.stoppedAt)
        try fs.rename(parent: root, name: "f", newParent: d.inode, newName: "g", noReplace: false)
        let rest = try readdirplus(fs, d.inode, handle: handle, from: offset)
        #expect(rest.sent["g"]?.inode == f.inode)
        #expect(rest.sent["g"]?.size == 3)
        #expect(try fs.lookup(parent: d.inode, name: "g").size == 3)
    }

    /// A file rewritten here (PUT of new bytes) while a readdir had fetched the old entry.
    @Test func aReaddirInProgressDoesNotBringBackTheSizeBeforeAnUpload() throws {
        let store = FakeObjectStore()
        seedStored(store, "a", "a")
        seedStored(store, "f", "short")
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let f = try fs.lookup(parent: root, name: "f")
        let handle = try fs.opendir(root)
        defer { fs.releasedir(handle: handle) }
        let first = try readdirplus(fs, root, handle: handle, stoppingAt: "f")
        let offset = try #require(first.stoppedAt)
        let opened = try fs.open(f.inode, writable: true, truncate: true)
        let longer = Array("a good deal longer".utf8)
        try longer.withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        try fs.flush(handle: opened.handle)
        fs.release(handle: opened.handle)
        let rest = try readdirplus(fs, root, handle: handle, from: offset)
        #expect(rest.sent["f"]?.size == Int64(longer.count))
        #expect(try fs.getattr(f.inode).size == Int64(longer.count))
    }

    /// Another client's newer version still wins over what this mount knew (the rule's second half).
    @Test func anotherClientsNewerVersionIsTakenFromALaterListing() throws {
        let store = FakeObjectStore()
        seedStored(store, "f", "mine")
        let fs = makeFilesystem(store, attributeWriteDelay: 0)
        defer { fs.shutdown() }
        let f = try fs.lookup(parent: root, name: "f")
        _ = try fs.setattr(f.inode, AttributeChanges(mode: 0o600))
        store.seed("f", Array("theirs, longer".utf8), contentType: "text/plain;cssp-mode=0640")
        clock.advance(10)  // beyond dir_timeout: a new listing
        let handle = try fs.opendir(root)
        defer { fs.releasedir(handle: handle) }
        let listed = try readdirplus(fs, root, handle: handle)
        #expect(listed.sent["f"]?.permissions == 0o640)
        #expect(listed.sent["f"]?.size == 14)
    }

    /// A forgotten node that knew more than the remembered listing corrects that listing, and
    /// the correction is not this mount's change: once another client deleted the object, a
    /// later listing that lacks the name shows it gone (the reference model, seed 80673: a HEAD
    /// had shown a newer mode, the object was deleted, the kernel forgot the node).
    @Test func aForgottenNodesCorrectionDoesNotBringBackANameDeletedElsewhere() throws {
        let store = FakeObjectStore()
        seedStored(store, "f", "mine")
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        #expect(try fs.names(in: root) == ["f"])
        let f = try fs.lookup(parent: root, name: "f")
        // Another client's chmod, which a HEAD shows this mount (the listing still says 0644).
        store.seed("f", Array("mine".utf8), contentType: "text/plain;cssp-mode=0600;cssp-uid=1000;cssp-gid=100")
        clock.advance(2)
        #expect(try fs.getattr(f.inode).permissions == 0o600)
        try store.delete(key: "f")
        fs.forget(f.inode, count: 1)
        // The listing expired, the change journal of this directory did not.
        clock.advance(4)
        #expect(try fs.names(in: root) == [])
    }

    /// A change owed on a file whose name now leads to a new file made here is not stored on the
    /// new one, even when both are empty (the same ETag): chmod of `f`, another client deletes it,
    /// this mount makes a socket `f` (the reference model, seed 9938).
    @Test func anOwedChangeOfAReplacedNodeIsNotStoredOnItsSuccessor() throws {
        let store = FakeObjectStore()
        seedStored(store, "f", "")
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let old = try fs.lookup(parent: root, name: "f")
        _ = try fs.setattr(old.inode, AttributeChanges(mode: 0o640))
        try store.delete(key: "f")
        clock.advance(10)  // beyond dir_timeout: the next lookup asks the store
        #expect(throws: FSError.self) { try fs.lookup(parent: root, name: "f") }
        let socket = try fs.mknod(parent: root, name: "f", mode: 0o600, kind: .socket, caller: Caller(uid: 1000, gid: 100))
        #expect(socket.inode != old.inode)
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.object("f")?.metadata["mode"] == "0600")
        #expect(try fs.getattr(socket.inode).permissions == 0o600)
    }

    /// A lookup whose every answer came before this mount removed the name (another client
    /// wrote it again in between, and this mount removed that too) asks again, and its last try
    /// still does not bring back a name this mount removed after the answer: the store no longer
    /// holds it (core model seed 5048, with a write-back delete that had not run yet).
    @Test func aLookupAnsweredBeforeEachRemovalHereDoesNotBringTheNameBack() throws {
        let store = FakeObjectStore()
        seedStored(store, "f", "first")
        let faulty = FaultInjectingStore(store)
        let fs = makeFilesystem(faulty)
        // After each HEAD of "f" answered (that the object is there), before the lookup takes the
        // answer: this mount removes "f", and (but the last time) another client writes it again.
        // The clock moves past the lookups' listing window, so that each try asks with a HEAD.
        let removals = Locked((count: 0, busy: false))
        let clock = self.clock
        faulty.afterEachAnswer { call in
            guard call.operation == .head, call.key == "f" else { return }
            let go = removals.withLock { r in
                guard !r.busy, r.count < Namespace.lookupAttempts else { return false }
                r.busy = true
                return true
            }
            guard go else { return }
            clock.advance(Namespace.lookupListingWindow + 1)
            #expect(throws: Never.self) { try fs.unlink(parent: Filesystem.rootInode, name: "f") }
            let count = removals.withLock { r in
                r.count += 1
                return r.count
            }
            if count < Namespace.lookupAttempts { seedStored(store, "f", "again \(count)") }
            clock.advance(Namespace.lookupListingWindow + 1)
            removals.withLock { $0.busy = false }
        }
        #expect(throws: FSError.self) { try fs.lookup(parent: root, name: "f") }
        faulty.afterEachAnswer(nil)
        #expect(removals.withLock { $0.count } == Namespace.lookupAttempts)
        #expect(!store.keys.contains("f"))
        #expect(throws: FSError.self) { try fs.lookup(parent: root, name: "f") }
    }

    /// A chmod stored while the file is open (its spool keeps the remembered listing's entry as
    /// it was), then the last handle closes and the kernel forgets the node: the next lookup,
    /// made from the remembered listing, shows the chmod (core model seed 22, with
    /// meta_max_entries 6, one run in three).
    @Test func aChmodStoredWhileTheFileWasOpenOutlivesItsNode() throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        #expect(try fs.names(in: root).isEmpty)  // the listing is remembered from now on
        let file = try fs.storeFile(root, "f", Array("one".utf8), mode: 0o640)
        let held = try fs.open(file.inode, writable: true, truncate: false).handle
        _ = try fs.setattr(file.inode, AttributeChanges(mode: 0o600))
        #expect(fs.storeOwedAttributes().isEmpty)
        #expect(store.object("f")?.contentType.contains("cssp-mode=0600") == true)
        fs.release(handle: held)
        fs.forget(file.inode, count: 1)
        #expect(fs.names.withLock { $0.inodes[file.inode] } == nil)
        #expect(try fs.lookup(parent: root, name: "f").permissions == 0o600)
    }

    /// Another client's version seen by a HEAD, then the node goes (the kernel forgot it): the
    /// next lookup within dir_timeout, from the remembered listing, shows that version, not the
    /// one the listing (or this mount's own earlier change of the name) described (mount model
    /// seed 1 with meta_max_entries=8: our mode 0640 came back over another client's object).
    @Test(arguments: [false, true])
    func anotherClientsVersionAHeadShowedOutlivesTheNode(writtenHere: Bool) throws {
        let store = FakeObjectStore()
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        if !writtenHere { store.seed("f", text: "first") }
        #expect(try fs.names(in: root) == (writtenHere ? [] : ["f"]))  // remembered from now on
        let inode =
            writtenHere
            ? try fs.storeFile(root, "f", Array("first".utf8), mode: 0o640).inode
            : try fs.lookup(parent: root, name: "f").inode
        store.seed("f", text: "the other client's")
        clock.advance(2)  // beyond attr_timeout, within dir_timeout
        #expect(try fs.getattr(inode).size == 18)  // a HEAD
        fs.forget(inode, count: 1)
        #expect(fs.names.withLock { $0.inodes[inode] } == nil)
        let again = try fs.lookup(parent: root, name: "f")
        #expect(again.size == 18)
        #expect(again.permissions == 0o644)
        #expect(try fs.text(root, "f") == "the other client's")
    }
}
