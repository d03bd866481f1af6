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
    public var signer: any RequestSigning
    /// The API the server speaks: how URLs, answers and errors look.
    public var dialect: HTTPDialect = .cssp
    /// S3 and COS virtual-host style: the bucket is in `baseURL`'s host, not in the path.
    public var bucketInHost = false
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

    public init(baseURL: String, container: String, signer: any RequestSigning) {
        self.baseURL = baseURL
        self.container = container
        self.signer = signer
    }

    /// The `Host` header of `baseURL` (its authority, without a default port).
    var hostHeader: String {
        var authority = Substring(baseURL)
        for scheme in ["https://", "http://"] where authority.hasPrefix(scheme) { authority = authority.dropFirst(scheme.count) }
        if baseURL.hasPrefix("https://"), authority.hasSuffix(":443") { authority = authority.dropLast(4) }
        if baseURL.hasPrefix("http://"), authority.hasSuffix(":80") { authority = authority.dropLast(3) }
        return String(authority)
    }
}

/// The APIs `HTTPObjectStore` and `S3ObjectStore` speak.
public enum HTTPDialect: Sendable, Equatable {
    /// CSSP: OpenStack Swift with CSSP signatures.
    case cssp
    /// S3, AWS Signature V4.
    case s3
    /// Tencent COS's XML API: S3's shape with `x-cos-` headers and its own signature.
    case cos
}

/// The CSSP client: libcurl for transport, OpenSSL for signing, shared by all FUSE threads.
public final class HTTPObjectStore: ManifestStore {
    public let configuration: HTTPStoreConfiguration
    let pool: CurlHandlePool
    let logger: Logger
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
        try objectInfo(key: key, response: try getResponse(key: key, range: range, sink: sink))
    }

    @discardableResult
    public func put(key: String, body: PutBody, contentType: String?, metadata: [String: String], onlyIfAbsent: Bool)
        throws(ObjectStoreError) -> String
    {
        var (request, etag) = try Self.putRequest(key: key, body: body, contentType: contentType)
        request.headers.append(("ETag", etag))
        if onlyIfAbsent { request.headers.append(("If-None-Match", "*")) }
        request.headers += Self.metadataHeaders(metadata)
        _ = try send(request)
        return etag
    }

    /// A PUT of `body` and the body's MD5 (hex), read before it is sent.
    static func putRequest(key: String, body: PutBody, contentType: String?) throws(ObjectStoreError) -> (Request, String) {
        var request = Request(method: "PUT", key: key)
        request.body = body
        request.contentType = contentType ?? "application/octet-stream"
        return (request, try md5(of: body))
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
}
