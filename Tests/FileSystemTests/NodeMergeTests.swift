import ObjectStore
import Testing

@testable import FileSystem

/// The attribute merge rules (`Node.apply`, `Node.merge`), as tables: a node's state, what the
/// server said, and what the node must say afterwards.
struct NodeMergeTests {
    static let listed = Timestamp(seconds: 1_700_000_000, nanoseconds: 250_000_000)
    static let headTime = 1_700_000_001.0  // the listing's time, rounded up by a HEAD

    func file(etag: String = "e1", version: UInt64 = 0) -> Node {
        var node = Node(inode: 5, parent: 1, name: "f", kind: .file, key: "f", size: 3, etag: etag, lastModified: Self.listed)
        node.stored = StoredAttributes(mode: 0o600, uid: 1, gid: 1, mtime: nil)
        node.attributeVersion = version
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

    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var nodeVersion: UInt64
        var seenVersion: UInt64
        var headETag: String
        var keepsListedTime: Bool
        var takesStoredAttributes: Bool
        var testDescription: String { name }
    }

    @Test(arguments: [
        Case(name: "same version: the listing's precise time stays", nodeVersion: 0, seenVersion: 0, headETag: "e1",
            keepsListedTime: true, takesStoredAttributes: true),
        Case(name: "a new version: the HEAD's time", nodeVersion: 0, seenVersion: 0, headETag: "e2",
            keepsListedTime: false, takesStoredAttributes: true),
        Case(name: "a local change since the HEAD was sent wins", nodeVersion: 1, seenVersion: 0, headETag: "e1",
            keepsListedTime: true, takesStoredAttributes: false),
    ])
    func applyingAHead(_ c: Case) {
        var node = file(version: c.nodeVersion)
        node.apply(head(etag: c.headETag), seenAtVersion: c.seenVersion, now: 42)
        #expect((node.lastModified == Self.listed) == c.keepsListedTime)
        #expect((node.stored.mode == 0o640) == c.takesStoredAttributes)
        #expect(node.etag == c.headETag && node.confirmedAt == 42 && node.metadataKnownAt == 42)
        #expect(node.extraMetadata == ["color": "blue"], "our own headers are not kept as foreign ones")
    }

    @Test func aListingOfTheSameVersionKeepsWhatAHeadReadFromHeaders() {
        var node = file()
        node.apply(head(), seenAtVersion: 0, now: 10)
        node.merge(entry(), info: nil, markerChecked: false, version: 0, fresh: false, now: 20)
        #expect(node.stored.mode == 0o640, "the HEAD's X-Object-Meta-Mode, not the listing's parameter")
        #expect(node.lastModified == Self.listed)
    }

    @Test func aListingOfANewVersionReplacesSizeTimeAndAttributes() {
        var node = file()
        node.manifest = "c/.cssp-parts/x/"
        node.merge(entry(etag: "e2", size: 9), info: nil, markerChecked: false, version: 0, fresh: false, now: 20)
        #expect(node.size == 9 && node.etag == "e2" && node.stored.mode == 0o644)
        #expect(node.manifest == nil, "a listing shows a DLO as 0 bytes: anything larger is a plain object")
        #expect(node.confirmedAt == 20)
    }

    @Test func aFreshNodeOnlyCountsTheLookup() {
        var node = file()
        node.confirmedAt = 5
        node.merge(entry(etag: "e1", size: 0), info: nil, markerChecked: false, version: 0, fresh: true, now: 20)
        #expect(node.size == 3 && node.confirmedAt == 5)
    }

    @Test func aLocalAttributeChangeSurvivesAListing() {
        var node = file(version: 2)
        node.merge(entry(etag: "e2"), info: nil, markerChecked: false, version: 1, fresh: false, now: 20)
        #expect(node.stored.mode == 0o600)
        #expect(node.etag == "e2", "the data's version still comes from the listing")
    }

    @Test func aDirectoryWithoutAMarkerHasDefaultAttributes() {
        var node = Node(inode: 6, parent: 1, name: "d", kind: .directory, key: "d/")
        node.stored = StoredAttributes(mode: 0o700, uid: 1, gid: 1, mtime: nil)
        let listed = DirectoryEntry(name: "d", kind: .directory, key: "d/", size: 0, etag: "", lastModified: .zero, contentType: "")
        node.merge(listed, info: nil, markerChecked: false, version: 0, fresh: false, now: 3)
        #expect(node.stored.mode == 0o700, "no marker checked: nothing is known")
        node.merge(listed, info: nil, markerChecked: true, version: 0, fresh: false, now: 4)
        #expect(node.stored.mode == nil && node.confirmedAt == 4)
    }
}
