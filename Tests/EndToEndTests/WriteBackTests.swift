import Foundation
import ObjectStoreTesting
import ObjectStore
import ObjectStoreHTTP
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `-o writeback` through the real binary (issue 20, step 1): rsync into a write-back mount
/// sends one PUT a file (its temporary name is renamed in the queue), the unmount stores the
/// queue, and a daemon killed with the queue full leaves it to the next mount.
@Suite(.serialized)
struct WriteBackMountTests {
    typealias Scene = WriteTests.Scene

    /// A flat tree of `count` files of different sizes and modes, with fixed times.
    func makeSource(_ scene: Scene, count: Int) throws -> String {
        let source = TestScratch.directory + "cssp-e2e-wb-" + scene.container
        let made = try shell("""
            set -e
            mkdir -p \(quoted(source)) && cd \(quoted(source))
            for i in $(seq 1 \(count)); do head -c $(( i * 701 )) /dev/urandom > f$i; done
            chmod 600 f1 f2; chmod 755 f3
            find . -type f -exec touch -d '2022-03-04 05:06:07.123456789' {} +
            """)
        guard made.status == 0 else { throw HarnessError("cannot make the source: \(made.stderr)") }
        return source
    }

    @Test func rsyncSendsOnePutAFileAndTheUnmountStoresTheQueue() throws {
        let scene = try Scene("wb-rsync")
        defer { scene.cleanUp() }
        let files = 40
        let source = try makeSource(scene, count: files)
        defer { try? FileManager.default.removeItem(atPath: source) }
        let mount = try scene.mount(["writeback"])
        let started = Date().timeIntervalSince1970
        let copied = try shell("rsync -a \(quoted(source + "/")) \(quoted(mount.path("tree/")))")
        #expect(copied.status == 0, "\(copied.stderr)")
        // The drain at unmount stores whatever the queue still holds.
        #expect(try mount.unmount() == 0)
        let requests = try scene.environment.clientRequests(container: scene.container, since: started)
        print("rsync -a of \(files) files in write-back mode: \(requests)")
        #expect(requests["COPY", default: 0] == 0 && requests["DELETE", default: 0] == 0, "\(requests)")
        // One PUT a file (with its mode and time), and the directory's marker.
        #expect(requests["PUT", default: 0] == files + 1, "\(requests)")
        #expect(requests["POST", default: 0] <= 2, "\(requests)")
        let again = try scene.mount()
        let expected = try WriteTests.statList(source)
        let actual = try WriteTests.statList(again.path("tree"))
        #expect(expected == actual, "\(lineDiff(expected, actual))")
        #expect(try shell("diff -r \(quoted(source)) \(quoted(again.path("tree")))").status == 0)
        #expect(try again.unmount() == 0)
    }

    /// kill -9 with every file still queued (the delay is an hour): the next mount stores them
    /// all from the journal, and rsync run again then sends nothing.
    @Test func aDaemonKilledWithAFullQueueLeavesItToTheNextMount() throws {
        let scene = try Scene("wb-kill")
        defer { scene.cleanUp() }
        let files = 20
        let source = try makeSource(scene, count: files)
        defer { try? FileManager.default.removeItem(atPath: source) }
        let first = try scene.mount(["writeback", "writeback_delay=3600"])
        let copied = try shell("rsync -a \(quoted(source + "/")) \(quoted(first.path("tree/")))")
        #expect(copied.status == 0, "\(copied.stderr)")
        let stored = try scene.store.raw.listAll(prefix: "tree/", delimiter: nil).filter { !$0.name.hasSuffix("/") }
        #expect(stored.isEmpty, "nothing is stored before its turn: \(stored.map(\.name))")
        kill(first.child.pid, SIGKILL)
        _ = first.waitForExit()
        try withExtendedLifetime(first) {
            #expect(try shell("fusermount3 -u \(quoted(first.directory))").status == 0)
            let second = try scene.mount()
            // The next mount stores the journal before it serves the names involved: the tree
            // shows at once as rsync left it, and once walked, the server holds every file.
            #expect(try WriteTests.statList(source) == WriteTests.statList(second.path("tree")), "\(second.stderrText)")
            let names = try scene.store.raw.listAll(prefix: "tree/", delimiter: nil).map(\.name).filter { !$0.hasSuffix("/") }
            #expect(names.count == files, "\(names) \(second.stderrText)")
            #expect(!names.contains { $0.contains("/.f") || $0.contains("cssp-conflict") }, "\(names)")
            let rerun = try shell("rsync -a --stats \(quoted(source + "/")) \(quoted(second.path("tree/")))")
            #expect(rerun.stdout.contains("Number of regular files transferred: 0"), "\(rerun.stdout)")
            #expect(try WriteTests.statList(source) == WriteTests.statList(second.path("tree")))
            #expect(try second.unmount() == 0)
        }
    }

