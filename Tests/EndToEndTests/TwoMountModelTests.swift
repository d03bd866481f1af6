import Foundation
import ObjectStore
import ObjectStoreHTTP
import ObjectStoreTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 22's two-mount reference model: two real mounts of one container (two daemons, two
/// cache directories, the default `poll_s`) and another client writing through the CSSP API,
/// random operations on a few names in two directories, one at a time. A mount writes by read,
/// modify, write (open, read the whole file, maybe another writer acts, truncate, write, close),
/// so the model knows the version each upload replaces: the bytes go to the name when that is
/// still the stored version, else to a conflict copy. Every few operations (a quiet period) each
/// mount must come to show the store (names, and every file's bytes); at the end the store must
/// hold, name by name, exactly the version the model says and the conflict copies it predicts:
/// no write silently lost, none misplaced. Every written version has bytes of its own.
/// Environment: `CSSP_E2E_HOSTS_SEED=N` replays one seed; `CSSP_E2E_HOSTS_SEEDS` (default 1)
/// seeds of `CSSP_E2E_HOSTS_OPS` (default 240) operations; `CSSP_E2E_HOSTS_TRACE=1` prints every
/// operation of a failed run.
@Suite(.serialized)
struct TwoMountModelTests {
    @Test func twoMountsAndAnotherClientLoseNothing() throws {
        let environment = try Environment.load()
        let (seeds, operations) = modelSeeds("CSSP_E2E_HOSTS", count: 1, operations: 240)
        var total = (operations: 0, conflicts: 0, quiet: 0, slowest: 0.0)
        forEachSeed(seeds) { seed in
            let run = try TwoMountRun(environment, seed: seed)
            defer { run.cleanUp() }
            try run.run(operations: operations)
            total.operations += run.operations
            total.conflicts += run.conflicts
            total.quiet += run.quietPeriods
            total.slowest = max(total.slowest, run.slowestConvergence)
        }
        print(
            "two-mount model: \(total.operations) operations over seeds \(seeds), \(total.conflicts) conflict copies, "
                + "\(total.quiet) quiet periods, the slowest mount showed the store after \(String(format: "%.2f", total.slowest)) s")
    }
}

final class TwoMountRun {
    struct Failure: Error, CustomStringConvertible { var description: String }

    let environment: Environment
    let seed: UInt64
    var random: SeededGenerator
    let container: String
    let store: HTTPObjectStore
    let caches: [String]
    var mounts: [Mount] = []
    /// The names the operations use.
    static let names = ["d1/a", "d1/b", "d1/c", "d2/a", "d2/b"]
    /// What the store holds at each name (nil: nothing), as the model says.
    var expected: [String: [UInt8]] = [:]
    /// The conflict copies' bytes the model expects per name.
    var conflictsExpected: [String: [[UInt8]]] = [:]
    var trace: [String] = []
    var operations = 0
    var conflicts = 0
    var quietPeriods = 0
    var slowestConvergence = 0.0
    /// Quiet periods after which a mount took longer than 2 s to show the store.
    var lateQuietPeriods = 0
    var versions = 0

    init(_ environment: Environment, seed: UInt64) throws {
        self.environment = environment
        self.seed = seed
        random = SeededGenerator(seed: seed &* 0x5851_F42D_4C95_7F2D)
        let made = try environment.newContainer("hosts")
        container = made.name
        store = made.store
        caches = [made.cache + "-a", made.cache + "-b"]
        for directory in ["d1/", "d2/"] {
            try store.put(key: directory, body: .bytes([]), contentType: "application/directory", metadata: [:])
        }
        for cache in caches {
            mounts.append(try Mount(environment, container: container, options: ["cache_dir=" + cache]))
        }
    }

    func cleanUp() {
        for mount in mounts { _ = try? mount.unmount() }
        for cache in caches { try? FileManager.default.removeItem(atPath: cache) }
    }

    func fail(_ message: String) -> Failure {
        Failure(
            description: "two-mount model diverged (seed \(seed), operation \(operations)): \(message)\n"
                + "replay: CSSP_E2E_HOSTS_SEED=\(seed) scripts/test\nlast operations:\n  "
                + trace.suffix(ProcessInfo.processInfo.environment["CSSP_E2E_HOSTS_TRACE"] != nil ? trace.count : 40)
                .joined(separator: "\n  "))
    }

