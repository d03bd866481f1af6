import CFuse3
import Locking
import Logging
import MountCSSPConfig
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Where log lines go: stderr while attached to a terminal, syslog once detached. Holds the
/// level (`-o log_level`, toggled to debug and back by SIGUSR1) and limits repeated lines.
final class LogSink: Sendable {
    static let shared = LogSink()
    private let toSyslog = Atomic<Bool>(false)
    /// Indexes into `Logger.Level.allCases`: the level now, and the configured one.
    private let current = Atomic<Int>(3)
    private let configured = Atomic<Int>(3)
    private let limiter = Locked(RateLimiter())

    func switchToSyslog() {
        openlog("mount.cssp", LOG_PID, LOG_DAEMON)
        toSyslog.store(true, ordering: .releasing)
    }

    var level: Logger.Level {
        get { Logger.Level.allCases[current.load(ordering: .relaxed)] }
        set {
            let index = Logger.Level.allCases.firstIndex(of: newValue)!
            current.store(index, ordering: .relaxed)
            configured.store(index, ordering: .relaxed)
        }
    }

    /// Debug on, or back to the configured level (SIGUSR1). Returns the level now.
    func toggleDebug() -> Logger.Level {
        let debug = Logger.Level.allCases.firstIndex(of: .debug)!
        let next = current.load(ordering: .relaxed) <= debug ? configured.load(ordering: .relaxed) : debug
        current.store(next, ordering: .relaxed)
        return Logger.Level.allCases[next]
    }

    /// Writes `line`, unless lines of the same `kind` came too often (see `RateLimiter`).
    func write(_ level: Logger.Level, _ line: String, kind: String) {
        var text = line
        if level > .debug {
            guard let suppressed = limiter.withLock({ $0.admit("\(level) \(kind)", now: Self.monotonic()) }) else { return }
            if suppressed > 0 { text += " (\(suppressed) similar lines suppressed)" }
        }
        if toSyslog.load(ordering: .acquiring) {
            let priority: Int32
            switch level {
            case .trace, .debug: priority = LOG_DEBUG
            case .info: priority = LOG_INFO
            case .notice: priority = LOG_NOTICE
            case .warning: priority = LOG_WARNING
            case .error: priority = LOG_ERR
            case .critical: priority = LOG_CRIT
            }
            cssp_syslog(priority, text)
        } else {
            Self.stderr("mount.cssp: \(level): \(text)\n")
        }
    }

    /// A line that is written whatever the level (the level change itself).
    static func stderrOrSyslog(_ level: Logger.Level, _ line: String) {
        shared.write(level, line, kind: line)
    }

    static func monotonic() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    static func stderr(_ text: String) {
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeMutableBytes { Glibc.write(2, $0.baseAddress! + offset, $0.count - offset) }
            if n <= 0 { return }
            offset += n
        }
        bytes.removeAll()
    }
}

struct SinkLogHandler: LogHandler {
    var metadata: Logger.Metadata = [:]
    /// The sink's level: one for the process, changed at run time by SIGUSR1.
    var logLevel: Logger.Level {
        get { LogSink.shared.level }
        set { LogSink.shared.level = newValue }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var line = "\(event.message)"
        let merged = metadata.merging(event.metadata ?? [:]) { $1 }
        if !merged.isEmpty {
            line += " " + merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        }
        // A kind of line: the operation, errno and key when the line has them; else its text
        // without digits (request ids, sizes and times differ between repeats).
        let kind: String
        if let op = merged["op"], let errno = merged["errno"] {
            kind = "\(op) \(errno) \(merged["key"].map { "\($0)" } ?? "")"
        } else {
            kind = String("\(event.message)".filter { !$0.isNumber })
        }
        LogSink.shared.write(event.level, line, kind: kind)
    }
}
