import Foundation
import ObjectStoreTesting
import Testing

/// The real binary, mounted with FUSE on the real local server, driven by ordinary tools.
@Suite(.serialized)
struct ReadOnlyMountTests {
    @Test func listingShowsFilesDirectoriesAndMarkers() throws {
        let fixture = try Fixture.get()
        let mount = try Mount(fixture.environment, container: fixture.container)
        let found = try shell("cd \(quoted(mount.path("tree"))) && find . | LC_ALL=C sort")
        #expect(found.status == 0, "\(found.stderr)")
        let expected = try shell("cd \(quoted(fixture.local + "/tree")) && find . | LC_ALL=C sort")
        #expect(found.stdout == expected.stdout)
        let listing = try shell("ls -la \(quoted(mount.path("tree")))")
        #expect(listing.status == 0)
        #expect(listing.stdout.contains("dlo.bin"))
        // The DLO's parts are not a directory, and its size is the real one.
        let types = try shell("stat -c '%F %s' \(quoted(mount.path("tree/dlo.bin"))) \(quoted(mount.path("tree/empty.bin"))) \(quoted(mount.path("tree/marker-dir")))")
        #expect(types.stdout == "regular file \(fixture.dloSize)\nregular empty file 0\ndirectory 0\n")
        let missing = try shell("cat \(quoted(mount.path("tree/no-such-file")))")
        #expect(missing.status != 0 && missing.stderr.contains("No such file or directory"), "\(missing.stderr)")
        #expect(try mount.unmount() == 0)
    }

    @Test func contentsAndChecksumsMatchWhatWasSeeded() throws {
        let fixture = try Fixture.get()
        let mount = try Mount(fixture.environment, container: fixture.container)
        for (path, text) in Fixture.treeFiles {
            let cat = try shell("cat \(quoted(mount.path("tree/" + path)))")
            #expect(cat.status == 0 && cat.stdout == text, "\(path): \(cat.stderr)")
        }
        #expect(try md5(mount.path("big/random.bin")) == fixture.bigMD5)
        #expect(try md5(mount.path("tree/dlo.bin")) == fixture.dloMD5)
        #expect(try mount.unmount() == 0)
    }

    @Test func copyOutIsIdenticalToTheSource() throws {
        let fixture = try Fixture.get()
        let mount = try Mount(fixture.environment, container: fixture.container)
        let out = TestScratch.directory + "cssp-e2e-out-" + UUID().uuidString.prefix(8)
        defer { try? FileManager.default.removeItem(atPath: out) }
        let copy = try shell("mkdir -p \(quoted(out)) && cp -r \(quoted(mount.path("tree"))) \(quoted(out)) && diff -r \(quoted(fixture.local + "/tree")) \(quoted(out + "/tree"))")
        #expect(copy.status == 0, "\(copy.stdout) \(copy.stderr)")
        #expect(try mount.unmount() == 0)
    }

    @Test func directoryOf12000Objects() throws {
        let fixture = try Fixture.get()
        let mount = try Mount(fixture.environment, container: fixture.container)
        let count = try shell("ls \(quoted(mount.path("many"))) | wc -l")
        #expect(count.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "\(Fixture.manyCount)")
        let long = try shell("ls -l \(quoted(mount.path("many"))) | grep -c '^-rw'")
        #expect(long.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "\(Fixture.manyCount)")
        #expect(try mount.unmount() == 0)
    }

    @Test func offsetsBeyond4GiB() throws {
        let fixture = try Fixture.get()
        let mount = try Mount(fixture.environment, container: fixture.container)
        let huge = mount.path("huge.bin")
        let size = Fixture.hugePartSize * Int64(Fixture.hugeParts)
        let stat = try shell("stat -c %s \(quoted(huge))")
        #expect(stat.stdout == "\(size)\n")
        // Every part has the same bytes: 1 MiB at 4 GiB + 3 MiB equals 1 MiB at 3 MiB of the first part.
        let far = try shell("dd if=\(quoted(huge)) bs=1M skip=\(4096 + 3) count=1 status=none | md5sum")
        let near = try shell("dd if=\(quoted(fixture.local + "/part.bin")) bs=1M skip=3 count=1 status=none | md5sum")
        #expect(far.status == 0 && far.stdout == near.stdout)
        // The last bytes, and a read at EOF.
        let tail = try shell("tail -c 1000 \(quoted(huge)) | md5sum")
        let partTail = try shell("tail -c 1000 \(quoted(fixture.local + "/part.bin")) | md5sum")
        #expect(tail.stdout == partTail.stdout)
        let eof = try shell("dd if=\(quoted(huge)) bs=4096 skip=\(size / 4096) count=1 status=none | wc -c")
        #expect(eof.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        #expect(try mount.unmount() == 0)
    }

