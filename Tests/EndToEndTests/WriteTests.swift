import Foundation
import ObjectStoreTesting
import ObjectStore
import ObjectStoreHTTP
import Testing

/// Writes through the real mount: everyday tools against a fresh container per test.
@Suite(.serialized)
struct WriteTests {
    /// A new container and a mount of it with a private spool directory.
    struct Scene {
        let environment: Environment
        let container: String
        let cache: String
        let store: HTTPObjectStoreHandle

        init(_ name: String) throws {
            environment = try Environment.load()
            container = "w-\(name)-" + UUID().uuidString.prefix(6).lowercased()
            store = HTTPObjectStoreHandle(environment.store(container: container))
            try store.raw.createContainer()
            cache = TestScratch.directory + "cssp-e2e-cache-" + container
        }

        func mount(_ options: [String] = []) throws -> Mount {
            try Mount(environment, container: container, options: ["cache_dir=" + cache] + options)
        }

        /// Spool data files of this mount.
        func spoolFiles() throws -> [String] {
            let result = try shell("find \(quoted(cache)) -name '*.data' 2>/dev/null")
            return result.stdout.split(separator: "\n").map(String.init)
        }

        func cleanUp() { try? FileManager.default.removeItem(atPath: cache) }

        /// Makes the server refuse every PUT into this container (its fault file) until the
        /// returned file is removed.
        func refusePuts() throws -> String {
            guard let faultFile = ProcessInfo.processInfo.environment["CSSP_SERVER_FAULT_FILE"] else {
                throw HarnessError("CSSP_SERVER_FAULT_FILE is not set: run through scripts/test")
            }
            try "PUT 503 /\(container)/\n".writeReplacing(file: faultFile)
            return faultFile
        }

        /// The object at `key` once the server has it (a background upload stores it), polled for
        /// at most `seconds`; nil if it never came.
        func waitForObject(_ key: String, seconds: Double) -> [UInt8]? {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if let bytes = try? store.raw.getBytes(key: key, range: nil) { return bytes }
                usleep(200_000)
            }
            return nil
        }

