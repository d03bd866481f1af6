import CCurl
import Logging
import Metrics
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Where a container lives and how to talk to it.
public struct HTTPStoreConfiguration: Sendable {
    /// `http(s)://host[:port]`, no trailing slash.
    public var baseURL: String
    public var container: String
    public var signer: RequestSigner
    /// Seconds to wait for a TCP/TLS connection.
    public var connectTimeout: Int = 10
    /// A transfer slower than `lowSpeedLimit` bytes a second for this many seconds fails (and
    /// may be retried): a stall, or a server that drips.
    public var stallTimeout: Int = 30
    public var lowSpeedLimit: Int = 1024
    /// Seconds a request may take beyond what its known size needs at `lowSpeedLimit` (a HEAD,
    /// a DELETE, a ranged GET, a PUT of a known length); a whole-object GET has no deadline.
    public var requestTimeout: Int = 60
    /// Seconds a server-side COPY may take (it answers nothing until it is done, so it has no
    /// low-speed limit). A COPY that fails is checked (are the ETags equal now?) before it is
    /// sent again.
    public var copyTimeout: Int = 3600
    /// The longest wait a `Retry-After` answer gets (longer ones are cut to this).
    public var retryAfterCap: Double = 60
    /// CA certificates that sign the server's certificate, besides the system's: a PEM file, a
    /// directory of hashed PEM files (`openssl rehash`).
    public var caFile: String? = nil
    public var caPath: String? = nil
    /// No certificate verification at all (`-o insecure`).
    public var insecure = false
    /// Attempts per idempotent request, the first included.
    public var maxAttempts: Int = 5
    /// Backoff before retry n is a random value in [b/2, b], b = min(backoffCap, backoffBase * 2^n).
    public var backoffBase: Double = 0.1
    public var backoffCap: Double = 30
    /// Added to this machine's clock when dating requests. Only tests set it, to simulate skew.
    public var clockOffsetSeconds: Int = 0
    /// Where the credentials came from, named in authentication errors (never the secret itself).
    public var credentialSource: String = "the credentials"
    /// Sent as `User-Agent`, so that a server's access log tells our requests from others'.
    public var userAgent: String? = nil

    public init(baseURL: String, container: String, signer: RequestSigner) {
        self.baseURL = baseURL
        self.container = container
        self.signer = signer
    }
}

/// The CSSP client: libcurl for transport, OpenSSL for signing, shared by all FUSE threads.
public final class HTTPObjectStore: ManifestStore {
    public let configuration: HTTPStoreConfiguration
    private let pool: CurlHandlePool
    private let logger: Logger
    /// Requests, their times, bytes and retries are counted here (`mount.cssp --stats`).
    public let metrics: MountMetrics

    public var containerName: String { configuration.container }
    /// What `/info` said, once asked (nil: not yet).
    private let serverInfo = Mutex<ServerInfo?>(nil)

    public init(
        configuration: HTTPStoreConfiguration, logger: Logger, maxIdleConnections: Int = 32,
        metrics: MountMetrics = MountMetrics()
    ) {
        self.configuration = configuration
        self.pool = CurlHandlePool(maxIdle: maxIdleConnections)
        self.logger = logger
        self.metrics = metrics
    }

    // MARK: ObjectStore

    public func headContainer() throws(ObjectStoreError) -> ContainerInfo {
        let response = try send(Request(method: "HEAD", key: nil))
        return ContainerInfo(
            objectCount: Self.size(response.headers["x-container-object-count"]) ?? 0,
            bytesUsed: Self.size(response.headers["x-container-bytes-used"]) ?? 0)
    }

    public func list(prefix: String, delimiter: String?, marker: String?, limit: Int) throws(ObjectStoreError)
        -> ListPage
    {
        try list(prefix: prefix, delimiter: delimiter, marker: marker, endMarker: nil, limit: limit)
    }

    public func list(prefix: String, delimiter: String?, marker: String?, endMarker: String?, limit: Int)
        throws(ObjectStoreError) -> ListPage
    {
        precondition(limit > 0 && limit <= 10_000, "listing limit must be in 1...10000")
        var request = Request(method: "GET", key: nil)
        request.query = [("limit", String(limit))]
        if !prefix.isEmpty { request.query.append(("prefix", prefix)) }
        if let delimiter { request.query.append(("delimiter", delimiter)) }
        if let marker { request.query.append(("marker", marker)) }
        if let endMarker { request.query.append(("end_marker", endMarker)) }
        metrics.listings.add()
        let response = try send(request)
        let entries = response.status == 204 ? [] : try ListingParser.parse(response.body)
        // Names come after the marker, in byte order: a server that ignores the marker would make
        // a listing loop forever.
        if let marker, let first = entries.first, !marker.utf8.lexicographicallyPrecedes(first.name.utf8) {
            throw ObjectStoreError(
                .invalidResponse, "the server ignored the listing marker ('\(first.name)' after '\(marker)'); is it a Swift or CSSP endpoint?")
        }
        if let endMarker, let last = entries.last, !last.name.utf8.lexicographicallyPrecedes(endMarker.utf8) {
            throw ObjectStoreError(
                .invalidResponse, "the server ignored the listing end_marker ('\(last.name)' before '\(endMarker)'); is it a Swift or CSSP endpoint?")
        }
        let next = entries.count >= limit ? entries.last?.name : nil
        return ListPage(entries: entries, nextMarker: next)
    }

