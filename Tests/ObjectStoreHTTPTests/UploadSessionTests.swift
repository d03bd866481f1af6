import Foundation
import ObjectStore
import Testing

@testable import ObjectStoreHTTP

/// The upload session of the Swift dialect (`ManifestStore`) on the wire: a session is its part
/// PUTs below `.cssp-parts/<id>/`, one listing of them, the manifest PUT and a HEAD, in that
/// order; an abort is the listing and a DELETE per part; a metadata change is one POST that
/// sends the manifest again. A small server keeps the objects and logs every request.
struct UploadSessionTests {
    static let server = #"""
        import http.server, hashlib, json, sys, urllib.parse
        objects, log = {}, []
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
            def key(self):
                return urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)[len("/c/"):]
            def note(self):
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                entry = self.command + " " + self.key()
                if "prefix" in query:
                    entry += " prefix=" + query["prefix"][0]
                if self.headers.get("X-Object-Manifest"):
                    entry += " manifest=" + urllib.parse.unquote(self.headers["X-Object-Manifest"])
                log.append(entry)
                with open(sys.argv[1], "w") as f:
                    json.dump(log, f)
            def do_GET(self):
                if self.path == "/info":
                    return self.reply(200, {}, b'{"swift": {"version": "2.30.0"}}')
                self.note()
                prefix = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("prefix", [""])[0]
                listing = "".join(
                    "<object><name>%s</name><hash>%s</hash><bytes>%d</bytes><content_type>application/octet-stream"
                    "</content_type><last_modified>2026-11-28T00:00:00.000000</last_modified></object>"
                    % (k, v["etag"], len(v["body"])) for k, v in sorted(objects.items()) if k.startswith(prefix))
                self.reply(200, {"Content-Type": "application/xml"}, ('<container name="c">' + listing + "</container>").encode())
            def do_PUT(self):
                self.note()
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                etag = hashlib.md5(body).hexdigest()
                manifest = self.headers.get("X-Object-Manifest")
                objects[self.key()] = {"body": body, "etag": etag, "manifest": urllib.parse.unquote(manifest) if manifest else None}
                self.reply(201, {"ETag": '"' + etag + '"'})
            def do_HEAD(self):
                self.note()
                o = objects.get(self.key())
                if o is None:
                    return self.reply(404)
                size, etag = len(o["body"]), o["etag"]
                if o["manifest"]:
                    prefix = o["manifest"][len("c/"):]
                    parts = [v for k, v in sorted(objects.items()) if k.startswith(prefix)]
                    size = sum(len(p["body"]) for p in parts)
                    etag = hashlib.md5("".join(p["etag"] for p in parts).encode()).hexdigest()
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.send_header("ETag", '"' + etag + '"')
                self.send_header("X-Timestamp", "1764288000.00000")
                if o["manifest"]:
                    self.send_header("X-Object-Manifest", o["manifest"])
                self.end_headers()
            def do_DELETE(self):
                self.note()
                self.reply(204 if objects.pop(self.key(), None) is not None else 404)
            def do_POST(self):
                self.note()
                self.reply(202)
            def log_message(self, *args):
                pass
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        print(server.server_address[1], flush=True)
        server.serve_forever()
        """#

    let logPath = NSTemporaryDirectory() + "cssp-upload-session-" + UUID().uuidString + ".json"

    /// The server, logging to `logPath`.
    func start() throws -> LocalHTTPServer { try LocalHTTPServer(script: Self.server, arguments: [logPath]) }

    /// What the server saw, in order.
    func log(_ local: LocalHTTPServer) throws -> [String] {
        guard let data = FileManager.default.contents(atPath: logPath) else { return [] }
        return try JSONDecoder().decode([String].self, from: data)
    }

    @Test func aFinishedSessionIsItsPartsThenOneListingThenTheManifestThenAHead() throws {
        let local = try start()
        defer { unlink(logPath) }
        let store = local.store()
        let session = try store.beginUpload(key: "big")
        #expect(session.id.hasPrefix(".cssp-parts/") && session.id.hasSuffix("/"))
        #expect(try log(local).isEmpty, "beginning a session sends nothing")
        let first = try store.uploadPart(session, number: 1, body: .bytes(Array(repeating: 1, count: 4)))
        let second = try store.uploadPart(session, number: 2, body: .bytes([2, 2]))
        var asked: [String] = []
        let finished = try store.finishUpload(
            session, partETags: [first, second], size: 6, partSize: 4,
            destination: {
                asked.append("destination")
                return "copy of big"
            }, contentType: nil, metadata: [:])
        #expect(asked == ["destination"])
        #expect(finished.key == "copy of big")
        #expect(finished.etag == store.uploadETag(partETags: [first, second]))
        #expect(finished.manifest == "c/" + session.id)
        #expect(
            try log(local) == [
                "PUT \(session.id)00000001", "PUT \(session.id)00000002", "GET  prefix=\(session.id)",
                "PUT copy of big manifest=c/\(session.id)", "HEAD copy of big",
            ])
    }

    @Test func partsThatDoNotListAsSentAreDeletedAndTheObjectIsNotMade() throws {
        let local = try start()
        defer { unlink(logPath) }
        let store = local.store()
        let session = try store.beginUpload(key: "big")
        let first = try store.uploadPart(session, number: 1, body: .bytes([1, 1]))
        // The second part never went up: the listing shows one part of two, six times.
        let error = #expect(throws: ObjectStoreError.self) {
            _ = try store.finishUpload(
                session, partETags: [first, first], size: 4, partSize: 2, destination: { "big" }, contentType: nil,
                metadata: [:])
        }
        #expect(error?.code == .invalidResponse)
        let seen = try log(local)
        #expect(!seen.contains { $0.hasPrefix("PUT big") || $0.hasPrefix("HEAD") })
        #expect(seen.filter { $0 == "GET  prefix=\(session.id)" }.count == 7, "six checks, then the abort's listing")
        #expect(seen.last == "DELETE \(session.id)00000001")
    }

    @Test func anAbortListsThePartsAndDeletesEach() throws {
        let local = try start()
        defer { unlink(logPath) }
        let store = local.store()
        let session = try store.beginUpload(key: "big")
        for number in 1...3 { _ = try store.uploadPart(session, number: number, body: .bytes([UInt8(number)])) }
        store.discardPart(session, number: 3)
        store.abortUpload(session)
        let seen = try log(local)
        #expect(Array(seen.prefix(5)) == (1...3).map { "PUT \(session.id)0000000\($0)" } + ["DELETE \(session.id)00000003", "GET  prefix=\(session.id)"])
        #expect(Set(seen.dropFirst(5)) == ["DELETE \(session.id)00000001", "DELETE \(session.id)00000002"])
        #expect(try store.listAll(prefix: session.id, delimiter: nil).isEmpty)
    }

    @Test func aMetadataChangeIsOnePostThatKeepsTheManifest() throws {
        let local = try start()
        defer { unlink(logPath) }
        let store = local.store()
        try store.setMetadata(key: "big", contentType: "text/plain", metadata: ["mtime": "1"], manifest: "c/.cssp-parts/1/")
        try store.setMetadata(key: "small", contentType: "text/plain", metadata: [:], manifest: nil)
        #expect(try log(local) == ["POST big manifest=c/.cssp-parts/1/", "POST small"])
    }
}
