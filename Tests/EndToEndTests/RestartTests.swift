import Foundation
import Locking
import ObjectStoreTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 40, step 1 (docs/restart-design.md): the process that mounts holds /dev/fuse and
/// serves nothing; a worker it forks serves. A worker killed with -9 is replaced, the kernel
/// sends the requests it had read again, and programs that work by path see no ENOTCONN. A
/// worker that keeps dying makes the mount answer EIO, never hang. The node numbers the kernel
/// holds survive (the node log), and so do file handles, open for reading or writing, and
/// directory streams (the handle log).
@Suite(.serialized)
struct RestartTests {
    struct Scene {
        let environment: Environment
        let container: String
        let cache: String
        let mount: Mount

        init(options: [String] = [], extraEnvironment: [String: String] = [:]) throws {
            environment = try Environment.load()
            (container, _, cache) = try environment.newContainer("restart")
            mount = try Mount(
                environment, container: container, options: ["cache_dir=" + cache] + options, extraEnvironment: extraEnvironment)
        }
    }

    /// Files of known content, read back by path after each kill.
    static let files: [(String, [UInt8])] = [
        ("a", Array("first file\n".utf8)),
        ("d/b", (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }),
        ("d/e/c", Array(repeating: 0x5a, count: 4096)),
    ]

    static func write(_ bytes: [UInt8], to path: String) throws {
        let url = URL(fileURLWithPath: path)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(bytes).write(to: url)
    }

    static func read(_ path: String) throws -> [UInt8] { Array(try Data(contentsOf: URL(fileURLWithPath: path))) }

    /// Reads names from a directory stream held open into `seen` (not "." or ".."), until it
    /// holds `count` or the stream ends.
    static func readNames(from stream: OpaquePointer, into seen: inout [String], until count: Int) {
        while seen.count < count, let entry = readdir(stream) {
            let name = withUnsafePointer(to: entry.pointee.d_name) { String(cString: UnsafeRawPointer($0).assumingMemoryBound(to: CChar.self)) }
            if name != "." && name != ".." { seen.append(name) }
        }
    }

