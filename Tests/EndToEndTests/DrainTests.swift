import Foundation
import ObjectStoreTesting
import ObjectStore
import ObjectStoreHTTP
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 11, item 2, through the real binary: an unmount (the umount helper, SIGTERM,
/// fusermount3 -u) stores what is owed before the daemon exits; what cannot be stored within
/// drain_timeout stays journaled, the daemon exits 75, and the next mount stores it.
@Suite(.serialized)
struct DrainTests {
    /// A mount whose upload of `owed.txt` failed during an outage (every PUT of it answered 503),
    /// with the scheduled retry a minute away: only the drain can store it in time.
    struct Outage {
        let environment: Environment
        let container: String
        let store: HTTPObjectStore
        let mount: Mount
        let faultFile: String
        let cache: String

        init(drainTimeout: Int = 30) throws {
            environment = try Environment.load()
            faultFile = try environment.faultFile()
            (container, store, cache) = try environment.newContainer("drain")
            mount = try Mount(
                environment, container: container,
                options: ["cache_dir=" + cache, "retries=1", "drain_timeout=\(drainTimeout)"],
                extraEnvironment: ["CSSP_TEST_PENDING_RETRY_SECONDS": "3600"])
            try "PUT status=503 /\(container)/owed.txt\n".writeReplacing(file: faultFile)
            let source = cache + "-source.txt"
            try "owed\n".writeReplacing(file: source)
            defer { try? FileManager.default.removeItem(atPath: source) }
            let write = try shell("cp \(quoted(source)) \(quoted(mount.path("owed.txt")))")
            #expect(write.status != 0 && write.stderr.contains("Input/output error"), "\(write.stderr)")
            #expect(throws: ObjectStoreError.self) { _ = try store.head(key: "owed.txt") }
            let status = try DrainTests.waitUntilOwed(environment, mount.directory)
            #expect(status.contains("owed.txt: 5 B, 2 tries failed, next in"), "\(status)")
            // The error lines name the operation, path, key, errno, status and request id.
            let lines = mount.stderrText.split(separator: "\n").filter { $0.contains("error:") }
            for op in ["flush", "release"] {
                let line = lines.first { $0.contains("op=\(op)") }.map(String.init) ?? ""
                #expect(
                    line.contains("errno=EIO key=owed.txt op=\(op) path=/owed.txt request=tx") && line.contains("status=503"),
                    "\(mount.stderrText)")
            }
        }

        func serverIsBack() throws { try FileManager.default.removeItem(atPath: faultFile) }

        func cleanUp() {
            try? FileManager.default.removeItem(atPath: faultFile)
            try? FileManager.default.removeItem(atPath: cache)
        }
    }

    /// Plain `umount MOUNTPOINT` of a mount made by plain `mount -t cssp` (issue 19, item 4)
    /// runs the umount helper, /sbin/umount.cssp here (linked to the binary under test, as the
    /// package installs it): it returns once the owed file is stored.
    @Test func plainUmountReturnsOnceTheOwedFileIsStored() throws {
        let environment = try Environment.load()
        try MountHelperTests().withHelper(environment) { try Self.plainUmountStoresWhatIsOwed(environment) }
    }

    /// Through whatever `/sbin/mount.cssp` is in place (linked to the binary under test, or the
    /// installed package): plain `mount -t cssp URL DIR` (no helper option), an upload owed
    /// during an outage, then plain `umount DIR`. When umount returns, the file is stored and
    /// /run/mount/utab holds no line of the mount.
    static func plainUmountStoresWhatIsOwed(_ environment: Environment) throws {
        let faultFile = try environment.faultFile()
        let (container, store, cache) = try environment.newContainer("drain")
        let directory = TestScratch.directory + "cssp-e2e-umount-" + container
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        defer { try? FileManager.default.removeItem(atPath: cache) }
        defer { try? FileManager.default.removeItem(atPath: faultFile) }
        let mounted = try shell(
            "env -i CSSP_TEST_PENDING_RETRY_SECONDS=3600 /bin/mount -t cssp \(environment.serverURL)/\(container) "
                + "\(quoted(directory)) -o passwd_file=\(quoted(environment.passwdFile)),cache_dir=\(quoted(cache)),retries=1")
        #expect(mounted.status == 0, "\(mounted.stderr)")
        defer { if isMounted(directory) { _ = try? shell("umount -i \(quoted(directory))") } }
        try "PUT status=503 /\(container)/owed.txt\n".writeReplacing(file: faultFile)
        let source = cache + "-source.txt"
        try "owed\n".writeReplacing(file: source)
        defer { try? FileManager.default.removeItem(atPath: source) }
        #expect(try shell("cp \(quoted(source)) \(quoted(directory + "/owed.txt"))").status != 0)
        let status = try Self.waitUntilOwed(environment, directory)
        #expect(status.contains("owed.txt: 5 B, 2 tries failed, next in"), "\(status)")
        // The server is back, but slow: each PUT of the file is answered after 1 s. A umount
        // that did not wait would return before the file is stored.
        try "PUT stall=1 /\(container)/owed.txt\n".writeReplacing(file: faultFile)
        let result = try shell("umount \(quoted(directory))")
        let stored = try? store.getBytes(key: "owed.txt", range: nil)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(stored == Array("owed\n".utf8), "umount returned before the owed file was stored")
        #expect(!isMounted(directory))
        #expect(utabLines(directory).isEmpty, "\(utabLines(directory))")
    }

    /// `--status` once the kernel's release (the last close, which tries once more in the
    /// background) has failed too and the retry is scheduled.
    static func waitUntilOwed(_ environment: Environment, _ directory: String) throws -> String {
        let deadline = Date().addingTimeInterval(10)
        var status = ""
        repeat {
            status = try shell("\(quoted(environment.binary)) --status \(quoted(directory))").stdout
            if status.contains("2 tries failed, next in") { break }
            usleep(20_000)
        } while Date() < deadline
        return status
    }

    /// The same for a user: `mount.cssp --unmount MOUNTPOINT`.
    @Test func unmountReturnsOnceTheOwedFileIsStored() throws {
        let outage = try Outage()
        defer { outage.cleanUp() }
        try outage.serverIsBack()
        let result = try shell("\(quoted(outage.environment.binary)) --unmount \(quoted(outage.mount.directory))")
        #expect(result.status == 0, "\(result.stderr)")
        #expect(try outage.store.getBytes(key: "owed.txt", range: nil) == Array("owed\n".utf8))
        #expect(!isMounted(outage.mount.directory))
        #expect(outage.mount.waitForExit() == 0)
    }

    @Test func sigtermStoresWhatIsOwedBeforeTheDaemonExits() throws {
        let outage = try Outage()
        defer { outage.cleanUp() }
        try outage.serverIsBack()
        #expect(kill(outage.mount.child.pid, SIGTERM) == 0)
        #expect(outage.mount.waitForExit() == 0)
        #expect(try outage.store.getBytes(key: "owed.txt", range: nil) == Array("owed\n".utf8))
        #expect(outage.mount.stderrText.contains("unmounting: waiting up to"), "\(outage.mount.stderrText)")
    }

    /// The outage outlasts drain_timeout: the daemon exits 75 and says what is still owed; the
    /// journal keeps it, and the next mount of the URL stores it (and says so).
    @Test func whatIsStillOwedAfterTheDrainTimeoutIsStoredByTheNextMount() throws {
        let outage = try Outage(drainTimeout: 2)
        defer { outage.cleanUp() }
        #expect(try outage.mount.unmount() == 75)
        #expect(outage.mount.stderrText.contains("1 upload(s) still owed after drain_timeout=2 s: 'owed.txt'"), "\(outage.mount.stderrText)")
        #expect(throws: ObjectStoreError.self) { _ = try outage.store.head(key: "owed.txt") }
        try outage.serverIsBack()
        let next = try Mount(outage.environment, container: outage.container, options: ["cache_dir=" + outage.cache])
        let deadline = Date().addingTimeInterval(30)
        while (try? outage.store.head(key: "owed.txt")) == nil && Date() < deadline { usleep(100_000) }
        #expect(try outage.store.getBytes(key: "owed.txt", range: nil) == Array("owed\n".utf8))
        #expect(try next.unmount() == 0)
        #expect(next.stderrText.contains("stored 'owed.txt'") && next.stderrText.contains("owed by an earlier mount"), "\(next.stderrText)")
    }
}