        /// Writes `text` to `path` and closes it: "close failed: ERRNO" or "close succeeded".
        func writeAndClose(_ path: String, _ text: String) throws -> Output {
            let writer = """
                import sys
                f = open(sys.argv[1], "w"); f.write(sys.argv[2])
                try:
                    f.close()
                except OSError as e:
                    print("close failed:", e.errno); sys.exit(0)
                print("close succeeded")
                """
            return try shell("/usr/bin/python3 -c \(quoted(writer)) \(quoted(path)) \(quoted(text))")
        }
    }

    /// A tree of a few hundred files from 0 B to a few MiB, empty dirs, symlinks, unicode names, modes.
    static func makeTree(at root: String) throws {
        let script = """
            set -e
            mkdir -p \(quoted(root)) && cd \(quoted(root))
            mkdir -p docs/empty "ünïcödé dir" src/deep/er/still bin
            for i in $(seq 1 240); do head -c $(( (i * 7919) % 20000 )) /dev/urandom > src/file$i.dat; done
            for i in $(seq 1 6); do head -c $(( i * 700000 )) /dev/urandom > bin/big$i.bin; done
            : > docs/zero-bytes
            echo "naïve" > "ünïcödé dir/façade ✓.txt"
            echo deep > src/deep/er/still/leaf
            chmod 600 src/file1.dat; chmod 755 bin/big1.bin; chmod 700 src/deep
            ln -s ../src/file2.dat docs/link-to-file
            ln -s "../ünïcödé dir" docs/link-to-dir
            # Times in the past, to the nanosecond: a tree made this very second would let rsync skip
            # directory times it considers equal at one-second resolution.
            find . -mindepth 1 -exec touch -h -d '2023-04-05 06:07:08.123456789' {} +
            touch -h -d '2001-02-03 04:05:06.789' docs/zero-bytes docs/link-to-dir
            touch -d '2019-12-31 23:59:59.999999999' bin src/deep
            """
        let result = try shell(script)
        guard result.status == 0 else { throw HarnessError("making the tree failed: \(result.stderr)") }
    }

    /// name, mode, mtime (ns), size (files only), type of everything below `root`.
    static func statList(_ root: String) throws -> String {
        try shell(
            "cd \(quoted(root)) && find . -mindepth 1 \\( -type d -printf '%p %m %T@ - %y\\n' \\) -o -printf '%p %m %T@ %s %y\\n' | LC_ALL=C sort"
        ).stdout
    }

    @Test func rsyncIntoTheMountIsCompleteAndIdempotentAcrossRemounts() throws {
        let scene = try Scene("rsync")
        defer { scene.cleanUp() }
        let source = TestScratch.directory + "cssp-e2e-tree-" + scene.container
        defer { try? FileManager.default.removeItem(atPath: source) }
        try Self.makeTree(at: source)
        var mount = try scene.mount()
        let first = try shell("rsync -a \(quoted(source + "/")) \(quoted(mount.path("tree/")))")
        #expect(first.status == 0, "\(first.stderr)")
        let again = try shell("rsync -a -i \(quoted(source + "/")) \(quoted(mount.path("tree/")))")
        #expect(again.status == 0 && again.stdout.isEmpty, "second rsync transferred: \(again.stdout)")
        let diff = try shell("diff -r \(quoted(source)) \(quoted(mount.path("tree")))")
        #expect(diff.status == 0, "\(diff.stdout)\(diff.stderr)")
        #expect(try mount.unmount() == 0)

        mount = try scene.mount()
        let afterRemount = try shell("rsync -a -i \(quoted(source + "/")) \(quoted(mount.path("tree/")))")
        #expect(afterRemount.status == 0 && afterRemount.stdout.isEmpty, "after remount: \(afterRemount.stdout)")
        #expect(try shell("diff -r \(quoted(source)) \(quoted(mount.path("tree")))").status == 0)
        let expected = try Self.statList(source)
        let actual = try Self.statList(mount.path("tree"))
        #expect(expected == actual, "\(lineDiff(expected, actual))")
        #expect(try mount.unmount() == 0)
    }

    @Test func tarExtractsIntoAndArchivesOutOfTheMount() throws {
        let scene = try Scene("tar")
        defer { scene.cleanUp() }
        let work = TestScratch.directory + "cssp-e2e-tar-" + scene.container
        defer { try? FileManager.default.removeItem(atPath: work) }
        try Self.makeTree(at: work + "/src")
        let mount = try scene.mount()
        let steps = try shell("""
            set -e
            cd \(quoted(work))
            tar --numeric-owner -cf in.tar -C src .
            mkdir \(quoted(mount.path("t")))
            tar --numeric-owner -xpf in.tar -C \(quoted(mount.path("t")))
            tar --numeric-owner -cf out.tar -C \(quoted(mount.path("t"))) .
            mkdir back && tar -xpf out.tar -C back
            diff -r src back
            tar --numeric-owner -tvf in.tar | LC_ALL=C sort > in.list
            tar --numeric-owner -tvf out.tar | LC_ALL=C sort > out.list
            diff in.list out.list
            """)
        #expect(steps.status == 0, "\(steps.stdout)\(steps.stderr)")
        #expect(try mount.unmount() == 0)
    }

    @Test func fileOver5GiBIsStoredInPartsAndRemovedCompletely() throws {
        let scene = try Scene("big")
        defer { scene.cleanUp() }
        let local = TestScratch.directory + "cssp-e2e-6g-" + scene.container
        defer { try? FileManager.default.removeItem(atPath: local) }
        // 6 GiB, sparse, with random blocks at the start, across the 4 GiB and 5 GiB marks, and at the end.
        let make = try shell("""
            set -e
            truncate -s 6G \(quoted(local))
            for offset in 0 1000 4095 5119 6143; do
                dd if=/dev/urandom of=\(quoted(local)) bs=1M count=1 seek=$offset conv=notrunc status=none
            done
            """)
        #expect(make.status == 0, "\(make.stderr)")
        let mount = try scene.mount()
        let copy = try shell("cp \(quoted(local)) \(quoted(mount.path("six.bin")))")
        #expect(copy.status == 0, "\(copy.stderr)")
        #expect(try md5(mount.path("six.bin")) == md5(local))
        let info = try scene.store.raw.head(key: "six.bin")
        #expect(info.size == 6 << 30)
        switch Environment.dialect {
        case .cssp:
            #expect(info.manifest != nil)
            let parts = try scene.store.raw.listAll(prefix: ".cssp-parts/", delimiter: nil)
            #expect(parts.count == 192)  // 6 GiB in 32 MiB parts
        case .s3, .cos:
            // One multipart upload of 192 parts, finished with the file's attributes (no copy:
            // S3 copies at most 5 GiB).
            let s3 = try scene.environment.s3Store(bucket: scene.container)
            let object = try s3.head(key: "six.bin")
            #expect(object.etag.hasSuffix("-192") && object.metadata["mode"] == "33188", "\(object)")
            #expect(try s3.uploadsInProgress(prefix: "").isEmpty)
        }
        let visible = try shell("find \(quoted(mount.directory)) -mindepth 1")
        #expect(visible.stdout == mount.path("six.bin") + "\n")
        #expect(try shell("rm \(quoted(mount.path("six.bin")))").status == 0)
        #expect(try scene.store.raw.listAll(prefix: "", delimiter: nil).isEmpty)
        #expect(try mount.unmount() == 0)
    }

    @Test func randomWritesAppendsTruncatesAndEditsMatchAReference() throws {
        let scene = try Scene("edit")
        defer { scene.cleanUp() }
        let reference = TestScratch.directory + "cssp-e2e-ref-" + scene.container
        defer { try? FileManager.default.removeItem(atPath: reference) }
        var mount = try scene.mount()
        // The same operations on a local file and on the mount, by a real program.
        let program = """
            import os, random, sys
            rng = random.Random(20261122)
            def run(path):
                r = random.Random(20261122)
                with open(path, "wb") as f:
                    f.write(os.urandom(0) + bytes(r.getrandbits(8) for _ in range(300000)))
                fd = os.open(path, os.O_RDWR)
                for _ in range(40):
                    off = r.randrange(0, 400000); n = r.randrange(1, 9000)
                    os.pwrite(fd, bytes(r.getrandbits(8) for _ in range(n)), off)
                os.ftruncate(fd, 123457); os.ftruncate(fd, 200003)
                os.fsync(fd); os.close(fd)
                with open(path, "ab") as f: f.write(b"appended tail\\n")
                fd = os.open(path, os.O_RDWR)
                os.pwrite(fd, b"EDITED", 10); os.close(fd)
                os.truncate(path, 150001)
            run(sys.argv[1]); run(sys.argv[2])
            """
        let ran = try shell("/usr/bin/python3 -c \(quoted(program)) \(quoted(reference)) \(quoted(mount.path("edited.bin")))")
        #expect(ran.status == 0, "\(ran.stderr)")
        let expected = try md5(reference)
        #expect(try md5(mount.path("edited.bin")) == expected)
        #expect(try mount.unmount() == 0)
        // What the server holds, through a fresh mount.
        mount = try scene.mount()
        #expect(try md5(mount.path("edited.bin")) == expected)
        #expect(try mount.unmount() == 0)
    }

    @Test func editorStyleSavesKeepTheOriginalMode() throws {
        let scene = try Scene("editor")
        defer { scene.cleanUp() }
        var mount = try scene.mount()
        let file = mount.path("notes.txt")
        let steps = try shell("""
            set -e
            printf 'first line\\nsecond line\\n' > \(quoted(file))
            chmod 640 \(quoted(file))
            sed -i 's/second/2nd/' \(quoted(file))
            /usr/bin/python3 -c '
            import os, sys
            path = sys.argv[1]; tmp = os.path.join(os.path.dirname(path), ".notes.txt.swp")
            mode = os.stat(path).st_mode & 0o7777
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, b"first line\\n2nd line\\nthird line\\n"); os.fchmod(fd, mode); os.fsync(fd); os.close(fd)
            os.rename(tmp, path)' \(quoted(file))
            """)
        #expect(steps.status == 0, "\(steps.stderr)")
        #expect(try mount.unmount() == 0)
        mount = try scene.mount()
        let after = try shell("stat -c %a \(quoted(mount.path("notes.txt"))) && cat \(quoted(mount.path("notes.txt"))) && ls -A \(quoted(mount.directory))")
        #expect(after.stdout == "640\nfirst line\n2nd line\nthird line\nnotes.txt\n", "\(after.stdout)")
        #expect(try mount.unmount() == 0)
    }

    @Test func failedUploadIsAnErrorAtCloseAndTheBytesAreStoredLater() throws {
        let scene = try Scene("fault")
        defer { scene.cleanUp() }
        let mount = try scene.mount(["retries=1"])
        let faultFile = try scene.refusePuts()
        defer { try? FileManager.default.removeItem(atPath: faultFile) }
        let wrote = try scene.writeAndClose(mount.path("precious.txt"), "precious data\n")
        #expect(wrote.stdout == "close failed: 5\n", "\(wrote.stdout) \(wrote.stderr)")
        #expect(try scene.spoolFiles().count == 1)
        // The bytes are still readable through the mount while they wait.
        #expect(try shell("cat \(quoted(mount.path("precious.txt")))").stdout == "precious data\n")
        try FileManager.default.removeItem(atPath: faultFile)
        // The background retry stores them: wait for that (bounded), then check the server's copy.
        let stored = scene.waitForObject("precious.txt", seconds: 90)
        #expect(stored.map { String(decoding: $0, as: UTF8.self) } == "precious data\n")
        let spoolDeadline = Date().addingTimeInterval(10)
        while try !scene.spoolFiles().isEmpty && Date() < spoolDeadline { usleep(100_000) }
        #expect(try scene.spoolFiles().isEmpty)
        #expect(try mount.unmount() == 0)
    }

    /// Hostile-network issue, item 2: when `cache_dir` is full a write fails with ENOSPC, and the
    /// close after it must not store the bytes written so far as the whole file. The previous
    /// version stays on the server; the bytes are kept in the spool's `lost+found/`.
    @Test func aWriteThatFillsTheCacheIsNeverStoredAsTheWholeFile() throws {
        let scene = try Scene("full")
        defer { scene.cleanUp() }
        try scene.store.raw.put(
            key: "f.bin", body: .bytes(Array("the previous version\n".utf8)), contentType: nil, metadata: [:])
        try FileManager.default.createDirectory(atPath: scene.cache, withIntermediateDirectories: true)
        let small = try shell("mount -t tmpfs -o size=3m,mode=0700 tmpfs \(quoted(scene.cache))")
        try #require(small.status == 0, "\(small.stderr)")
        defer { _ = try? shell("umount \(quoted(scene.cache))") }
        let mount = try scene.mount()
        let writer = """
            import sys
            f = open(sys.argv[1], "wb")
            try:
                for _ in range(128):
                    f.write(b"x" * 65536)
                    f.flush()
            except OSError as e:
                print("write failed:", e.errno)
            try:
                f.close()
            except OSError as e:
                print("close failed:", e.errno); sys.exit(0)
            print("close succeeded")
            """
        let wrote = try shell("/usr/bin/python3 -c \(quoted(writer)) \(quoted(mount.path("f.bin")))")
        #expect(wrote.stdout.hasSuffix("close failed: 28\n"), "\(wrote.stdout) \(wrote.stderr)")
        #expect(try mount.unmount() == 0)
        let stored = try scene.store.raw.getBytes(key: "f.bin", range: nil)
        #expect(String(decoding: stored, as: UTF8.self) == "the previous version\n", "\(stored.count) bytes stored")
        let kept = try shell("find \(quoted(scene.cache)) -path '*lost+found*' -type f")
        #expect(kept.stdout.split(separator: "\n").count == 1, "\(kept.stdout)")
    }

    /// Hostile-network issue, items 1 and 9: close returned EIO (the store refused the upload) and
    /// the daemon is killed at once (kill -9: the OOM killer, a power cut). The journal note was
    /// written before close returned, so the next mount stores the bytes; it is made on the dead
    /// mountpoint itself ("Transport endpoint is not connected"), which it detaches first.
    @Test func theBytesOfAFailedCloseSurviveKillNine() throws {
        let scene = try Scene("kill")
        defer { scene.cleanUp() }
        let first = try scene.mount(["retries=1"])
        let faultFile = try scene.refusePuts()
        defer { try? FileManager.default.removeItem(atPath: faultFile) }
        let wrote = try scene.writeAndClose(first.path("crash.txt"), "written before a crash\n")
        #expect(wrote.stdout == "close failed: 5\n", "\(wrote.stdout) \(wrote.stderr)")
        kill(first.child.pid, SIGKILL)
        _ = first.waitForExit()
        try FileManager.default.removeItem(atPath: faultFile)
        var st = stat()
        #expect(stat(first.directory, &st) != 0 && errno == ENOTCONN, "the mountpoint is not dead")
        try withExtendedLifetime(first) {
            let second = try Mount(
                scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache], at: first.directory)
            let stored = scene.waitForObject("crash.txt", seconds: 60)
            #expect(stored.map { String(decoding: $0, as: UTF8.self) } == "written before a crash\n", "\(second.stderrText)")
            #expect(second.stderrText.contains("dead csspfs mount"), "\(second.stderrText)")
            #expect(try second.unmount() == 0)
        }
    }

    @Test func namespaceOperationsFollowPOSIX() throws {
        let scene = try Scene("names")
        defer { scene.cleanUp() }
        let mount = try scene.mount()
        let d = quoted(mount.directory)
        let err = quoted(TestScratch.directory + "cssp-e2e-err")
        let steps = try shell("""
            set -e
            cd \(d)
            mkdir -p a/b && echo one > a/b/f && echo two > g
            ! rmdir a 2>/dev/null
            mv g a/b/g && test ! -e g && test "$(cat a/b/g)" = two
            echo new > h && mv h a/b/f && test "$(cat a/b/f)" = new
            mv a z && test "$(cat z/b/f)" = new && test ! -e a
            mkdir empty && mv z/b/f empty/ && rm empty/f && rmdir empty
            ! ln z/b/g hardlink 2>/dev/null
            ln -s z/b/g sym && test "$(cat sym)" = two && test "$(readlink sym)" = z/b/g
            # FIFOs and sockets are empty objects of their type (tar, rsync -a); devices are EPERM.
            mkfifo -m 640 fifo && test -p fifo && test "$(stat -c %a fifo)" = 640
            python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("sock")' && test -S sock
            if mknod dev c 1 3 2>/dev/null; then exit 13; fi
            # A name that is not UTF-8 is refused (EILSEQ), never stored under a mangled key.
            if touch "$(printf 'bad\\351name')" 2>\(err); then exit 11; fi
            grep -qi 'multibyte' \(err)
            # A path whose key would pass the store's 1024 bytes: ENAMETOOLONG, not EIO.
            l=$(printf 'x%.0s' $(seq 1 250))
            mkdir -p "$l/$l/$l/$l"
            if mkdir "$l/$l/$l/$l/$l" 2>\(err); then exit 12; fi
            grep -qi 'too long' \(err)
            rm -r "$l"
            # fstat of an open file after unlink: st_nlink 0; rename flags we do not do: EINVAL.
            python3 -c '
            import os, ctypes
            fd = os.open("gone", os.O_CREAT | os.O_WRONLY, 0o644)
            os.unlink("gone")
            assert os.fstat(fd).st_nlink == 0, os.fstat(fd).st_nlink
            os.close(fd)
            libc = ctypes.CDLL(None, use_errno=True)
            open("w1", "w").close()
            assert libc.renameat2(-100, b"w1", -100, b"w2", 4) == -1 and ctypes.get_errno() == 22
            os.unlink("w1")
            '
            """)
        #expect(steps.status == 0, "\(steps.stdout)\(steps.stderr)")
        let keys = try scene.store.raw.listAll(prefix: "", delimiter: nil).map(\.name)
        #expect(keys == ["fifo", "sock", "sym", "z/", "z/b/", "z/b/g"], "\(keys)")
        #expect(try mount.unmount() == 0)
        // The types survive a remount: they come from the listing's content types.
        let again = try scene.mount()
        let types = try shell("cd \(quoted(again.directory)) && stat -c '%F %a' fifo sock")
        #expect(types.stdout.hasPrefix("fifo 640\nsocket "), "\(types.stdout)\(types.stderr)")
        // d_ino from readdir is the inode stat shows (find, du and ls -i rely on it), also for
        // names not looked up before the listing.
        let inodes = try shell(
            "cd \(quoted(again.directory)) && python3 -c 'import os; print(all(e.inode() == os.lstat(e.name).st_ino for e in os.scandir(\".\")))'")
        #expect(inodes.stdout == "True\n", "\(inodes.stdout)\(inodes.stderr)")
        #expect(try again.unmount() == 0)
    }
}

