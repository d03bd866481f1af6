import Foundation
import ObjectStoreTesting
import ObjectStore
import ObjectStoreHTTP

/// One seeded container shared by the end-to-end tests, built once through the project's client.
/// A local copy of `tree/` is kept so that what the mount shows can be compared with `diff -r`.
final class Fixture: Sendable {
    static let shared: Result<Fixture, HarnessError> = {
        do { return .success(try Fixture()) } catch let error as HarnessError { return .failure(error) } catch {
            return .failure(HarnessError("seeding failed: \(error)"))
        }
    }()

    static func get() throws -> Fixture { try shared.get() }

    let environment: Environment
    let container: String
    /// Local directory holding `tree/` exactly as the container's `tree/` should appear.
    let local: String
    let bigMD5: String
    let dloMD5: String
    let dloSize: Int64
    static let manyCount = 12_000
    static let hugePartSize: Int64 = 64 << 20
    static let hugeParts = 65

    static let treeFiles: [String: String] = [
        "top.txt": "top\n",
        "a/one.txt": "one\n",
        "a/b/c/deep.txt": "deep down\n",
        "names/with space.txt": "space\n",
        "names/unicodé ✓.txt": "unicode\n",
        "names/plus+sign.txt": "plus\n",
        "names/percent%41.txt": "percent\n",
        "names/hash#tag.txt": "hash\n",
        "names/question?.txt": "question\n",
        "typed-dir2/inside.txt": "inside\n",
    ]

    init() throws {
        environment = try Environment.load()
        container = "e2e-" + UUID().uuidString.prefix(8).lowercased()
        let store = environment.store(container: container)
        try store.createContainer()
        local = TestScratch.directory + "cssp-e2e-src-" + container
        let tree = local + "/tree"
        let fm = FileManager.default
        try? fm.removeItem(atPath: local)

        // Small files, written locally and uploaded.
        for (path, text) in Self.treeFiles {
            let full = tree + "/" + path
            try fm.createDirectory(atPath: (full as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try text.write(toFile: full, atomically: false, encoding: .utf8)
            try store.put(key: "tree/" + path, body: .bytes(Array(text.utf8)), contentType: "text/plain", metadata: [:])
        }
        fm.createFile(atPath: tree + "/empty.bin", contents: Data())
        try store.put(key: "tree/empty.bin", body: .bytes([]), contentType: nil, metadata: [:])
        // Directory conventions: a `dir/` marker, and application/directory objects.
        try fm.createDirectory(atPath: tree + "/marker-dir", withIntermediateDirectories: true)
        try store.put(key: "tree/marker-dir/", body: .bytes([]), contentType: nil, metadata: [:])
        try fm.createDirectory(atPath: tree + "/typed-dir", withIntermediateDirectories: true)
        try store.put(key: "tree/typed-dir", body: .bytes([]), contentType: "application/directory", metadata: [:])
        try store.put(key: "tree/typed-dir2", body: .bytes([]), contentType: "application/directory", metadata: [:])

        // An SDK-style DLO: parts at key/<uploadId>/<n>, zero-byte manifest at key.
        let dlo = tree + "/dlo.bin"
        try shell("head -c 3500000 /dev/urandom > \(quoted(dlo))")
        let dloBytes = Array(try Data(contentsOf: URL(fileURLWithPath: dlo)))
        dloSize = Int64(dloBytes.count)
        let uploadID = UUID().uuidString
        for (n, start) in stride(from: 0, to: dloBytes.count, by: 1 << 20).enumerated() {
            let part = Array(dloBytes[start..<min(dloBytes.count, start + (1 << 20))])
            try store.put(key: "tree/dlo.bin/\(uploadID)/\(String(format: "%08d", n + 1))", body: .bytes(part), contentType: nil, metadata: [:])
        }
        try store.putManifest(key: "tree/dlo.bin", partPrefix: "tree/dlo.bin/\(uploadID)/", contentType: nil, metadata: [:])
        dloMD5 = try md5(dlo)

        // 100 MiB of random bytes.
        let big = local + "/random.bin"
        try shell("head -c 104857600 /dev/urandom > \(quoted(big))")
        try store.put(key: "big/random.bin", body: .file(path: big, offset: 0, length: 100 << 20), contentType: nil, metadata: [:])
        bigMD5 = try md5(big)

        // Over 4 GiB, without 4 GiB locally: one 64 MiB part copied server-side, behind a manifest.
        let part = local + "/part.bin"
        try shell("head -c \(Self.hugePartSize) /dev/urandom > \(quoted(part))")
        try store.put(key: "huge-parts/00000000", body: .file(path: part, offset: 0, length: Self.hugePartSize), contentType: nil, metadata: [:])
        try Self.parallel(Self.hugeParts - 1, jobs: 4) { i in
            try store.copy(from: "huge-parts/00000000", to: "huge-parts/" + String(format: "%08d", i + 1))
        }
        try store.putManifest(key: "huge.bin", partPrefix: "huge-parts/", contentType: nil, metadata: [:])

        // A directory of 12 000 objects.
        try Self.parallel(Self.manyCount, jobs: 16) { i in
            try store.put(key: "many/obj-" + String(format: "%05d", i), body: .bytes([UInt8(i % 256)]), contentType: nil, metadata: [:])
        }
    }

    static func parallel(_ count: Int, jobs: Int, _ body: @escaping @Sendable (Int) throws -> Void) throws {
        let lock = NSLock()
        nonisolated(unsafe) var next = 0
        nonisolated(unsafe) var failure: Error? = nil
        DispatchQueue.concurrentPerform(iterations: jobs) { _ in
            while true {
                lock.lock()
                let i = next
                next += 1
                let stop = failure != nil
                lock.unlock()
                if i >= count || stop { return }
                do { try body(i) } catch {
                    lock.lock()
                    if failure == nil { failure = error }
                    lock.unlock()
                }
            }
        }
        if let failure { throw failure }
    }
}
