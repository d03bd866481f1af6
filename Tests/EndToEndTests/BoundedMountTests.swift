import Foundation
import ObjectStore
import ObjectStoreTesting
import Testing

/// `meta_max_entries` through the real binary and the kernel (issue 21): past the bound the
/// kernel is asked to forget names, and every name still shows the store plus this mount's
/// changes.
@Suite(.serialized)
struct BoundedMountTests {
    static func metric(_ environment: Environment, _ mount: Mount, _ name: String) throws -> Double {
        let result = try shell("\(quoted(environment.binary)) --stats \(quoted(mount.directory))")
        guard result.status == 0, let value = StatusTests.sample(result.stdout, name) else {
            throw HarnessError("--stats has no \(name): \(result.stderr)")
        }
        return value
    }

    /// `find -printf` of the tree, sorted: path, size and mode of every name.
    static func tree(_ mount: Mount) throws -> String {
        let result = try shell("cd \(quoted(mount.directory)) && find . -mindepth 1 -printf '%p %s %m\\n' | LC_ALL=C sort")
        guard result.status == 0 else { throw HarnessError("find: \(result.stderr)") }
        return result.stdout
    }

    /// Three directories of 300 objects another client wrote, `ls -l` of each with a bound of
    /// 200: the kernel forgets names until about 200 are kept, and after changes here every name
    /// shows what it should (size, mode, content).
    @Test func aBoundedMountForgetsNamesAndShowsEveryOneAsItIs() throws {
        let environment = try Environment.load()
        let (container, store, cache) = try environment.newContainer("bound")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        var expected: [String: (size: Int, mode: String)] = [:]
        for d in 1...3 {
            for f in 0..<300 {
                let text = "d\(d) f\(f)" + String(repeating: "x", count: f % 7)
                _ = try store.put(key: "d\(d)/f\(f)", body: .bytes(Array(text.utf8)), contentType: "text/plain", metadata: [:])
                expected["./d\(d)/f\(f)"] = (text.utf8.count, "644")
            }
            expected["./d\(d)"] = (0, "755")
        }
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + cache, "meta_max_entries=200"])
        defer { _ = try? mount.unmount() }
        func expectedTree() -> String {
            expected.keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }.map { path in
                let (size, mode) = expected[path]!
                return "\(path) \(path.split(separator: "/").count == 2 ? 0 : size) \(mode)\n"
            }.joined()
        }
        for d in 1...3 { #expect(try shell("ls -l \(quoted(mount.path("d\(d)"))) | wc -l").stdout == "301\n") }
        // The kernel's forgets come on their own time: wait for them, not for a clock.
        let kept = try poll(seconds: 20) { try Self.metric(environment, mount, "cssp_cached_entries") <= 200 }
        let cached = try Self.metric(environment, mount, "cssp_cached_entries")
        #expect(kept, "cached entries: \(cached)")
        #expect(try Self.metric(environment, mount, "cssp_entries_forgotten_total") >= 600)
        #expect(try Self.metric(environment, mount, "cssp_remembered_names") <= 300)
        #expect(try Self.tree(mount) == expectedTree())
        // Changes here, to names forgotten and not: each shows at once, and after more walks.
        #expect(try shell("chmod 600 \(quoted(mount.path("d1/f1"))) \(quoted(mount.path("d3/f299")))").status == 0)
        #expect(try shell("mv \(quoted(mount.path("d2/f2"))) \(quoted(mount.path("d3/moved")))").status == 0)
        #expect(try shell("rm \(quoted(mount.path("d3/f3")))").status == 0)
        #expect(try shell("printf 'rewritten' > \(quoted(mount.path("d1/f4")))").status == 0)
        expected["./d1/f1"]!.mode = "600"
        expected["./d3/f299"]!.mode = "600"
        expected["./d3/moved"] = expected.removeValue(forKey: "./d2/f2")
        expected["./d3/f3"] = nil
        expected["./d1/f4"] = (9, "644")
        for _ in 1...2 { #expect(try Self.tree(mount) == expectedTree()) }
        #expect(try shell("cat \(quoted(mount.path("d1/f4"))) \(quoted(mount.path("d3/moved"))) \(quoted(mount.path("d2/f250")))").stdout
            == "rewrittend2 f2xxd2 f250xxxxx")
        #expect(try mount.unmount() == 0)
        // And the next mount, with no bound, sees the same.
        let again = try Mount(environment, container: container, options: ["cache_dir=" + cache, "meta_max_entries=0"])
        defer { _ = try? again.unmount() }
        #expect(try Self.tree(again) == expectedTree())
        #expect(try again.unmount() == 0)
    }
}