/// `HTTPObjectStore` is a class from a module the tests import; this keeps Scene Sendable-simple.
struct HTTPObjectStoreHandle {
    let raw: HTTPObjectStore
    init(_ raw: HTTPObjectStore) { self.raw = raw }
}

/// mount(8) and fstab: the installed helpers `/sbin/mount.cssp`, and `/sbin/umount.cssp` and
/// `/sbin/umount.fuse.cssp` (umount(8) runs one of them for a csspfs mount: it stores what is
/// owed, then unmounts).
@Suite(.serialized)
struct MountHelperTests {
    static let helpers = ["/sbin/mount.cssp", "/sbin/umount.cssp", "/sbin/umount.fuse.cssp"]

    /// Links the built binary as mount(8)'s and umount(8)'s helpers for the duration of `body`.
    func withHelper(_ environment: Environment, _ body: () throws -> Void) throws {
        var installed: [String] = []
        defer { for helper in installed { try? FileManager.default.removeItem(atPath: helper) } }
        for helper in Self.helpers {
            if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: helper) {
                guard target == environment.binary else {
                    throw HarnessError("\(helper) points at \(target), not the binary under test")
                }
            } else if FileManager.default.fileExists(atPath: helper) {
                throw HarnessError("\(helper) exists and is not the binary under test; remove it to run this test")
            } else {
                try FileManager.default.createSymbolicLink(atPath: helper, withDestinationPath: environment.binary)
                installed.append(helper)
            }
        }
        try body()
    }

    @Test func mountTypeCsspAndAnFstabLineMountAndUnmountCleanly() throws {
        let fixture = try Fixture.get()
        let env = fixture.environment
        let directory = TestScratch.directory + "cssp-e2e-helper-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let url = env.serverURL + "/" + fixture.container
        try withHelper(env) {
            // mount -t, with an empty environment as systemd gives helpers.
            let viaType = try shell(
                "env -i /bin/mount -t cssp \(url) \(quoted(directory)) -o passwd_file=\(quoted(env.passwdFile)),_netdev,nofail,helper=cssp")
            #expect(viaType.status == 0, "\(viaType.stderr)")
            #expect(isMounted(directory))
            #expect(try shell("cat \(quoted(directory + "/tree/top.txt"))").stdout == "top\n")
            #expect(try shell("umount \(quoted(directory))").status == 0)
            #expect(!isMounted(directory))

            let fstab = directory + ".fstab"
            defer { try? FileManager.default.removeItem(atPath: fstab) }
            try "\(url) \(directory) cssp _netdev,allow_other,passwd_file=\(env.passwdFile),noatime,x-systemd.automount,nofail 0 0\n"
                .writeReplacing(file: fstab)
            let viaFstab = try shell("env -i /bin/mount -T \(quoted(fstab)) \(quoted(directory))")
            #expect(viaFstab.status == 0, "\(viaFstab.stderr)")
            #expect(try shell("ls \(quoted(directory + "/tree"))").stdout.contains("top.txt"))
            #expect(try shell("grep -c ' \(directory) fuse.cssp ' /proc/mounts").stdout == "1\n")
            #expect(try shell("umount \(quoted(directory))").status == 0)
            #expect(!isMounted(directory))

            // mount -f (fake) checks everything and mounts nothing.
            let fake = try shell(
                "env -i /bin/mount -f -t cssp \(url) \(quoted(directory)) -o passwd_file=\(quoted(env.passwdFile))")
            #expect(fake.status == 0, "\(fake.stderr)")
            #expect(!isMounted(directory), "mount -f mounted")

            // A failing mount is a failing mount(8).
            let bad = try shell("env -i /bin/mount -t cssp \(env.serverURL)/no-such-container \(quoted(directory)) -o passwd_file=\(quoted(env.passwdFile))")
            #expect(bad.status != 0)
            #expect(bad.stderr.contains("does not exist"), "\(bad.stderr)")
            #expect(!isMounted(directory))
        }
    }
}

/// The lines only in `a` (-) and only in `b` (+), for failure messages.
func lineDiff(_ a: String, _ b: String) -> String {
    let left = Set(a.split(separator: "\n"))
    let right = Set(b.split(separator: "\n"))
    return (left.subtracting(right).sorted().map { "- " + $0 } + right.subtracting(left).sorted().map { "+ " + $0 })
        .joined(separator: "\n")
}
