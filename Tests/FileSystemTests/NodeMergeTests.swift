import ObjectStore
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// The attribute merge rules (`Node.apply`, `Node.merge`), as tables: a node's state, what the
/// server said, and what the node must say afterwards.
struct NodeMergeTests {
    static let listed = Timestamp(seconds: 1_700_000_000, nanoseconds: 250_000_000)
    static let headTime = 1_700_000_001.0  // the listing's time, rounded up by a HEAD

    func file(etag: String = "e1") -> Node {
        var node = Node(inode: 5, parent: 1, name: "f", kind: .file, key: "f", size: 3, etag: etag, lastModified: Self.listed)
        node.stored = StoredAttributes(mode: 0o600, uid: 1, gid: 1, mtime: nil)
        return node
    }

    func entry(etag: String = "e1", size: Int64 = 3, contentType: String = "text/plain;cssp-mode=0644") -> DirectoryEntry {
        DirectoryEntry(
            name: "f", kind: .file, key: "f", size: size, etag: etag, lastModified: Self.listed, contentType: contentType)
    }

    func head(etag: String = "e1", mode: String = "0640", manifest: String? = nil) -> ObjectInfo {
        ObjectInfo(
            key: "f", size: 3, etag: etag, contentType: "text/plain", lastModified: Self.headTime,
            metadata: ["mode": mode, "color": "blue"], manifest: manifest)
    }

    /// Another version of a symlink (another client's, or the object a lost COPY answer left)
    /// has another target: the listing does not carry it, so the node forgets the old one and
    /// readlink reads it again (core model seed 9198: readlink kept the replaced link's target).
    @Test func anotherVersionOfASymlinkForgetsItsTarget() {
        var node = Node(inode: 5, parent: 1, name: "l", kind: .symlink, key: "l", size: 7, etag: "e1", lastModified: Self.listed)
        node.symlinkTarget = "../t209"
        let link = DirectoryEntry(
            name: "l", kind: .symlink, key: "l", size: 7, etag: "e2", lastModified: Self.listed, contentType: "application/link")
        var listed = node
        listed.merge(link, listedAt: 11, head: nil, fresh: false, now: 100)
        #expect(listed.etag == "e2" && listed.symlinkTarget == nil)
        var same = node
        same.merge(DirectoryEntry(
            name: "l", kind: .symlink, key: "l", size: 7, etag: "e1", lastModified: Self.listed, contentType: "application/link"),
            listedAt: 11, head: nil, fresh: false, now: 100)
        #expect(same.symlinkTarget == "../t209")
        var headed = node
        headed.apply(ObjectInfo(key: "l", size: 7, etag: "e2", contentType: "application/link", lastModified: Self.headTime,
            metadata: [:], manifest: nil), askedAt: 11, now: 100)
        #expect(headed.symlinkTarget == nil)
    }

