import Foundation
import MountCSSPConfig
import ObjectStoreTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 41's interop: s3fs and rclone, on the same bucket through the same s3api, see the mode
/// and mtime csspfs wrote, and csspfs sees theirs: the metadata keys and number forms are what
/// those tools write (`x-amz-meta-mode` a decimal st_mode, `x-amz-meta-mtime` seconds with a
/// fraction), not only what csspfs reads back.
@Suite(.serialized)
struct S3InteropTests {
    let environment: Environment
    let bucket: String
    let cache: String
    let peer: (key: String, secret: String)

    init() throws {
        environment = try Environment.load()
        bucket = "s3i-" + UUID().uuidString.prefix(6).lowercased()
        try environment.store(container: bucket).createContainer()
        cache = TestScratch.directory + "cssp-e2e-cache-" + bucket
        let env = ProcessInfo.processInfo.environment
        guard let key = env["CSSP_PEER_USER"], let secret = env["CSSP_PEER_KEY"] else {
            throw HarnessError("CSSP_PEER_USER and CSSP_PEER_KEY are not set: run through scripts/test")
        }
        peer = (key, secret)
    }

    /// `stat` of each path on a mount: octal permissions, file type, mtime with nanoseconds.
    func stats(_ paths: [String]) throws -> [String] {
        let output = try shell("stat -c '%a %F %.9Y' " + paths.map(quoted).joined(separator: " "))
        #expect(output.status == 0, "\(output.stderr)")
        return output.stdout.split(separator: "\n").map(String.init)
    }

    /// s3fs on the bucket (its own daemon, which has mounted when the command returns), for `body`.
    func withS3fs(_ body: (String) throws -> Void) throws {
        let directory = TestScratch.directory + "cssp-e2e-s3fs-" + bucket
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let mounted = try shell(
            "s3fs \(bucket) \(quoted(directory)) -o url=\(environment.serverURL),use_path_request_style",
            environment: ProcessInfo.processInfo.environment.merging(["AWSACCESSKEYID": peer.key, "AWSSECRETACCESSKEY": peer.secret]) { $1 })
        try #require(mounted.status == 0, "s3fs: \(mounted.stderr)")
        let table = try String(contentsOfFile: "/proc/mounts", encoding: .utf8)
        try #require(table.contains(" \(directory) fuse.s3fs "), "s3fs returned without a mount")
        defer { _ = try? shell("umount \(quoted(directory))") }
        try body(directory)
        let unmounted = try shell("umount \(quoted(directory))")
        #expect(unmounted.status == 0, "\(unmounted.stderr)")
    }

    /// rclone against the bucket through s3api: a remote made of environment variables only.
    func rclone(_ arguments: String) throws -> Output {
        let remote = [
            "RCLONE_CONFIG": "/dev/null", "RCLONE_CONFIG_X_TYPE": "s3", "RCLONE_CONFIG_X_PROVIDER": "Other",
            "RCLONE_CONFIG_X_ENDPOINT": environment.serverURL, "RCLONE_CONFIG_X_FORCE_PATH_STYLE": "true",
            "RCLONE_CONFIG_X_REGION": "us-east-1", "RCLONE_CONFIG_X_ACCESS_KEY_ID": peer.key,
            "RCLONE_CONFIG_X_SECRET_ACCESS_KEY": peer.secret,
        ]
        var environment = ProcessInfo.processInfo.environment.merging(remote) { $1 }
        // (rclone 1.60's S3 backend fails on any AWS_CA_BUNDLE, which some machines set; plain HTTP here.)
        environment["AWS_CA_BUNDLE"] = nil
        return try shell("rclone " + arguments, environment: environment)
    }

    @Test func s3fsAndRcloneSeeTheModesAndTimesCsspfsWrote() throws {
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let csspfs = try Mount(environment, container: bucket, options: ["cache_dir=" + cache], dialect: .s3)
        let made = try shell(
            "cd \(quoted(csspfs.directory)) && printf hello > f && chmod 640 f && touch -m -d @1600000000.25 f"
                + " && mkdir d && chmod 710 d && ln -s f l")
        #expect(made.status == 0, "\(made.stderr)")
        #expect(try csspfs.unmount() == 0)

        try withS3fs { s3fs in
            let shown = try stats([s3fs + "/f", s3fs + "/d"])
            #expect(shown.first == "640 regular file 1600000000.250000000", "\(shown)")
            #expect(shown.last?.hasPrefix("710 directory ") == true, "\(shown)")
            #expect(try String(contentsOfFile: s3fs + "/f", encoding: .utf8) == "hello")
            #expect(try FileManager.default.destinationOfSymbolicLink(atPath: s3fs + "/l") == "f")
        }
        let listed = try rclone("lsjson -M x:\(bucket)/f")
        #expect(listed.status == 0, "\(listed.stderr)")
        #expect(listed.stdout.contains("\"ModTime\":\"2020-09-13T12:26:40.250000000Z\""), "\(listed.stdout)")
        #expect(listed.stdout.contains("\"mode\":\"33184\""), "\(listed.stdout)")
    }

    @Test func csspfsSeesTheModesAndTimesS3fsAndRcloneWrote() throws {
        defer { try? FileManager.default.removeItem(atPath: cache) }
        try withS3fs { s3fs in
            let made = try shell(
                "cd \(quoted(s3fs)) && printf x > g && chmod 604 g && mkdir e && chmod 750 e && ln -s g m")
            #expect(made.status == 0, "\(made.stderr)")
        }
        let local = TestScratch.directory + "cssp-e2e-rclone-" + bucket
        defer { try? FileManager.default.removeItem(atPath: local) }
        let prepared = try shell("printf rc > \(quoted(local)) && chmod 620 \(quoted(local)) && touch -m -d @1500000000.5 \(quoted(local))")
        #expect(prepared.status == 0, "\(prepared.stderr)")
        let copied = try rclone("copyto -M \(quoted(local)) x:\(bucket)/r")
        #expect(copied.status == 0, "\(copied.stderr)")

        let csspfs = try Mount(environment, container: bucket, options: ["cache_dir=" + cache], dialect: .s3)
        let shown = try stats([csspfs.path("g"), csspfs.path("e"), csspfs.path("r")])
        #expect(shown.count == 3)
        #expect(shown.first?.hasPrefix("604 regular file ") == true, "\(shown)")
        #expect(shown.dropFirst().first?.hasPrefix("750 directory ") == true, "\(shown)")
        #expect(shown.last == "620 regular file 1500000000.500000000", "\(shown)")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: csspfs.path("m")) == "g")
        #expect(try String(contentsOfFile: csspfs.path("m"), encoding: .utf8) == "x")
        // And in a listing, as ls -l shows them: the symlink a symlink there too.
        let listed = try shell("ls -l \(quoted(csspfs.directory)) | cut -c1-10")
        #expect(listed.stdout.split(separator: "\n").dropFirst().sorted() == ["-rw----r--", "-rw--w----", "drwxr-x---", "lrwxrwxrwx"])
        #expect(try csspfs.unmount() == 0)
    }
}
