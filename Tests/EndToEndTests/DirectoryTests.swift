import Foundation
import ObjectStoreTesting
import Testing

/// Issue 24 through the real binary: directories under concurrent creates, `rewinddir`, and
/// `d_ino`.
@Suite(.serialized)
struct DirectoryTests {
    /// Listing pages the daemon asked for so far (`--stats`).
    static func listings(_ environment: Environment, _ mount: Mount) throws -> Int {
        let result = try shell("\(quoted(environment.binary)) --stats \(quoted(mount.directory))")
        guard result.status == 0, let value = StatusTests.sample(result.stdout, "cssp_listings_total") else {
            throw HarnessError("--stats has no cssp_listings_total: \(result.stderr)")
        }
        return Int(value)
    }

    /// Four processes creating files in one directory: each create updates the mount's listing
    /// of it, so the directory is not listed again per file (it was: one listing per create, and
    /// creating slowed as the directory grew).
    @Test func concurrentCreatesInOneDirectoryDoNotListItAgain() throws {
        let environment = try Environment.load()
        let (container, _, cache) = try environment.newContainer("creates")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        // The listings counted are the lookups'; the poll's (one a second, poll_s) are not.
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + cache, "poll_s=0"])
        let d = quoted(mount.path("d"))
        #expect(try shell("mkdir \(d)").status == 0)
        let before = try Self.listings(environment, mount)
        let since = Date().timeIntervalSince1970
        let perProcess = 200
        let creates = try shell(
            """
            for p in 1 2 3 4; do
              ( for i in $(seq 1 \(perProcess)); do : > \(d)/p$p-$i || exit 1; done ) &
            done
            fail=0; for job in $(jobs -p); do wait $job || fail=1; done; exit $fail
            """)
        #expect(creates.status == 0, "\(creates.stderr)")
        let listed = try Self.listings(environment, mount) - before
        print("\(4 * perProcess) creates by 4 processes in one directory: \(listed) listing requests")
        // A listing per dir_timeout (5 s) at most, and a few peeks: not one per create (800).
        #expect(listed <= 20, "\(listed) listings for \(4 * perProcess) creates")
        // At most one request per create beyond its upload (the server's own count).
        let sent = try environment.clientRequests(container: container, since: since)
        let others = sent.filter { $0.key != "PUT" }.values.reduce(0, +)
        // Over S3 (s3api ignores If-None-Match), a HEAD before each new name's PUT besides.
        let perCreate = Environment.dialect == .cssp ? 1 : 2
        #expect(sent["PUT"] == 4 * perProcess && others <= perCreate * 4 * perProcess, "\(sent)")
        #expect(try shell("ls \(d) | wc -l").stdout == "\(4 * perProcess)\n")
        // Every name readdir shows has the inode its stat shows (the kernel still holds the
        // names it created).
        let inodes = try walkStream(mount.path("d"), ["read:created"])
        #expect(inodes == ["created \(4 * perProcess) names, 0 d_ino != st_ino: "])
        #expect(try mount.unmount() == 0)
    }

    /// A Python program that walks one directory stream through libc (opendir, readdir64,
    /// rewinddir) and checks every entry's d_ino against lstat's st_ino. Steps, in order:
    /// `read:LABEL` (read to the end; prints `LABEL N names, M d_ino != st_ino: ...`),
    /// `rewind`, `create:PREFIX:N`, `unlink:PREFIX:N`, `stat` (lstat every name now present).
    static let stream = #"""
        import ctypes, os, sys
        class Dirent(ctypes.Structure):
            _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64), ("d_reclen", ctypes.c_ushort),
                        ("d_type", ctypes.c_ubyte), ("d_name", ctypes.c_char * 256)]
        libc = ctypes.CDLL(None, use_errno=True)
        libc.opendir.restype = ctypes.c_void_p
        libc.opendir.argtypes = [ctypes.c_char_p]
        libc.readdir64.restype = ctypes.POINTER(Dirent)
        libc.readdir64.argtypes = [ctypes.c_void_p]
        libc.rewinddir.argtypes = [ctypes.c_void_p]
        directory = sys.argv[1]
        stream = libc.opendir(directory.encode())
        if not stream:
            sys.exit("opendir failed: %s" % os.strerror(ctypes.get_errno()))
        for step in sys.argv[2:]:
            verb, _, rest = step.partition(":")
            if verb == "read":
                seen = {}
                while True:
                    entry = libc.readdir64(stream)
                    if not entry:
                        break
                    name = entry.contents.d_name.decode()
                    if name not in (".", ".."):
                        seen[name] = entry.contents.d_ino
                wrong = sorted("%s:%d/%d" % (name, ino, os.lstat(os.path.join(directory, name)).st_ino)
                               for name, ino in seen.items() if os.lstat(os.path.join(directory, name)).st_ino != ino)
                print("%s %d names, %d d_ino != st_ino: %s" % (rest, len(seen), len(wrong), " ".join(wrong[:5])))
            elif verb == "rewind":
                libc.rewinddir(stream)
            elif verb in ("create", "unlink"):
                prefix, count = rest.split(":")
                for i in range(int(count)):
                    path = os.path.join(directory, "%s%d" % (prefix, i))
                    if verb == "create":
                        open(path, "w").close()
                    else:
                        os.unlink(path)
            elif verb == "stat":
                for name in os.listdir(directory):
                    os.lstat(os.path.join(directory, name))
        """#

    func walkStream(_ directory: String, _ steps: [String]) throws -> [String] {
        let script = TestScratch.directory + "cssp-e2e-stream-" + UUID().uuidString.prefix(8) + ".py"
        try Self.stream.write(toFile: script, atomically: false, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: script) }
        let result = try shell("/usr/bin/python3 \(quoted(script)) \(quoted(directory)) " + steps.map(quoted).joined(separator: " "))
        guard result.status == 0 else { throw HarnessError("directory stream failed: \(result.stderr)") }
        return result.stdout.split(separator: "\n").map(String.init)
    }

    /// POSIX: after `rewinddir` the stream shows the directory as it is now. Both when the
    /// stream was read before the change and when it was only opened (the mount had the
    /// directory's listing remembered from an `ls` just before).
    @Test func rewinddirShowsWhatWasCreatedAndRemovedSinceOpendir() throws {
        let environment = try Environment.load()
        let (container, store, cache) = try environment.newContainer("rewind")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        for i in 0..<10 { try store.put(key: "d/old\(i)", body: .bytes(Array("x".utf8)), contentType: nil, metadata: [:]) }
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + cache])
        let d = mount.path("d")
        _ = try shell("ls \(quoted(d))")
        let unread = try walkStream(d, ["create:new:300", "unlink:old:5", "rewind", "read:after"])
        #expect(unread == ["after 305 names, 0 d_ino != st_ino: "])
        let read = try walkStream(d, ["read:before", "create:more:300", "unlink:new:100", "rewind", "read:after"])
        #expect(read == ["before 305 names, 0 d_ino != st_ino: ", "after 505 names, 0 d_ino != st_ino: "])
        #expect(try mount.unmount() == 0)
    }

    /// d_ino is the st_ino of the same name: for names never looked up (a fresh mount; files,
    /// empty files and directories another client made), after they are looked up, across
    /// `rewinddir`, while names come and go, and after the kernel forgot them.
    @Test func dInoIsTheInodeStatShowsThroughChanges() throws {
        let environment = try Environment.load()
        let (container, store, cache) = try environment.newContainer("dino")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        for i in 0..<20 {
            try store.put(key: "d/file\(i)", body: .bytes(Array("data \(i)".utf8)), contentType: nil, metadata: [:])
            try store.put(key: "d/empty\(i)", body: .bytes([]), contentType: nil, metadata: [:])
            try store.put(key: "d/sub\(i)/x", body: .bytes(Array("x".utf8)), contentType: nil, metadata: [:])
        }
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + cache])
        let d = mount.path("d")
        let fresh = try walkStream(d, ["read:fresh", "stat", "rewind", "read:looked-up"])
        #expect(fresh == ["fresh 60 names, 0 d_ino != st_ino: ", "looked-up 60 names, 0 d_ino != st_ino: "])
        let changing = try walkStream(d, [
            "read:first", "create:n:30", "unlink:n:10", "rewind", "read:changed", "stat", "rewind", "read:again",
        ])
        #expect(
            changing == [
                "first 60 names, 0 d_ino != st_ino: ", "changed 80 names, 0 d_ino != st_ino: ",
                "again 80 names, 0 d_ino != st_ino: ",
            ])
        // The kernel forgets every name it held (dentries and inodes dropped): new nodes, new
        // numbers perhaps, but d_ino and st_ino agree still.
        #expect(try shell("sync; echo 2 > /proc/sys/vm/drop_caches").status == 0)
        let forgotten = try walkStream(d, ["read:forgotten", "stat", "rewind", "read:relooked"])
        #expect(forgotten == ["forgotten 80 names, 0 d_ino != st_ino: ", "relooked 80 names, 0 d_ino != st_ino: "])
        #expect(try mount.unmount() == 0)
    }
}
