import Foundation
import ObjectStoreTesting
import ObjectStore
import ObjectStoreHTTP
import Testing

/// Large objects other tools write, the way the swift CLI writes them: segments in a
/// `<container>_segments` container, and a Static Large Object manifest or a Dynamic Large
/// Object manifest in the container (the same requests by hand, signed by scripts/cssp-curl).
@Suite(.serialized)
struct LargeObjectTests {
    @Test func slosAndSegmentContainerDLOsReadRenameAndDeleteWithDefaultOptions() throws {
        let environment = try Environment.load()
        let container = "lo-" + UUID().uuidString.prefix(8).lowercased()
        let segments = container + "_segments"
        let store = environment.store(container: container)
        try store.createContainer()
        try environment.store(container: segments).createContainer()
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
        let curl = quoted(root + "/scripts/cssp-curl")
        let base = environment.serverURL
        let work = TestScratch.directory + "cssp-e2e-lo-" + container
        defer { try? FileManager.default.removeItem(atPath: work) }
        // Three 1 MiB segments (SLO) and three for a DLO, as `swift upload --use-slo -S` and
        // `swift upload -S` store them.
        let seed = try shell(
            """
            set -e
            mkdir -p \(quoted(work)) && cd \(quoted(work))
            for i in 1 2 3; do
                head -c 1048576 /dev/urandom > slo.$i
                head -c 1048576 /dev/urandom > dlo.$i
                \(curl) -sf -X PUT --data-binary @slo.$i \(base)/\(segments)/slo/seg/0000000$i -o /dev/null
                \(curl) -sf -X PUT --data-binary @dlo.$i \(base)/\(segments)/dlo/seg/0000000$i -o /dev/null
            done
            cat slo.1 slo.2 slo.3 > slo.all && cat dlo.1 dlo.2 dlo.3 > dlo.all
            printf '[{"path":"/\(segments)/slo/seg/00000001"},{"path":"/\(segments)/slo/seg/00000002"},{"path":"/\(segments)/slo/seg/00000003"}]' > manifest.json
            \(curl) -sf -X PUT --data-binary @manifest.json '\(base)/\(container)/big.slo?multipart-manifest=put' -o /dev/null
            \(curl) -sf -X PUT -H 'X-Object-Manifest: \(segments)/dlo/seg/' --data-binary '' \(base)/\(container)/big.dlo -o /dev/null
            """, environment: ProcessInfo.processInfo.environment)
        #expect(seed.status == 0, "\(seed.stderr)")

        let cache = TestScratch.directory + "cssp-e2e-cache-" + container
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + cache])
        let m = quoted(mount.directory)
        let w = quoted(work)
        let steps = try shell(
            """
            set -e
            cd \(m)
            # ls -l first: the listing's ETag of an SLO differs from a GET's; reading must not be ESTALE.
            test "$(stat -c %s big.slo)" = 3145728
            test "$(stat -c %s big.dlo)" = 3145728
            ls -l > /dev/null
            cmp big.slo \(w)/slo.all
            cmp big.dlo \(w)/dlo.all
            # Renaming keeps each manifest pointing at the segments, which stay where they are.
            mv big.dlo moved.dlo
            cmp moved.dlo \(w)/dlo.all
            mv big.slo moved.slo
            cmp moved.slo \(w)/slo.all
            rm moved.dlo moved.slo
            test -z "$(ls)"
            """)
        #expect(steps.status == 0, "\(steps.stdout)\(steps.stderr)\n\(mount.stderrText)")
        #expect(try mount.unmount() == 0)
        // Segments csspfs does not own are never moved or deleted.
        let kept = try environment.store(container: segments).listAll(prefix: "", delimiter: nil).map(\.name)
        #expect(kept.count == 6, "\(kept)")
    }
}
