import Foundation
import ObjectStore
import Testing

/// Metadata that listings lack, through the real mount: objects another tool wrote carry their
/// mtime and mode only in `X-Object-Meta-*` headers. A listing is followed by background HEADs,
/// one per such object, and what they say reaches `ls -l`/`stat` without a HEAD per `stat`.
struct MetadataMountTests {
    @Test func otherToolsMetadataArrivesAfterAListingWithOneHeadPerObject() throws {
        let fixture = try Fixture.get()
        let environment = fixture.environment
        let store = environment.store(container: fixture.container)
        let directory = "foreign-" + UUID().uuidString.prefix(8)
        let count = 24
        let keys = (0..<count).map { "\(directory)/f\($0)" }
        for key in keys {
            // As rclone writes them: mtime with a fraction, mode as an octal st_mode.
            try store.put(
                key: key, body: .bytes(Array(key.utf8)), contentType: nil,
                metadata: ["mtime": "1500000000.5", "mode": "100600"])
        }
        let since = Date().timeIntervalSince1970
        // Attributes cached for 10 s: each `stat` below is answered by what the listings sent.
        let mount = try Mount(environment, container: fixture.container, options: ["attr_timeout=10"])
        let path = mount.path(directory)

        // The first `ls -l` answers from the listing (the server's time, the default mode)...
        let first = try shell("ls -l \(quoted(path)) | grep -c '^-rw-r--r--'")
        #expect(first.stdout == "\(count)\n", "\(first)")
        // ...and queues one HEAD per object. Wait (bounded) until the server has answered them all.
        let deadline = Date().addingTimeInterval(30)
        var headed = 0
        while Date() < deadline {
            headed = try keys.reduce(0) { $0 + min(1, try environment.requests("HEAD", container: fixture.container, key: $1, since: since)) }
            if headed == count { break }
            usleep(100_000)
        }
        #expect(headed == count)

        // What they said: the next listing shows it, and `stat` agrees, without any further HEAD.
        let second = try shell("ls -l \(quoted(path)) | grep -c '^-rw------- '")
        #expect(second.stdout == "\(count)\n", "\(second)")
        let stats = try shell("cd \(quoted(path)) && stat -c '%Y %a' * | sort | uniq -c")
        #expect(stats.stdout.trimmingCharacters(in: .whitespaces) == "\(count) 1500000000 600\n", "\(stats)")
        for key in keys {
            #expect(try environment.requests("HEAD", container: fixture.container, key: key, since: since) == 1, "\(key)")
        }
        #expect(try mount.unmount() == 0)
    }
}
