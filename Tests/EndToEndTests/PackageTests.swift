import Foundation
import ObjectStoreTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 11, item 4: the .deb that `packaging/build-deb` makes (scripts/test builds it and sets
/// CSSP_DEB) installs, mounts through `mount -t cssp` and an fstab line, answers --stats,
/// unmounts through its umount helper, and `dpkg --purge` leaves none of its files behind.
/// Issue 19, item 4: a plain `umount` of a plain `mount -t cssp` waits until what is owed is
/// stored, and no line of a mount is left in /run/mount/utab. Issue 40: an upgrade restarts the
/// running mounts' workers with the new binary.
@Suite(.serialized)
struct PackageTests {
    @Test func theDebInstallsMountsAndPurgesWithoutATrace() throws {
        let fixture = try Fixture.get()
        let env = fixture.environment
        guard let deb = ProcessInfo.processInfo.environment["CSSP_DEB"] else {
            throw HarnessError("CSSP_DEB is not set: run through scripts/test (it builds the package)")
        }
        for helper in MountHelperTests.helpers where FileManager.default.fileExists(atPath: helper) {
            throw HarnessError("\(helper) exists (another install?): remove it to run this test")
        }
        let hadCredentials = FileManager.default.fileExists(atPath: "/etc/passwd-cssp")
        let started = Date()
        let install = try shell("dpkg -i \(quoted(deb))", environment: ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin"])
        print("dpkg -i took \(Date().timeIntervalSince(started)) s")
        #expect(install.status == 0, "\(install.stderr)")
        defer { _ = try? shell("dpkg --purge csspfs") }
        let files = try shell("dpkg -L csspfs").stdout.split(separator: "\n").map(String.init)
        for path in ["/sbin/mount.cssp", "/sbin/umount.cssp", "/sbin/umount.fuse.cssp", "/usr/share/man/man8/mount.cssp.8.gz",
            "/usr/share/doc/csspfs/copyright", "/usr/share/doc/csspfs/examples/mnt-cssp.mount",
            "/usr/share/doc/csspfs/examples/mnt-cssp.automount", "/usr/share/doc/csspfs/examples/fstab"]
        {
            #expect(files.contains(path), "\(path) not in the package")
        }
        if !hadCredentials {
            var st = stat()
            #expect(stat("/etc/passwd-cssp", &st) == 0 && st.st_mode & 0o777 == 0o600, "no /etc/passwd-cssp with mode 0600")
        }

        let directory = TestScratch.directory + "cssp-e2e-deb-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = directory + ".cache"
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let url = env.serverURL + "/" + fixture.container
        let options = "passwd_file=\(env.passwdFile),cache_dir=\(cache)"
        // mount -t, with an empty environment as systemd gives helpers.
        let viaType = try shell("env -i /bin/mount -t cssp \(url) \(quoted(directory)) -o \(quoted(options))")
        #expect(viaType.status == 0, "\(viaType.stderr)")
        #expect(utabLines(directory).count == 1, "\(utabLines(directory))")
        #expect(try shell("cat \(quoted(directory + "/tree/top.txt"))").stdout == "top\n")
        let stats = try shell("/sbin/mount.cssp --stats \(quoted(directory))")
        #expect(stats.status == 0 && stats.stdout.contains("cssp_requests_total{method=\"GET\",status=\"200\"}"), "\(stats.stderr)")
        // An upgrade (the same package again): its postinst makes the running mount's worker
        // give way to the installed binary (issue 40, --restart); a descriptor held open goes on.
        func worker() throws -> String? {
            try shell("/sbin/mount.cssp --status \(quoted(directory))").stdout.split(separator: "\n").first { $0.hasPrefix("worker: ") }
                .map(String.init)
        }
        let held = open(directory + "/tree/top.txt", O_RDONLY)
        let before = try worker()
        let upgrade = try shell("dpkg -i \(quoted(deb))", environment: ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin"])
        #expect(upgrade.status == 0 && !upgrade.stderr.contains("still runs"), "\(upgrade.stderr)")
        let after = try worker()
        #expect(before != nil && after != nil && after != before, "\(String(describing: before)) then \(String(describing: after))")
        var buffer = [UInt8](repeating: 0, count: 16)
        #expect(pread(held, &buffer, 16, 0) == 4 && Array(buffer[0..<4]) == Array("top\n".utf8), "errno \(errno)")
        #expect(close(held) == 0)
        #expect(try shell("umount \(quoted(directory))").status == 0)
        #expect(!isMounted(directory))
        #expect(utabLines(directory).isEmpty, "\(utabLines(directory))")

        try DrainTests.plainUmountStoresWhatIsOwed(env)

        // helper=cssp, which mounts before issue 19 needed, is still accepted.
        let fstab = directory + ".fstab"
        defer { try? FileManager.default.removeItem(atPath: fstab) }
        try "\(url) \(directory) cssp _netdev,nofail,x-systemd.automount,helper=cssp,\(options) 0 0\n"
            .writeReplacing(file: fstab)
        let viaFstab = try shell("env -i /bin/mount -T \(quoted(fstab)) \(quoted(directory))")
        #expect(viaFstab.status == 0, "\(viaFstab.stderr)")
        // One line, mount.cssp's: mount(8) finds it and adds none of its own.
        #expect(utabLines(directory).count == 1, "\(utabLines(directory))")
        #expect(try shell("ls \(quoted(directory + "/tree"))").stdout.contains("top.txt"))
        #expect(try shell("umount \(quoted(directory))").status == 0)
        #expect(!isMounted(directory))
        #expect(utabLines(directory).isEmpty, "\(utabLines(directory))")

        let purge = try shell("dpkg --purge csspfs")
        #expect(purge.status == 0, "\(purge.stderr)")
        // Nothing the package put there is left (directories other packages share aside).
        for path in files {
            var st = stat()
            guard lstat(path, &st) == 0 else { continue }
            // (/sbin is a link to /usr/sbin on Debian 12.)
            let shared = stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR && !path.contains("csspfs")
            #expect(shared, "\(path) is left after dpkg --purge")
        }
        #expect(!FileManager.default.fileExists(atPath: "/var/lib/csspfs"))
        #expect(FileManager.default.fileExists(atPath: "/etc/passwd-cssp") == hadCredentials)
    }
}
