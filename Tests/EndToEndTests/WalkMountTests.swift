import Foundation
import ObjectStore
import ObjectStoreHTTP
import ObjectStoreTesting
import Testing

/// Issue 21 through the real binary and server: a walk of a tree of many directories is listed
/// flat, in lanes (`end_marker`), and rsync's lookups of every directory take their markers
/// from those pages instead of a HEAD each.
@Suite(.serialized)
struct WalkMountTests {
    static let directories = 120

    /// A tree of directories without markers (as other tools leave them), and rsync's view of it:
    /// the same names in a local directory.
    static func seed(_ environment: Environment) throws -> (container: String, source: String) {
        let (container, store, _) = try environment.newContainer("walks")
        let source = TestScratch.directory + "cssp-e2e-walk-" + container
        for d in 0..<directories {
            let name = String(format: "d%03d", d)
            try store.put(key: "t/\(name)/f", body: .bytes(Array(name.utf8)), contentType: nil, metadata: [:], onlyIfAbsent: false)
            try FileManager.default.createDirectory(atPath: source + "/" + name, withIntermediateDirectories: true)
            try Array(name.utf8).withUnsafeBytes { try Data($0).write(to: URL(fileURLWithPath: source + "/\(name)/f")) }
        }
        return (container, source)
    }

    /// A mount of a new container seeded with the tree, and the tree's local copy (`cleanUp`
    /// removes it and the mount's cache).
    static func mountSeededTree(options: [String]) throws -> (Environment, String, Mount, String) {
        let environment = try Environment.load()
        let (container, source) = try seed(environment)
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + source + "-cache"] + options)
        return (environment, container, mount, source)
    }

    static func cleanUp(_ source: String) {
        try? FileManager.default.removeItem(atPath: source)
        try? FileManager.default.removeItem(atPath: source + "-cache")
    }

    /// HEADs of the directories' markers (`t/dNNN/`) since `since`.
    static func markerHeads(_ environment: Environment, _ container: String, since: Double) throws -> Int {
        try environment.requests("HEAD", container: container, keys: (0..<directories).map { String(format: "t/d%03d/", $0) }, since: since)
    }

    /// rsync looks up every directory of t/ first, then the file in each: before, each of
    /// those lookups HEADed the directory's marker (120 HEADs, one after another); now the
    /// flat listing's pages answer them.
    /// What a lane's listing request carries: Swift's `end_marker`; S3 has none, and a lane
    /// starts after its first name (`start-after`).
    static var laneParameter: String { Environment.dialect == .cssp ? "end_marker" : "start-after" }

    @Test func rsyncOfATreeTakesTheMarkersFromTheWalkListing() throws {
        // (No background HEADs of the objects, which another tool wrote: only the lookups'.)
        let (environment, container, mount, source) = try Self.mountSeededTree(options: ["meta_prefetch=0"])
        defer { Self.cleanUp(source) }
        let since = Date().timeIntervalSince1970
        let dryRun = try shell("rsync -rn --size-only --out-format='%n' \(quoted(source + "/")) \(quoted(mount.path("t/")))")
        #expect(dryRun.status == 0, "\(dryRun.stderr)")
        // Every file exists on the mount with its size (their times may differ by a second).
        #expect(dryRun.stdout.split(separator: "\n").filter { $0.hasSuffix("/f") }.isEmpty, "\(dryRun.stdout)")
        let heads = try Self.markerHeads(environment, container, since: since)
        #expect(heads <= 10, "\(heads) of \(Self.directories) markers HEADed")
        #expect(try environment.clientRequests(containing: Self.laneParameter, since: since) >= 1)
        #expect(try mount.unmount() == 0)
    }

    /// `find` reads every directory: the lanes' pages fill them, with what each directory's
    /// own listing shows.
    @Test func findOfATreeListsItInLanes() throws {
        let (environment, _, mount, source) = try Self.mountSeededTree(options: ["meta_prefetch=0", "poll_s=0"])
        defer { Self.cleanUp(source) }
        let since = Date().timeIntervalSince1970
        let found = try shell("cd \(quoted(mount.path("t"))) && find . | sort")
        let expected = try shell("cd \(quoted(source)) && find . | sort")
        #expect(found.status == 0 && found.stdout == expected.stdout, "\(found.stderr)")
        let listed = try DirectoryTests.listings(environment, mount)
        // One listing each of the root, t/ and the directories read before the walk was
        // evident (and listed ahead), then a page a lane; one per directory was 120.
        #expect(listed <= 40, "\(listed) listings")
        #expect(try environment.clientRequests(containing: Self.laneParameter, since: since) >= 1)
        #expect(try mount.unmount() == 0)
    }
}
