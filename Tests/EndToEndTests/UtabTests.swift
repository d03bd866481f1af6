import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 19, item 4: a mount made by root records one line in /run/mount/utab, which makes a
/// plain umount(8) run the umount helper; whatever ends the mount removes it again, and a line
/// a killed daemon leaves is removed by the next mount on that mountpoint.
@Suite(.serialized)
struct UtabTests {
    /// A new container, mounted by the binary under test as root (the harness's foreground mount).
    struct Scene {
        let environment: Environment
        let container: String
        let cache: String
        let mount: Mount

        init() throws {
            environment = try Environment.load()
            (container, _, cache) = try environment.newContainer("utab")
            mount = try Mount(environment, container: container, options: ["cache_dir=" + cache, "_netdev"])
        }
    }

    @Test func theLineNamesTheMountAndItsHelperAndFusermountRemovesIt() throws {
        let scene = try Scene()
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let mount = scene.mount
        let source = scene.environment.serverURL + "/" + scene.container
        let lines = utabLines(mount.directory)
        #expect(lines == ["SRC=\(source) TARGET=\(mount.directory) ROOT=/ OPTS=_netdev,helper=cssp"], "\(lines)")
        #expect(try mount.unmount(using: "fusermount3 -u") == 0)
        #expect(utabLines(mount.directory).isEmpty, "\(utabLines(mount.directory))")
    }

    @Test func sigtermRemovesTheLine() throws {
        let scene = try Scene()
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let mount = scene.mount
        #expect(utabLines(mount.directory).count == 1)
        #expect(kill(mount.child.pid, SIGTERM) == 0)
        #expect(mount.waitForExit() == 0)
        #expect(!isMounted(mount.directory))
        #expect(utabLines(mount.directory).isEmpty, "\(utabLines(mount.directory))")
    }

    /// A daemon killed with SIGKILL cannot remove its line; its mount is still there (dead), and
    /// so is the line. The next mount on the mountpoint detaches the dead mount and removes it.
    @Test func aKilledDaemonsLineIsRemovedByTheNextMount() throws {
        let scene = try Scene()
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let first = scene.mount
        #expect(kill(first.child.pid, SIGKILL) == 0)
        _ = first.waitForExit()
        #expect(utabLines(first.directory).count == 1)
        let next = try Mount(
            scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache], at: first.directory)
        #expect(utabLines(next.directory).count == 1, "\(utabLines(next.directory))")
        #expect(try next.unmount() == 0)
        #expect(utabLines(next.directory).isEmpty, "\(utabLines(next.directory))")
    }

    /// A killed daemon's dead mount detached by hand (fusermount3 -u, as CacheTests does) leaves
    /// its line with nobody to remove it; the next csspfs mount anywhere removes it.
    @Test func aLineLeftByAKilledDaemonWhoseMountWasDetachedGoesWithTheNextMountAnywhere() throws {
        let scene = try Scene()
        defer { try? FileManager.default.removeItem(atPath: scene.cache) }
        let killed = scene.mount
        #expect(kill(killed.child.pid, SIGKILL) == 0)
        _ = killed.waitForExit()
        #expect(try shell("fusermount3 -u \(quoted(killed.directory))").status == 0)
        #expect(utabLines(killed.directory).count == 1, "the line of the killed daemon")
        let elsewhere = try Mount(scene.environment, container: scene.container, options: ["cache_dir=" + scene.cache])
        #expect(utabLines(killed.directory).isEmpty, "\(utabLines(killed.directory))")
        #expect(utabLines(elsewhere.directory).count == 1)
        #expect(try elsewhere.unmount() == 0)
    }
}
