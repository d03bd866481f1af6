import Foundation
import ObjectStore
import Testing

@testable import ObjectStoreHTTP

/// Retries as the hostile-network issue (items 4 and 5) wants them, against a small HTTP server
/// that misbehaves on purpose and counts what it was sent (`GET /c/log` answers the log).
struct RetryTests {
    static let server = #"""
        import http.server, socket, sys, time
        log = []
        state = {"deleted": False, "copied": False, "throttled": False}
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def reply(self, status, headers={}, body=b""):
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
            def lose_answer(self):
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            def do_HEAD(self):
                log.append("%.3f HEAD %s" % (time.time(), self.path.split("?")[0]))
                path = self.path.split("?")[0]
                if path == "/c/throttled" and not state["throttled"]:
                    state["throttled"] = True
                    return self.reply(503, {"Retry-After": "1"})
                if path == "/c/source" or (path == "/c/destination" and state["copied"]) or path == "/c/throttled":
                    return self.reply(200, {"ETag": '"s"'})
                self.reply(404)
            def do_GET(self):
                path = self.path.split("?")[0]
                if path == "/c/log":
                    return self.reply(200, {}, "\n".join(log).encode())
                log.append("%.3f GET %s" % (time.time(), path))
                if path == "/c/drip":
                    self.send_response(200)
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    for _ in range(100):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.3)
                    return
                self.reply(404)
            def do_DELETE(self):
                log.append("%.3f DELETE %s" % (time.time(), self.path.split("?")[0]))
                if state["deleted"]:
                    return self.reply(404)
                state["deleted"] = True
                self.lose_answer()
            def do_PUT(self):
                log.append("%.3f PUT %s %s" % (time.time(), self.path.split("?")[0], self.headers.get("X-Copy-From", "")))
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("X-Copy-From"):
                    state["copied"] = True
                    return self.lose_answer()
                self.reply(201)
            def log_message(self, *args):
                pass
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        print(server.server_address[1], flush=True)
        server.serve_forever()
        """#

    /// The requests the server saw (time, method, path), without the log request itself.
    func log(_ server: LocalHTTPServer) throws -> [(time: Double, request: String)] {
        let text = String(decoding: try server.store().getBytes(key: "log", range: nil), as: UTF8.self)
        return text.split(separator: "\n").map { line in
            let parts = line.split(separator: " ", maxSplits: 1)
            return (Double(parts[0]) ?? 0, String(parts[1]))
        }
    }

    @Test func aThrottledRequestWaitsAsLongAsRetryAfterSays() throws {
        let server = try LocalHTTPServer(script: Self.server)
        _ = try server.store().head(key: "throttled")
        let heads = try log(server).filter { $0.request.hasPrefix("HEAD") }
        try #require(heads.count == 2)
        #expect(heads[1].time - heads[0].time >= 0.95, "retried after \(heads[1].time - heads[0].time) s, Retry-After: 1")
    }

    /// Issue 11: every attempt is counted by method and status, the retry by its cause, and the
    /// bytes each way.
    @Test func attemptsRetriesAndBytesAreCounted() throws {
        let server = try LocalHTTPServer(script: Self.server)
        let store = server.store()
        _ = try store.head(key: "throttled")
        try store.put(key: "new", body: .bytes(Array(repeating: 1, count: 1000)), contentType: nil, metadata: [:])
        let metrics = store.metrics
        #expect(metrics.requests.value("HEAD", "503") == 1)
        #expect(metrics.requests.value("HEAD", "200") == 1)
        #expect(metrics.requests.value("PUT", "201") == 1)
        #expect(metrics.retries.value("503") == 1)
        #expect(metrics.requestSeconds.count("HEAD") == 2)
        #expect(metrics.bytesSent.value == 1000)
        #expect(metrics.bytesReceived.value == 0)
        let text = metrics.registry.render()
        #expect(text.contains(#"cssp_requests_total{method="HEAD",status="503"} 1"#))
        #expect(text.contains(#"cssp_retries_total{reason="503"} 1"#))
        #expect(text.contains(#"cssp_request_seconds_count{method="PUT"} 1"#))
    }

    @Test func aDeleteWhoseAnswerWasLostIsDone() throws {
        let server = try LocalHTTPServer(script: Self.server)
        try server.store().delete(key: "object")
        #expect(try log(server).filter { $0.request.hasPrefix("DELETE") }.count == 2)
    }

    /// The first COPY did its work and lost its answer: a HEAD of both shows it, and it is not sent
    /// again (a long copy sent again and again never finishes).
    @Test func aCopyWhoseAnswerWasLostIsNotSentAgain() throws {
        let server = try LocalHTTPServer(script: Self.server)
        try server.store().copy(from: "source", to: "destination")
        #expect(try log(server).filter { $0.request.hasPrefix("PUT") }.count == 1)
    }

    /// A server that drips one byte every 0.3 s (3 B/s) is below the low-speed limit: the GET fails
    /// after `stall_timeout` instead of holding its thread for the whole body.
    @Test func aDrippingAnswerFails() throws {
        let server = try LocalHTTPServer(script: Self.server)
        let store = server.store(configure: { $0.stallTimeout = 1; $0.maxAttempts = 1 })
        var received = 0
        let error = #expect(throws: ObjectStoreError.self) { _ = try store.get(key: "drip", range: nil) { received += $0.count } }
        #expect(error?.code == .transient)
        #expect(received < 100)
    }
}
