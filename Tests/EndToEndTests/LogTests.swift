import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 11, item 3: SIGUSR1 turns debug logging on and off in a running daemon.
struct LogTests {
    @Test func sigusr1TogglesDebugLogging() throws {
        let environment = try Environment.load()
        let (container, _, cache) = try environment.newContainer("log")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + cache])
        /// Waits (bounded) until the daemon's stderr has `text`.
        func logged(_ text: String) -> Bool {
            let deadline = Date().addingTimeInterval(10)
            while !mount.stderrText.contains(text) && Date() < deadline { usleep(10_000) }
            return mount.stderrText.contains(text)
        }
        _ = try shell("ls \(quoted(mount.path("before")))")
        #expect(!mount.stderrText.contains("debug:"))
        #expect(kill(mount.child.pid, SIGUSR1) == 0)
        #expect(logged("SIGUSR1: log level debug now"))
        _ = try shell("ls \(quoted(mount.path("during")))")
        #expect(logged("debug: lookup 1/during"), "\(mount.stderrText)")
        #expect(kill(mount.child.pid, SIGUSR1) == 0)
        #expect(logged("SIGUSR1: log level notice now"))
        _ = try shell("ls \(quoted(mount.path("after")))")
        #expect(!mount.stderrText.contains("lookup 1/after"))
        #expect(try mount.unmount() == 0)
    }
}
