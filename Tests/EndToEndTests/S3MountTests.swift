import Foundation
import MountCSSPConfig
import ObjectStore
import ObjectStoreHTTP
import ObjectStoreTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `mount.cssp s3://BUCKET` through the test server's s3api: what only that URL form has. (The
/// write, directory and model suites run over it too, with CSSP_E2E_DIALECT=s3.)
@Suite(.serialized)
struct S3MountTests {
    let environment: Environment
    let bucket: String
    let cache: String

    init() throws {
        environment = try Environment.load()
        // (A name COS takes too: BUCKET-APPID.)
        bucket = "s3m-" + UUID().uuidString.prefix(6).lowercased() + "-1250000000"
        try environment.store(container: bucket).createContainer()
        cache = TestScratch.directory + "cssp-e2e-cache-" + bucket
    }

    /// What one API writes, the other reads: a tree and a file large enough for a multipart
    /// upload, written through s3:// (or cos://, through the COS front), read through a CSSP
    /// mount of the same container and through s3:// again after a remount with an empty
    /// cache; then the other way round.
    @Test(arguments: [StoreDialect.s3, .cos])
    func bothAPIsSeeTheSameFiles(dialect: StoreDialect) throws {
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let work = TestScratch.directory + "cssp-e2e-s3m-" + bucket
        defer { try? FileManager.default.removeItem(atPath: work) }
        try WriteTests.makeTree(at: work + "/tree")
        let made = try shell("head -c 75000000 /dev/urandom > \(quoted(work + "/big"))")
        #expect(made.status == 0)
        var s3 = try Mount(environment, container: bucket, options: ["cache_dir=" + cache], dialect: dialect)
        let copied = try shell("cp -a \(quoted(work + "/tree")) \(quoted(work + "/big")) \(quoted(s3.directory))")
        #expect(copied.status == 0, "\(copied.stderr)")
        // Modes and times came through: rsync finds nothing to send.
        let again = try shell("rsync -a -i \(quoted(work + "/tree/")) \(quoted(s3.path("tree/")))")
        #expect(again.status == 0 && again.stdout.isEmpty, "rsync sent: \(again.stdout)\(again.stderr)")
        #expect(try s3.unmount() == 0)

        try? FileManager.default.removeItem(atPath: cache)
        let cssp = try Mount(environment, container: bucket, options: ["cache_dir=" + cache + "-cssp"], dialect: .cssp)
        defer { try? FileManager.default.removeItem(atPath: cache + "-cssp") }
        for mount in [cssp] {
            let diff = try shell("diff -r \(quoted(work + "/tree")) \(quoted(mount.path("tree"))) && cmp \(quoted(work + "/big")) \(quoted(mount.path("big")))")
            #expect(diff.status == 0, "\(diff.stdout)\(diff.stderr)")
        }
        let written = try shell("echo from-cssp > \(quoted(cssp.path("tree/new.txt"))) && mv \(quoted(cssp.path("tree/src"))) \(quoted(cssp.path("tree/moved")))")
        #expect(written.status == 0, "\(written.stderr)")
        #expect(try cssp.unmount() == 0)

        s3 = try Mount(environment, container: bucket, options: ["cache_dir=" + cache], dialect: dialect)
        #expect(try String(contentsOfFile: s3.path("tree/new.txt"), encoding: .utf8) == "from-cssp\n")
        let moved = try shell("diff -r \(quoted(work + "/tree/src")) \(quoted(s3.path("tree/moved"))) && cmp \(quoted(work + "/big")) \(quoted(s3.path("big")))")
        #expect(moved.status == 0, "\(moved.stdout)\(moved.stderr)")
        #expect(!FileManager.default.fileExists(atPath: s3.path("tree/src")))
        let removed = try shell("rm -rf \(quoted(s3.path("tree"))) \(quoted(s3.path("big")))")
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(try s3.unmount() == 0)
        #expect(try environment.store(container: bucket).listAll(prefix: "", delimiter: nil).isEmpty)
        let s3Client = try environment.s3Store(bucket: bucket, dialect: dialect == .cos ? .cos : .s3)
        #expect(try s3Client.uploadsInProgress(prefix: "").isEmpty, "an upload was left behind")
    }

    /// A wrong secret, a missing bucket, a missing region: one line each, nothing mounted.
    @Test func badInputIsOneLineAndNothingIsMounted() throws {
        let directory = TestScratch.directory + "cssp-e2e-s3-bad-" + bucket
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let wrong = TestScratch.directory + "passwd-s3-wrong"
        try "cssptest:bench:not-the-secret\n".write(toFile: wrong, atomically: true, encoding: .utf8)
        chmod(wrong, 0o600)
        let cases: [(String, String, String)] = [
            ("s3://\(bucket)", "passwd_file=\(wrong),endpoint=\(environment.serverURL)", "check the access key and secret"),
            ("s3://no-such-bucket-\(bucket)", "passwd_file=\(try environment.s3PasswdFile()),endpoint=\(environment.serverURL)", "does not exist"),
            ("cos://\(bucket)", "passwd_file=\(try environment.s3PasswdFile())", "region"),
            ("cos://\(bucket)", "passwd_file=\(wrong),endpoint=\(try environment.cosURL())", "check the access key and secret"),
        ]
        for (url, options, fragment) in cases {
            let result = try shell("\(quoted(environment.binary)) \(quoted(url)) \(quoted(directory)) -f -o \(quoted(options))")
            #expect(result.status != 0 && !isMounted(directory))
            let lines = result.stderr.split(separator: "\n")
            #expect(lines.count == 1 && result.stderr.contains(fragment), "\(url): \(result.stderr)")
            #expect(!result.stderr.contains("not-the-secret"))
        }
    }
}