    /// After a kill -9 of the worker the mount is still there: the same files read by path,
    /// the directories list, a new file is written and read back, the supervisor's log says
    /// why the worker died, and the unmount ends the supervisor with status 0.
    @Test func aKilledWorkerIsReplacedAndPathsKeepWorking() throws {
        let scene = try Scene()
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let mount = scene.mount
        for (name, bytes) in Self.files { try Self.write(bytes, to: mount.path(name)) }
        for (name, bytes) in Self.files { #expect(try Self.read(mount.path(name)) == bytes) }
        // A descriptor open for writing that the dead worker opened goes on writing.
        let held = open(mount.path("held"), O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        #expect(held >= 0)
        // A directory held open (as a process's working directory is): its number survives, so
        // names below it still resolve through it, and stat shows the same numbers.
        let directory = open(mount.path("d"), O_RDONLY | O_DIRECTORY)
        #expect(directory >= 0)
        var before = stat()
        #expect(fstat(directory, &before) == 0)
        var fileBefore = stat()
        #expect(stat(mount.path("d/b"), &fileBefore) == 0)
        for round in 1...3 {
            let (killed, next) = try mount.killWorker()
            #expect(killed != next)
            if round == 1 {
                #expect(Glibc.write(held, "x", 1) == 1, "errno \(errno)")
                #expect(close(held) == 0, "errno \(errno)")
            }
            var after = stat()
            #expect(fstat(directory, &after) == 0 && after.st_ino == before.st_ino, "kill \(round)")
            let below = openat(directory, "e/c", O_RDONLY)
            #expect(below >= 0, "a name below the held directory after kill \(round): errno \(errno)")
            if below >= 0 { close(below) }
            var fileAfter = stat()
            #expect(stat(mount.path("d/b"), &fileAfter) == 0 && fileAfter.st_ino == fileBefore.st_ino)
            for (name, bytes) in Self.files { #expect(try Self.read(mount.path(name)) == bytes, "\(name) after kill \(round)") }
            #expect(try FileManager.default.contentsOfDirectory(atPath: mount.path("d")).sorted() == ["b", "e"])
            let new = Array("made after kill \(round)\n".utf8)
            try Self.write(new, to: mount.path("new\(round)"))
            #expect(try Self.read(mount.path("new\(round)")) == new)
            #expect(mount.stderrText.contains("worker \(killed) killed by signal 9"), "\(mount.stderrText)")
            // --status names both processes and counts the restarts; --stats counts them too.
            let status = try shell("\(quoted(scene.environment.binary)) --status \(quoted(mount.directory))").stdout
            #expect(status.contains("supervisor: \(mount.child.pid)\nworker: \(next)\n"), "\(status)")
            #expect(status.contains("worker restarts: \(round)\n"), "\(status)")
            let stats = try shell("\(quoted(scene.environment.binary)) --stats \(quoted(mount.directory))").stdout
            #expect(stats.contains("cssp_worker_restarts \(round)\n"), "\(stats)")
        }
        close(directory)
        #expect(try mount.unmount() == 0)
        // Every byte reached the server.
        let store = scene.environment.store(container: scene.container)
        for round in 1...3 {
            var bytes: [UInt8] = []
            _ = try store.get(key: "new\(round)", range: nil) { bytes += $0 }
            #expect(bytes == Array("made after kill \(round)\n".utf8))
        }
        var heldBytes: [UInt8] = []
        _ = try store.get(key: "held", range: nil) { heldBytes += $0 }
        #expect(heldBytes == Array("x".utf8))
    }

    /// Descriptors open for writing survive the worker too (step 2): a file created and written
    /// in parts, a log appended to, and a reader of the file being written, each across three
    /// kills; a chmod between kills stays. Closed, everything is on the server once, with its
    /// mode, and the spool holds nothing more; with write-back as without.
    @Test(arguments: [false, true]) func descriptorsHeldForWritingGoOnAcrossKills(writeBack: Bool) throws {
        let scene = try Scene(options: writeBack ? ["writeback"] : [])
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let mount = scene.mount
        let first = Array("line 0\n".utf8)
        try Self.write(first, to: mount.path("d/log"))
        let created = open(mount.path("d/new"), O_RDWR | O_CREAT | O_EXCL, 0o644)
        let appending = open(mount.path("d/log"), O_WRONLY | O_APPEND)
        let reader = open(mount.path("d/new"), O_RDONLY)
        #expect(created >= 0 && appending >= 0 && reader >= 0, "errno \(errno)")
        let parts = (0..<4).map { part in (0..<50_000).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ part) } }
        var logged = first
        for round in 0...3 {
            if round > 0 { try mount.killWorker() }
            #expect(parts[round].withUnsafeBytes { Glibc.write(created, $0.baseAddress, $0.count) } == parts[round].count,
                "write after kill \(round): errno \(errno)")
            let line = Array("line \(round + 1)\n".utf8)
            #expect(Glibc.write(appending, line, line.count) == line.count, "append after kill \(round): errno \(errno)")
            logged += line
            var seen = [UInt8](repeating: 0, count: 50_000)
            let n = pread(reader, &seen, seen.count, off_t(round * 50_000))
            #expect(n == seen.count && seen == parts[round], "read after kill \(round): \(n), errno \(errno)")
            if round == 1 { #expect(fchmod(created, 0o600) == 0, "errno \(errno)") }
        }
        #expect(close(created) == 0 && close(appending) == 0 && close(reader) == 0, "errno \(errno)")
        var attributes = stat()
        #expect(stat(mount.path("d/new"), &attributes) == 0 && attributes.st_mode & 0o777 == 0o600)
        #expect(try Self.read(mount.path("d/new")) == parts.flatMap { $0 })
        #expect(try Self.read(mount.path("d/log")) == logged)
        #expect(try mount.unmount() == 0)
        let store = scene.environment.store(container: scene.container)
        var stored: [UInt8] = []
        let info = try store.get(key: "d/new", range: nil) { stored += $0 }
        #expect(stored == parts.flatMap { $0 } && info.metadata["mode"] == "0600", "\(info.metadata)")
        var log: [UInt8] = []
        _ = try store.get(key: "d/log", range: nil) { log += $0 }
        #expect(log == logged)
        let left = (FileManager.default.enumerator(atPath: scene.cache)?.allObjects as? [String] ?? []).filter { $0.hasSuffix(".data") }
        #expect(left.isEmpty, "\(left)")
    }

    /// What the kernel holds open survives the worker (step 2): a descriptor open for reading
    /// goes on where it was, a directory stream read partly goes on with the names it had not
    /// shown (each once), through three kills.
    @Test func aDescriptorHeldForReadingAndADirectoryStreamGoOnAcrossKills() throws {
        let scene = try Scene()
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let mount = scene.mount
        let bytes = Self.files[1].1
        try Self.write(bytes, to: mount.path("d/b"))
        // Names long enough that the stream needs several getdents calls (32 KiB each in glibc).
        let store = scene.environment.store(container: scene.container)
        let names = (0..<400).map { String(format: "%03d-", $0) + String(repeating: "n", count: 200) }
        DispatchQueue.concurrentPerform(iterations: 8) { lane in
            for name in names.enumerated().filter({ $0.offset % 8 == lane }).map(\.element) {
                _ = try? store.put(key: "many/" + name, body: .bytes([]), contentType: "text/plain", metadata: [:], onlyIfAbsent: false)
            }
        }
        let fd = open(mount.path("d/b"), O_RDONLY)
        #expect(fd >= 0)
        guard let stream = opendir(mount.path("many")) else {
            Issue.record("opendir: errno \(errno)")
            close(fd)
            return
        }
        var seen: [String] = []
        func readNames(_ count: Int) { Self.readNames(from: stream, into: &seen, until: count) }
        var read: [UInt8] = []
        func readBytes(_ count: Int) {
            var buffer = [UInt8](repeating: 0, count: count)
            let n = pread(fd, &buffer, count, off_t(read.count))
            #expect(n == count, "pread at \(read.count): \(n), errno \(errno)")
            if n > 0 { read += buffer[0..<n] }
        }
        readNames(10)
        readBytes(100_000)
        for round in 1...3 {
            try mount.killWorker()
            readNames(10 + 130 * round)
            if round < 3 { readBytes(100_000) }
        }
        readBytes(bytes.count - read.count)
        readNames(names.count + 1)
        #expect(read == bytes)
        #expect(seen == names, "\(seen.count) names, \(Set(seen).count) of them different")
        #expect(close(fd) == 0 && closedir(stream) == 0)
        #expect(try mount.unmount() == 0)
    }

    /// A planned restart (step 4): `mount.cssp --restart` makes the worker answer what it is
    /// doing and exit, and the supervisor starts the binary installed at the path it was started
    /// from, here a new copy put over the old one as an upgrade does. A workload by path goes on
    /// without an error, a descriptor held for appending and one for reading and a directory
    /// stream go on, the new worker runs the new file, and six restarts in a row are no deaths
    /// (five would make the supervisor give up).
    @Test func aRestartStartsTheInstalledBinaryAndNoProgramNotices() throws {
        let environment = try Environment.load()
        let (container, _, cache) = try environment.newContainer("restart")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let installed = TestScratch.directory + "installed-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: installed, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: installed) }
        let binary = installed + "/mount.cssp"
        try FileManager.default.copyItem(atPath: environment.binary, toPath: binary)
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + cache], binary: binary)
        try Self.write(Array("line 0\n".utf8), to: mount.path("d/log"))
        for i in 0..<200 { try Self.write(Array("name \(i)".utf8), to: mount.path("many/n\(i)")) }
        let appending = open(mount.path("d/log"), O_WRONLY | O_APPEND)
        let reading = open(mount.path("d/log"), O_RDONLY)
        guard appending >= 0, reading >= 0, let stream = opendir(mount.path("many")) else {
            Issue.record("open: errno \(errno)")
            return
        }
        var seen: [String] = []
        func readNames(_ count: Int) { Self.readNames(from: stream, into: &seen, until: count) }
        readNames(20)
        // The workload: by path, one call after another, each one checked.
        let failures = Locked<[String]>([])
        let stop = Locked(false)
        let directory = mount.directory
        let thread = Thread {
            var round = 0
            while !stop.withLock({ $0 }) {
                let path = directory + "/w\(round % 7)"
                let text = "round \(round)"
                do {
                    try Self.write(Array(text.utf8), to: path)
                    if try Self.read(path) != Array(text.utf8) { failures.withLock { $0.append("\(path) read other bytes") } }
                } catch {
                    failures.withLock { $0.append("\(path): \(error)") }
                }
                round += 1
            }
        }
        thread.start()
        var logged = Array("line 0\n".utf8)
        var workers: Set<pid_t> = [try #require(mount.worker())]
        for restart in 1...6 {
            // An upgrade: a new file at the installed path (the running one stays, unlinked).
            try FileManager.default.copyItem(atPath: environment.binary, toPath: binary + ".new")
            #expect(rename(binary + ".new", binary) == 0)
            let answer = try shell("\(quoted(binary)) --restart \(quoted(mount.directory))")
            #expect(answer.status == 0 && answer.stdout.contains("serves in place of worker"), "\(answer)")
            let worker = try #require(mount.worker())
            #expect(!workers.contains(worker), "restart \(restart): the same worker serves")
            workers.insert(worker)
            let exe = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(worker)/exe")
            #expect(exe == binary, "restart \(restart): the new worker runs \(exe)")
            let line = Array("line \(restart)\n".utf8)
            #expect(Glibc.write(appending, line, line.count) == line.count, "append after restart \(restart): errno \(errno)")
            logged += line
            var buffer = [UInt8](repeating: 0, count: 4096)
            let n = pread(reading, &buffer, buffer.count, 0)
            #expect(n == logged.count && Array(buffer[0..<max(0, n)]) == logged, "read after restart \(restart): \(n), errno \(errno)")
            readNames(20 + 30 * restart)
        }
        stop.withLock { $0 = true }
        while !thread.isFinished { usleep(10_000) }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        readNames(201)
        #expect(Set(seen) == Set((0..<200).map { "n\($0)" }) && seen.count == 200, "\(seen.count) names")
        #expect(close(appending) == 0 && close(reading) == 0 && closedir(stream) == 0)
        let status = try shell("\(quoted(binary)) --status \(quoted(mount.directory))").stdout
        #expect(status.contains("worker restarts: 6\n") && status.contains("worker binary: \(binary)\n"), "\(status)")
        let log = mount.stderrText
        #expect(!log.contains("killed") && !log.contains("no new worker"), "\(log)")
        #expect(try Self.read(mount.path("d/log")) == logged)
        #expect(try mount.unmount() == 0)
        var stored: [UInt8] = []
        _ = try environment.store(container: container).get(key: "d/log", range: nil) { stored += $0 }
        #expect(stored == logged)
    }