    public func head(key: String) throws(ObjectStoreError) -> ObjectInfo {
        let response = try send(Request(method: "HEAD", key: key))
        return try objectInfo(key: key, response: response)
    }

    public func get(key: String, range: ByteRange?, sink: (UnsafeRawBufferPointer) -> Void) throws(ObjectStoreError)
        -> ObjectInfo
    {
        var request = Request(method: "GET", key: key)
        request.range = range
        let response = try withoutActuallyEscaping(sink) { (escapable) throws(ObjectStoreError) in
            try send(request, sink: escapable)
        }
        return try objectInfo(key: key, response: response)
    }

    @discardableResult
    public func put(key: String, body: PutBody, contentType: String?, metadata: [String: String], onlyIfAbsent: Bool)
        throws(ObjectStoreError) -> String
    {
        var request = Request(method: "PUT", key: key)
        request.body = body
        request.contentType = contentType ?? "application/octet-stream"
        let etag = try Self.md5(of: body)
        request.headers.append(("ETag", etag))
        if onlyIfAbsent { request.headers.append(("If-None-Match", "*")) }
        request.headers += Self.metadataHeaders(metadata)
        _ = try send(request)
        return etag
    }

    /// A part is hashed while it is sent and checked against the ETag the server computed, instead
    /// of being read twice (hash, then send): a part is invisible until a manifest names it, and
    /// the manifest is written only after every part checked out. A mismatch is sent again.
    public func putPart(key: String, body: PutBody) throws(ObjectStoreError) -> String {
        var request = Request(method: "PUT", key: key)
        request.body = body
        request.contentType = "application/octet-stream"
        request.hashBody = true
        for attempt in 1...3 {
            let response = try send(request)
            let stored = Self.unquote(response.headers["etag"] ?? "")
            if let sent = response.sentMD5, stored == sent { return stored }
            logger.warning(
                "part stored with a different MD5 than sent; sending it again",
                metadata: ["key": "\(key)", "attempt": "\(attempt)"])
        }
        throw ObjectStoreError(
            .invalidResponse, "part '\(key)' was stored with a different MD5 than was sent, three times")
    }

    public func putManifest(key: String, manifest: String, contentType: String?, metadata: [String: String])
        throws(ObjectStoreError)
    {
        var request = Request(method: "PUT", key: key)
        request.body = .bytes([])
        request.contentType = contentType ?? "application/octet-stream"
        let target = PercentEncoding.encode(manifest, keepSlash: true)
        request.headers.append(("X-Object-Manifest", target))
        request.headers += Self.metadataHeaders(metadata)
        _ = try send(request)
    }

    public func copy(from source: String, to destination: String, contentType: String?, metadata: [String: String]?)
        throws(ObjectStoreError)
    {
        var request = Request(method: "PUT", key: destination)
        request.body = .bytes([])
        request.isCopy = true
        request.maxAttempts = 1
        let from = PercentEncoding.encode("/" + configuration.container + "/" + source, keepSlash: true)
        request.headers.append(("X-Copy-From", from))
        if let metadata {
            request.headers.append(("X-Fresh-Metadata", "true"))
            request.headers += Self.metadataHeaders(metadata)
        }
        if let contentType { request.contentType = contentType }
        var attempt = 0
        while true {
            attempt += 1
            do {
                _ = try send(request)
                return
            } catch {
                guard error.isRetryable, attempt < configuration.maxAttempts else { throw error }
                // The copy may be done (its answer lost) or still running on the server: a long
                // copy sent again and again would never finish.
                if isCopied(from: source, to: destination) { return }
                usleep(UInt32(backoff(attempt: attempt) * 1_000_000))
            }
        }
    }

    /// Whether `destination` holds `source`'s content now (equal ETags).
    private func isCopied(from source: String, to destination: String) -> Bool {
        guard let copied = try? head(key: destination), !copied.etag.isEmpty,
            let original = try? head(key: source)
        else { return false }
        return copied.etag == original.etag
    }

    public func delete(key: String) throws(ObjectStoreError) {
        _ = try send(Request(method: "DELETE", key: key))
    }

    /// What the server's `/info` says (unsigned, as Swift serves it), asked once, on first use.
    struct ServerInfo {
        /// `max_deletes_per_request` of Swift's bulk middleware, at most 1 000 (the server
        /// deletes the keys one after another before it answers); nil: one DELETE per key.
        var bulkDeleteLimit: Int?
        /// A `"swift"` section: the proxy is OpenStack Swift, whose object server refuses a PUT
        /// with `If-None-Match: *` over an existing object (every release since 1.x).
        var isSwift: Bool
    }

    private var info: ServerInfo {
        if let known = serverInfo.withLock({ $0 }) { return known }
        var request = Request(method: "GET", key: nil)
        request.path = "/info"
        request.maxAttempts = 2
        let body = (try? send(request))?.body
        let info = ServerInfo(
            bulkDeleteLimit: body.flatMap(Self.bulkDeleteLimit(info:)).map { min($0, 1_000) },
            isSwift: body.map { Self.firstIndex(of: "\"swift\"", in: $0[...]) != nil } ?? false)
        let first: Bool = serverInfo.withLock { known in
            defer { if known == nil { known = info } }
            return known == nil
        }
        if first {
            if let limit = info.bulkDeleteLimit {
                logger.info("the server deletes many keys in one request (bulk delete, \(limit) keys a request)")
            } else {
                logger.info("the server's /info does not offer bulk delete: one DELETE per key")
            }
            if !info.isSwift {
                logger.warning(
                    "the server's /info does not say it is OpenStack Swift, so If-None-Match may be ignored: exclusive creates (O_EXCL) are checked by this mount only, and a new file's upload is checked by a HEAD before it")
            }
        }
        return info
    }

