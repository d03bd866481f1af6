import Foundation
import ObjectStore
import ObjectStoreHTTP
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 19 through the real binary: an answer the mount got from the server before a local
/// change (a remembered listing, a listing under way, a background HEAD) must not undo the change
/// once it is stored. The issue's own sequence, with default options:
///
///     ls -l /mnt/c            # a listing, remembered for dir_timeout (5 s)
///     chmod 600 /mnt/c/f      # owed, stored by a POST after attr_write_delay (1 s)
///     sleep 2; ls -l /mnt/c/f # -rw-r--r--: the listing from before the chmod wins again
///
/// Each test makes a change, checks `stat` through the mount while it is owed, waits until the
/// server holds it (a HEAD, polled), then checks `stat` through the mount again and again, and
/// the server once more. Most mount with `entry_timeout=0`: every `stat` is then a LOOKUP, so the
/// daemon's answer shows at once instead of after the kernel's own second. Not `attr_timeout=0`:
/// that is also how long the daemon trusts a file's attributes, so every `stat` would be a HEAD
/// and the server's answer would hide the daemon's (`withAttrTimeoutZeroEveryStatAsksTheServer`).
@Suite(.serialized)
struct AttributeRuleTests {
    typealias Scene = WriteTests.Scene

    /// A change made through the mount and how to see that it holds: `stat -c format path` through
    /// the mount shows `shows`, and `holds` is true of a HEAD of `key`.
    struct Change: Sendable, CustomTestStringConvertible {
        var name: String
        /// Shell commands, run in the mountpoint.
        var command: String
        var path: String
        var format: String
        var shows: String
        var key: String
        var holds: @Sendable (ObjectInfo) -> Bool
        var testDescription: String { name }

        /// Mode 0600 at `path`, made by `command` (default: `chmod 600 PATH`).
        static func mode600(_ path: String = "f", by command: String? = nil) -> Change {
            let command = command ?? "chmod 600 \(path)"
            let stored = Environment.storedMode(0o600)
            return Change(name: command, command: command, path: path, format: "%a", shows: "600", key: path) {
                $0.metadata["mode"] == stored
            }
        }

        static let chown = Change(
            name: "chown 1234:5678 f", command: "chown 1234:5678 f", path: "f", format: "%u:%g", shows: "1234:5678", key: "f"
        ) { $0.metadata["uid"] == "1234" && $0.metadata["gid"] == "5678" }

        /// utimensat(2) with a fixed access and modification time.
        static let utimes = Change(
            name: "touch -d @1600000000.5 f", command: "touch -d @1600000000.5 f", path: "f", format: "%.9Y",
            shows: "1600000000.500000000", key: "f"
        ) { $0.metadata["mtime"]?.hasPrefix("1600000000.5") == true }

        /// truncate(2) on the path: the size of a file no handle holds.
        static let truncate = Change(
            name: "truncate(2) f to 3 bytes", command: "/usr/bin/python3 -c 'import os; os.truncate(\"f\", 3)'",
            path: "f", format: "%s", shows: "3", key: "f"
        ) { $0.size == 3 }
    }

    /// What the container holds before the mount under test.
    enum Seed: Sendable, CustomTestStringConvertible {
        /// `f` ("hello\n") and `d/g` written by an earlier mount (mode 0644, owner 0:0, all in the
        /// listing's content type), and an empty directory `d2`.
        case earlierMount
        /// `f` as another tool writes it: a plain content type, mode 0640 only in
        /// `X-Object-Meta-Mode`, which needs a HEAD.
        case anotherTool

        var testDescription: String { self == .earlierMount ? "f stored by an earlier mount" : "f written by another tool" }
    }

    /// Where the answer from before the change comes from.
    enum Before: Sendable, CustomTestStringConvertible {
        /// A shell command run in the mountpoint before the change (`ls -l`, `cat f`).
        case command(String)
        /// `ls -l` of the mountpoint, then the background HEAD of `f` it queued has answered.
        case listingAndItsBackgroundHead
        /// `ls -l` of the mountpoint waiting for its LIST, which the server holds back: the
        /// change is made while the listing is under way.
        case listingUnderWay

        var testDescription: String {
            switch self {
            case .command(let command): return command
            case .listingAndItsBackgroundHead: return "ls -l and its background HEAD"
            case .listingUnderWay: return "ls -l under way"
            }
        }
    }

    // MARK: Tests

    static let changes: [Change] = [.mode600(), .chown, .utimes, .truncate]

    /// The issue: `ls -l`, then a change of `f`.
    @Test(arguments: changes)
    func aChangeAfterAListingHoldsOnceStored(_ change: Change) throws {
        try expectTheChangeHolds(change, after: .command("ls -l"), options: ["entry_timeout=0"])
    }

    /// `cat f` (the first lookup in the directory asks about `f` alone), then the chmod, whose
    /// lookup is the second in the directory: it lists the directory and remembers the listing.
    @Test(arguments: [Seed.earlierMount, .anotherTool])
    func aChmodAfterACatHoldsOnceStored(_ seed: Seed) throws {
        try expectTheChangeHolds(.mode600(), after: .command("cat f"), options: ["entry_timeout=0"], seed: seed)
    }