    /// Seeds `count` files below `tree/` in two directories, and `keep` beside it.
    func seedTree(_ scene: Scene, count: Int) throws {
        for i in 0..<count {
            try scene.store.raw.put(
                key: "tree/\(i % 2 == 0 ? "a" : "b")/f\(i)", body: .bytes(Array("file \(i)".utf8)), contentType: nil, metadata: [:])
        }
        try scene.store.raw.put(key: "keep", body: .bytes(Array("kept".utf8)), contentType: nil, metadata: [:])
    }

    func storedNames(_ scene: Scene) throws -> [String] {
        try scene.store.raw.listAll(prefix: "", delimiter: nil).map(\.name)
    }

    /// rm -rf in write-back mode returns with the deletes journaled; the server (Swift's bulk
    /// middleware, advertised in /info) gets them in bulk deletes; the unmount waits for them.
    @Test func rmRfSendsBulkDeletesAndTheUnmountWaitsForThem() throws {
        let scene = try Scene("wb-rmrf")
        defer { scene.cleanUp() }
        let files = 80
        try seedTree(scene, count: files)
        let mount = try scene.mount(["writeback"])
        let started = Date().timeIntervalSince1970
        let removed = try shell("rm -rf \(quoted(mount.path("tree")))")
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(try shell("ls -A \(quoted(mount.path("")))").stdout == "keep\n")
        #expect(try mount.unmount() == 0)
        #expect(try storedNames(scene) == ["keep"])
        let bulk = try scene.environment.clientRequests(containing: "bulk-delete", since: started)
        let requests = try scene.environment.clientRequests(container: scene.container, since: started)
        print("rm -rf of \(files) files in write-back mode: \(bulk) bulk deletes, \(requests)")
        #expect(bulk >= 1, "\(requests)")
        #expect(bulk + requests["DELETE", default: 0] < files / 2, "\(bulk) bulk deletes, \(requests)")
    }

    /// kill -9 with every delete of an rm -rf still owed (the server refused them): the next
    /// mount hides the names at once and sends the deletes.
    @Test func deletesADaemonKilledBeforeSendingAreSentByTheNextMount() throws {
        let scene = try Scene("wb-rmkill")
        defer { scene.cleanUp() }
        let files = 30
        try seedTree(scene, count: files)
        let faultFile = try scene.environment.faultFile()
        defer { try? FileManager.default.removeItem(atPath: faultFile) }
        try "POST status=503 /\(scene.container)\nDELETE status=503 /\(scene.container)/\n".writeReplacing(file: faultFile)
        let first = try scene.mount(["writeback"])
        let removed = try shell("rm -rf \(quoted(first.path("tree")))")
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(try storedNames(scene).count == files + 1, "the server refused every delete")
        kill(first.child.pid, SIGKILL)
        _ = first.waitForExit()
        try withExtendedLifetime(first) {
            #expect(try shell("fusermount3 -u \(quoted(first.directory))").status == 0)
            try FileManager.default.removeItem(atPath: faultFile)
            let second = try scene.mount()
            #expect(try shell("ls -A \(quoted(second.path("")))").stdout == "keep\n")
            #expect(try second.unmount() == 0)
            #expect(try storedNames(scene) == ["keep"], "\(second.stderrText)")
        }
    }
}
