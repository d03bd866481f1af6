import Foundation
import ObjectStoreTesting
import ObjectStore
import ObjectStoreHTTP
import Testing

/// Owed attributes through the real binary (speed issue, goal 4): rsync's chmod and utimes of
/// its temporary file ride on the rename's COPY, so a file costs a PUT, a COPY and a DELETE; and a
/// change still owed when the daemon is killed is stored by the next mount.
@Suite(.serialized)
struct AttributeTests {
    typealias Scene = WriteTests.Scene

    @Test func rsyncCostsAPutACopyAndADeleteAFileAndKeepsModesAndTimes() throws {
        let scene = try Scene("rsync-requests")
        defer { scene.cleanUp() }
        let source = TestScratch.directory + "cssp-e2e-flat-" + scene.container
        defer { try? FileManager.default.removeItem(atPath: source) }
        let files = 40
        let made = try shell("""
            set -e
            mkdir -p \(quoted(source)) && cd \(quoted(source))
            for i in $(seq 1 \(files)); do head -c $(( i * 997 )) /dev/urandom > f$i; done
            chmod 600 f1 f2 f3; chmod 755 f4 f5; chmod 640 f6
            find . -type f -exec touch -d '2022-03-04 05:06:07.123456789' {} +
            touch -d '2020-01-02 03:04:05.5' f7
            """)
        #expect(made.status == 0, "\(made.stderr)")
        let mount = try scene.mount()
        let started = Date().timeIntervalSince1970
        let copied = try shell("rsync -a \(quoted(source + "/")) \(quoted(mount.path("tree/")))")
        #expect(copied.status == 0, "\(copied.stderr)")
        // (After the unmount, which drains them: the rename's DELETE of the temporary name may
        // still be queued when rsync returns; CI once counted 39 of 40.)
        #expect(try mount.unmount() == 0)
        let requests = try scene.environment.clientRequests(container: scene.container, since: started)
        let total = requests.values.reduce(0, +)
        print("rsync -a of \(files) files: \(total) requests, \(String(format: "%.2f", Double(total) / Double(files))) a file: \(requests)")
        // PUT (the temporary file), PUT with X-Copy-From (the rename), DELETE: three a file. The
        // rest is the directory (its marker, its mode and time) and the lookups before the
        // first listing is remembered.
        #expect(requests["POST", default: 0] <= 2, "\(requests)")
        #expect(requests["DELETE", default: 0] == files, "\(requests)")
        switch Environment.dialect {
        case .cssp:
            // (Listings of the container are not counted: their paths name no key.)
            #expect(total <= 3 * files + 12, "\(requests)")
        case .s3, .cos:
            // Listings are left out here too. s3api ignores If-None-Match: a HEAD before each
            // new name's PUT.
            let listings = try scene.environment.clientRequests(containing: "list-type", since: started)
            #expect(total - listings <= 4 * files + 12, "\(requests), \(listings) of them listings")
        }
        // What rsync set is what the server holds: another mount shows the same tree.
        let again = try scene.mount()
        let expected = try WriteTests.statList(source)
        let actual = try WriteTests.statList(again.path("tree"))
        #expect(expected == actual, "\(lineDiff(expected, actual))")
        #expect(try again.unmount() == 0)
    }

    /// A chmod and touch of a closed file are journaled when they return; the daemon is killed
    /// before it stores them (the delay is an hour here); the next mount stores them.
    @Test func anOwedChmodSurvivesKillNine() throws {
        let scene = try Scene("owed-kill")
        defer { scene.cleanUp() }
        let first = try scene.mount(["attr_write_delay=3600"])
        let changed = try shell("""
            set -e
            printf 'kept\\n' > \(quoted(first.path("f")))
            chmod 600 \(quoted(first.path("f")))
            touch -m -d '@1623053350.25' \(quoted(first.path("f")))
            """)
        #expect(changed.status == 0, "\(changed.stderr)")
        let before = try scene.store.raw.head(key: "f")
        #expect(before.metadata["mode"] == Environment.storedMode(0o644), "stored at once, not owed: \(before.metadata)")
        kill(first.child.pid, SIGKILL)
        _ = first.waitForExit()
        try withExtendedLifetime(first) {
            let second = try Mount(
                scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache], at: first.directory)
            let deadline = Date().addingTimeInterval(60)
            var stored = try scene.store.raw.head(key: "f")
            while stored.metadata["mode"] != Environment.storedMode(0o600) && Date() < deadline {
                usleep(100_000)
                stored = try scene.store.raw.head(key: "f")
            }
            #expect(stored.metadata["mode"] == Environment.storedMode(0o600), "\(stored.metadata) \(second.stderrText)")
            #expect(stored.metadata["mtime"]?.hasPrefix("1623053350.25") == true, "\(stored.metadata)")
            let shown = try shell("stat -c '%a %Y' \(quoted(second.path("f")))")
            #expect(shown.stdout == "600 1623053350\n", "\(shown.stdout)")
            #expect(try second.unmount() == 0)
        }
    }
}