    /// Another tool's object: its mode comes from the HEAD that followed the listing; the chmod
    /// comes after that HEAD's answer.
    @Test func anotherToolsObjectChmoddedAfterItsBackgroundHeadHoldsOnceStored() throws {
        try expectTheChangeHolds(
            .mode600(), after: .listingAndItsBackgroundHead, options: ["entry_timeout=0"], seed: .anotherTool)
    }

    /// Renames and a chmod, after the directories involved were listed.
    static let renames: [Change] = [
        // The rename records f in d2's remembered listing.
        .mode600("d2/f", by: "mv f d2/f && chmod 600 d2/f"),
        // A renamed directory loses its listing; e's is made after the rename.
        .mode600("e/g", by: "mv d e && ls -l e && chmod 600 e/g"),
        .mode600("h", by: "mv f h && chmod 600 h"),
        // Owed when the file moves: the rename's COPY carries it.
        .mode600("h", by: "chmod 600 f && mv f h"),
        // Owed when its directory moves: stored before the keys move.
        .mode600("e/g", by: "chmod 600 d/g && mv d e"),
    ]

    @Test(arguments: renames)
    func aRenameAndAChmodAfterListingsHoldOnceStored(_ change: Change) throws {
        try expectTheChangeHolds(change, after: .command("ls -l . d d2"), options: ["entry_timeout=0"])
    }

    /// The change is made while `ls -l` waits for its LIST: an answer asked before the change,
    /// arriving after it. (The truncation's download waits for the server too.)
    @Test(arguments: [Change.mode600(), .truncate])
    func aChangeWhileAListingIsUnderWayHoldsOnceStored(_ change: Change) throws {
        try expectTheChangeHolds(change, after: .listingUnderWay, options: ["entry_timeout=0"])
    }

    /// attr_write_delay=0: the chmod is a POST before it returns, never owed.
    @Test(arguments: [Before.command("ls -l"), .listingUnderWay])
    func withoutAttrWriteDelayAChmodHolds(_ before: Before) throws {
        try expectTheChangeHolds(.mode600(), after: before, options: ["entry_timeout=0", "attr_write_delay=0"])
    }

    /// The issue with default options: the kernel answers `stat` from the chmod's reply for
    /// attr_timeout, so the daemon's answer shows only after that second.
    @Test func withDefaultOptionsAChmodAfterAListingHoldsOnceTheKernelAsksAgain() throws {
        try expectTheChangeHolds(.mode600(), after: .command("ls -l"), options: [], waitForTheKernelCache: true)
    }

    /// attr_timeout=0: the daemon trusts nothing, every `stat` is a HEAD (a path, not a trap for
    /// the issue: the server's answer is right).
    @Test func withAttrTimeoutZeroEveryStatAsksTheServer() throws {
        try expectTheChangeHolds(.mode600(), after: .command("ls -l"), options: ["attr_timeout=0", "entry_timeout=0"])
    }