    /// Swift's bulk middleware, as `/info` advertises it (`ServerInfo.bulkDeleteLimit`).
    public var bulkDeleteLimit: Int? { info.bulkDeleteLimit }

    public var honoursIfNoneMatch: Bool { info.isSwift }

    /// The `max_deletes_per_request` of the `bulk_delete` section of a Swift `/info` answer
    /// (JSON), or nil when it has none.
    static func bulkDeleteLimit(info body: [UInt8]) -> Int? {
        guard let section = firstIndex(of: "\"bulk_delete\"", in: body[...]),
            let open = body[section...].firstIndex(of: UInt8(ascii: "{")),
            let close = body[open...].firstIndex(of: UInt8(ascii: "}"))
        else { return nil }
        guard let value = jsonNumber("max_deletes_per_request", in: body[open..<close]), value > 0 else { return nil }
        return value
    }

    /// Where `needle` first starts in `bytes`.
    static func firstIndex(of needle: String, in bytes: ArraySlice<UInt8>) -> Int? {
        let pattern = Array(needle.utf8)
        guard !pattern.isEmpty, bytes.count >= pattern.count else { return nil }
        var index = bytes.startIndex
        while index + pattern.count <= bytes.endIndex {
            if bytes[index..<index + pattern.count].elementsEqual(pattern) { return index }
            index += 1
        }
        return nil
    }

