import Foundation
import ObjectStoreTesting
import ObjectStore
import Testing

/// The block cache through the real mount: reuse across mounts (counted in the server's own
/// log), survival of a killed daemon, ETag revalidation, parallel readers, and the size cap.
@Suite(.serialized)
struct CacheMountTests {
    let cacheDirectory = TestScratch.directory + "cssp-e2e-cache-" + UUID().uuidString.prefix(8)

    func gets(_ environment: Environment, container: String, key: String, since: Double) throws -> Int {
        try environment.requests("GET", container: container, key: key, since: since)
    }

    func randomBytes(_ count: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        return (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
    }

    func checksum(of bytes: [UInt8]) throws -> String {
        let file = TestScratch.directory + "cssp-e2e-md5-" + UUID().uuidString.prefix(8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        try Data(bytes).write(to: URL(fileURLWithPath: file))
        return try md5(file)
    }

    @Test func remountsAndKilledMountsReuseTheCacheAndChangesAreSeen() throws {
        let fixture = try Fixture.get()
        let environment = fixture.environment
        let store = environment.store(container: fixture.container)
        let key = "cache/object-" + UUID().uuidString.prefix(8)
        let first = randomBytes(5 << 20 + 12345)
        try store.put(key: key, body: .bytes(first), contentType: nil, metadata: [:])
        let options = ["cache_dir=" + cacheDirectory]
        defer { try? FileManager.default.removeItem(atPath: cacheDirectory) }

        // Fill the cache, then kill the daemon without any chance to tidy up.
        let filling = try Mount(environment, container: fixture.container, options: options)
        #expect(try md5(filling.path(key)) == checksum(of: first))
        kill(filling.child.pid, SIGKILL)
        _ = filling.waitForExit()
        #expect(try shell("fusermount3 -u \(quoted(filling.directory))").status == 0)

        // The next mount opens that cache and reads the object without a GET.
        let since = Date().timeIntervalSince1970
        let reusing = try Mount(environment, container: fixture.container, options: options)
        #expect(try md5(reusing.path(key)) == checksum(of: first))
        #expect(try gets(environment, container: fixture.container, key: key, since: since) == 0)
        #expect(!reusing.stderrText.contains("damaged"), "\(reusing.stderrText)")
        #expect(try reusing.unmount() == 0)

        // Replaced on the server: a new mount shows the new bytes, never the cached old ones.
        let second = randomBytes(5 << 20 + 999)
        try store.put(key: key, body: .bytes(second), contentType: nil, metadata: [:])
        let afterChange = Date().timeIntervalSince1970
        let changed = try Mount(environment, container: fixture.container, options: options)
        // Four readers at once, each through its own descriptor: identical, correct bytes.
        let parallel = try shell(
            "for i in 1 2 3 4; do md5sum \(quoted(changed.path(key))) & done | cut -d' ' -f1 | sort | uniq -c")
        #expect(parallel.stdout.trimmingCharacters(in: .whitespaces) == "4 \(try checksum(of: second))\n", "\(parallel)")
        #expect(try gets(environment, container: fixture.container, key: key, since: afterChange) > 0)
        #expect(try changed.unmount() == 0)
    }

    @Test func randomReadersSeeTheSourceByteForByte() throws {
        // Random reads fill the cache in 4 MiB pieces and store them in the kernel's page cache
        // too; four parallel readers compare every 4 KiB piece with the local source.
        let fixture = try Fixture.get()
        let mount = try Mount(fixture.environment, container: fixture.container, options: ["cache_dir=" + cacheDirectory])
        defer { try? FileManager.default.removeItem(atPath: cacheDirectory) }
        let script = """
            import os, random, sys
            a, b = os.open(sys.argv[1], os.O_RDONLY), os.open(sys.argv[2], os.O_RDONLY)
            size, bad = os.fstat(b).st_size, 0
            random.seed(int(sys.argv[3]))
            for _ in range(2000):
                off = random.randrange(0, size - 4096)
                bad += os.pread(a, 4096, off) != os.pread(b, 4096, off)
            print(bad)
            """
        // Each reader's count goes to its own file: four processes printing into one pipe at
        // once interleave their writes ("0\n00\n\n0\n" was seen).
        let results = TestScratch.directory + "cssp-e2e-random-readers-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: results, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: results) }
        let readers = try shell(
            "for i in 1 2 3 4; do /usr/bin/python3 -c \(quoted(script)) \(quoted(mount.path("big/random.bin"))) "
                + "\(quoted(fixture.local + "/random.bin")) $i > \(quoted(results))/$i & done; wait")
        let counts = try (1...4).map { try String(contentsOfFile: "\(results)/\($0)", encoding: .utf8) }
        #expect(counts == ["0\n", "0\n", "0\n", "0\n"], "\(counts) \(readers)")
        // What the kernel now holds and what it still asks for add up to the object.
        #expect(try md5(mount.path("big/random.bin")) == fixture.bigMD5)
        #expect(try mount.unmount() == 0)
    }

    @Test func theCacheFileStaysWithinItsCap() throws {
        let fixture = try Fixture.get()
        let mount = try Mount(
            fixture.environment, container: fixture.container, options: ["cache_dir=" + cacheDirectory, "cache_size=8M"])
        defer { try? FileManager.default.removeItem(atPath: cacheDirectory) }
        #expect(try md5(mount.path("big/random.bin")) == fixture.bigMD5)
        #expect(try mount.unmount() == 0)
        // The blocks' bytes (what the disk holds, not the apparent size), and SQLite's index of them.
        let data = try shell("du -B1 \(quoted(cacheDirectory + "/blocks.db-data")) | cut -f1").stdout
        let disk = try #require(Int(data.trimmingCharacters(in: .whitespacesAndNewlines)))
        #expect(disk <= 8 << 20, "blocks.db-data takes \(disk) bytes")
        #expect(disk >= 4 << 20, "blocks.db-data takes \(disk) bytes: was anything cached?")
        let index = try #require(
            FileManager.default.attributesOfItem(atPath: cacheDirectory + "/blocks.db")[.size] as? Int)
        #expect(index <= 1 << 20, "blocks.db is \(index) bytes")
    }
}
