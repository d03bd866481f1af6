import FSCore
import FSJournal
import Locking
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

/// Uploads running now and uploads owed (failed, waiting for their retry), for
/// `mount.cssp --status` and the upload gauges of `--stats`. The uploader registers what it
/// sends for as long as it sends it; the filesystem records each owed spool's last failure and
/// next try here, beside the spool's own lifecycle (`SpoolState`), which it does not change.
public final class Transfers: Sendable {
    /// One upload in progress.
    public struct Running: Sendable {
        public var key: String
        public var progress: TransferProgress
        /// Monotonic seconds when it started.
        public var started: Double
        public var total: Int64 { progress.bytesTotal }
        public var done: Int64 { min(total, progress.bytesDone) }
    }

    /// One upload owed.
    public struct Owed: Sendable {
        public var key: String
        public var size: Int64
        /// Failed attempts so far.
        public var tries: Int
        public var lastError: String
        /// Monotonic seconds (`Transfers.monotonic`) of the next try; nil while a handle is
        /// open (its next flush or close tries again).
        public var nextTry: Double?
        /// Write-back: journaled at close and waiting in the queue, not failed.
        public var queued = false
    }

    private struct State {
        package var nextID = 0
        package var running: [Int: Running] = [:]
        package var owed: [InodeNumber: Owed] = [:]
        /// Bumped by every change of `owed`.
        package var changes: UInt64 = 0
    }

    /// Guards the tables; every change wakes `waitForRoom`.
    private let state = ConditionLocked(State())

    public init() {}

    /// Registers an upload to `key` (its total in `progress`); `end` with the returned id removes it.
    package func begin(key: String, progress: TransferProgress) -> Int {
        state.withLock { s in
            s.nextID += 1
            s.running[s.nextID] = Running(key: key, progress: progress, started: Self.monotonic())
            return s.nextID
        }
    }

    package func end(_ id: Int) {
        state.withLock { _ = $0.running.removeValue(forKey: id) }
    }

    /// An upload of the file `inode` failed: it is owed until stored.
    package func recordFailure(_ inode: InodeNumber, key: String, size: Int64, error: String) {
        state.withLock { s in
            let tries = (s.owed[inode]?.tries ?? 0) + 1
            s.owed[inode] = Owed(key: key, size: size, tries: tries, lastError: error, nextTry: nil, queued: false)
            s.changes += 1
        }
    }

    /// Write-back: the file `inode` was journaled at close; the queue stores it in `delay` s.
    package func recordQueued(_ inode: InodeNumber, key: String, size: Int64, in delay: Double) {
        state.withLock { s in
            s.owed[inode] = Owed(key: key, size: size, tries: 0, lastError: "", nextTry: Self.monotonic() + delay, queued: true)
            s.changes += 1
        }
    }

    /// The owed upload of `inode` goes to `key` now (a rename of a queued file).
    package func move(_ inode: InodeNumber, to key: String) {
        state.withLock { s in s.owed[inode]?.key = key }
    }

    /// The owed upload of `inode` is tried again in `delay` seconds.
    package func scheduleRetry(_ inode: InodeNumber, in delay: Double) {
        state.withLock { s in s.owed[inode]?.nextTry = Self.monotonic() + delay }
    }

    package func clearOwed(_ inode: InodeNumber) {
        state.withLock { s in
            if s.owed.removeValue(forKey: inode) != nil { s.changes += 1 }
        }
    }

    package var owedInodes: [InodeNumber] { state.withLock { Array($0.owed.keys) } }

    /// Whether the uploads owed hold at most `limit` bytes, or `inode`'s is the only one
    /// (write-back's bound, `writeback_max_mb`: a file larger than the bound alone goes through).
    package func hasRoom(limit: Int64, for inode: InodeNumber) -> Bool {
        state.withLock { Self.hasRoom($0, limit: limit, for: inode) }
    }

    private static func hasRoom(_ s: State, limit: Int64, for inode: InodeNumber) -> Bool {
        s.owed.values.reduce(0) { $0 + $1.size } <= limit || s.owed.keys.allSatisfy { $0 == inode }
    }

    /// Waits until `hasRoom`, or something owed changed, or `timeout` seconds passed.
    package func waitForChange(limit: Int64, for inode: InodeNumber, timeout: Double) {
        let before = state.withLock { $0.changes }
        _ = state.withLock(when: { $0.changes != before || Self.hasRoom($0, limit: limit, for: inode) }, timeout: timeout) { _ in }
    }

    /// The queued uploads, oldest first (write-back's back-pressure stores the oldest itself).
    package var queuedInodes: [InodeNumber] {
        state.withLock { s in
            s.owed.filter { $0.value.queued }.sorted { ($0.value.nextTry ?? 0) < ($1.value.nextTry ?? 0) }.map(\.key)
        }
    }

    /// The bytes of the uploads owed.
    package var owedBytes: Int64 { state.withLock { $0.owed.values.reduce(0) { $0 + $1.size } } }

    public var running: [Running] { state.withLock { Array($0.running.values) }.sorted { $0.started < $1.started } }
    public var owed: [Owed] {
        state.withLock { Array($0.owed.values) }.sorted { ($0.nextTry ?? 0, $0.key) < ($1.nextTry ?? 0, $1.key) }
    }

    /// Seconds of CLOCK_MONOTONIC, the clock of `started` and `nextTry`.
    public static func monotonic() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// The human view of `mount.cssp --status`: each upload in progress with its bytes done of
    /// its total and its rate, each owed upload with its tries, last error and next try.
    public func report(now: Double = Transfers.monotonic()) -> String {
        let running = self.running, owed = self.owed
        var out = "uploads in progress: \(running.count)\n"
        for upload in running {
            let seconds = max(now - upload.started, 0.001)
            let percent = upload.total > 0 ? upload.done * 100 / upload.total : 100
            out += "  \(upload.key): \(Self.bytes(upload.done)) of \(Self.bytes(upload.total)) (\(percent)%), "
                + "\(Self.bytes(Int64(Double(upload.done) / seconds)))/s for \(Self.seconds(seconds))\n"
        }
        out += "uploads owed: \(owed.count)\n"
        for upload in owed where upload.queued {
            let due = (upload.nextTry ?? now) - now
            out += "  \(upload.key): \(Self.bytes(upload.size)), queued (write-back), "
                + (due > 0 ? "stored in \(Self.seconds(due))\n" : "being stored\n")
        }
        for upload in owed where !upload.queued {
            let next: String
            if let at = upload.nextTry {
                next = at > now ? "next in \(Self.seconds(at - now))" : "retrying now"
            } else {
                next = "next at the next close or fsync of the open file"
            }
            out += "  \(upload.key): \(Self.bytes(upload.size)), \(upload.tries) \(upload.tries == 1 ? "try" : "tries") failed, "
                + next + "; last error: \(upload.lastError)\n"
        }
        return out
    }

    /// 1536 → "1.5 KiB".
    package static func bytes(_ count: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
        var value = Double(count)
        var unit = 0
        while value >= 1024 && unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        if unit == 0 { return "\(count) B" }
        let tenths = Int((value * 10).rounded())
        return "\(tenths / 10).\(tenths % 10) \(units[unit])"
    }

    /// 75.2 → "75 s", 3700 → "1 h 1 min".
    package static func seconds(_ value: Double) -> String {
        let whole = Int(value.rounded(.up))
        if whole < 120 { return "\(whole) s" }
        if whole < 3600 { return "\(whole / 60) min \(whole % 60) s" }
        return "\(whole / 3600) h \(whole % 3600 / 60) min"
    }
}
