import Foundation
import ObjectStoreTesting
import ObjectStore
import ObjectStoreHTTP
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 11 through the real binary: `mount.cssp --stats` and `--status` ask the running daemon
/// over its control socket.
@Suite(.serialized)
struct StatusTests {
    /// The value of the sample `name` (with its labels, as printed) in a `--stats` answer.
    static func sample(_ text: String, _ name: String) -> Double? {
        for line in text.split(separator: "\n") where line.hasPrefix(name + " ") {
            return Double(line.dropFirst(name.count + 1))
        }
        return nil
    }

    @Test func statsPrintsEveryDocumentedMetricWithWhatTheMountDid() throws {
        let environment = try Environment.load()
        let (container, _, cache) = try environment.newContainer("stats")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + cache, "cache_size=100M"])
        let bytes = [UInt8](repeating: 42, count: 300_000)
        try Data(bytes).write(to: URL(fileURLWithPath: mount.path("f.bin")))
        let d = quoted(mount.path("d"))
        #expect(try shell("mkdir \(d) && touch \(d)/x && rmdir \(d) 2>/dev/null").status != 0)
        let result = try shell("\(quoted(environment.binary)) --stats \(quoted(mount.directory))")
        #expect(result.status == 0, "\(result.stderr)")
        let text = result.stdout
        for name in [
            "cssp_requests_total", "cssp_request_seconds", "cssp_bytes_sent_total", "cssp_bytes_received_total",
            "cssp_retries_total", "cssp_cache_hits_total", "cssp_cache_misses_total", "cssp_cache_bytes",
            "cssp_cache_limit_bytes", "cssp_uploads_in_progress", "cssp_upload_bytes_done", "cssp_upload_bytes_total",
            "cssp_pending_uploads", "cssp_fuse_ops_total", "cssp_errors_total", "cssp_listings_total",
        ] {
            #expect(text.contains("# TYPE \(name) "), "\(name) missing")
        }
        #expect((Self.sample(text, #"cssp_requests_total{method="PUT",status="201"}"#) ?? 0) >= 1)
        #expect((Self.sample(text, "cssp_bytes_sent_total") ?? 0) >= 300_000)
        #expect((Self.sample(text, #"cssp_fuse_ops_total{op="write"}"#) ?? 0) >= 1)
        #expect(Self.sample(text, #"cssp_errors_total{op="rmdir",errno="ENOTEMPTY"}"#) == 1)
        #expect(Self.sample(text, "cssp_cache_limit_bytes") == Double(100 << 20))
        #expect(Self.sample(text, "cssp_pending_uploads") == 0)
        // Nothing secret: neither the key nor the secret.
        #expect(!text.contains(environment.secret) && !text.contains(environment.accessKey))
        #expect(try mount.unmount() == 0)
        // Gone with the daemon: a clear line, not a hang.
        let after = try shell("\(quoted(environment.binary)) --stats \(quoted(mount.directory))")
        #expect(after.status != 0 && after.stderr.contains("is not a csspfs mount"), "\(after.stderr)")
    }

    /// During an outage (every PUT of the file answered 503) the failed file is listed as owed with
    /// its tries and the server's answer; once the server is back it is stored and the list empties.
    @Test func statusListsAnOwedUploadDuringAnOutage() throws {
        let environment = try Environment.load()
        let faultFile = try environment.faultFile()
        let (container, store, cache) = try environment.newContainer("status")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let mount = try Mount(environment, container: container, options: ["cache_dir=" + cache, "retries=1"])
        defer { try? FileManager.default.removeItem(atPath: faultFile) }
        try "PUT status=503 /\(container)/owed.txt\n".writeReplacing(file: faultFile)
        // cp checks what close returns (a shell redirection does not).
        let source = TestScratch.directory + "cssp-e2e-" + container + ".txt"
        try "owed\n".writeReplacing(file: source)
        defer { try? FileManager.default.removeItem(atPath: source) }
        let write = try shell("cp \(quoted(source)) \(quoted(mount.path("owed.txt")))")
        #expect(write.status != 0 && write.stderr.contains("Input/output error"), "\(write.stderr)")
        let status = try shell("\(quoted(environment.binary)) --status \(quoted(mount.directory))")
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stdout.contains("uploads owed: 1\n  owed.txt: 5 B, "), "\(status.stdout)")
        #expect(status.stdout.contains("last error: upload 'owed.txt'") && status.stdout.contains("503"), "\(status.stdout)")
        let stats = try shell("\(quoted(environment.binary)) --stats \(quoted(mount.directory))").stdout
        #expect(Self.sample(stats, "cssp_pending_uploads") == 1)
        #expect((Self.sample(stats, #"cssp_retries_total{reason="503"}"#) ?? 0) >= 1)
        #expect((Self.sample(stats, #"cssp_requests_total{method="PUT",status="503"}"#) ?? 0) >= 2)
        // The server is back: the scheduled retry stores it (within its backoff, ~2 s).
        try FileManager.default.removeItem(atPath: faultFile)
        let deadline = Date().addingTimeInterval(30)
        var now = ""
        repeat {
            now = try shell("\(quoted(environment.binary)) --status \(quoted(mount.directory))").stdout
            if now.contains("uploads owed: 0") { break }
            usleep(100_000)
        } while Date() < deadline
        #expect(now.contains("uploads owed: 0"), "\(now)")
        #expect(try store.getBytes(key: "owed.txt", range: nil) == Array("owed\n".utf8))
        #expect(try mount.unmount() == 0)
    }

    /// A multipart upload whose parts the server answers slowly (2 s each, one at a time) shows
    /// its bytes sent growing, part by part, against the file's whole size.
    @Test func statusShowsALargeUploadGrowing() throws {
        let environment = try Environment.load()
        let faultFile = try environment.faultFile()
        let (container, store, cache) = try environment.newContainer("progress")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let mount = try Mount(
            environment, container: container,
            options: ["cache_dir=" + cache, "multipart_threshold_mb=1", "part_size_mb=1", "upload_parallel=1"])
        defer { try? FileManager.default.removeItem(atPath: faultFile) }
        try "PUT stall=2 /\(container)/.cssp-parts/\n".writeReplacing(file: faultFile)
        let source = cache + "-source.bin"
        try Data((0..<(4 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }).write(to: URL(fileURLWithPath: source))
        defer { try? FileManager.default.removeItem(atPath: source) }
        let copy = try Child.spawn(
            ["/bin/cp", source, mount.path("big.bin")], environment: nil, stdout: 2, stderr: 2)
        // Samples of "big.bin: DONE of TOTAL" while the copy runs.
        var samples: [String] = []
        var status: Int32? = nil
        while status == nil {
            let text = try shell("\(quoted(environment.binary)) --status \(quoted(mount.directory))").stdout
            if let line = text.split(separator: "\n").first(where: { $0.contains("big.bin: ") }) {
                let shown = String(line.split(separator: "(")[0])
                if samples.last != shown { samples.append(shown) }
            }
            status = copy.poll()
            usleep(50_000)
        }
        #expect(status == 0)
        // While written, the total is what the file holds so far; at close, the whole 4 MiB.
        let whole = samples.filter { $0.hasSuffix("of 4.0 MiB ") }
        #expect(Set(whole).count >= 3, "\(samples)")
        #expect(whole.contains("  big.bin: 1.0 MiB of 4.0 MiB ") && whole.contains("  big.bin: 2.0 MiB of 4.0 MiB "), "\(samples)")
        #expect(try store.head(key: "big.bin").size == 4 << 20)
        #expect(try mount.unmount() == 0)
    }
}
