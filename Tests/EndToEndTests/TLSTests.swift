import Foundation
import ObjectStore
import ObjectStoreTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// HTTPS with a private CA (hostile-network issue, item 3): the local server behind a TLS relay
/// (`scripts/tls-relay`) whose certificate a CA made by this test signed.
@Suite(.serialized)
struct TLSTests {
    /// A CA, a certificate for 127.0.0.1 signed by it, and the relay serving it.
    final class PrivateCAEndpoint {
        let directory = TestScratch.directory + "cssp-e2e-tls-" + UUID().uuidString.prefix(8)
        let relay: Process
        var url = ""
        var caFile: String { directory + "/ca.pem" }

        init(serverURL: String) throws {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let made = try shell(
                """
                set -e
                cd \(quoted(directory))
                openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj '/CN=csspfs test CA' 2>/dev/null
                openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj '/CN=127.0.0.1' 2>/dev/null
                printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext
                openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 \
                    -extfile san.ext 2>/dev/null
                mkdir hashed && cp ca.pem hashed/ && openssl rehash hashed
                """)
            guard made.status == 0 else { throw HarnessError("making the certificates failed: \(made.stderr)") }
            guard let port = serverURL.split(separator: ":").last else { throw HarnessError("no port in \(serverURL)") }
            let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent()
            let listening: Int
            (relay, listening) = try launchPrintingPort(
                "/usr/bin/python3",
                [
                    root.appendingPathComponent("scripts/tls-relay").path, directory + "/server.pem",
                    directory + "/server.key", "0", String(port),
                ])
            url = "https://127.0.0.1:\(listening)"
        }

        deinit {
            kill(relay.processIdentifier, SIGKILL)
            relay.waitUntilExit()
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    @Test func aPrivateCAIsTrustedOnlyWhenGiven() throws {
        let environment = try Environment.load()
        let container = "tls-" + UUID().uuidString.prefix(6).lowercased()
        let store = environment.store(container: container)
        try store.createContainer()
        try store.put(key: "hello.txt", body: .bytes(Array("over TLS\n".utf8)), contentType: nil, metadata: [:])
        let endpoint = try PrivateCAEndpoint(serverURL: environment.serverURL)

        // Not trusted by default: the mount is refused with a line that says what to do.
        let mountpoint = endpoint.directory + "/mnt"
        try FileManager.default.createDirectory(atPath: mountpoint, withIntermediateDirectories: true)
        let refused = try shell(
            "timeout 60 \(quoted(environment.binary)) \(quoted(endpoint.url + "/" + container)) \(quoted(mountpoint)) -f "
                + "-o passwd_file=\(quoted(environment.passwdFile))")
        #expect(refused.status == 32, "\(refused.status) \(refused.stderr)")
        #expect(refused.stderr.contains("not trusted") && refused.stderr.contains("cafile="), "\(refused.stderr)")
        #expect(refused.stderr.split(separator: "\n").count == 1, "\(refused.stderr)")

        for options in [["cafile=" + endpoint.caFile], ["capath=" + endpoint.directory + "/hashed"], ["insecure"]] {
            let mount = try Mount(environment, container: container, options: options, url: endpoint.url)
            let read = try shell("cat \(quoted(mount.path("hello.txt")))")
            #expect(read.stdout == "over TLS\n", "\(options): \(read.stderr)")
            #expect(options != ["insecure"] || mount.stderrText.contains("insecure"), "no warning: \(mount.stderrText)")
            #expect(try mount.unmount() == 0)
        }
    }
}
