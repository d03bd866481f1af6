import Foundation
import ObjectStoreTesting

#if canImport(Glibc)
import Glibc
#endif
import Logging
import MountCSSPConfig
import ObjectStore
import ObjectStoreHTTP
import Testing

/// What the README's test command (scripts/test) provides: a running local CSSP server and the
/// built mount.cssp. Missing pieces fail the tests with a message, never skip them.
struct Environment {
    let serverURL: String
    let passwdFile: String
    let accessKey: String
    let secret: String
    let binary: String
    /// The local server's directory (its logs are in `log/`), when the test command says where.
    let serverDirectory: String?

    static func load() throws -> Environment {
        let env = ProcessInfo.processInfo.environment
        guard let url = env["CSSP_SERVER_URL"], let passwd = env["CSSP_PASSWD_FILE"],
            let key = env["CSSP_TEST_ACCESS_KEY"], let secret = env["CSSP_TEST_SECRET_KEY"]
        else {
            throw HarnessError("end-to-end tests need the local CSSP server: run them through scripts/test")
        }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let binary = env["CSSP_MOUNT_BINARY"] ?? root.appendingPathComponent(".build/debug/mount.cssp").path
        guard FileManager.default.isExecutableFile(atPath: binary) else {
            throw HarnessError("no mount.cssp binary at \(binary): build it first (scripts/test does)")
        }
        return Environment(
            serverURL: url, passwdFile: passwd, accessKey: key, secret: secret, binary: binary,
            serverDirectory: env["CSSP_SERVER_DIR"])
    }

    /// The test server's fault file (server/cssp_auth.py, parse_faults): a test writes its rules
    /// and removes it when done.
    func faultFile() throws -> String {
        guard let path = ProcessInfo.processInfo.environment["CSSP_SERVER_FAULT_FILE"] else {
            throw HarnessError("CSSP_SERVER_FAULT_FILE is not set: run through scripts/test")
        }
        return path
    }

    /// A new container `PREFIX-xxxxxx`, a client for it, and the path of a cache directory of
    /// its own (not created; the caller removes it).
    func newContainer(_ prefix: String) throws -> (name: String, store: HTTPObjectStore, cache: String) {
        let name = prefix + "-" + UUID().uuidString.prefix(6).lowercased()
        let store = store(container: name)
        try store.createContainer()
        return (name, store, TestScratch.directory + "cssp-e2e-cache-" + name)
    }

    /// The store API mounts use unless a test names one: `CSSP_E2E_DIALECT` (cssp, the
    /// default; s3: the same server through Swift's s3api; cos: through the COS front, for
    /// containers named BUCKET-APPID).
    static var dialect: StoreDialect {
        ProcessInfo.processInfo.environment["CSSP_E2E_DIALECT"].flatMap(StoreDialect.init(rawValue:)) ?? .cssp
    }

    /// How the mount stores permissions `mode` in `X-Object-Meta-Mode` (`x-amz-meta-mode`):
    /// CSSP's octal permissions, or over S3 s3fs's decimal `st_mode` of a file.
    static func storedMode(_ mode: UInt16) -> String {
        dialect == .cssp ? "0" + String(mode, radix: 8) : String(0o100000 | UInt32(mode))
    }

    /// A passwd file of the S3 peer key scripts/cssp-server made (`account:user:secret`), mode 600.
    func s3PasswdFile() throws -> String {
        let env = ProcessInfo.processInfo.environment
        guard let key = env["CSSP_PEER_USER"], let secret = env["CSSP_PEER_KEY"] else {
            throw HarnessError("CSSP_PEER_USER and CSSP_PEER_KEY are not set: run through scripts/test")
        }
        let path = TestScratch.directory + "passwd-s3"
        if !FileManager.default.fileExists(atPath: path) {
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            if fd >= 0 {
                let line = key + ":" + secret + "\n"
                _ = line.withCString { write(fd, $0, strlen($0)) }
                close(fd)
            }
        }
        return path
    }

    /// A client of `container`, at `url` when given (a relay in front of the server).
    func store(container: String, url: String? = nil) -> HTTPObjectStore {
        Curl.globalInit()
        var configuration = HTTPStoreConfiguration(
            baseURL: url ?? serverURL, container: container, signer: RequestSigner(accessKey: accessKey, secret: secret))
        configuration.maxAttempts = 5
        return HTTPObjectStore(configuration: configuration, logger: Logger(label: "e2e"))
    }