    func chance(_ p: Double) -> Bool { Double.random(in: 0..<1, using: &random) < p }
    func pick<T>(_ items: [T]) -> T { items[Int.random(in: 0..<items.count, using: &random)] }

    /// Bytes no other version has.
    func newVersion(_ writer: String) -> [UInt8] {
        versions += 1
        return Array("v\(versions) by \(writer) (seed \(seed))\n".utf8)
    }

    func run(operations count: Int) throws {
        while operations < count {
            operations += 1
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<6: try readModifyWrite(mount: Int.random(in: 0..<2, using: &random), interleaved: chance(0.35))
            case 6..<8: try anotherClient()
            default: try unlink(mount: Int.random(in: 0..<2, using: &random))
            }
            if operations % 8 == 0 { try quietPeriod() }
        }
        try quietPeriod()
        try checkStore()
    }

    /// A mount's read, modify, write of one name (`named`, else a random one); another writer
    /// (the API, or the other mount's own read, modify, write) may act between the read and the
    /// close. Opened without O_TRUNC, the file is the version the mount knew, read whole: the
    /// version its upload replaces.
    func readModifyWrite(mount index: Int, interleaved: Bool, named chosen: String? = nil) throws {
        let name = chosen ?? pick(Self.names)
        let writer = index == 0 ? "a" : "b"
        let indent = chosen == nil ? "" : "    "
        let path = mounts[index].path(name)
        let fd = open(path, O_RDWR | O_CREAT, 0o644)
        guard fd >= 0 else {
            // The mount still showed a name another client had removed: its open finds the
            // object gone (its caches' times, or the next poll, correct the view).
            guard errno == ENOENT || errno == ESTALE else { throw fail("\(writer): open \(name): errno \(errno)") }
            trace.append("\(indent)\(writer) opens \(name): \(errno == ENOENT ? "ENOENT" : "ESTALE") (its view was older)")
            return
        }
        var seen: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(fd, &buffer, buffer.count)
            guard n >= 0 else {
                let code = errno
                close(fd)
                throw fail("\(writer): read \(name): errno \(code)")
            }
            if n == 0 { break }
            seen += buffer[0..<n]
        }
        trace.append("\(indent)\(writer) opens \(name), reads \(seen.count) bytes (\(String(decoding: seen.prefix(12), as: UTF8.self)))")
        if interleaved {
            trace.append("\(indent)  meanwhile:")
            if chance(0.5) {
                try anotherClient(name: name)
            } else {
                try readModifyWrite(mount: 1 - index, interleaved: false, named: name)
            }
        }
        let bytes = newVersion(writer)
        guard ftruncate(fd, 0) == 0, pwrite(fd, bytes, bytes.count, 0) == bytes.count else {
            let code = errno
            close(fd)
            throw fail("\(writer): write \(name): errno \(code)")
        }
        // The version this upload replaces is the one it read (nothing: a new name).
        let current = expected[name]
        let replacesCurrent = seen.isEmpty ? current == nil : seen == current
        guard close(fd) == 0 else { throw fail("\(writer): close \(name): errno \(errno)") }
        if replacesCurrent {
            expected[name] = bytes
            trace.append("\(indent)  \(writer) closes \(name): stored at its name")
        } else {
            conflictsExpected[name, default: []].append(bytes)
            conflicts += 1
            trace.append("\(indent)  \(writer) closes \(name): the stored version changed since it was read, a conflict copy")
        }
    }

    /// Another client (the CSSP API) PUTs or DELETEs a name: it checks nothing, as any client.
    func anotherClient(name chosen: String? = nil) throws {
        let name = chosen ?? pick(Self.names)
        if expected[name] != nil && chance(0.3) {
            try store.delete(key: name)
            expected[name] = nil
            trace.append("another client DELETEs \(name)")
        } else {
            let bytes = newVersion("the API")
            try store.put(key: name, body: .bytes(bytes), contentType: nil, metadata: [:])
            expected[name] = bytes
            trace.append("another client PUTs \(name)")
        }
    }

    /// A mount unlinks a name it shows (an unlink is not checked against another client's
    /// newer version: the name goes, whatever version it holds).
    func unlink(mount index: Int) throws {
        let name = pick(Self.names)
        let writer = index == 0 ? "a" : "b"
        if Glibc.unlink(mounts[index].path(name)) == 0 {
            expected[name] = nil
            trace.append("\(writer) unlinks \(name)")
        } else {
            guard errno == ENOENT else { throw fail("\(writer): unlink \(name): errno \(errno)") }
            trace.append("\(writer) unlinks \(name): ENOENT (its view)")
        }
    }

    /// What the store holds below `directory`: names and bytes.
    func storeView(_ directory: String) throws -> [String: [UInt8]] {
        var view: [String: [UInt8]] = [:]
        for entry in try store.listAll(prefix: directory, delimiter: "/") {
            guard case .object(let object) = entry, object.key != directory else { continue }
            view[String(object.key.dropFirst(directory.count))] = try store.getBytes(key: object.key, range: nil)
        }
        return view
    }

    /// What mount `index` shows in `directory`: names and bytes.
    func mountView(_ index: Int, _ directory: String) -> [String: [UInt8]]? {
        let path = mounts[index].path(String(directory.dropLast()))
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: path) else { return nil }
        var view: [String: [UInt8]] = [:]
        for name in names {
            guard let data = FileManager.default.contents(atPath: path + "/" + name) else { return nil }
            view[name] = Array(data)
        }
        return view
    }

    /// Each mount comes to show the store (within 10 s; the time is kept).
    func quietPeriod() throws {
        quietPeriods += 1
        let start = Date()
        for directory in ["d1/", "d2/"] {
            let truth = try storeView(directory)
            for index in mounts.indices {
                var late = false
                while mountView(index, directory) != truth {
                    if !late && Date().timeIntervalSince(start) > 2 {
                        late = true
                        lateQuietPeriods += 1
                        print("two-mount model: seed \(seed), operation \(operations): after 2 s mount \(index == 0 ? "a" : "b") "
                            + "differs in \(directory): \(difference(mountView(index, directory), truth))")
                    }
                    if Date().timeIntervalSince(start) > 10 {
                        throw fail(
                            "mount \(index == 0 ? "a" : "b") still shows \(describe(mountView(index, directory))) in \(directory) "
                                + "10 s after the last change; the store holds \(describe(truth))")
                    }
                    usleep(50_000)
                }
            }
        }
        slowestConvergence = max(slowestConvergence, Date().timeIntervalSince(start))
        trace.append("quiet period: both mounts show the store")
    }

    /// The names where a mount's view differs from the store's: what each shows.
    func difference(_ view: [String: [UInt8]]?, _ truth: [String: [UInt8]]) -> String {
        guard let view else { return "(unreadable)" }
        let text = { (bytes: [UInt8]?) in bytes.map { String(decoding: $0.prefix(12), as: UTF8.self) } ?? "nothing" }
        return Set(view.keys).union(truth.keys).sorted().filter { view[$0] != truth[$0] }
            .map { "\($0): mount \(text(view[$0])), store \(text(truth[$0]))" }.joined(separator: "; ")
    }

    func describe(_ view: [String: [UInt8]]?) -> String {
        guard let view else { return "(unreadable)" }
        return view.keys.sorted().map { "\($0)=\(String(decoding: view[$0]!.prefix(10), as: UTF8.self))" }.joined(separator: ", ")
    }

    /// Name by name, what the model says, and its conflict copies.
    func checkStore() throws {
        for name in Self.names {
            let stored = try? store.getBytes(key: name, range: nil)
            guard stored == expected[name] else {
                throw fail("the store holds \(stored.map { String(decoding: $0, as: UTF8.self) } ?? "nothing") at \(name), "
                    + "expected \(expected[name].map { String(decoding: $0, as: UTF8.self) } ?? "nothing")")
            }
            let copies = try store.listAll(prefix: name + ".cssp-conflict-", delimiter: nil).map {
                try store.getBytes(key: $0.name, range: nil)
            }
            let want = conflictsExpected[name] ?? []
            guard copies.map({ String(decoding: $0, as: UTF8.self) }).sorted() == want.map({ String(decoding: $0, as: UTF8.self) }).sorted()
            else {
                throw fail("conflict copies of \(name): \(copies.map { String(decoding: $0, as: UTF8.self) }), expected \(want.map { String(decoding: $0, as: UTF8.self) })")
            }
        }
    }
}
