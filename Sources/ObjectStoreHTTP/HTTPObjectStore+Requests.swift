import CCurl
import Logging
import Metrics
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// Requests: signing, sending with retries and deadlines through libcurl, and turning answers
// (headers, status, body) into results and errors.
extension HTTPObjectStore {
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

    func backoff(attempt: Int) -> Double {
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
    func knownLength(of request: Request) -> Int64? {
        switch request.method {
        case "PUT": return uploadLength(of: request)
        case "GET":
            guard request.key != nil, let range = request.range, range.upper < Int64.max - 1 else { return nil }
            return range.length
        default: return 0
        }
    }

    func uploadLength(of request: Request) -> Int64 {
        switch request.body {
        case .bytes(let bytes)?: return Int64(bytes.count)
        case .file(_, _, let length, _)?: return length
        case nil: return 0
        }
    }

    /// Where a request goes: its path (encoded, and decoded for signatures) and its query items.
    struct Target {
        var encodedPath: String
        var path: String
        var query: [(name: String, value: String)]
    }

    func target(for request: Request) -> Target {
        if let path = request.path { return Target(encodedPath: path, path: path, query: []) }
        // Path-style: the container (bucket) is the first segment; virtual-host style: the host.
        var encoded = configuration.bucketInHost ? "" : "/" + PercentEncoding.encode(configuration.container, keepSlash: false)
        var path = configuration.bucketInHost ? "" : "/" + configuration.container
        if let key = request.key {
            encoded += "/" + PercentEncoding.encode(key, keepSlash: true)
            path += "/" + key
        } else if configuration.dialect != .cssp {
            encoded += "/"
            path += "/"
        }
        let format: [(name: String, value: String)] = configuration.dialect == .cssp && request.listingFormat ? [("format", "xml")] : []
        return Target(encodedPath: encoded, path: path, query: format + request.query.map { (name: $0.0, value: $0.1) })
    }

    func url(for request: Request) -> String {
        let target = target(for: request)
        let items = target.query.map { $0.value.isEmpty ? $0.name : "\($0.name)=\(PercentEncoding.encode($0.value, keepSlash: false))" }
        let url = configuration.baseURL + target.encodedPath
        return items.isEmpty ? url : url + "?" + items.joined(separator: "&")
    }

    /// S3's hash of a request's body: that of nothing, of bytes in memory, or none for a file
    /// (streamed, it would be read twice).
    func payloadHash(of request: Request) -> String {
        switch request.body {
        case nil: return SigV4Signer.emptyPayloadHash
        case .bytes(let bytes)?: return configuration.dialect == .s3 ? SigV4Signer.payloadHash(of: bytes) : ""
        case .file?: return SigV4Signer.unsignedPayload
        }
    }

    /// One attempt, counted in the metrics. A failed one takes back the upload progress it made.
    func performOnce(_ request: Request, sink: ((UnsafeRawBufferPointer) -> Void)?)
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

    func attempt(_ request: Request, sink: ((UnsafeRawBufferPointer) -> Void)?, context: TransferContext)
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

        let now = Int(time(nil)) + configuration.clockOffsetSeconds
        var resource = "/" + configuration.container
        if let key = request.key { resource += "/" + key }
        var headers = request.headers
        headers.append(("Date", RequestSigner.httpDate(secondsSinceEpoch: now)))
        if let contentType = request.contentType { headers.append(("Content-Type", contentType)) }
        if let range = request.range {
            let upper = range.upper >= Int64.max - 1 ? "" : String(range.upper)
            headers.append(("Range", "bytes=\(range.lower)-\(upper)"))
        }
        if request.path == nil {
            // S3 and COS sign the host: it is sent as signed, not left to libcurl.
            if configuration.dialect != .cssp { headers.append(("Host", configuration.hostHeader)) }
            let target = target(for: request)
            let input = SigningInput(
                method: request.method, encodedPath: target.encodedPath, path: target.path, query: target.query,
                headers: headers, resource: resource, payloadHash: payloadHash(of: request), time: now)
            headers += configuration.signer.signingHeaders(for: input)
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
            ?? response.headers["x-amz-request-id"] ?? response.headers["x-cos-request-id"]
        let what = request.key.map { "'\($0)'" }
            ?? (configuration.dialect == .cssp ? "container" : "bucket") + " '\(configuration.container)'"
        let detail = ListingParser.parseError(response.body)
        func make(_ code: ObjectStoreError.Code, _ message: String) -> ObjectStoreError {
            ObjectStoreError(code, message, httpStatus: status, requestID: requestID)
        }
        // S3 and COS say more in their error codes than in their statuses.
        switch detail?.code {
        case "NoSuchBucket"?: return make(.notFound, "bucket '\(configuration.container)' does not exist")
        case "BadDigest"?, "InvalidDigest"?:
            return make(.checksumMismatch, "the server received different bytes than were sent for \(what)")
        case "SlowDown"?: return make(.throttled, "the server is throttling requests")
        case "FileAlreadyExists"?, "ObjectAlreadyExists"?, "PreconditionFailed"?:
            return make(.preconditionFailed, "\(what) changed on the server")
        default: break
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

    /// The object's size as a HEAD or GET answer states it (a range's total, not its length).
    static func objectSize(_ h: [String: String], key: String) throws(ObjectStoreError) -> Int64 {
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
        return size
    }

    /// A GET of `range` of `key` whose body streams to `sink`.
    func getResponse(key: String, range: ByteRange?, sink: (UnsafeRawBufferPointer) -> Void) throws(ObjectStoreError)
        -> Response
    {
        var request = Request(method: "GET", key: key)
        request.range = range
        return try withoutActuallyEscaping(sink) { (escapable) throws(ObjectStoreError) in
            try send(request, sink: escapable)
        }
    }

    func objectInfo(key: String, response: Response) throws(ObjectStoreError) -> ObjectInfo {
        let h = response.headers
        let size = try Self.objectSize(h, key: key)
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
