import Logging
import Metrics
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A bucket of an S3-compatible store (`HTTPDialect.s3`) or of Tencent COS (`.cos`, S3's shape
/// with `x-cos-` headers and its own signature), behind the same `ObjectStore` interface as a
/// CSSP container. The transport (libcurl, retries, deadlines, signing per attempt) is the
/// `HTTPObjectStore` it holds; this type turns the interface's calls into S3 requests.
///
/// Subtleties:
/// 1. A listing page of the interface may hold up to 10 000 names; S3 answers at most 1 000 a
///    request, so one page is several requests, each starting after the last name of the one
///    before. A name that is a common prefix is skipped whole (`start-after` past it).
/// 2. Keys in listings come URL-encoded (`encoding-type=url`): XML 1.0 cannot carry every
///    byte a key may hold.
/// 3. A multipart upload's key and metadata are fixed when it begins, unlike a Swift
///    manifest's: `finishUpload` completes it where it began, then copies it (new metadata, or
///    a conflict copy's name) only when what it finishes with differs.
/// 4. A copy may answer 200 with an `<Error>` body (the server failed after it started
///    answering): an error, as its code says.
/// 5. S3 keeps no content type a listing shows, and no `X-Timestamp`: times are a second's.
/// 6. Attributes go as s3fs and rclone write them (`wireForm`): the mode as a decimal `st_mode`
///    (`x-amz-meta-mode: 33188`), the mtime in seconds with a fraction, uid and gid; the
///    content type without the `cssp-` parameters a CSSP listing would show (an S3 listing
///    shows no content type). What the filesystem hands over is CSSP's form: octal permissions.
public final class S3ObjectStore: ObjectStore {
    let http: HTTPObjectStore
    let logger: Logger
    /// `x-amz-` or `x-cos-`: the prefix of this dialect's own headers.
    let headerPrefix: String
    /// The host of the bucket, as COS names a copy's source (`bucket.cos.region.myqcloud.com`).
    let copySourceHost: String?
    /// Whether a PUT with `If-None-Match: *` (COS: `x-cos-forbid-overwrite`) is refused over an
    /// existing object: probed once, on first use (nil: not yet).
    private let probedIfNoneMatch = Mutex<Bool?>(nil)
    /// `max_upload_part_num` of an s3api's `/info`, read once (nil: not yet).
    private let partLimit = Mutex<Int?>(nil)

    public var configuration: HTTPStoreConfiguration { http.configuration }
    public var metrics: MountMetrics { http.metrics }
    public var containerName: String { http.configuration.container }

    /// `copySourceHost`: COS only, the bucket's host name for `x-cos-copy-source`.
    public init(
        configuration: HTTPStoreConfiguration, logger: Logger, maxIdleConnections: Int = 32,
        metrics: MountMetrics = MountMetrics(), copySourceHost: String? = nil
    ) {
        precondition(configuration.dialect != .cssp, "S3ObjectStore speaks S3 or COS")
        http = HTTPObjectStore(configuration: configuration, logger: logger, maxIdleConnections: maxIdleConnections, metrics: metrics)
        self.logger = logger
        headerPrefix = configuration.dialect == .cos ? "x-cos-" : "x-amz-"
        self.copySourceHost = copySourceHost
    }

    typealias Request = HTTPObjectStore.Request

    // MARK: Reads

    /// S3 tells no object count or size: a HEAD of the bucket says it exists and may be used.
    public func headContainer() throws(ObjectStoreError) -> ContainerInfo {
        _ = try http.send(Request(method: "HEAD", key: nil))
        return ContainerInfo(objectCount: 0, bytesUsed: 0)
    }

    public func list(prefix: String, delimiter: String?, marker: String?, limit: Int) throws(ObjectStoreError) -> ListPage {
        try list(prefix: prefix, delimiter: delimiter, marker: marker, endMarker: nil, limit: limit)
    }

    /// S3 has no `end_marker`: the requests stop once a page reaches it, and the page is cut there.
    public func list(prefix: String, delimiter: String?, marker: String?, endMarker: String?, limit: Int)
        throws(ObjectStoreError) -> ListPage
    {
        precondition(limit > 0 && limit <= 10_000, "listing limit must be in 1...10000")
        var entries: [ListEntry] = []
        var after = marker
        var truncated = true
        while truncated && entries.count < limit {
            var request = Request(method: "GET", key: nil)
            request.query = [("encoding-type", "url"), ("max-keys", String(min(1_000, limit - entries.count)))]
            if configuration.dialect == .s3 { request.query.insert(("list-type", "2"), at: 0) }
            if !prefix.isEmpty { request.query.append(("prefix", prefix)) }
            if let delimiter { request.query.append(("delimiter", delimiter)) }
            if let after {
                // (Subtlety 1: a common prefix's keys were all rolled up in it.)
                let start = Self.startAfter(after, prefix: prefix, delimiter: delimiter)
                request.query.append((configuration.dialect == .s3 ? "start-after" : "marker", start))
            }
            http.metrics.listings.add()
            let response = try http.send(request)
            let page = try S3Listing.parse(response.body)
            // Names come after the marker, in byte order: a server that ignores it would loop.
            if let after, let first = page.entries.first, !after.utf8.lexicographicallyPrecedes(first.name.utf8) {
                throw ObjectStoreError(
                    .invalidResponse, "the server ignored the listing's start ('\(first.name)' after '\(after)'); is it an S3 endpoint?")
            }
            entries += page.entries
            truncated = page.isTruncated
            guard let last = page.entries.last?.name else {
                if truncated { throw ObjectStoreError(.invalidResponse, "the server answered an empty listing page with more to come") }
                break
            }
            after = last
            if let endMarker, !last.utf8.lexicographicallyPrecedes(endMarker.utf8) { break }
        }
        return ListPage(entries: entries, nextMarker: truncated ? entries.last?.name : nil).ending(before: endMarker)
    }

    /// Where a listing goes on after `name`: after every key below it when it is a common prefix.
    static func startAfter(_ name: String, prefix: String, delimiter: String?) -> String {
        guard let delimiter, delimiter.utf8.count == 1, name.utf8.count > prefix.utf8.count, name.hasSuffix(delimiter),
            let last = delimiter.utf8.first, last < 0x7F
        else { return name }
        // "dir/" -> "dir0": after "dir/…" and before any name that follows them.
        return String(decoding: Array(name.utf8.dropLast()) + [last + 1], as: UTF8.self)
    }

    public func head(key: String) throws(ObjectStoreError) -> ObjectInfo {
        let response = try http.send(Request(method: "HEAD", key: key))
        return try objectInfo(key: key, response: response)
    }

    public func get(key: String, range: ByteRange?, sink: (UnsafeRawBufferPointer) -> Void) throws(ObjectStoreError)
        -> ObjectInfo
    {
        try objectInfo(key: key, response: try http.getResponse(key: key, range: range, sink: sink))
    }

    func objectInfo(key: String, response: HTTPObjectStore.Response) throws(ObjectStoreError) -> ObjectInfo {
        let h = response.headers
        let size = try HTTPObjectStore.objectSize(h, key: key)
        let metaPrefix = headerPrefix + "meta-"
        var metadata: [String: String] = [:]
        for (name, value) in h where name.hasPrefix(metaPrefix) {
            metadata[String(name.dropFirst(metaPrefix.count))] = value
        }
        return ObjectInfo(
            key: key, size: size, etag: HTTPObjectStore.unquote(h["etag"] ?? ""), contentType: h["content-type"] ?? "",
            lastModified: h["last-modified"].flatMap { HTTPDate.parse($0) } ?? 0, metadata: metadata)
    }

    // MARK: Writes

    func metadataHeaders(_ metadata: [String: String]) -> [(name: String, value: String)] {
        metadata.sorted { $0.key < $1.key }.map { (headerPrefix + "meta-" + $0.key, $0.value) }
    }

    /// Subtlety 6: the content type and metadata to send for what the filesystem stores.
    static func wireForm(key: String, contentType: String?, metadata: [String: String]) -> (String?, [String: String]) {
        var type = contentType
        if let contentType, contentType.contains(";") {
            let parts = contentType.split(separator: ";", omittingEmptySubsequences: false)
            let kept = parts.dropFirst().filter { !$0.drop { $0 == " " }.lowercased().hasPrefix("cssp-") }
            type = ([parts[0]] + kept).joined(separator: ";")
        }
        var wire = metadata
        // CSSP's form is octal permissions with a leading zero; s3fs reads a decimal st_mode.
        if let mode = metadata["mode"], mode.hasPrefix("0"), let permissions = UInt32(mode, radix: 8), permissions <= 0o7777 {
            let fileType: UInt32
            switch Self.baseType(type) {
            case _ where key.hasSuffix("/"), "application/directory": fileType = 0o040000
            case "application/link": fileType = 0o120000
            case "inode/fifo": fileType = 0o010000
            case "inode/socket": fileType = 0o140000
            default: fileType = 0o100000
            }
            wire["mode"] = String(fileType | permissions)
        } else if metadata["mode"] == nil, Self.baseType(type) == "application/link" {
            // csspfs stores no mode for a symlink (always 0777); s3fs knows one only by its mode.
            wire["mode"] = String(0o120777)
        }
        return (type, wire)
    }

    /// A content type without parameters, lower-cased.
    private static func baseType(_ type: String?) -> String {
        (type ?? "").split(separator: ";").first.map { $0.lowercased().filter { $0 != " " } } ?? ""
    }

    @discardableResult
    public func put(key: String, body: PutBody, contentType: String?, metadata: [String: String], onlyIfAbsent: Bool)
        throws(ObjectStoreError) -> String
    {
        let (type, wire) = Self.wireForm(key: key, contentType: contentType, metadata: metadata)
        var (request, etag) = try HTTPObjectStore.putRequest(key: key, body: body, contentType: type)
        request.headers.append(("Content-MD5", Self.base64(hex: etag)))
        if onlyIfAbsent && honoursIfNoneMatch { request.headers.append(absentCondition) }
        request.headers += metadataHeaders(wire)
        _ = try http.send(request)
        return etag
    }

    /// The header that makes a PUT fail over an existing object.
    private var absentCondition: (name: String, value: String) {
        configuration.dialect == .cos ? ("x-cos-forbid-overwrite", "true") : ("If-None-Match", "*")
    }

    /// Found out once: a probe object is stored twice under the condition; the second must be
    /// refused (S3 since 2024, COS, s3api over Swift). Without it, callers HEAD before a PUT.
    public var honoursIfNoneMatch: Bool {
        if let known = probedIfNoneMatch.withLock({ $0 }) { return known }
        let key = manifestPartsPrefix + "probe-" + String(UInt64.random(in: 0...UInt64.max), radix: 16)
        var honoured = false
        do throws(ObjectStoreError) {
            var request = Request(method: "PUT", key: key)
            request.body = .bytes([])
            request.headers.append(absentCondition)
            // (A failure is an answer too: the mount then HEADs before its PUTs, which is safe.)
            request.maxAttempts = 1
            _ = try http.send(request)
            do {
                _ = try http.send(request)
            } catch where error.code == .preconditionFailed {
                honoured = true
            }
            try? delete(key: key)
        } catch {
            logger.debug("the probe of conditional PUTs failed: \(error.message)")
        }
        if !honoured {
            logger.warning(
                "the server does not refuse a PUT with \(absentCondition.name) over an existing object: exclusive creates (O_EXCL) are checked by this mount only, and a new file's upload is checked by a HEAD before it")
        }
        probedIfNoneMatch.withLock { if $0 == nil { $0 = honoured } }
        return honoured
    }

    public func putManifest(key: String, manifest: String, contentType: String?, metadata: [String: String])
        throws(ObjectStoreError)
    {
        throw ObjectStoreError(.invalidRequest, "an S3 store keeps no DLO manifests ('\(key)')")
    }

    /// `x-amz-copy-source` (COS: `x-cos-copy-source`, with the bucket's host) of `key`.
    func copySource(_ key: String) -> String {
        let encoded = PercentEncoding.encode(key, keepSlash: true)
        if let copySourceHost { return copySourceHost + "/" + encoded }
        return "/" + PercentEncoding.encode(containerName, keepSlash: false) + "/" + encoded
    }

    public func copy(from source: String, to destination: String, contentType: String?, metadata: [String: String]?)
        throws(ObjectStoreError)
    {
        var request = Request(method: "PUT", key: destination)
        request.body = .bytes([])
        request.isCopy = true
        request.headers.append((headerPrefix + "copy-source", copySource(source)))
        if metadata != nil || contentType != nil {
            // REPLACE takes the whole set: what the caller leaves out is the source's.
            var newType = contentType
            var newMetadata = metadata
            if newType == nil || newMetadata == nil {
                let info = try head(key: source)
                newType = newType ?? info.contentType
                newMetadata = newMetadata ?? info.metadata
            }
            request.headers.append((headerPrefix + "metadata-directive", configuration.dialect == .cos ? "Replaced" : "REPLACE"))
            let (type, wire) = Self.wireForm(key: destination, contentType: newType, metadata: newMetadata ?? [:])
            request.contentType = type
            request.headers += metadataHeaders(wire)
        }
        let response = try http.send(request)
        try Self.checkBody(response, of: "copy of '\(source)' to '\(destination)'")
    }

    /// Subtlety 4: a 200 whose body is an `<Error>`.
    static func checkBody(_ response: HTTPObjectStore.Response, of what: String) throws(ObjectStoreError) {
        guard let detail = ListingParser.parseError(response.body) else { return }
        let code: ObjectStoreError.Code = ["InternalError", "SlowDown", "ServiceUnavailable"].contains(detail.code) ? .transient : .invalidRequest
        throw ObjectStoreError(code, "the server failed the \(what): \(detail.code) \(detail.message)", httpStatus: response.status)
    }

    public func setMetadata(key: String, contentType: String, metadata: [String: String], manifest: String?)
        throws(ObjectStoreError)
    {
        try copy(from: key, to: key, contentType: contentType, metadata: metadata)
    }

    public func delete(key: String) throws(ObjectStoreError) {
        _ = try http.send(Request(method: "DELETE", key: key))
    }

    public var bulkDeleteLimit: Int? { 1_000 }

    /// DeleteObjects: one POST of up to 1 000 keys (quiet: only failures are listed), with the
    /// body's Content-MD5 as S3 requires. Keys XML cannot carry are deleted one by one.
    public func bulkDelete(keys: [String]) throws(ObjectStoreError) -> [String] {
        let sendable = keys.filter(S3Listing.isXMLSafe)
        for key in keys where !S3Listing.isXMLSafe(key) {
            do {
                try delete(key: key)
            } catch where error.code == .notFound {}
        }
        guard !sendable.isEmpty else { return [] }
        var xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Delete><Quiet>true</Quiet>"
        for key in sendable { xml += "<Object><Key>" + S3Listing.escape(key) + "</Key></Object>" }
        xml += "</Delete>"
        let body = Array(xml.utf8)
        var request = Request(method: "POST", key: nil)
        request.query = [("delete", "")]
        request.contentType = "application/xml"
        request.headers.append(("Content-MD5", Self.base64(hex: MD5.hex(of: body))))
        request.body = .bytes(body)
        let response = try http.send(request)
        let failed = try S3Listing.deleteErrors(response.body)
        return failed.filter { $0.code != "NoSuchKey" }.map(\.key)
    }

    // MARK: Multipart uploads

    /// What an upload began with (subtlety 3), by upload ID.
    private let begun = Mutex<[String: (contentType: String?, metadata: [String: String])]>([:])

    public var maximumParts: Int {
        if let known = partLimit.withLock({ $0 }) { return known }
        // s3api over Swift says its limit in /info (1 000 by default); AWS and COS allow 10 000.
        var request = Request(method: "GET", key: nil)
        request.path = "/info"
        request.maxAttempts = 1
        let body = (try? http.send(request))?.body
        let limit = body.flatMap { HTTPObjectStore.jsonNumber("max_upload_part_num", in: $0[...]) }.map { min(max($0, 1), 10_000) }
            ?? 10_000
        partLimit.withLock { if $0 == nil { $0 = limit } }
        return limit
    }

    public var fixesUploadMetadataAtBegin: Bool { true }

    public func beginUpload(key: String) throws(ObjectStoreError) -> UploadSession {
        try beginUpload(key: key, contentType: nil, metadata: [:])
    }

    public func beginUpload(key: String, contentType: String?, metadata: [String: String]) throws(ObjectStoreError) -> UploadSession {
        var request = Request(method: "POST", key: key)
        request.query = [("uploads", "")]
        let (type, wire) = Self.wireForm(key: key, contentType: contentType ?? "application/octet-stream", metadata: metadata)
        request.contentType = type
        request.headers += metadataHeaders(wire)
        request.body = .bytes([])
        let response = try http.send(request)
        guard let id = S3Listing.field("UploadId", in: response.body), !id.isEmpty else {
            throw ObjectStoreError(.invalidResponse, "the server began an upload of '\(key)' without an UploadId")
        }
        begun.withLock { $0[id] = (contentType ?? "application/octet-stream", metadata) }
        return UploadSession(key: key, id: id)
    }

    public func uploadPart(_ session: UploadSession, number: Int, body: PutBody) throws(ObjectStoreError) -> String {
        var request = Request(method: "PUT", key: session.key)
        request.query = [("partNumber", String(number)), ("uploadId", session.id)]
        request.body = body
        request.hashBody = true
        for attempt in 1...3 {
            let response = try http.send(request)
            let stored = HTTPObjectStore.unquote(response.headers["etag"] ?? "")
            if let sent = response.sentMD5, stored == sent { return stored }
            logger.warning(
                "part stored with a different MD5 than sent; sending it again",
                metadata: ["key": "\(session.key)", "part": "\(number)", "attempt": "\(attempt)"])
        }
        throw ObjectStoreError(
            .invalidResponse, "part \(number) of '\(session.key)' was stored with a different MD5 than was sent, three times")
    }

    /// S3 keeps only the parts `CompleteMultipartUpload` names: nothing to drop.
    public func discardPart(_ session: UploadSession, number: Int) {}

    public func finishUpload(
        _ session: UploadSession, partETags: [String], size: Int64, partSize: Int64,
        destination: () throws(ObjectStoreError) -> String, contentType: String?, metadata: [String: String]
    ) throws(ObjectStoreError) -> FinishedUpload {
        let key = try destination()
        var xml = "<CompleteMultipartUpload>"
        for (index, etag) in partETags.enumerated() {
            xml += "<Part><PartNumber>\(index + 1)</PartNumber><ETag>\"\(etag)\"</ETag></Part>"
        }
        xml += "</CompleteMultipartUpload>"
        var request = Request(method: "POST", key: session.key)
        request.query = [("uploadId", session.id)]
        request.contentType = "application/xml"
        request.body = .bytes(Array(xml.utf8))
        let response: HTTPObjectStore.Response
        do {
            response = try http.send(request)
        } catch where error.code == .notFound {
            // Sent again after an answer was lost: the upload is done, the object is there.
            let info = try head(key: session.key)
            guard info.etag == uploadETag(partETags: partETags) else { throw error }
            return try finishing(session, at: key, etag: info.etag, contentType: contentType, metadata: metadata)
        }
        try Self.checkBody(response, of: "completion of the upload of '\(session.key)'")
        let etag = S3Listing.field("ETag", in: response.body).map(HTTPObjectStore.unquote) ?? uploadETag(partETags: partETags)
        return try finishing(session, at: key, etag: etag, contentType: contentType, metadata: metadata)
    }

    /// Subtlety 3: the object completed at `session.key`, moved or given its metadata by a copy
    /// where what it finishes with differs from what it began with.
    private func finishing(
        _ session: UploadSession, at key: String, etag: String, contentType: String?, metadata: [String: String]
    ) throws(ObjectStoreError) -> FinishedUpload {
        let began = begun.withLock { $0.removeValue(forKey: session.id) }
        let type = contentType ?? "application/octet-stream"
        let same = began.map { $0.contentType == type && $0.metadata == metadata } ?? false
        if key != session.key || !same {
            try copy(from: session.key, to: key, contentType: type, metadata: metadata)
            if key != session.key { try delete(key: session.key) }
        }
        return FinishedUpload(key: key, etag: etag, manifest: nil)
    }

    public func abortUpload(_ session: UploadSession) {
        begun.withLock { _ = $0.removeValue(forKey: session.id) }
        var request = Request(method: "DELETE", key: session.key)
        request.query = [("uploadId", session.id)]
        do {
            _ = try http.send(request)
        } catch where error.code == .notFound {
        } catch {
            logger.warning("cannot abort the upload of '\(session.key)': \(error.message)")
        }
    }

    /// The multipart uploads under way below `prefix`: key, upload ID, when it began.
    public func uploadsInProgress(prefix: String) throws(ObjectStoreError) -> [(session: UploadSession, initiated: Double)] {
        var found: [(session: UploadSession, initiated: Double)] = []
        var keyMarker: String? = nil
        var idMarker: String? = nil
        repeat {
            var request = Request(method: "GET", key: nil)
            request.query = [("uploads", "")]
            if !prefix.isEmpty { request.query.append(("prefix", prefix)) }
            if let keyMarker { request.query.append(("key-marker", keyMarker)) }
            if let idMarker { request.query.append(("upload-id-marker", idMarker)) }
            let page = try S3Listing.uploads(try http.send(request).body)
            found += page.uploads
            keyMarker = page.nextKeyMarker
            idMarker = page.nextUploadIDMarker
            if page.isTruncated && keyMarker == nil {
                throw ObjectStoreError(.invalidResponse, "the server listed uploads in part without saying where to go on")
            }
            if !page.isTruncated { keyMarker = nil }
        } while keyMarker != nil
        return found
    }

    /// Aborts the uploads below `prefix` that began more than `age` seconds before `now` (a
    /// mount that died left them: S3 keeps their parts, and bills them, until they are
    /// aborted). Returns how many it aborted.
    @discardableResult
    public func abortStaleUploads(prefix: String, olderThan age: Double, now: Double) throws(ObjectStoreError) -> Int {
        let stale = try uploadsInProgress(prefix: prefix).filter { now - $0.initiated > age }
        for upload in stale { abortUpload(upload.session) }
        return stale.count
    }

    /// S3: the MD5 of the parts' MD5s (their bytes), then `-` and the number of parts.
    public func uploadETag(partETags: [String]) -> String {
        var bytes: [UInt8] = []
        for etag in partETags { bytes += Self.bytes(hex: etag) }
        return MD5.hex(of: bytes) + "-\(partETags.count)"
    }

    /// The MD5 of the bytes, as a PUT of them gets.
    public func etag(ofFile path: String, offset: Int64, length: Int64) -> String? {
        http.etag(ofFile: path, offset: offset, length: length)
    }

    // MARK: Encoding

    static func bytes(hex: String) -> [UInt8] {
        var out: [UInt8] = []
        var high: UInt8? = nil
        for c in hex.utf8 {
            let v: UInt8
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): v = c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): v = c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): v = c - UInt8(ascii: "A") + 10
            default: return []
            }
            if let h = high {
                out.append(h << 4 | v)
                high = nil
            } else {
                high = v
            }
        }
        return out
    }

    /// `Content-MD5`: the digest's bytes in base64.
    static func base64(hex: String) -> String { Digest.base64(bytes(hex: hex)) }
}