    /// A request the worker did and died before answering (step 3): the kernel sends it again to
    /// the successor, which finds it done (the directory made, the name gone, the file moved)
    /// and answers as done, never EEXIST or ENOENT for the program's own change, and never does
    /// it twice. The same program runs three times, with the worker dying (a fault point, by
    /// SIGKILL) after doing other operations each time: at most four deaths per mount, below
    /// the supervisor's limit.
    @Test(arguments: ["mkdir,create,write,setattr", "symlink,mknod,rename", "unlink,rmdir"])
    func aRequestDoneByAWorkerThatDiedBeforeAnsweringIsAnsweredAsDone(dying: String) throws {
        let scene = try Scene(extraEnvironment: ["CSSP_TEST_WORKER_DIES_BEFORE_ANSWERING": dying])
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let mount = scene.mount
        let first = try #require(mount.worker())
        func succeeds(_ what: String, _ result: Int32) {
            #expect(result >= 0, "\(what): errno \(errno) (\(String(cString: strerror(errno))))\n\(mount.stderrText)")
        }
        succeeds("mkdir", mkdir(mount.path("d"), 0o755))
        let fd = open(mount.path("d/f"), O_WRONLY | O_CREAT | O_EXCL, 0o644)
        succeeds("create", fd)
        succeeds("write", Int32(Glibc.write(fd, "hello", 5)))
        succeeds("fchmod", fchmod(fd, 0o600))
        succeeds("close", close(fd))
        #expect(try Self.read(mount.path("d/f")) == Array("hello".utf8))
        var st = stat()
        succeeds("stat", stat(mount.path("d/f"), &st))
        #expect(st.st_mode & 0o777 == 0o600)
        succeeds("symlink", symlink("f", mount.path("d/l")))
        succeeds("mkfifo", mkfifo(mount.path("d/p"), 0o644))
        succeeds("rename", rename(mount.path("d/f"), mount.path("d/g")))
        #expect(try FileManager.default.contentsOfDirectory(atPath: mount.path("d")).sorted() == ["g", "l", "p"])
        let store = scene.environment.store(container: scene.container)
        var moved: [UInt8] = []
        let info = try store.get(key: "d/g", range: nil) { moved += $0 }
        #expect(moved == Array("hello".utf8) && info.metadata["mode"] == "0600", "\(info.metadata)")
        for name in ["l", "p", "g"] { succeeds("unlink \(name)", unlink(mount.path("d/" + name))) }
        succeeds("rmdir", rmdir(mount.path("d")))
        #expect(try FileManager.default.contentsOfDirectory(atPath: mount.directory).isEmpty)
        // Each operation of the plan killed its worker once, and its successor answered it: as
        // done where doing it again would fail (ENOENT); the others it did again, which does
        // what they did (a write, a chmod, a PUT of the same directory marker or empty object).
        let plan = dying.split(separator: ",").map(String.init)
        let log = mount.stderrText
        for operation in plan where ["unlink", "rmdir", "rename"].contains(operation) {
            #expect(log.contains("notice: \(operation) ") && log.contains("was done by that worker: answered as done"), "\(log)")
        }
        let deaths = plan.count
        #expect(mount.worker() != first)
        let stats = try shell("\(quoted(scene.environment.binary)) --stats \(quoted(mount.directory))").stdout
        #expect(stats.contains("cssp_worker_restarts \(deaths)\n"), "\(stats)")
        #expect(try mount.unmount() == 0)
        // Nothing left behind (the unmount sent the deletes a rename journals), nothing made twice.
        #expect(try store.list(prefix: "", delimiter: nil, marker: nil, limit: 100).entries.isEmpty)
    }

