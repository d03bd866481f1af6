import Foundation
import ObjectStore
import ObjectStoreTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 22 through the real binary and real Swift: two mounts of one container (two daemons,
/// two cache directories) and another client writing through the CSSP API.
@Suite(.serialized)
struct ManyHostsMountTests {
    typealias Scene = WriteTests.Scene

    /// Writes `text` through an open descriptor; returns close's errno (0: it succeeded).
    static func write(_ fd: Int32, _ text: String) -> Int32 {
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        #expect(written == bytes.count)
        return close(fd) == 0 ? 0 : errno
    }

    static func conflictCopies(_ scene: Scene, of key: String) throws -> [String] {
        try scene.store.raw.listAll(prefix: key + ".cssp-conflict-", delimiter: nil).map(\.name)
    }

    /// `key` holds `theirs`, and its one conflict copy `ours`.
    static func expectConflictCopy(_ scene: Scene, of key: String, theirs: String, ours: String) throws {
        #expect(try scene.store.raw.getBytes(key: key, range: nil) == Array(theirs.utf8))
        let copies = try conflictCopies(scene, of: key)
        #expect(copies.count == 1)
        #expect(try copies.first.map { try scene.store.raw.getBytes(key: $0, range: nil) } == Array(ours.utf8))
    }

    /// With `excl_create=server`, `O_CREAT|O_EXCL` of one name from two mounts at once, 200 times (bench/many-hosts.sh
    /// races 1 000 and more): exactly one open succeeds each time (the other is EEXIST), and the name holds the winner's bytes.
    @Test func exclusiveCreatesFromTwoMountsHaveOneWinner() throws {
        let scene = try Scene("excl")
        defer { scene.cleanUp() }
        let a = try Mount(
            scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache + "-a", "excl_create=server"])
        let b = try Mount(
            scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache + "-b", "excl_create=server"])
        defer {
            _ = try? a.unmount()
            _ = try? b.unmount()
            try? FileManager.default.removeItem(atPath: scene.cache + "-a")
            try? FileManager.default.removeItem(atPath: scene.cache + "-b")
        }
        // One thread per mount, released together for each name by a barrier (os.open lets go
        // of Python's lock): each line is a name's result, a then b, 1 for a created file
        // (holding its mount's tag), 0 for EEXIST.
        let racer = """
            import os, sys, threading
            rounds = int(sys.argv[3])
            barrier = threading.Barrier(2)
            results = {}
            def race(base, tag):
                out = []
                for n in range(rounds):
                    barrier.wait()
                    try:
                        fd = os.open("%s/lock-%d" % (base, n), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                    except FileExistsError:
                        out.append("0")
                        continue
                    os.write(fd, tag.encode())
                    os.close(fd)
                    out.append("1")
                results[tag] = out
            threads = [threading.Thread(target=race, args=(sys.argv[1], "a")), threading.Thread(target=race, args=(sys.argv[2], "b"))]
            for t in threads: t.start()
            for t in threads: t.join()
            for x, y in zip(results["a"], results["b"]): print(x + y)
            """
        let rounds = 200
        let result = try shell(
            "/usr/bin/python3 -c \(quoted(racer)) \(quoted(a.directory)) \(quoted(b.directory)) \(rounds)")
        #expect(result.status == 0, "\(result.stderr)")
        let lines = result.stdout.split(separator: "\n")
        #expect(lines.count == rounds)
        let both = lines.filter { $0 == "11" }.count
        let neither = lines.filter { $0 == "00" }.count
        #expect(both == 0, "\(both) of \(rounds) names were created by both mounts")
        #expect(neither == 0, "\(neither) of \(rounds) names were created by neither mount")
        for n in stride(from: 0, to: lines.count, by: 97) {
            let winner = lines[n] == "10" ? "a" : "b"
            #expect(try scene.store.raw.getBytes(key: "lock-\(n)", range: nil) == Array(winner.utf8))
        }
    }

    /// A file open for writing here, replaced by another client before the close: the close
    /// succeeds, the name keeps the other client's version, ours is a conflict copy, and
    /// `--stats` counts it. Then the same for a new name two mounts write at once.
    @Test func noUploadSilentlyReplacesAnotherClientsVersion() throws {
        let scene = try Scene("lost")
        defer { scene.cleanUp() }
        try scene.store.raw.put(key: "shared", body: .bytes(Array("version 1".utf8)), contentType: nil, metadata: [:])
        let a = try Mount(scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache + "-a"])
        let b = try Mount(scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache + "-b"])
        defer {
            _ = try? a.unmount()
            _ = try? b.unmount()
            try? FileManager.default.removeItem(atPath: scene.cache + "-a")
            try? FileManager.default.removeItem(atPath: scene.cache + "-b")
        }
        // Another client (the CSSP API) replaces the file between the open and the close.
        let fd = open(a.path("shared"), O_WRONLY | O_TRUNC)
        #expect(fd >= 0)
        try scene.store.raw.put(key: "shared", body: .bytes(Array("theirs".utf8)), contentType: nil, metadata: [:])
        #expect(Self.write(fd, "ours, from a") == 0)
        try Self.expectConflictCopy(scene, of: "shared", theirs: "theirs", ours: "ours, from a")
        let stats = try shell("\(quoted(scene.environment.binary)) --stats \(quoted(a.directory))")
        #expect(StatusTests.sample(stats.stdout, "cssp_conflicts_total") == 1, "\(stats.stdout)")

        // A new name made on both mounts, b's closed first: a's goes aside.
        let fromA = open(a.path("new"), O_WRONLY | O_CREAT, 0o644)
        let fromB = open(b.path("new"), O_WRONLY | O_CREAT, 0o644)
        #expect(fromA >= 0 && fromB >= 0)
        #expect(Self.write(fromB, "b was first") == 0)
        #expect(Self.write(fromA, "a came second") == 0)
        try Self.expectConflictCopy(scene, of: "new", theirs: "b was first", ours: "a came second")
        #expect(a.stderrText.contains("conflict: 'new'") && a.stderrText.contains("new.cssp-conflict-"), "\(a.stderrText)")
    }

    /// A server that ignores `If-None-Match` and has no `/info` (a gateway in front of Swift,
    /// `scripts/http-relay`): the mount says so in its log and checks a new name's upload by a
    /// HEAD before it instead, so a name another client made between the open and the close
    /// still sends this mount's bytes to a conflict copy (the relay would let the conditional
    /// PUT overwrite it: checked first). `excl_create=server` falls back to the mount's own check.
    @Test func aServerThatIgnoresIfNoneMatchIsCheckedByAHead() throws {
        let scene = try Scene("nomatch")
        defer { scene.cleanUp() }
        guard let port = scene.environment.serverURL.split(separator: ":").last else {
            throw HarnessError("no port in \(scene.environment.serverURL)")
        }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let (relay, listening) = try launchPrintingPort(
            "/usr/bin/python3", [root.appendingPathComponent("scripts/http-relay").path, "0", String(port)])
        defer {
            kill(relay.processIdentifier, SIGKILL)
            relay.waitUntilExit()
        }
        let url = "http://127.0.0.1:\(listening)"
        let relayed = scene.environment.store(container: scene.container, url: url)
        try relayed.put(key: "probe", body: .bytes(Array("one".utf8)), contentType: nil, metadata: [:])
        try relayed.put(key: "probe", body: .bytes(Array("two".utf8)), contentType: nil, metadata: [:], onlyIfAbsent: true)
        #expect(try scene.store.raw.getBytes(key: "probe", range: nil) == Array("two".utf8), "the relay ignores If-None-Match")
        #expect(!relayed.honoursIfNoneMatch)

        let mount = try Mount(scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache], url: url)
        defer { _ = try? mount.unmount() }
        let fd = open(mount.path("new"), O_WRONLY | O_CREAT, 0o644)
        #expect(fd >= 0)
        try scene.store.raw.put(key: "new", body: .bytes(Array("theirs".utf8)), contentType: nil, metadata: [:])
        #expect(Self.write(fd, "ours") == 0)
        try Self.expectConflictCopy(scene, of: "new", theirs: "theirs", ours: "ours")
        // A new name nobody else made is stored as usual.
        let alone = open(mount.path("alone"), O_WRONLY | O_CREAT, 0o644)
        #expect(alone >= 0 && Self.write(alone, "only ours") == 0)
        #expect(try scene.store.raw.getBytes(key: "alone", range: nil) == Array("only ours".utf8))
        #expect(mount.stderrText.contains("does not say it is OpenStack Swift"), "\(mount.stderrText)")

        // excl_create=server falls back to this mount's own check: nothing is stored at the
        // open (the server's answer could not be trusted), the close stores the file.
        let exclusive = try Mount(
            scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache + "-x", "excl_create=server"],
            url: url)
        defer {
            _ = try? exclusive.unmount()
            try? FileManager.default.removeItem(atPath: scene.cache + "-x")
        }
        let lock = open(exclusive.path("lock"), O_WRONLY | O_CREAT | O_EXCL, 0o644)
        #expect(lock >= 0)
        #expect(throws: ObjectStoreError.self) { _ = try scene.store.raw.head(key: "lock") }
        #expect(Self.write(lock, "held") == 0)
        #expect(try scene.store.raw.getBytes(key: "lock", range: nil) == Array("held".utf8))
        #expect(open(exclusive.path("lock"), O_WRONLY | O_CREAT | O_EXCL, 0o644) == -1 && errno == EEXIST)
    }

    /// With `poll_s` (default 1) and caches that would hide them for a minute, names another
    /// client made, rewrote (same size) and removed show in `ls`, `stat` and `cat`; a file held
    /// open and read through the kernel's page cache meets the new version at a read: ESTALE,
    /// never the other client's bytes mixed in. (The time it takes is in bench/many-hosts.sh.)
    @Test func anIdleMountShowsAnotherClientsChanges() throws {
        let scene = try Scene("poll")
        defer { scene.cleanUp() }
        let raw = scene.store.raw
        for (key, text) in [("kept", "aaaa"), ("removed", "gone soon"), ("held", "version 1 of a held file")] {
            try raw.put(key: key, body: .bytes(Array(text.utf8)), contentType: nil, metadata: [:])
        }
        let mount = try scene.mount(["dir_timeout=60", "entry_timeout=60", "negative_timeout=60", "attr_timeout=1"])
        defer { _ = try? mount.unmount() }
        let fm = FileManager.default
        #expect(try fm.contentsOfDirectory(atPath: mount.directory).sorted() == ["held", "kept", "removed"])
        #expect(!fm.fileExists(atPath: mount.path("new")))
        #expect(try String(contentsOfFile: mount.path("kept"), encoding: .utf8) == "aaaa")
        let fd = open(mount.path("held"), O_RDONLY)
        #expect(fd >= 0)
        defer { close(fd) }
        let old = Array("version 1 of a held file".utf8)
        var buffer = [UInt8](repeating: 0, count: 100)
        #expect(pread(fd, &buffer, 100, 0) == old.count)

        try raw.put(key: "new", body: .bytes(Array("made elsewhere".utf8)), contentType: nil, metadata: [:])
        try raw.put(key: "kept", body: .bytes(Array("bbbb".utf8)), contentType: nil, metadata: [:])
        try raw.delete(key: "removed")
        try raw.put(key: "held", body: .bytes(Array("version 2 of a held file".utf8)), contentType: nil, metadata: [:])

        // Each check is repeated until it holds, for at most 10 s; without the poll none would
        // within a minute.
        func eventually(_ what: String, _ condition: () throws -> Bool) rethrows {
            let deadline = Date().addingTimeInterval(10)
            while try !condition() {
                if Date() > deadline {
                    Issue.record("\(what) did not show within 10 s")
                    return
                }
                usleep(50_000)
            }
        }
        try eventually("the names another client made and removed") {
            try fm.contentsOfDirectory(atPath: mount.path("")).sorted() == ["held", "kept", "new"]
        }
        eventually("stat of the new name") { fm.fileExists(atPath: mount.path("new")) }
        eventually("stat of the removed name") { !fm.fileExists(atPath: mount.path("removed")) }
        eventually("the same-size rewrite") { (try? String(contentsOfFile: mount.path("kept"), encoding: .utf8)) == "bbbb" }
        var staleSeen = false
        eventually("ESTALE at a read of the held file") {
            let n = pread(fd, &buffer, 100, 0)
            if n < 0 {
                #expect(errno == ESTALE)
                staleSeen = true
                return true
            }
            #expect(Array(buffer[0..<n]) == old, "a handle that read the old version read other bytes")
            return false
        }
        #expect(staleSeen)
        #expect(try String(contentsOfFile: mount.path("held"), encoding: .utf8) == "version 2 of a held file")
    }

    /// A mount that daemonizes (no -f: as mount(8) and fstab run it) polls too. Its timers
    /// start after the fork: a libdispatch queue used before it (a warm-up of `/info`) left the
    /// child's timers dead, so neither the poll nor write-back's delayed uploads ever ran.
    @Test func aDaemonizedMountPolls() throws {
        let scene = try Scene("daemon")
        defer { scene.cleanUp() }
        let raw = scene.store.raw
        try raw.put(key: "d/x", body: .bytes(Array("x".utf8)), contentType: nil, metadata: [:])
        let directory = TestScratch.directory + "cssp-e2e-daemon-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let options = "passwd_file=\(scene.environment.passwdFile),cache_dir=\(scene.cache),dir_timeout=60,entry_timeout=60,negative_timeout=60"
        let mounted = try shell(
            "\(quoted(scene.environment.binary)) \(quoted(scene.environment.serverURL + "/" + scene.container)) \(quoted(directory)) -o \(quoted(options))")
        #expect(mounted.status == 0, "\(mounted.stderr)")
        defer { _ = try? shell("fusermount3 -u \(quoted(directory))") }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory + "/d") == ["x"])
        try raw.put(key: "d/y", body: .bytes(Array("y".utf8)), contentType: nil, metadata: [:])
        let deadline = Date().addingTimeInterval(10)
        var names: [String] = []
        while Date() < deadline {
            names = try FileManager.default.contentsOfDirectory(atPath: directory + "/d").sorted()
            if names == ["x", "y"] { break }
            usleep(50_000)
        }
        #expect(names == ["x", "y"], "another client's new name did not show in a daemonized mount within 10 s")
    }
}
