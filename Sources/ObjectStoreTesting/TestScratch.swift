import Foundation

/// Where tests put their files: one directory per test process below the system's temporary
/// directory (`<tmp>/cssp-tests-<pid>/`), removed when the process exits. A directory left by a
/// process that died (a crash, a kill) is removed by the next test process that starts.
/// Neither removal descends into a mount: a directory with a mount below it (a test's FUSE mount
/// left behind) is left as it is, since removing through the mount would delete the objects of
/// the store it shows.
public enum TestScratch {
    /// The process's directory, with a trailing slash: `TestScratch.directory + "name"`.
    public static var directory: String { root.path }

    private static let root = Root()

    private final class Root: Sendable {
        let path: String

        init() {
            let base = NSTemporaryDirectory().hasSuffix("/") ? NSTemporaryDirectory() : NSTemporaryDirectory() + "/"
            path = base + TestScratch.prefix + String(getpid()) + "/"
            TestScratch.removeLeftovers(in: base)
            try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            atexit { TestScratch.remove(TestScratch.root.path) }
        }
    }

    static let prefix = "cssp-tests-"

    /// Removes the directories of test processes no longer running.
    static func removeLeftovers(in base: String) {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: base) else { return }
        for name in names where name.hasPrefix(prefix) {
            guard let pid = pid_t(name.dropFirst(prefix.count)), pid != getpid() else { continue }
            if kill(pid, 0) == 0 || errno == EPERM { continue }  // still running
            remove(base + name + "/")
        }
    }

    /// Removes `path` (ending in "/") and everything below it, unless something is mounted there.
    static func remove(_ path: String) {
        let mounts = (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? ""
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 4 else { continue }
            // The mount point, with spaces and the like escaped as octal (\040).
            let point = String(fields[4]).replacingOccurrences(of: "\\040", with: " ") + "/"
            if point.hasPrefix(path) { return }
        }
        try? FileManager.default.removeItem(atPath: path)
    }
}