    /// The whole number after `"name":` in JSON bytes, or nil.
    static func jsonNumber(_ name: String, in bytes: ArraySlice<UInt8>) -> Int? {
        guard let found = firstIndex(of: "\"" + name + "\"", in: bytes) else { return nil }
        var index = found + name.utf8.count + 2
        while index < bytes.endIndex, bytes[index] == UInt8(ascii: " ") || bytes[index] == UInt8(ascii: ":") { index += 1 }
        var digits = ""
        while index < bytes.endIndex, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) {
            digits.append(Character(UnicodeScalar(bytes[index])))
            index += 1
        }
        return Int(digits)
    }

    /// Swift's bulk delete: `POST /<container>?bulk-delete` with one `/container/key` per line.
    /// The answer is 200 whatever happened to each key; its body (JSON) counts them. Keys not
    /// counted as deleted or not found are returned, for the caller to delete one by one.
    public func bulkDelete(keys: [String]) throws(ObjectStoreError) -> [String] {
        guard !keys.isEmpty else { return [] }
        guard bulkDeleteLimit != nil else {
            for key in keys {
                do {
                    try delete(key: key)
                } catch where error.code == .notFound {}
            }
            return []
        }
        let container = PercentEncoding.encode(configuration.container, keepSlash: false)
        let lines = keys.map { "/" + container + "/" + PercentEncoding.encode($0, keepSlash: true) }
        var request = Request(method: "POST", key: nil)
        request.query = [("bulk-delete", "")]
        request.listingFormat = false
        request.contentType = "text/plain"
        request.headers.append(("Accept", "application/json"))
        request.body = .bytes(Array(lines.joined(separator: "\n").utf8))
        let response = try send(request)
        let body = response.body[...]
        let done = (Self.jsonNumber("Number Deleted", in: body) ?? 0) + (Self.jsonNumber("Number Not Found", in: body) ?? 0)
        if done == keys.count { return [] }
        // Some failed (or the answer says nothing we can read): the caller deletes each of them
        // again (a DELETE of a deleted key is harmless).
        return keys
    }

    public func post(key: String, contentType: String, metadata: [String: String], manifest: String?)
        throws(ObjectStoreError)
    {
        var request = Request(method: "POST", key: key)
        request.contentType = contentType
        request.headers += Self.metadataHeaders(metadata)
        if let manifest { request.headers.append(("X-Object-Manifest", PercentEncoding.encode(manifest, keepSlash: true))) }
        _ = try send(request)
    }

    /// Swift: the MD5 of the parts' hex ETags concatenated.
    public func manifestETag(partETags: [String]) -> String {
        MD5.hex(of: Array(partETags.joined().utf8))
    }

    /// Swift: the MD5 of the bytes.
    public func etag(ofFile path: String, offset: Int64, length: Int64) -> String? {
        let md5 = MD5()
        guard Self.readFile(path, offset: offset, length: length, { md5.update($0) }) else { return nil }
        return md5.finalize()
    }

    /// Creates the container (idempotent). Not part of `ObjectStore`: the mount never creates
    /// containers; tests and the demo do, on the local server.
    public func createContainer() throws(ObjectStoreError) {
        var request = Request(method: "PUT", key: nil)
        request.body = .bytes([])
        _ = try send(request)
    }

    // MARK: Requests

    struct Request {
        var method: String
        /// nil for container requests.
        var key: String?
        var query: [(String, String)] = []
        var headers: [(name: String, value: String)] = []
        var contentType: String? = nil
        var range: ByteRange? = nil
        var body: PutBody? = nil
        /// Hash the body while sending it (`Response.sentMD5`).
        var hashBody = false
        /// A server-side copy: no low-speed limit, `copyTimeout` instead.
        var isCopy = false
        /// Attempts of this request (nil: the configuration's).
        var maxAttempts: Int? = nil
        /// Sent as `?format=xml` (listings' format); other query items follow.
        var listingFormat = true
        /// A path of the server instead of the container's (`/info`): sent unsigned.
        var path: String? = nil
    }

    struct Response {
        var status: Int
        /// Lower-cased names.
        var headers: [String: String]
        var body: [UInt8]
        /// The MD5 of the body sent, when the request asked for it.
        var sentMD5: String? = nil
    }

    static func metadataHeaders(_ metadata: [String: String]) -> [(name: String, value: String)] {
        metadata.sorted { $0.key < $1.key }.map { ("X-Object-Meta-\($0.key)", $0.value) }
    }

    /// Sends `request`, retrying what is safe to retry. For a GET with `sink`, a 2xx body streams
    /// to `sink`; a retry after a partial body resumes where the last attempt stopped.
    func send(_ request: Request, sink: ((UnsafeRawBufferPointer) -> Void)? = nil) throws(ObjectStoreError)
        -> Response
    {
        var attempt = 0
        var delivered: Int64 = 0
        // The version whose bytes were delivered: a resumed GET must continue that version, or
        // fail (412) rather than splice two versions of the object together.
        var deliveredETag: String? = nil
        while true {
            attempt += 1
            var current = request
            if delivered > 0 {
                let start = (request.range?.lower ?? 0) + delivered
                current.range = ByteRange(lower: start, upper: request.range?.upper ?? Int64.max - 1)
                if let deliveredETag { current.headers.append(("If-Match", deliveredETag)) }
            }
            let outcome = performOnce(current, sink: sink)
            switch outcome {
            case .success(let response):
                return response
            case .failure(let failure):
                if delivered == 0 && failure.delivered > 0 { deliveredETag = failure.versionETag }
                delivered += failure.delivered
                let error = failure.error
                // A DELETE sent again after an answer was lost finds nothing: it was done.
                if request.method == "DELETE" && attempt > 1 && error.code == .notFound {
                    return Response(status: 204, headers: [:], body: [])
                }
                guard error.isRetryable, attempt < (request.maxAttempts ?? configuration.maxAttempts) else { throw error }
                metrics.retries.labels(failure.status > 0 ? String(failure.status) : "network").add()
                // A server that says when to come back is believed (up to retryAfterCap).
                let delay = max(backoff(attempt: attempt), min(failure.retryAfter ?? 0, configuration.retryAfterCap))
                logger.debug(
                    "retrying request",
                    metadata: [
                        "method": "\(request.method)", "key": "\(request.key ?? "")", "attempt": "\(attempt)",
                        "error": "\(error)", "delay": "\(delay)",
                    ])
                usleep(UInt32(delay * 1_000_000))
            }
        }
    }

    /// What is wrong with the server's certificate (or the CA files given), when that is why the
    /// transfer failed: retrying cannot help, and "check the URL" would mislead.
    static func certificateProblem(_ result: CURLcode) -> String? {
        switch result {
        case CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_CRL_BADFILE,
            CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS:
            return String(cString: curl_easy_strerror(result))
        default:
            return nil
        }
    }

    /// `Retry-After`: seconds, or an HTTP date.
    static func retryAfter(_ value: String?, now: Double = Double(time(nil))) -> Double? {
        guard let value else { return nil }
        if let seconds = Double(value), seconds.isFinite, seconds >= 0 { return seconds }
        guard let date = HTTPDate.parse(value) else { return nil }
        return max(0, date - now)
    }

    private func backoff(attempt: Int) -> Double {
        let ceiling = min(configuration.backoffCap, configuration.backoffBase * Double(1 << min(attempt - 1, 20)))
        return Double.random(in: (ceiling / 2)...ceiling)
    }

    struct AttemptFailure: Error {
        var error: ObjectStoreError
        /// Body bytes handed to the sink before the failure.
        var delivered: Int64
        /// The ETag of the response whose bytes were delivered, when it names one version (not a
        /// DLO, whose ETag is computed per response and cannot be matched).
        var versionETag: String? = nil
        /// Seconds the server asked to wait (`Retry-After`).
        var retryAfter: Double? = nil
        /// The HTTP status of the answer, 0 when none came.
        var status = 0
    }

    /// The bytes a request moves when known up front (its deadline grows with them); nil for a
    /// GET of a whole object or a listing.
    private func knownLength(of request: Request) -> Int64? {
        switch request.method {
        case "PUT": return uploadLength(of: request)
        case "GET":
            guard request.key != nil, let range = request.range, range.upper < Int64.max - 1 else { return nil }
            return range.length
        default: return 0
        }
    }

    private func uploadLength(of request: Request) -> Int64 {
        switch request.body {
        case .bytes(let bytes)?: return Int64(bytes.count)
        case .file(_, _, let length, _)?: return length
        case nil: return 0
        }
    }

    private func url(for request: Request) -> String {
        if let path = request.path { return configuration.baseURL + path }
        var url = configuration.baseURL + "/" + PercentEncoding.encode(configuration.container, keepSlash: false)
        if let key = request.key { url += "/" + PercentEncoding.encode(key, keepSlash: true) }
        var items = request.listingFormat ? ["format=xml"] : []
        for (name, value) in request.query {
            items.append(value.isEmpty ? name : "\(name)=\(PercentEncoding.encode(value, keepSlash: false))")
        }
        return items.isEmpty ? url : url + "?" + items.joined(separator: "&")
    }

    /// One attempt, counted in the metrics. A failed one takes back the upload progress it made.
    private func performOnce(_ request: Request, sink: ((UnsafeRawBufferPointer) -> Void)?)
        -> Result<Response, AttemptFailure>
    {
        let context = TransferContext()
        var start = timespec()
        clock_gettime(CLOCK_MONOTONIC, &start)
        let result = attempt(request, sink: sink, context: context)
        var end = timespec()
        clock_gettime(CLOCK_MONOTONIC, &end)
        let seconds = Double(end.tv_sec - start.tv_sec) + Double(end.tv_nsec - start.tv_nsec) / 1e9
        metrics.requests.labels(request.method, context.status > 0 ? String(context.status) : "none").add()
        metrics.requestSeconds.observe(seconds, request.method)
        metrics.bytesSent.add(context.sent)
        metrics.bytesReceived.add(context.delivered + Int64(context.body.count))
        if case .failure = result { context.progress?.add(-context.sent) }
        return result
    }

    private func attempt(_ request: Request, sink: ((UnsafeRawBufferPointer) -> Void)?, context: TransferContext)
        -> Result<Response, AttemptFailure>
    {
        if case .some(.file(let path, let offset, let length, let progress)) = request.body {
            context.progress = progress
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                let reason = String(cString: strerror(errno))
                return .failure(
                    AttemptFailure(error: ObjectStoreError(.localIO, "cannot read \(path): \(reason)"), delivered: 0))
            }
            context.upload = .file(fd: fd, offset: offset, remaining: length)
        } else if case .some(.bytes(let bytes)) = request.body {
            context.upload = .bytes(bytes, position: 0)
        }
        defer { context.closeUpload() }
        if request.hashBody { context.md5 = MD5() }

        let date = RequestSigner.httpDate(
            secondsSinceEpoch: Int(time(nil)) + configuration.clockOffsetSeconds)
        var resource = "/" + configuration.container
        if let key = request.key { resource += "/" + key }
        var headers = request.headers
        headers.append(("Date", date))
        if let contentType = request.contentType { headers.append(("Content-Type", contentType)) }
        if let range = request.range {
            let upper = range.upper >= Int64.max - 1 ? "" : String(range.upper)
            headers.append(("Range", "bytes=\(range.lower)-\(upper)"))
        }
        if request.path == nil {
            let authorization = configuration.signer.authorization(
                method: request.method, contentMD5: nil, contentType: request.contentType, date: date,
                headers: request.headers, resource: resource)
            headers.append(("Authorization", authorization))
        }
        // Swift answers 100-continue quickly, but skipping the round trip is faster still.
        headers.append(("Expect", ""))

        let curlResult: CURLcode = pool.withHandle { handle in
            let h = handle.raw
            curl_easy_reset(h)
            var list: UnsafeMutablePointer<curl_slist>? = nil
            for (name, value) in headers {
                list = curl_slist_append(list, value.isEmpty ? "\(name):" : "\(name): \(value)")
            }
            defer { curl_slist_free_all(list) }
            let target = url(for: request)
            _ = cssp_curl_setopt_ptr(h, CURLOPT_URL, target)
            _ = cssp_curl_setopt_ptr(h, CURLOPT_HTTPHEADER, list)
            _ = cssp_curl_setopt_long(h, CURLOPT_NOSIGNAL, 1)
            if let agent = configuration.userAgent { _ = cssp_curl_setopt_ptr(h, CURLOPT_USERAGENT, agent) }
            _ = cssp_curl_setopt_long(h, CURLOPT_CONNECTTIMEOUT, configuration.connectTimeout)
            if request.isCopy {
                _ = cssp_curl_setopt_long(h, CURLOPT_TIMEOUT, configuration.copyTimeout)
            } else {
                _ = cssp_curl_setopt_long(h, CURLOPT_LOW_SPEED_LIMIT, configuration.lowSpeedLimit)
                _ = cssp_curl_setopt_long(h, CURLOPT_LOW_SPEED_TIME, configuration.stallTimeout)
                if let bytes = knownLength(of: request) {
                    let needed = bytes / Int64(max(1, configuration.lowSpeedLimit))
                    _ = cssp_curl_setopt_long(h, CURLOPT_TIMEOUT, configuration.requestTimeout + Int(min(needed, 1 << 40)))
                }
            }
            _ = cssp_curl_setopt_long(h, CURLOPT_TCP_KEEPALIVE, 1)
            if let caFile = configuration.caFile { _ = cssp_curl_setopt_ptr(h, CURLOPT_CAINFO, caFile) }
            if let caPath = configuration.caPath { _ = cssp_curl_setopt_ptr(h, CURLOPT_CAPATH, caPath) }
            if configuration.insecure {
                _ = cssp_curl_setopt_long(h, CURLOPT_SSL_VERIFYPEER, 0)
                _ = cssp_curl_setopt_long(h, CURLOPT_SSL_VERIFYHOST, 0)
            }
            _ = cssp_curl_setopt_long(h, CURLOPT_BUFFERSIZE, 512 * 1024)
            _ = cssp_curl_setopt_long(h, CURLOPT_UPLOAD_BUFFERSIZE, 1024 * 1024)
            switch request.method {
            case "GET": break
            case "HEAD": _ = cssp_curl_setopt_long(h, CURLOPT_NOBODY, 1)
            case "PUT":
                _ = cssp_curl_setopt_long(h, CURLOPT_UPLOAD, 1)
                _ = cssp_curl_setopt_off(h, CURLOPT_INFILESIZE_LARGE, curl_off_t(context.uploadLength))
                _ = cssp_curl_setopt_data_cb(h, CURLOPT_READFUNCTION, curlRead)
            default:
                if request.body != nil {
                    // A body with another method (a bulk delete's POST): sent as an upload is.
                    _ = cssp_curl_setopt_long(h, CURLOPT_UPLOAD, 1)
                    _ = cssp_curl_setopt_off(h, CURLOPT_INFILESIZE_LARGE, curl_off_t(context.uploadLength))
                    _ = cssp_curl_setopt_data_cb(h, CURLOPT_READFUNCTION, curlRead)
                }
                _ = cssp_curl_setopt_ptr(h, CURLOPT_CUSTOMREQUEST, request.method)
            }
            let opaque = Unmanaged.passUnretained(context).toOpaque()
            _ = cssp_curl_setopt_data_cb(h, CURLOPT_HEADERFUNCTION, curlHeader)
            _ = cssp_curl_setopt_ptr(h, CURLOPT_HEADERDATA, opaque)
            _ = cssp_curl_setopt_data_cb(h, CURLOPT_WRITEFUNCTION, curlWrite)
            _ = cssp_curl_setopt_ptr(h, CURLOPT_WRITEDATA, opaque)
            _ = cssp_curl_setopt_ptr(h, CURLOPT_READDATA, opaque)
            context.sink = sink
            if sink != nil { context.rangeStart = request.range?.lower }
            defer { context.sink = nil }
            return curl_easy_perform(h)
        }

        if let refused = context.refused {
            let error = ObjectStoreError(
                .invalidResponse, "refused \(refused) from \(configuration.baseURL) for '\(request.key ?? "")'")
            return .failure(AttemptFailure(error: error, delivered: context.delivered))
        }
        if let problem = Self.certificateProblem(curlResult) {
            let error = ObjectStoreError(
                .invalidRequest,
                "the certificate of \(configuration.baseURL) is not trusted (\(problem)): if a private CA signed it, "
                    + "use -o cafile=PATH (or capath=DIR)")
            return .failure(AttemptFailure(error: error, delivered: 0))
        }
        if curlResult != CURLE_OK {
            let reason = String(cString: curl_easy_strerror(curlResult))
            let error = ObjectStoreError(
                .transient,
                "cannot reach \(configuration.baseURL): \(reason); check the URL and that the service is reachable")
            let etag = context.headers["x-object-manifest"] == nil ? context.headers["etag"] : nil
            return .failure(AttemptFailure(error: error, delivered: context.delivered, versionETag: etag))
        }
        let response = Response(
            status: context.status, headers: context.headers, body: context.body, sentMD5: context.md5?.finalize())
        if (200..<300).contains(response.status) { return .success(response) }
        return .failure(
            AttemptFailure(
                error: error(for: response, request: request), delivered: context.delivered,
                retryAfter: Self.retryAfter(response.headers["retry-after"]), status: response.status))
    }

    /// Turns a non-2xx response into a typed error whose message says what to do.
    func error(for response: Response, request: Request) -> ObjectStoreError {
        let status = response.status
        let requestID = response.headers["x-trans-id"] ?? response.headers["x-openstack-request-id"]
        let what = request.key.map { "'\($0)'" } ?? "container '\(configuration.container)'"
        let detail = ListingParser.parseError(response.body)
        func make(_ code: ObjectStoreError.Code, _ message: String) -> ObjectStoreError {
            ObjectStoreError(code, message, httpStatus: status, requestID: requestID)
        }
        switch status {
        case 401, 403:
            if Self.isClockSkew(detailCode: detail?.code, serverDate: response.headers["date"],
                localOffset: configuration.clockOffsetSeconds)
            {
                return make(
                    .clockSkew,
                    "the server rejected the request time: this machine's clock differs from the server's by more "
                        + "than 15 minutes; set the clock right (e.g. enable NTP) and retry")
            }
            let key = configuration.signer.accessKey
            if detail?.code == "SignatureDoesNotMatch" || detail?.code == "InvalidSignatureException" {
                return make(
                    .accessDenied,
                    "the server rejected the signature for access key '\(key)': check the secret key in "
                        + configuration.credentialSource)
            }
            return make(
                .accessDenied,
                "access denied for access key '\(key)' on \(what)"
                    + (detail.map { " (\($0.code))" } ?? "")
                    + ": check the access key and secret in \(configuration.credentialSource)")
        case 404:
            return make(.notFound, "\(what) does not exist")
        case 408:
            return make(.transient, "the server timed out waiting for the request")
        case 412:
            return make(.preconditionFailed, "\(what) changed on the server")
        case 416:
            return make(.rangeNotSatisfiable, "the requested range lies beyond the end of \(what)")
        case 422:
            return make(.checksumMismatch, "the server received different bytes than were sent for \(what)")
        case 429, 498:
            return make(.throttled, "the server is throttling requests")
        case 500..<600:
            return make(.transient, "the server failed to handle \(request.method) \(what)")
        default:
            return make(
                .invalidRequest,
                "the server refused \(request.method) \(what)" + (detail.map { ": \($0.code) \($0.message)" } ?? ""))
        }
    }

    /// A 401/403 is a clock problem when the body says so, or (HEAD has no body) when the server's
    /// `Date` is more than 15 minutes from the time we signed with.
    static func isClockSkew(detailCode: String?, serverDate: String?, localOffset: Int) -> Bool {
        if detailCode == "RequestTimeTooSkewed" || detailCode == "RequestExpired" { return true }
        guard detailCode == nil, let serverDate, let server = HTTPDate.parse(serverDate) else { return false }
        let signedWith = Double(time(nil) + localOffset)
        return abs(signedWith - server) > 15 * 60
    }

    private func objectInfo(key: String, response: Response) throws(ObjectStoreError) -> ObjectInfo {
        let h = response.headers
        var size: Int64 = 0
        if let length = h["content-length"] {
            guard let parsed = Self.size(length) else { throw Self.impossible("size '\(length)'", key) }
            size = parsed
        }
        if let contentRange = h["content-range"], let slash = contentRange.lastIndex(of: "/") {
            let total = String(contentRange[contentRange.index(after: slash)...])
            guard let parsed = Self.size(total) else { throw Self.impossible("size '\(total)'", key) }
            size = parsed
        }
        var metadata: [String: String] = [:]
        for (name, value) in h where name.hasPrefix("x-object-meta-") {
            metadata[String(name.dropFirst("x-object-meta-".count))] = value
        }
        let modified = Self.timestamp(h["x-timestamp"]) ?? h["last-modified"].flatMap { HTTPDate.parse($0) } ?? 0
        return ObjectInfo(
            key: key, size: size, etag: Self.versionETag(h), contentType: h["content-type"] ?? "",
            lastModified: modified, metadata: metadata, manifest: h["x-object-manifest"].map { PercentEncoding.decode($0) ?? $0 })
    }

    /// The largest size or count an answer may state (1 PiB): a larger one, or a negative one, is
    /// a broken or hostile answer, and would overflow the arithmetic built on it.
    public static let largestSize: Int64 = 1 << 50

    /// A size or count as a header states it, if it is a plausible one.
    static func size(_ text: String?) -> Int64? {
        guard let text, let value = Int64(text), value >= 0, value <= largestSize else { return nil }
        return value
    }

    /// An `X-Timestamp` (seconds since the epoch), if it is a time between 1970 and 9999.
    static func timestamp(_ text: String?) -> Double? {
        guard let text, let value = Double(text), value.isFinite, value >= 0, value < 253_402_300_800 else {
            return nil
        }
        return value
    }

    static func impossible(_ what: String, _ key: String) -> ObjectStoreError {
        ObjectStoreError(.invalidResponse, "the server answered an impossible \(what) for '\(key)'")
    }

    /// The ETag that names this version of the object as listings name it. A Static Large Object
    /// answers with the MD5 of its segments' ETags, while listings show its manifest's ETag
    /// (`X-Manifest-Etag`): the manifest's is used, so a listing, a HEAD and a GET agree (a file
    /// would otherwise look replaced, ESTALE, after every `ls -l`), and a new manifest is still
    /// a new version.
    static func versionETag(_ headers: [String: String]) -> String {
        if headers["x-static-large-object"]?.lowercased() == "true", let manifest = headers["x-manifest-etag"] {
            return unquote(manifest)
        }
        return unquote(headers["etag"] ?? "")
    }

    static func unquote(_ etag: String) -> String {
        var e = Substring(etag)
        if e.hasPrefix("\"") { e = e.dropFirst() }
        if e.hasSuffix("\"") { e = e.dropLast() }
        return e.lowercased()
    }

    static func md5(of body: PutBody) throws(ObjectStoreError) -> String {
        switch body {
        case .bytes(let bytes):
            return MD5.hex(of: bytes)
        case .file(let path, let offset, let length, _):
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                throw ObjectStoreError(.localIO, "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            defer { close(fd) }
            let md5 = MD5()
            let chunk = 1 << 20
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunk, alignment: 16)
            defer { buffer.deallocate() }
            var position = offset
            var remaining = length
            while remaining > 0 {
                let n = pread(fd, buffer.baseAddress, min(chunk, Int(remaining)), off_t(position))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else {
                    throw ObjectStoreError(.localIO, "cannot read \(path): unexpected end or error")
                }
                md5.update(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
                position += Int64(n)
                remaining -= Int64(n)
            }
            return md5.finalize()
        }
    }
}