    @Test func roMountRefusesWritesWithEROFS() throws {
        let fixture = try Fixture.get()
        let mount = try Mount(fixture.environment, container: fixture.container, options: ["ro"])
        for command in ["touch NEW", "mkdir NEWDIR", "rm tree/top.txt", "echo x >> tree/top.txt", "mv tree/top.txt tree/moved"] {
            let result = try shell("cd \(quoted(mount.directory)) && \(command)")
            #expect(result.status != 0, "\(command) succeeded")
            #expect(result.stderr.contains("Read-only file system"), "\(command): \(result.stderr)")
        }
        #expect(try mount.unmount() == 0)
    }

    @Test(arguments: ["TERM", "INT"])
    func signalsUnmountCleanly(signal: String) throws {
        let fixture = try Fixture.get()
        let mount = try Mount(fixture.environment, container: fixture.container)
        #expect(try shell("ls \(quoted(mount.directory))").status == 0)
        try shell("kill -\(signal) \(mount.child.pid)")
        #expect(mount.waitForExit() == 0)
        #expect(!isMounted(mount.directory))
        #expect(!mount.stderrText.contains("error"), "\(mount.stderrText)")
    }

    @Test func umountStopsTheDaemon() throws {
        let fixture = try Fixture.get()
        let mount = try Mount(fixture.environment, container: fixture.container)
        #expect(try mount.unmount(using: "umount") == 0)
        #expect(!isMounted(mount.directory))
    }

    @Test func backgroundModeReturnsOnlyWhenMountedAndKeepsSecretsOutOfArgv() throws {
        let fixture = try Fixture.get()
        let directory = TestScratch.directory + "cssp-e2e-bg-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let env = fixture.environment
        let start = try shell("\(quoted(env.binary)) \(env.serverURL)/\(fixture.container) \(quoted(directory)) -o passwd_file=\(quoted(env.passwdFile))")
        #expect(start.status == 0, "\(start.stderr)")
        #expect(isMounted(directory))
        // Mounted means answering: the first ls after the helper returns works.
        #expect(try shell("ls \(quoted(directory + "/tree"))").stdout.contains("top.txt"))
        let daemons = try shell("pgrep -f -- \(quoted("mount.cssp .*" + directory))")
        let pid = daemons.stdout.split(separator: "\n").first.map(String.init) ?? ""
        #expect(!pid.isEmpty)
        let argv = try shell("tr '\\0' ' ' < /proc/\(pid)/cmdline")
        #expect(!argv.stdout.contains(env.secret))
        #expect(try shell("fusermount3 -u \(quoted(directory))").status == 0)
        // The daemon exits after the unmount.
        let gone = try shell("for i in $(seq 200); do kill -0 \(pid) 2>/dev/null || exit 0; sleep 0.05; done; exit 1")
        #expect(gone.status == 0, "daemon \(pid) still running after unmount")
    }
}

/// Bad input: one line on stderr that says what to do, a nonzero exit, nothing mounted.
@Suite(.serialized)
struct MountFailureTests {
    func attempt(_ fixture: Fixture, url: String? = nil, options: String, environment: [String: String] = [:]) throws -> (Output, String) {
        let directory = TestScratch.directory + "cssp-e2e-fail-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let target = url ?? fixture.environment.serverURL + "/" + fixture.container
        var env = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        env["HOME"] = directory  // No ~/.passwd-cssp from the machine.
        let result = try shell("\(quoted(fixture.environment.binary)) \(quoted(target)) \(quoted(directory)) \(options)", environment: env)
        #expect(!isMounted(directory))
        #expect(result.stderr.split(separator: "\n").count == 1, "\(result.stderr)")
        #expect(!result.stderr.contains(fixture.environment.secret))
        return (result, directory)
    }

    func passwdFile(_ contents: String, mode: Int = 0o600) throws -> String {
        let path = TestScratch.directory + "cssp-e2e-passwd-" + UUID().uuidString.prefix(8)
        try contents.write(toFile: path, atomically: false, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: path)
        return path
    }

