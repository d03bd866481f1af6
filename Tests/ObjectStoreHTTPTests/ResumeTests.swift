import Foundation
import Logging
import ObjectStore
import Testing

@testable import ObjectStoreHTTP

/// A GET cut off half-way is resumed with a range; it must continue the same version or fail,
/// never splice another version's bytes onto the first half (integrity issue, item 10).
/// Against a small HTTP server (Python's http.server) that cuts the first answer after 50 of
/// 100 bytes, and answers a ranged request with a different version unless it carries If-Match.
struct ResumeTests {
    static let server = #"""
        import http.server, socket
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def do_GET(self):
                if "Range" not in self.headers:
                    self.send_response(200)
                    self.send_header("Content-Length", "100")
                    self.send_header("ETag", '"aaaa"')
                    self.end_headers()
                    self.wfile.write(b"A" * 50)
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif self.headers.get("If-Match"):
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self.send_response(206)
                    self.send_header("Content-Range", "bytes 50-99/100")
                    self.send_header("Content-Length", "50")
                    self.send_header("ETag", '"bbbb"')
                    self.end_headers()
                    self.wfile.write(b"B" * 50)
            def log_message(self, *args):
                pass
        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        print(server.server_address[1], flush=True)
        server.serve_forever()
        """#

    @Test func aResumedGetNeverSplicesTwoVersions() throws {
        let server = try LocalHTTPServer(script: Self.server)
        let store = server.store()
        var received: [UInt8] = []
        do {
            _ = try store.get(key: "object", range: nil) { received.append(contentsOf: $0) }
            Issue.record("the GET succeeded with \(received.count) bytes: \(Set(received).map { Character(UnicodeScalar($0)) })")
        } catch {
            #expect(error.code == .preconditionFailed, "\(error)")
        }
        #expect(!received.contains(UInt8(ascii: "B")), "bytes of another version were spliced in")
    }
}