    /// Requests `method` of `key` in `container` that the proxy logged as started at or after
    /// `since` (Unix seconds): the server's own count, not the client's.
    func requests(_ method: String, container: String, key: String, since: Double) throws -> Int {
        try requests(method, container: container, keys: [key], since: since)
    }

    /// `requests` of any of `keys` (the log read once).
    func requests(_ method: String, container: String, keys: [String], since: Double) throws -> Int {
        guard let serverDirectory else { throw HarnessError("CSSP_SERVER_DIR is not set (scripts/test sets it)") }
        let log = try String(contentsOfFile: serverDirectory + "/log/proxy.log", encoding: .utf8)
        var count = 0
        // The path ends at a space, or at a query (logged quoted, as %3F).
        let paths = keys.map { "/\(container)/\($0)" }
        for line in log.split(separator: "\n")
        where line.contains(" \(method) ") && paths.contains(where: { line.contains($0 + " ") || line.contains($0 + "%3F") }) {
            // The second-to-last and third-to-last fields are the request's start and end times.
            let fields = line.split(separator: " ")
            if fields.count > 3, let start = Double(fields[fields.count - 3]), start >= since { count += 1 }
        }
        return count
    }
}

extension Environment {
    /// Requests of clients (not the server's own subrequests) to `container` that the proxy
    /// logged as started at or after `since` (Unix seconds), by method.
    func clientRequests(container: String, since: Double) throws -> [String: Int] {
        guard let serverDirectory else { throw HarnessError("CSSP_SERVER_DIR is not set (scripts/test sets it)") }
        let log = try String(contentsOfFile: serverDirectory + "/log/proxy.log", encoding: .utf8)
        var counts: [String: Int] = [:]
        for line in log.split(separator: "\n") where line.contains("/\(container)/") || line.contains("/\(container) ") {
            let fields = line.split(separator: " ")
            // "proxy-server:" client remote time METHOD path ...; a subrequest has client "-".
            guard fields.count > 5, fields[1] != "-", let start = Double(fields[fields.count - 3]), start >= since else {
                continue
            }
            counts[String(fields[4]), default: 0] += 1
        }
        return counts
    }
}

extension Environment {
    /// Requests clients sent since `since` (seconds) whose logged path contains `text` (the
    /// query too, percent-encoded: `bulk-delete`).
    func clientRequests(containing text: String, since: Double) throws -> Int {
        guard let serverDirectory else { throw HarnessError("CSSP_SERVER_DIR is not set (scripts/test sets it)") }
        let log = try String(contentsOfFile: serverDirectory + "/log/proxy.log", encoding: .utf8)
        return log.split(separator: "\n").filter { line in
            let fields = line.split(separator: " ")
            guard fields.count > 5, fields[1] != "-", let start = Double(fields[fields.count - 3]), start >= since else {
                return false
            }
            return fields[5].contains(text)
        }.count
    }
}

/// The seeds a model test runs: `PREFIX_SEED` replays one, else `PREFIX_SEEDS` (`count` by
/// default) from 1; and `PREFIX_OPS` (`operations` by default) operations each.
/// `regressions`: seeds beyond the usual range that once found a bug, run after them.
func modelSeeds(_ prefix: String, count: UInt64, operations: Int, regressions: [UInt64] = []) -> (seeds: [UInt64], operations: Int) {
    let setting = { (name: String) in ProcessInfo.processInfo.environment[prefix + name].flatMap { UInt64($0) } }
    return (
        setting("_SEED").map { [$0] } ?? Array(1...(setting("_SEEDS") ?? count)) + regressions,
        setting("_OPS").map(Int.init) ?? operations
    )
}

/// Runs `body` for each seed, until one throws: its error is the test's issue.
func forEachSeed(_ seeds: [UInt64], _ body: (UInt64) throws -> Void) {
    for seed in seeds {
        do {
            try body(seed)
        } catch {
            Issue.record("\(error)")
            return
        }
    }
}