    /// A workload by path (open, read, close; stat; readdir; create) runs in a thread while the
    /// worker is killed three times: no call fails with ENOTCONN or ECONNABORTED (the mount
    /// never went), and every call after the last worker took over succeeds.
    @Test func aWorkloadAcrossKillsNeverSeesTheMountGo() throws {
        let scene = try Scene()
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let mount = scene.mount
        for (name, bytes) in Self.files { try Self.write(bytes, to: mount.path(name)) }
        let stop = Locked(false)
        let failures = Locked<[String: Int]>([:])
        let rounds = Locked(0)
        let directory = mount.directory
        let thread = Thread {
            func path(_ relative: String) -> String { directory + "/" + relative }
            var round = 0
            while !stop.withLock({ $0 }) {
                round += 1
                for (name, bytes) in Self.files {
                    do {
                        if try Self.read(path(name)) != bytes { failures.withLock { $0["wrong bytes", default: 0] += 1 } }
                    } catch {
                        let code = ((error as NSError).userInfo[NSUnderlyingErrorKey] as? NSError)?.code ?? -1
                        failures.withLock { $0["read: errno \(code)", default: 0] += 1 }
                    }
                }
                var st = stat()
                if lstat(path("d/e"), &st) != 0 { failures.withLock { $0["lstat: errno \(errno)", default: 0] += 1 } }
                if opendir(path("d")).map({ closedir($0) }) == nil {
                    failures.withLock { $0["opendir: errno \(errno)", default: 0] += 1 }
                }
                let fd = open(path("w\(round % 5)"), O_WRONLY | O_CREAT | O_TRUNC, 0o644)
                if fd < 0 {
                    failures.withLock { $0["create: errno \(errno)", default: 0] += 1 }
                } else {
                    _ = "round \(round)".withCString { Glibc.write(fd, $0, strlen($0)) }
                    if close(fd) != 0 { failures.withLock { $0["close: errno \(errno)", default: 0] += 1 } }
                }
                rounds.withLock { $0 = round }
            }
        }
        thread.start()
        func waitForRounds(_ count: Int) -> Bool {
            let start = rounds.withLock { $0 }
            return poll(seconds: 30, interval: 5_000) { rounds.withLock { $0 } >= start + count }
        }
        #expect(waitForRounds(3))
        for _ in 1...3 {
            _ = try mount.killWorker()
            #expect(waitForRounds(3), "the workload goes on after the kill")
        }
        let before = failures.withLock { $0 }
        #expect(waitForRounds(5))
        stop.withLock { $0 = true }
        while !thread.isFinished { usleep(10_000) }
        let after = failures.withLock { $0 }
        let gone = after.filter { $0.key.hasSuffix("errno \(ENOTCONN)") || $0.key.hasSuffix("errno \(ECONNABORTED)") }
        #expect(gone.isEmpty, "\(after)")
        #expect(after == before, "calls failed after the last worker took over: \(after)")
        #expect(try mount.unmount() == 0)
    }