/// State of one transfer, reached from libcurl's callbacks through the user-data pointer.
final class TransferContext {
    enum Upload {
        case bytes([UInt8], position: Int)
        case file(fd: Int32, offset: Int64, remaining: Int64)
    }

    var status = 0
    var headers: [String: String] = [:]
    var body: [UInt8] = []
    var sink: ((UnsafeRawBufferPointer) -> Void)?
    /// Where the bytes of a ranged GET must start: a 2xx answer other than a 206 for that range
    /// (a server or proxy that ignored the Range header) is refused, never served as the range.
    var rangeStart: Int64?
    /// Why the answer's body was refused (the transfer is aborted).
    var refused: String?
    /// The most bytes of a body kept in memory: a successful answer larger than this is refused;
    /// an error answer is cut (only its beginning says anything).
    static let bodyLimit = 32 << 20
    static let errorBodyLimit = 64 << 10
    var delivered: Int64 = 0
    var upload: Upload?
    var uploadError = false
    /// Body bytes sent by this attempt, and the upload's progress they also count in.
    var sent: Int64 = 0
    var progress: TransferProgress?
    /// Fed with every byte sent, when the request hashes its body.
    var md5: MD5?

    var uploadLength: Int64 {
        switch upload {
        case .bytes(let b, _): return Int64(b.count)
        case .file(_, _, let remaining): return remaining
        case nil: return 0
        }
    }