struct HarnessError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// The result of a command.
struct Output {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// Single-quotes a path for bash.
func quoted(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'" }

func isMounted(_ directory: String) -> Bool {
    let mounts = (try? String(contentsOfFile: "/proc/mounts", encoding: .utf8)) ?? ""
    let escaped = directory.replacingOccurrences(of: " ", with: "\\040")
    return mounts.split(separator: "\n").contains { $0.split(separator: " ").dropFirst().first == Substring(escaped) }
}

/// The lines of /run/mount/utab (util-linux's record of what the kernel's mount table does not
/// hold, such as the umount helper) whose mountpoint is `directory`.
func utabLines(_ directory: String) -> [String] {
    let utab = (try? String(contentsOfFile: "/run/mount/utab", encoding: .utf8)) ?? ""
    let target = " TARGET=" + directory.replacingOccurrences(of: " ", with: "\\040") + " "
    return utab.split(separator: "\n").map(String.init).filter { $0.contains(target) }
}

/// A foreground mount.cssp serving one mountpoint, as libfuse's test harness does it: start,
/// poll until the mount appears (failing at once if the daemon exits), unmount, expect exit 0.
final class Mount {
    let directory: String
    let child: Child
    private let stderrPath: String
    private var exitStatus: Int32? = nil
    /// The worker last seen serving the mount (issue 40).
    private var lastWorker: pid_t? = nil

    /// `url`: the server's URL when not the environment's (a TLS relay in front of it). `at`: an
    /// existing mountpoint (another `Mount`'s), instead of a new one. `binary`: another
    /// mount.cssp than the environment's (a copy of it, installed elsewhere).
    /// `dialect`: the API to mount the container through (s3: `s3://CONTAINER` with
    /// `endpoint=` the server, through its s3api; cos: `cos://CONTAINER` through the COS front).
    init(
        _ environment: Environment, container: String, options: [String] = [], extraEnvironment: [String: String] = [:],
        url: String? = nil, at existing: String? = nil, binary: String? = nil, dialect: StoreDialect = Environment.dialect
    ) throws {
        let id = UUID().uuidString.prefix(8)
        directory = existing ?? TestScratch.directory + "cssp-e2e-mnt-" + id
        stderrPath = TestScratch.directory + "cssp-e2e-mnt-" + id + ".stderr"
        if existing == nil { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        let errorFD = open(stderrPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        let nullFD = open("/dev/null", O_WRONLY | O_CLOEXEC)
        defer {
            close(errorFD)
            close(nullFD)
        }
        let source: String
        var mountOptions: [String]
        switch dialect {
        case .cssp:
            source = (url ?? environment.serverURL) + "/" + container
            mountOptions = ["passwd_file=" + environment.passwdFile]
        case .s3:
            source = "s3://" + container
            mountOptions = ["passwd_file=" + (try environment.s3PasswdFile()), "endpoint=" + (url ?? environment.serverURL)]
        case .cos:
            // Through the COS front, which checks every COS signature and forwards to s3api.
            source = "cos://" + container
            mountOptions = ["passwd_file=" + (try environment.s3PasswdFile()), "endpoint=" + (try url ?? environment.cosURL())]
        }
        // (A test's own passwd_file wins: the last one given does.)
        mountOptions += options
        let argv = [binary ?? environment.binary, source, directory, "-f", "-o", mountOptions.joined(separator: ",")]
        child = try Child.spawn(
            argv, environment: ProcessInfo.processInfo.environment.merging(extraEnvironment) { $1 }, stdout: nullFD,
            stderr: errorFD)
        // Poll for the mount; the daemon exiting first is a failure, reported with its stderr.
        let deadline = Date().addingTimeInterval(20)
        // Mounted and answering (a dead mount left by a killed daemon is listed but answers
        // ENOTCONN; statvfs, since the kernel answers a stat of its root from its cache for a while).
        var st = statvfs()
        while !isMounted(directory) || statvfs(directory, &st) != 0 {
            if let status = child.poll() {
                exitStatus = status
                throw HarnessError("mount.cssp exited with \(status): \(stderrText)")
            }
            if Date() > deadline { throw HarnessError("mount did not appear within 20 s: \(stderrText)") }
            usleep(10_000)
        }
        lastWorker = worker()
    }

    var stderrText: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    func path(_ relative: String) -> String { directory + "/" + relative }

    /// The worker serving the mount (issue 40): the foreground mount.cssp's one child; nil
    /// while there is none (between a death and the next, or after the supervisor gave up).
    func worker() -> pid_t? {
        let path = "/proc/\(child.pid)/task/\(child.pid)/children"
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        let children = text.split(separator: " ").compactMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        return children.count == 1 ? children[0] : nil
    }

    /// Kills the worker with -9 and returns once another serves in its place.
    @discardableResult
    func killWorker() throws -> (killed: pid_t, next: pid_t) {
        guard let killed = worker() else { throw HarnessError("no worker under \(child.pid): \(stderrText)") }
        guard kill(killed, SIGKILL) == 0 else { throw HarnessError("kill -9 \(killed): errno \(errno)") }
        var next: pid_t? = nil
        let replaced = poll(seconds: 20, interval: 5_000) {
            next = worker()
            return next != nil && next != killed
        }
        guard replaced, let next else { throw HarnessError("no worker took over from \(killed): \(stderrText)") }
        lastWorker = next
        return (killed, next)
    }

    /// A planned restart (`mount.cssp --restart`, issue 40): returns once another worker serves.
    @discardableResult
    func restartWorker(binary: String) throws -> (stopped: pid_t, next: pid_t) {
        guard let stopped = worker() else { throw HarnessError("no worker under \(child.pid): \(stderrText)") }
        let answer = try shell("\(quoted(binary)) --restart \(quoted(directory))")
        guard answer.status == 0, let next = worker(), next != stopped else {
            throw HarnessError("--restart: \(answer.status) \(answer.stdout) \(answer.stderr)\n\(stderrText)")
        }
        lastWorker = next
        return (stopped, next)
    }

    /// Waits for the daemon to exit and returns its status. The supervisor's worker ends with
    /// it, a moment later when the supervisor was killed (PR_SET_PDEATHSIG): that too is waited
    /// for, so that the mount is dead (ENOTCONN) once this returns.
    func waitForExit() -> Int32 {
        if let exitStatus { return exitStatus }
        let status = child.wait()
        exitStatus = status
        if let worker = lastWorker { _ = poll(seconds: 20, interval: 2_000) { Self.hasEnded(worker) } }
        return status
    }

    /// Whether process `pid` is gone, or a zombie none of whose threads still runs (its
    /// descriptors are closed then: a leader shows Z while its other threads still exit).
    static func hasEnded(_ pid: pid_t) -> Bool {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return true }
        let state = text[text.index(after: close)...].dropFirst().first
        guard state == "Z" || state == "X" else { return false }
        let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task"))?.count ?? 0
        return threads <= 1
    }

    /// Unmounts (fusermount3 -u by default) and returns the daemon's exit status.
    @discardableResult
    func unmount(using command: String = "fusermount3 -u") throws -> Int32 {
        // The kernel sends RELEASE for a closed file in the background and holds the inode until
        // the daemon answers: an unmount right after a close can find the mount busy for a few
        // milliseconds. Poll for that (bounded), as for the mount appearing.
        let deadline = Date().addingTimeInterval(10)
        while true {
            let result = try shell("\(command) \(quoted(directory))")
            if result.status == 0 { break }
            guard result.stderr.contains("busy"), Date() < deadline else {
                throw HarnessError("\(command) failed: \(result.stderr)")
            }
            usleep(20_000)
        }
        return waitForExit()
    }

    deinit {
        if exitStatus == nil {
            if isMounted(directory) { _ = try? shell("fusermount3 -u \(quoted(directory))") }
            // A mount the unmount did not take (the test failed already): its daemon is told to
            // stop, or the run would wait for it for ever (seen once: fusermount3 -u said EINVAL
            // on a mountpoint whose SIGKILLed daemon's mount the next mount had detached).
            if isMounted(directory) { kill(child.pid, SIGTERM) }
            _ = waitForExit()
        }
        try? FileManager.default.removeItem(atPath: directory)
        // CSSP_E2E_KEEP_LOGS=1 keeps each daemon's stderr for debugging.
        if ProcessInfo.processInfo.environment["CSSP_E2E_KEEP_LOGS"] == nil {
            try? FileManager.default.removeItem(atPath: stderrPath)
        }
    }
}

func md5(_ path: String) throws -> String {
    let result = try shell("md5sum \(quoted(path))")
    guard result.status == 0 else { throw HarnessError("md5sum \(path): \(result.stderr)") }
    return String(result.stdout.prefix(32))
}

extension String {
    /// Replaces the file at `path` with this text in one step (a new file renamed over it), as
    /// a reader polling the file (the test server's fault file) needs. Foundation's
    /// `write(toFile:atomically: true)` does the same but leaves an empty
    /// `/tmp/TemporaryDirectory.*` behind on every call (swift-corelibs-foundation).
    func writeReplacing(file path: String) throws {
        let temporary = path + ".new-" + String(UInt64.random(in: 0...UInt64.max), radix: 16)
        try write(toFile: temporary, atomically: false, encoding: .utf8)
        guard rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw HarnessError("cannot replace \(path): \(reason)")
        }
    }
}