    /// The attribute rule (`Node+Merge`), as a table over a node described as of tick 10.
    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var askedAt: UInt64
        var headETag = "e1"
        /// The HEAD's time, seconds after the listing's.
        var later: Double = 1
        /// A change of ours: owed (attributes), or under way (a POST not answered yet).
        var owed = false
        var underWay = false
        var admitted: Bool
        var keepsListedTime = false
        var testDescription: String { name }
    }

    @Test(arguments: [
        Case(name: "asked after, same version: taken, the listing's precise time stays", askedAt: 11, admitted: true,
            keepsListedTime: true),
        Case(name: "asked after, another version: taken with the HEAD's time", askedAt: 11, headETag: "e2", admitted: true),
        Case(name: "asked after, a change of ours owed: refused", askedAt: 11, owed: true, admitted: false,
            keepsListedTime: true),
        Case(name: "asked after, a change of ours under way: refused", askedAt: 11, underWay: true, admitted: false,
            keepsListedTime: true),
        Case(name: "asked after, another client's version while a change is owed: theirs wins", askedAt: 11,
            headETag: "e2", owed: true, admitted: true),
        Case(name: "asked before the node was described: refused", askedAt: 9, admitted: false, keepsListedTime: true),
        Case(name: "asked before, another version the server dated later: taken", askedAt: 9, headETag: "e2",
            later: 1e9, admitted: true),
        Case(name: "asked before, another version dated earlier (one we replaced): refused", askedAt: 9, headETag: "e2",
            later: -5, admitted: false, keepsListedTime: true),
    ])
    func applyingAHead(_ c: Case) {
        var node = file()
        node.describedAsOf = 10
        if c.owed || c.underWay { node.attributeVersion = 1 }
        node.attributesOwed = c.owed
        var answer = head(etag: c.headETag)
        answer.lastModified = Double(Self.listed.seconds) + c.later
        let admitted = node.apply(answer, askedAt: c.askedAt, now: 42)
        #expect(admitted == c.admitted)
        #expect((node.lastModified == Self.listed) == c.keepsListedTime)
        #expect((node.stored.mode == 0o640) == (c.admitted && !c.underWay))
        #expect(node.etag == (c.admitted ? c.headETag : "e1"))
        #expect(node.metadataKnownAt == (c.admitted ? 42 : 0))
        #expect(node.describedAsOf == (c.admitted ? max(10, c.askedAt) : 10))
        if c.admitted { #expect(node.extraMetadata == ["color": "blue"], "our own headers are not kept as foreign ones") }
        #expect(!node.attributesOwed || !c.admitted, "another version voids what is owed")
    }

    @Test func anAcknowledgedChangeRefusesEveryAnswerAskedBeforeIt() {
        var node = file()
        node.attributeVersion = 1
        node.attributesOwed = true
        node.acknowledge(at: 20, version: 1)
        node.attributesOwed = false
        #expect(!node.hasUnacknowledgedChange && node.describedAsOf == 20)
        node.merge(entry(etag: "e1"), listedAt: 19, head: nil, fresh: false, now: 30)
        #expect(node.stored.mode == 0o600, "the listing from before the store")
        node.merge(entry(etag: "e1"), listedAt: 21, head: nil, fresh: false, now: 31)
        #expect(node.stored.mode == 0o644, "a listing asked after it")
    }

    @Test func anAcknowledgementOfAnOlderVersionLeavesTheLaterChangeWaiting() {
        var node = file()
        node.attributeVersion = 2
        node.acknowledge(at: 20, version: 1)
        #expect(node.hasUnacknowledgedChange)
        node.merge(entry(etag: "e1"), listedAt: 21, head: nil, fresh: false, now: 30)
        #expect(node.stored.mode == 0o600)
    }

    @Test func aListingOfTheSameVersionKeepsWhatAHeadReadFromHeaders() {
        var node = file()
        node.apply(head(), askedAt: 1, now: 10)
        node.merge(entry(), listedAt: 2, head: nil, fresh: false, now: 20)
        #expect(node.stored.mode == 0o640, "the HEAD's X-Object-Meta-Mode, not the listing's parameter")
        #expect(node.lastModified == Self.listed)
    }

    @Test func aListingOfANewVersionReplacesSizeTimeAndAttributes() {
        var node = file()
        node.manifest = "c/.cssp-parts/x/"
        node.merge(entry(etag: "e2", size: 9), listedAt: 1, head: nil, fresh: false, now: 20)
        #expect(node.size == 9 && node.etag == "e2" && node.stored.mode == 0o644)
        #expect(node.manifest == nil, "a listing shows a DLO as 0 bytes: anything larger is a plain object")
        #expect(node.confirmedAt == 20)
    }

    @Test func aFreshNodeOnlyCountsTheLookup() {
        var node = file()
        node.confirmedAt = 5
        node.merge(entry(etag: "e1", size: 0), listedAt: 1, head: nil, fresh: true, now: 20)
        #expect(node.size == 3 && node.confirmedAt == 5)
    }

    @Test func anotherClientsVersionInALaterListingWinsOverAnOwedChange() {
        var node = file()
        node.attributeVersion = 1
        node.attributesOwed = true
        node.merge(entry(etag: "e2"), listedAt: 1, head: nil, fresh: false, now: 20)
        #expect(node.etag == "e2" && node.stored.mode == 0o644 && !node.attributesOwed)
    }

    @Test func aZeroByteEntryNeverCountsAsAnotherVersion() {
        // Its ETag may be a DLO manifest's own, not the object's.
        var node = file()
        node.attributeVersion = 1
        node.attributesOwed = true
        node.merge(entry(etag: "manifest", size: 0), listedAt: 1, head: nil, fresh: false, now: 20)
        #expect(node.attributesOwed && node.stored.mode == 0o600 && node.etag == "e1")
    }

    @Test func aDirectoryWithoutAMarkerHasDefaultAttributes() {
        var node = Node(inode: 6, parent: 1, name: "d", kind: .directory, key: "d/")
        node.stored = StoredAttributes(mode: 0o700, uid: 1, gid: 1, mtime: nil)
        let listed = DirectoryEntry(name: "d", kind: .directory, key: "d/", size: 0, etag: "", lastModified: .zero, contentType: "")
        node.merge(listed, listedAt: 1, head: nil, fresh: false, now: 3)
        #expect(node.stored.mode == 0o700, "no marker checked: nothing is known")
        node.merge(listed, listedAt: 1, head: HeadAnswer(info: nil, askedAt: 2), fresh: false, now: 4)
        #expect(node.stored.mode == nil && node.confirmedAt == 4)
        node.stored.mode = 0o750
        node.acknowledge(at: 5)
        node.merge(listed, listedAt: 1, head: HeadAnswer(info: nil, askedAt: 3), fresh: false, now: 6)
        #expect(node.stored.mode == 0o750, "a marker HEAD asked before our chmod was stored")
    }
}