    /// Without HOME a user's cache is `/tmp/csspfs-UID`, a name anyone can make first: one
    /// another user made (or open to others) is refused; a missing one is made private.
    @Test func aCacheDirectoryInTmpMustBeTheUsersOwn() throws {
        let fixture = try Fixture.get()
        let uid = 64_999
        let cache = "/tmp/csspfs-\(uid)"
        try? FileManager.default.removeItem(atPath: cache)
        try FileManager.default.createDirectory(atPath: cache, withIntermediateDirectories: false)  // root's, 0755
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let mountpoint = TestScratch.directory + "cssp-e2e-fail-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: mountpoint, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: mountpoint) }
        // The credentials travel in the environment, never on a command line.
        let environment = [
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CSSP_ACCESS_KEY_ID": fixture.environment.accessKey,
            "CSSP_SECRET_ACCESS_KEY": fixture.environment.secret,
        ]
        let command =
            "setpriv --reuid=\(uid) --regid=\(uid) --clear-groups \(quoted(fixture.environment.binary)) "
            + "\(quoted(fixture.environment.serverURL + "/" + fixture.container)) \(quoted(mountpoint))"
        let refused = try shell(command, environment: environment)
        #expect(refused.status == 1, "\(refused.status) \(refused.stderr)")
        #expect(refused.stderr.contains("not a private directory"), "\(refused.stderr)")
        #expect(!isMounted(mountpoint))

        try FileManager.default.removeItem(atPath: cache)
        let made = try shell(command, environment: environment)
        if isMounted(mountpoint) { _ = try shell("umount \(quoted(mountpoint))") }
        var st = stat()
        #expect(lstat(cache, &st) == 0, "\(made.stderr)")
        #expect(st.st_uid == uid && st.st_mode & 0o777 == 0o700, "owner \(st.st_uid), mode \(String(st.st_mode & 0o777, radix: 8))")
    }

    @Test func wrongSecretIsAnAuthenticationError() throws {
        let fixture = try Fixture.get()
        let file = try passwdFile("\(fixture.environment.accessKey):not-the-secret\n")
        let (result, _) = try attempt(fixture, options: "-o passwd_file=\(file)")
        #expect(result.status != 0)
        #expect(result.stderr.contains("access denied for access key"), "\(result.stderr)")
        #expect(result.stderr.contains(file))
    }

    @Test func skewedClockIsReportedAsAClockProblem() throws {
        let fixture = try Fixture.get()
        let (result, _) = try attempt(
            fixture, options: "-o passwd_file=\(fixture.environment.passwdFile)",
            environment: ["CSSP_TEST_CLOCK_OFFSET_SECONDS": "3600"])
        #expect(result.status != 0)
        #expect(result.stderr.contains("clock"), "\(result.stderr)")
    }

    @Test func missingContainer() throws {
        let fixture = try Fixture.get()
        let (result, _) = try attempt(
            fixture, url: fixture.environment.serverURL + "/no-such-container-x",
            options: "-o passwd_file=\(fixture.environment.passwdFile)")
        #expect(result.status != 0)
        #expect(result.stderr.contains("does not exist"), "\(result.stderr)")
    }

    @Test func unreachableHost() throws {
        let fixture = try Fixture.get()
        let (result, _) = try attempt(fixture, url: "http://127.0.0.1:9/c", options: "-o passwd_file=\(fixture.environment.passwdFile)")
        #expect(result.status != 0)
        #expect(result.stderr.contains("cannot reach http://127.0.0.1:9"), "\(result.stderr)")
    }

    @Test func passwdFileReadableByOthersIsRefused() throws {
        let fixture = try Fixture.get()
        let file = try passwdFile("\(fixture.environment.accessKey):\(fixture.environment.secret)\n", mode: 0o644)
        let (result, _) = try attempt(fixture, options: "-o passwd_file=\(file)")
        #expect(result.status == 1)
        #expect(result.stderr.contains("chmod 600"), "\(result.stderr)")
    }

    @Test func missingMountpointAndBadOptions() throws {
        let fixture = try Fixture.get()
        let env = fixture.environment
        let missing = try shell("\(quoted(env.binary)) \(env.serverURL)/\(fixture.container) /nonexistent/cssp -o passwd_file=\(env.passwdFile)")
        #expect(missing.status == 1 && missing.stderr.contains("does not exist: create it"), "\(missing.stderr)")
        let bogus = try shell("\(quoted(env.binary)) \(env.serverURL)/\(fixture.container) /tmp -o bogus_option")
        #expect(bogus.status == 1 && bogus.stderr.contains("unknown option 'bogus_option'"), "\(bogus.stderr)")
    }
}
