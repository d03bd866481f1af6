import Foundation
import ObjectStore
import ObjectStoreTesting
import Testing

/// Metadata that listings lack, through the real mount (issue 38): objects another tool wrote
/// carry their mtime and mode only in `X-Object-Meta-*` headers. With the default
/// `foreign_attrs=head` the first `ls -l` already shows them (never the listing's time first),
/// `find` sends no HEAD, each object is HEADed once, and a remount with the same cache_dir HEADs
/// none of them again; with `foreign_attrs=listing`, the listing's time and the default mode
/// stay, whatever HEADs and GETs say.
struct MetadataMountTests {
    /// Objects as rclone writes them (mtime with a fraction, mode as an octal st_mode) in a new
    /// directory of the fixture's container: the directory and their keys.
    func seed(_ count: Int) throws -> (Fixture, String, [String]) {
        let fixture = try Fixture.get()
        let store = fixture.environment.store(container: fixture.container)
        let directory = "foreign-" + UUID().uuidString.prefix(8)
        let keys = (0..<count).map { String(format: "\(directory)/f%02d", $0) }
        for key in keys {
            try store.put(
                key: key, body: .bytes(Array(key.utf8)), contentType: nil,
                metadata: ["mtime": "1500000000.5", "mode": "100600"])
        }
        return (fixture, directory, keys)
    }

    func heads(_ fixture: Fixture, _ keys: [String], since: Double) throws -> [Int] {
        try keys.map { try fixture.environment.requests("HEAD", container: fixture.container, key: $0, since: since) }
    }

    @Test func otherToolsMetadataShowsFromTheFirstListingWithOneHeadPerObjectOnce() throws {
        let (fixture, directory, keys) = try seed(24)
        let cache = TestScratch.directory + "cssp-foreign-cache-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: cache) }
        var since = Date().timeIntervalSince1970
        let mount = try Mount(fixture.environment, container: fixture.container, options: ["cache_dir=" + cache, "attr_timeout=10"])
        let path = mount.path(directory)
        // find: names only, no HEAD.
        #expect(try shell("find \(quoted(path)) -type f | wc -l").stdout == "24\n")
        #expect(try heads(fixture, keys, since: since).reduce(0, +) == 0, "find HEADed files")
        // ls -l: the headers' mode and time at once, one HEAD per object; stat agrees.
        let first = try shell("ls -l \(quoted(path)) | grep -c '^-rw------- '")
        #expect(first.stdout == "24\n", "\(first)")
        let stats = try shell("cd \(quoted(path)) && stat -c '%Y %a' * | sort | uniq -c")
        #expect(stats.stdout.trimmingCharacters(in: .whitespaces) == "24 1500000000 600\n", "\(stats)")
        #expect(try heads(fixture, keys, since: since) == Array(repeating: 1, count: 24))
        #expect(try mount.unmount() == 0)
        // The next mount with the same cache_dir: the same, without a HEAD of any of them.
        since = Date().timeIntervalSince1970
        let again = try Mount(fixture.environment, container: fixture.container, options: ["cache_dir=" + cache, "attr_timeout=10"])
        let stats2 = try shell("ls -l \(quoted(again.path(directory))) >/dev/null && cd \(quoted(again.path(directory))) && stat -c '%Y %a' * | sort | uniq -c")
        #expect(stats2.stdout.trimmingCharacters(in: .whitespaces) == "24 1500000000 600\n", "\(stats2)")
        #expect(try heads(fixture, keys, since: since).reduce(0, +) == 0, "HEADed again after the remount")
        #expect(try again.unmount() == 0)
    }

    @Test func withListingAttributesNothingChangesWhateverHeadsSay() throws {
        let (fixture, directory, _) = try seed(8)
        // attr_timeout=0: every stat asks the server again (a HEAD), whose headers must not show.
        let mount = try Mount(fixture.environment, container: fixture.container, options: ["foreign_attrs=listing", "attr_timeout=0"])
        let path = mount.path(directory)
        let listed = try shell("cd \(quoted(path)) && stat -c '%n %Y %a' * ")
        #expect(listed.stdout.split(separator: "\n").allSatisfy { $0.hasSuffix(" 644") }, "\(listed)")
        // Reading every file (GETs carry the headers) and stat-ing again changes nothing.
        #expect(try shell("cat \(quoted(path))/* >/dev/null").status == 0)
        #expect(try shell("cd \(quoted(path)) && stat -c '%n %Y %a' * ").stdout == listed.stdout)
        #expect(try mount.unmount() == 0)
    }
}
