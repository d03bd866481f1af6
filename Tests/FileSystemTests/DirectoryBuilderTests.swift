import ObjectStore
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

struct DirectoryBuilderTests {
    func object(_ key: String, size: Int64 = 1, type: String = "text/plain") -> ListEntry {
        .object(ObjectSummary(key: key, size: size, etag: "e", contentType: type, lastModified: 0))
    }

    @Test func heldFileIsReleasedOnceTheListingPassesItsDirectoryName() {
        var builder = DirectoryBuilder(prefix: "p/")
        // "p/a" could still meet "p/a/" (which sorts after "p/a-b"), and "p/a-b" could meet "p/a-b/".
        var step = builder.add([object("p/a"), object("p/a-b")], isLastPage: false)
        #expect(step.entries.isEmpty)
        // "p/b" sorts after both "p/a/" and "p/a-b/": both are plain files.
        step = builder.add([object("p/b")], isLastPage: false)
        #expect(step.entries.map(\.name).sorted() == ["a", "a-b"])
        step = builder.add([], isLastPage: true)
        #expect(step.entries.map(\.name) == ["b"])
    }

    @Test func collisionAcrossPagesIsReported() {
        var builder = DirectoryBuilder(prefix: "")
        _ = builder.add([object("x", size: 0)], isLastPage: false)
        let step = builder.add([.commonPrefix("x/")], isLastPage: true)
        #expect(step.entries.isEmpty)
        #expect(step.collisions.map(\.name) == ["x"])
    }

    @Test func ownMarkerAndInvalidNamesAreNotEntries() {
        var builder = DirectoryBuilder(prefix: "d/")
        let step = builder.add(
            [object("d/", size: 0), .commonPrefix("d//"), object("d/.."), object("d/ok")], isLastPage: true)
        #expect(step.entries.map(\.name) == ["ok"])
        #expect(builder.skippedNames == 2)
    }

    @Test func directoryContentTypeMergesWithItsPrefix() {
        var builder = DirectoryBuilder(prefix: "")
        let step = builder.add(
            [object("d", size: 0, type: "application/directory; charset=utf-8"), .commonPrefix("d/")], isLastPage: true)
        #expect(step.entries.map(\.name) == ["d"])
        #expect(step.entries.map(\.kind) == [.directory])
        #expect(step.collisions.isEmpty)
    }

    @Test func resolutionFavoursTheFileOnlyForItsOwnParts() {
        let parts: [ListEntry] = [.commonPrefix("k/upload/")]
        #expect(DirectoryBuilder.resolve(key: "k", manifest: "c/k/upload/", container: "c", childrenPreview: parts) == .fileWins)
        #expect(
            DirectoryBuilder.resolve(
                key: "k", manifest: "c/k/upload/", container: "c", childrenPreview: parts + [object("k/other")])
                == .directoryWins)
        #expect(DirectoryBuilder.resolve(key: "k", manifest: nil, container: "c", childrenPreview: parts) == .directoryWins)
        #expect(DirectoryBuilder.resolve(key: "k", manifest: "other/k/upload/", container: "c", childrenPreview: parts) == .directoryWins)
        #expect(DirectoryBuilder.resolve(key: "k", manifest: "c/elsewhere/", container: "c", childrenPreview: parts) == .directoryWins)
    }
}
