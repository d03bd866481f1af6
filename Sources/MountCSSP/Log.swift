import CFuse3
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Where log lines go: stderr while attached to a terminal, syslog once detached.
final class LogSink: Sendable {
    static let shared = LogSink()
    private let toSyslog = Atomic<Bool>(false)

    func switchToSyslog() {
        openlog("mount.cssp", LOG_PID, LOG_DAEMON)
        toSyslog.store(true, ordering: .releasing)
    }

    func write(_ level: Logger.Level, _ line: String) {
        if toSyslog.load(ordering: .acquiring) {
            let priority: Int32
            switch level {
            case .trace, .debug: priority = LOG_DEBUG
            case .info, .notice: priority = LOG_INFO
            case .warning: priority = LOG_WARNING
            case .error: priority = LOG_ERR
            case .critical: priority = LOG_CRIT
            }
            cssp_syslog(priority, line)
        } else {
            Self.stderr("mount.cssp: \(level): \(line)\n")
        }
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
    var logLevel: Logger.Level = .info

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
        LogSink.shared.write(event.level, line)
    }
}