    /// Beside issue 19 (the mount reference model found it): a change owed when another client
    /// replaces the object belongs to the version it was made on, so the other client's object,
    /// written later, keeps its own attributes and content type. The unmount's drain stores the
    /// change within a second of the close that confirmed the object, when no HEAD checks that
    /// it is still that version.
    @Test func anOwedChangeIsNotStoredOnAnotherClientsNewerObject() throws {
        let scene = try Scene("attr-race")
        defer { scene.cleanUp() }
        let mount = try scene.mount()
        try Self.run("printf 'hello\\n' > f && chmod 600 f", in: mount)
        try scene.store.raw.put(key: "f", body: .bytes(Array("other client\n".utf8)), contentType: "text/plain", metadata: [:])
        #expect(try mount.unmount() == 0)
        let info = try scene.store.raw.head(key: "f")
        #expect(
            info.metadata["mode"] == nil && info.contentType == "text/plain",
            "the other client's object took the owed chmod: \(Self.describe(info)), content type \(info.contentType)")
    }

    // MARK: The scenario

    /// Seeds a fresh container, mounts it with `options`, does `before` and the change, and
    /// expects the change to show through the mount while owed and, once the server holds it,
    /// in every `stat`; and the server to keep it.
    /// `waitForTheKernelCache`: the stats after the store wait until the kernel's attributes from
    /// the change's own reply (attr_timeout, 1 s) have expired.
    func expectTheChangeHolds(
        _ change: Change, after before: Before, options: [String], seed: Seed = .earlierMount,
        waitForTheKernelCache: Bool = false
    ) throws {
        let scene = try Scene("attr-rule")
        defer { scene.cleanUp() }
        try Self.seed(scene, seed)
        let mount = try scene.mount(options)
        let mounted = Date().timeIntervalSince1970
        switch before {
        case .command(let command):
            try Self.run(command, in: mount)
            try Self.run(change.command, in: mount)
        case .listingAndItsBackgroundHead:
            try Self.run("ls -l", in: mount)
            let headed = try poll(seconds: 30) {
                try scene.environment.requests("HEAD", container: scene.container, key: "f", since: mounted) > 0
            }
            #expect(headed, "the listing queued no HEAD of f")
            try Self.run(change.command, in: mount)
        case .listingUnderWay:
            try Self.whileAListingWaits(scene, mount) { try Self.run(change.command, in: mount) }
        }
        let changed = Date()
        let what = "\(change.name) after \(before.testDescription) with -o \(options.joined(separator: ","))"

        // Owed (attr_write_delay has not passed), or stored: the new value either way.
        let owed = try Self.stat(change, mount, times: 1)
        #expect(owed == [change.shows], "right after \(what): stat shows \(owed)")

        var info: ObjectInfo? = nil
        let stored = poll(seconds: 30) {
            info = try? scene.store.raw.head(key: change.key)
            return info.map(change.holds) ?? false
        }
        #expect(stored, "\(what): the server never held it: \(Self.describe(info))")

        if waitForTheKernelCache {
            // A timing condition of the kernel's cache, not synchronisation with the daemon: for
            // attr_timeout (1 s) after the chmod's reply the kernel answers stat itself, from that
            // reply; only then does it ask the daemon, whose answer is what this test checks.
            let expired = changed.addingTimeInterval(1.2)
            if expired > Date() { usleep(useconds_t(expired.timeIntervalSinceNow * 1_000_000)) }
        }
        let shown = try Self.stat(change, mount, times: 20)
        #expect(
            shown.allSatisfy { $0 == change.shows },
            "\(what): once the server held it (\(Self.describe(info))), stat \(change.path) showed \(shown), expected \(change.shows) every time")
        let kept = try? scene.store.raw.head(key: change.key)
        #expect(kept.map(change.holds) == true, "\(what): the server no longer holds it: \(Self.describe(kept))")
        #expect(try mount.unmount() == 0)
    }

    static func seed(_ scene: Scene, _ seed: Seed) throws {
        switch seed {
        case .earlierMount:
            let earlier = try scene.mount()
            try run("printf 'hello\\n' > f && mkdir d d2 && printf 'in d\\n' > d/g", in: earlier)
            #expect(try earlier.unmount() == 0)
        case .anotherTool:
            try scene.store.raw.put(
                key: "f", body: .bytes(Array("hello\n".utf8)), contentType: "text/plain",
                metadata: ["mode": "0640", "mtime": "1500000000.5"])
        }
    }

    static func run(_ command: String, in mount: Mount) throws {
        let result = try shell("cd \(quoted(mount.directory)) && { \(command); } >/dev/null")
        #expect(result.status == 0, "\(command): \(result.stderr)")
    }

    /// `stat -c FORMAT PATH` `times` times, 50 ms apart: a second of stats right after the server
    /// held the change, while a listing from before it is still younger than dir_timeout.
    static func stat(_ change: Change, _ mount: Mount, times: Int) throws -> [String] {
        let path = quoted(mount.path(change.path))
        let result = try shell(
            "for i in $(seq \(times)); do stat -c \(quoted(change.format)) \(path) 2>&1; [ $i = \(times) ] || sleep 0.05; done")
        return result.stdout.split(separator: "\n").map(String.init)
    }

    static func describe(_ info: ObjectInfo?) -> String {
        guard let info else { return "no object" }
        let metadata = info.metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        return "\(info.size) B, \(metadata)"
    }

    /// Runs `body` while `ls -l` of the mountpoint waits for its LIST, which the server holds back
    /// for 2 s (its fault file): `ls` is blocked in getdents64 before `body` starts.
    static func whileAListingWaits(_ scene: Scene, _ mount: Mount, _ body: () throws -> Void) throws {
        let faultFile = try scene.environment.faultFile()
        defer { try? FileManager.default.removeItem(atPath: faultFile) }
        // Every GET in the container: the listing, and of a change only a truncation's download.
        try "GET stall=2 /\(scene.container)\n".writeReplacing(file: faultFile)
        let null = open("/dev/null", O_WRONLY | O_CLOEXEC)
        defer { close(null) }
        let ls = try Child.spawn(["/bin/ls", "-l", mount.directory], environment: nil, stdout: null, stderr: null)
        let waiting = poll(seconds: 10, interval: 5_000) { isInGetdents(ls.pid) }
        #expect(waiting, "ls -l never waited in getdents64")
        try body()
        try FileManager.default.removeItem(atPath: faultFile)
        #expect(ls.wait() == 0)
    }

    /// Whether process `pid` is in getdents64(2) (`/proc/PID/syscall` starts with its number).
    static func isInGetdents(_ pid: pid_t) -> Bool {
        #if arch(x86_64)
        let number = "217"
        #elseif arch(arm64)
        let number = "61"
        #endif
        let text = (try? String(contentsOfFile: "/proc/\(pid)/syscall", encoding: .utf8)) ?? ""
        return text.split(separator: " ").first.map(String.init) == number
    }
}