    /// Why a successful answer to a GET of the range starting at `start` is not that range.
    func rangeProblem(_ start: Int64) -> String? {
        guard status == 206 else { return "a \(status) answer to a ranged GET (the Range header was ignored)" }
        // Content-Range: bytes START-END/TOTAL
        guard let range = headers["content-range"], range.hasPrefix("bytes "),
            let dash = range.firstIndex(of: "-"),
            let first = Int64(range[range.index(range.startIndex, offsetBy: 6)..<dash]), first == start
        else { return "a ranged answer for other bytes than asked (Content-Range '\(headers["content-range"] ?? "")', asked from \(start))" }
        return nil
    }

    func closeUpload() {
        if case .file(let fd, _, _) = upload { close(fd) }
        upload = nil
    }
}

private let curlHeader: cssp_curl_data_cb = { ptr, size, count, user in
    let n = size * count
    guard let ptr, let user else { return n }
    let context = Unmanaged<TransferContext>.fromOpaque(user).takeUnretainedValue()
    let raw = UnsafeRawBufferPointer(start: ptr, count: n)
    var line = String(decoding: raw, as: UTF8.self)
    while line.hasSuffix("\r\n") || line.hasSuffix("\n") { line.removeLast() }
    if line.hasPrefix("HTTP/") {
        // A new status line (after 100 Continue or a redirect) starts a new header block.
        let parts = line.split(separator: " ", maxSplits: 2)
        context.status = parts.count > 1 ? Int(parts[1]) ?? 0 : 0
        context.headers = [:]
    } else if let colon = line.firstIndex(of: ":") {
        let name = line[..<colon].lowercased()
        var value = line[line.index(after: colon)...]
        while value.first == " " { value = value.dropFirst() }
        context.headers[name] = String(value)
    }
    return n
}