    /// A request the worker had read when it died is sent again by the kernel (FUSE_NOTIFY_RESEND)
    /// and answered by its successor: a `stat` whose lookup waits on a slow server when the
    /// worker is killed returns the file, and `--stats` counts the resent request. On a kernel
    /// that cannot send it again (before 6.9: pretended here), the successor answers it with EIO
    /// instead of leaving it to hang, and says so.
    @Test(arguments: [true, false]) func aRequestInFlightWhenTheWorkerDiesIsAnsweredByItsSuccessor(kernelResends: Bool) throws {
        let scene = try Scene(
            options: ["poll_s=0"], extraEnvironment: kernelResends ? [:] : ["CSSP_TEST_KERNEL_WITHOUT_RESEND": "1"])
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let mount = scene.mount
        let store = scene.environment.store(container: scene.container)
        _ = try store.put(
            key: "elsewhere/other", body: .bytes(Array("made elsewhere".utf8)), contentType: "text/plain", metadata: [:],
            onlyIfAbsent: false)
        let faultFile = try scene.environment.faultFile()
        defer { try? "".writeReplacing(file: faultFile) }
        // The first two requests about the container (the lookup's) wait 5 s at the server.
        try "* stall=5,times=2 /\(scene.container)\n".writeReplacing(file: faultFile)
        let result = Locked<(rc: Int32, size: Int64)?>(nil)
        let path = mount.path("elsewhere/other")
        let thread = Thread {
            var st = stat()
            let rc = stat(path, &st)
            result.withLock { $0 = (rc == 0 ? 0 : errno, Int64(st.st_size)) }
        }
        thread.start()
        let log = scene.environment.serverDirectory! + "/log/proxy.log"
        let stalled = poll(seconds: 20, interval: 5_000) {
            ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains("injecting network faults for GET /\(scene.container)")
                || ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains("injecting network faults for HEAD /\(scene.container)/elsewhere")
        }
        #expect(stalled, "the lookup never reached the server")
        #expect(result.withLock { $0 } == nil, "the stat must still wait when the worker dies")
        try mount.killWorker()
        #expect(poll(seconds: 20, interval: 5_000) { result.withLock { $0 } != nil }, "the stat was never answered")
        guard kernelResends else {
            #expect(result.withLock { $0 }?.rc == EIO, "\(String(describing: result.withLock { $0 }))")
            #expect(mount.stderrText.contains("1 request(s) the dead worker had read answered with EIO"), "\(mount.stderrText)")
            let status = try shell("\(quoted(scene.environment.binary)) --status \(quoted(mount.directory))").stdout
            #expect(status.contains("kernel resends a dead worker's requests: no"), "\(status)")
            // What follows is served.
            var st = stat()
            #expect(stat(path, &st) == 0 && st.st_size == 14)
            #expect(try mount.unmount() == 0)
            return
        }
        #expect(result.withLock { $0 }?.rc == 0 && result.withLock { $0 }?.size == 14, "\(String(describing: result.withLock { $0 }))")
        let stats = try shell("\(quoted(scene.environment.binary)) --stats \(quoted(mount.directory))").stdout
        let resent = stats.split(separator: "\n").first { $0.hasPrefix("cssp_resent_requests ") }.flatMap { Double($0.split(separator: " ")[1]) }
        #expect((resent ?? 0) >= 1, "\(stats)")
        #expect(try mount.unmount() == 0)
    }

