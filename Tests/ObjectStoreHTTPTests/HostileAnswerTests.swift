import Foundation
import ObjectStore
import Testing

@testable import ObjectStoreHTTP

/// Broken or hostile answers (hostile-network issue, item 6) never crash the daemon, and are
/// never taken for good ones: a server answers each request with what a test gives it.
struct HostileAnswerTests {
    /// Answers every request with the answer given for its method (JSON: method -> [status,
    /// headers, body]); a GET with a `marker` gets the same page as the first one.
    static let server = #"""
        import http.server, json, sys
        answers = json.loads(sys.argv[1])
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def answer(self):
                status, headers, body = answers[self.command]
                body = body.encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
            do_GET = do_HEAD = answer
            def log_message(self, *args):
                pass
        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        print(server.server_address[1], flush=True)
        server.serve_forever()
        """#

    func server(_ answers: [String: (Int, [String: String], String)]) throws -> LocalHTTPServer {
        let table = answers.mapValues { [$0.0, $0.1, $0.2] as [Any] }
        let json = String(decoding: try JSONSerialization.data(withJSONObject: table), as: UTF8.self)
        return try LocalHTTPServer(script: Self.server, arguments: [json])
    }

    @Test(arguments: ["nan", "inf", "-inf", "1e300", "-1e300", "9223372036854775808", "x"])
    func absurdTimestampsAreNoTime(_ value: String) throws {
        let local = try server(["HEAD": (200, ["X-Timestamp": value, "ETag": "\"e\""], "")])
        let info = try local.store().head(key: "object")
        #expect(info.lastModified == 0)
    }

    @Test(arguments: ["Sat, 21 Nov 99999999999999 22:40:21 GMT", "Sat, 99 Nov 2026 22:40:21 GMT", "Sat, 21 Nov 2026 99:99:99 GMT"])
    func absurdDatesAreNoTime(_ value: String) throws {
        let local = try server(["HEAD": (200, ["Last-Modified": value, "ETag": "\"e\""], "")])
        let info = try local.store().head(key: "object")
        #expect(info.lastModified == 0)
    }

    @Test(arguments: ["9223372036854775807", "1125899906842625", "1e3"])
    func impossibleSizesAreRefused(_ value: String) throws {
        let local = try server(["HEAD": (200, ["Content-Length": value, "ETag": "\"e\""], "")])
        let error = #expect(throws: ObjectStoreError.self) { _ = try local.store().head(key: "object") }
        #expect(error?.code == .invalidResponse)
    }

    /// libcurl itself refuses a negative length: the request fails, the size is never taken.
    @Test func aNegativeSizeIsRefused() throws {
        let local = try server(["HEAD": (200, ["Content-Length": "-5", "ETag": "\"e\""], "")])
        #expect(throws: ObjectStoreError.self) { _ = try local.store().head(key: "object") }
    }

    @Test(arguments: ["-1", "9223372036854775807"])
    func impossibleListingSizesAreRefused(_ value: String) throws {
        let listing = """
            <?xml version="1.0" encoding="UTF-8"?><container name="c"><object><name>a</name><hash>e</hash>\
            <bytes>\(value)</bytes><content_type>text/plain</content_type>\
            <last_modified>2026-11-21T22:40:21.123456</last_modified></object></container>
            """
        let local = try server(["GET": (200, ["Content-Type": "application/xml"], listing)])
        let error = #expect(throws: ObjectStoreError.self) {
            _ = try local.store().list(prefix: "", delimiter: nil, marker: nil, limit: 10)
        }
        #expect(error?.code == .invalidResponse)
    }

    @Test func aContainerHeadWithNegativeCountsIsZero() throws {
        let local = try server(["HEAD": (204, ["X-Container-Object-Count": "-3", "X-Container-Bytes-Used": "-1"], "")])
        let info = try local.store().headContainer()
        #expect(info.objectCount == 0 && info.bytesUsed == 0)
    }

    /// A ranged GET answered with other bytes than the range: a 200 with the whole object (a
    /// server or proxy that ignored Range) or a 206 for another range. Such bytes were served, and
    /// cached, as if they were the range.
    @Test(arguments: [
        (200, ["ETag": "\"e\""], String(repeating: "0123456789", count: 10)),
        (206, ["ETag": "\"e\"", "Content-Range": "bytes 0-9/100"], "0123456789"),
    ])
    func aRangedGetAnsweredWithOtherBytesIsRefused(_ answer: (Int, [String: String], String)) throws {
        let local = try server(["GET": answer])
        var received: [UInt8] = []
        let error = #expect(throws: ObjectStoreError.self) {
            _ = try local.store().get(key: "object", range: ByteRange(lower: 50, upper: 59)) { received += $0 }
        }
        #expect(error?.code == .invalidResponse)
        #expect(received.isEmpty)
    }

    /// A server that ignores `marker` answers every page with the first: a listing would loop.
    @Test func aListingWhoseServerIgnoresTheMarkerEnds() throws {
        let listing = """
            <?xml version="1.0" encoding="UTF-8"?><container name="c">\
            <object><name>a</name><hash>e</hash><bytes>1</bytes><content_type>text/plain</content_type>\
            <last_modified>2026-11-21T22:40:21.123456</last_modified></object>\
            <object><name>b</name><hash>e</hash><bytes>1</bytes><content_type>text/plain</content_type>\
            <last_modified>2026-11-21T22:40:21.123456</last_modified></object></container>
            """
        let local = try server(["GET": (200, ["Content-Type": "application/xml"], listing)])
        let error = #expect(throws: ObjectStoreError.self) { _ = try local.store().listAll(prefix: "", delimiter: nil, pageSize: 2) }
        #expect(error?.code == .invalidResponse)
    }
}