private let curlWrite: cssp_curl_data_cb = { ptr, size, count, user in
    let n = size * count
    guard let ptr, let user else { return n }
    let context = Unmanaged<TransferContext>.fromOpaque(user).takeUnretainedValue()
    let raw = UnsafeRawBufferPointer(start: ptr, count: n)
    let success = (200..<300).contains(context.status)
    if let sink = context.sink, success {
        if context.delivered == 0, let start = context.rangeStart, let problem = context.rangeProblem(start) {
            context.refused = problem
            return 0
        }
        sink(raw)
        context.delivered += Int64(n)
    } else if success {
        guard context.body.count + n <= TransferContext.bodyLimit else {
            context.refused = "an answer larger than \(TransferContext.bodyLimit >> 20) MiB"
            return 0
        }
        context.body.append(contentsOf: raw)
    } else {
        context.body.append(contentsOf: raw.prefix(max(0, TransferContext.errorBodyLimit - context.body.count)))
    }
    return n
}

private let curlRead: cssp_curl_data_cb = { ptr, size, count, user in
    guard let ptr, let user else { return 0 }
    let context = Unmanaged<TransferContext>.fromOpaque(user).takeUnretainedValue()
    let capacity = size * count
    switch context.upload {
    case .bytes(let bytes, let position):
        let n = min(capacity, bytes.count - position)
        if n > 0 {
            bytes.withUnsafeBytes { src in
                UnsafeMutableRawPointer(ptr).copyMemory(from: src.baseAddress! + position, byteCount: n)
            }
        }
        context.upload = .bytes(bytes, position: position + n)
        if n > 0 { context.md5?.update(UnsafeRawBufferPointer(start: ptr, count: n)) }
        context.sent += Int64(n)
        return n
    case .file(let fd, let offset, let remaining):
        let want = min(capacity, Int(remaining))
        if want == 0 { return 0 }
        var n: Int
        repeat { n = pread(fd, ptr, want, off_t(offset)) } while n < 0 && errno == EINTR
        if n <= 0 {
            context.uploadError = true
            return Int(CURL_READFUNC_ABORT)
        }
        context.upload = .file(fd: fd, offset: offset + Int64(n), remaining: remaining - Int64(n))
        context.md5?.update(UnsafeRawBufferPointer(start: ptr, count: n))
        context.sent += Int64(n)
        context.progress?.add(Int64(n))
        return n
    case nil:
        return 0
    }
}

/// RFC 1123 dates as HTTP uses them (`Sat, 21 Nov 2026 22:40:21 GMT`).
enum HTTPDate {
    static func parse(_ text: String) -> Double? {
        let parts = text.split(separator: " ")
        guard parts.count >= 5, let day = Int(parts[1]), let year = Int(parts[3]) else { return nil }
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard let monthIndex = months.firstIndex(of: String(parts[2])) else { return nil }
        let clock = parts[4].split(separator: ":")
        guard clock.count == 3, let h = Int(clock[0]), let m = Int(clock[1]), let s = Int(clock[2]) else { return nil }
        // Years and fields outside these ranges are no time (and would overflow the arithmetic).
        guard (1970...9999).contains(year), (1...31).contains(day), (0...23).contains(h), (0...59).contains(m),
            (0...60).contains(s)
        else { return nil }
        let days = ListingParser.daysFromCivil(year: year, month: monthIndex + 1, day: day)
        return Double(days * 86_400 + h * 3600 + m * 60 + s)
    }
}