    /// The supervisor killed with -9 ends the mount, as documented: its worker ends with it,
    /// the mountpoint answers ENOTCONN, and the next mount there detaches it and serves.
    @Test func aSupervisorKilledWithMinus9EndsTheMount() throws {
        let scene = try Scene()
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let first = scene.mount
        guard let worker = first.worker() else { throw HarnessError("no worker: \(first.stderrText)") }
        #expect(kill(first.child.pid, SIGKILL) == 0)
        _ = first.waitForExit()
        #expect(Mount.hasEnded(worker), "the worker outlived its supervisor")
        var st = statvfs()
        #expect(statvfs(first.directory, &st) != 0 && errno == ENOTCONN)
        try withExtendedLifetime(first) {
            let next = try Mount(
                scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache], at: first.directory)
            #expect(next.stderrText.contains("dead csspfs mount"), "\(next.stderrText)")
            #expect(try next.unmount() == 0)
        }
    }

    /// A worker that dies again and again (five times within 30 s) is not started once more:
    /// every request fails with EIO, none hangs, the log says why, and the mount unmounts.
    @Test func aWorkerThatKeepsDyingMakesTheMountAnswerEIO() throws {
        let scene = try Scene()
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let mount = scene.mount
        try Self.write(Array("x".utf8), to: mount.path("x"))
        for _ in 1...4 { _ = try mount.killWorker() }
        guard let last = mount.worker() else { throw HarnessError("no worker") }
        #expect(kill(last, SIGKILL) == 0)
        #expect(poll(seconds: 20) { mount.stderrText.contains("no new worker") }, "\(mount.stderrText)")
        #expect(mount.worker() == nil)
        var st = stat()
        #expect(stat(mount.path("x"), &st) != 0 && errno == EIO)
        #expect(open(mount.path("y"), O_WRONLY | O_CREAT, 0o644) < 0 && errno == EIO)
        #expect(try mount.unmount() != 0, "the supervisor exits with the last worker's status (killed)")
        #expect(!isMounted(mount.directory))
    }
}
