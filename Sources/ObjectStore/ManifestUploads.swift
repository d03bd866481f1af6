#if canImport(Glibc)
import Glibc
#endif

/// One object being uploaded in parts: begun, parts sent, then finished under a key or aborted.
/// What `id` means belongs to the store (Swift: the prefix its parts go under).
public struct UploadSession: Sendable, Equatable {
    /// The key the upload was begun for.
    public var key: String
    public var id: String

    public init(key: String, id: String) {
        self.key = key
        self.id = id
    }
}

/// What finishing an upload stored.
public struct FinishedUpload: Sendable, Equatable {
    public var key: String
    public var etag: String
    /// What a HEAD of it shows as `ObjectInfo.manifest`.
    public var manifest: String?

    public init(key: String, etag: String, manifest: String?) {
        self.key = key
        self.etag = etag
        self.manifest = manifest
    }
}

/// A store that makes large objects the Swift way: parts are ordinary objects below a prefix,
/// and a zero-byte manifest (`X-Object-Manifest: container/prefix`, a DLO) concatenates them in
/// name order. Such a store gets its upload sessions and `setMetadata` from the extension
/// below, built on these calls.
///
/// Subtleties:
/// 1. A session's parts go to `.cssp-parts/<random id>/<n>` (n zero-padded to 8 digits: a DLO
///    concatenates in name order), never below the key itself, where they would make the key
///    look like a file and a directory at once. Beginning one sends nothing.
/// 2. Finishing lists the parts until they show exactly as uploaded (listings may lag behind
///    fresh PUTs), writes the manifest last, then checks its size, and its ETag against the MD5
///    of the parts' ETags. A manifest's view of its parts follows container listings, so each
///    check is retried a few times; a manifest that is stored but cannot be checked (the server
///    away) still counts as stored.
/// 3. Parts that never list as uploaded are deleted; the caller keeps the bytes.
/// 4. POST replaces every header, `X-Object-Manifest` included: `setMetadata` sends it again.
public protocol ManifestStore: ObjectStore {
    /// Stores one part; returns its ETag (the MD5 of its bytes), checked. Unlike `put`, it may
    /// check the bytes after storing them: a part is seen only through a manifest.
    func putPart(key: String, body: PutBody) throws(ObjectStoreError) -> String

    /// POST: replaces the object's metadata and content type (and drops its manifest unless it
    /// is sent again).
    func post(key: String, contentType: String, metadata: [String: String], manifest: String?) throws(ObjectStoreError)

    /// The ETag the store reports for a DLO manifest over parts with these ETags, in order.
    func manifestETag(partETags: [String]) -> String
}

/// Where a `ManifestStore`'s upload sessions put their parts, relative to the container.
public let manifestPartsPrefix = ".cssp-parts/"

extension ManifestStore {
    /// A store that cannot check after storing checks before, as `put` does.
    public func putPart(key: String, body: PutBody) throws(ObjectStoreError) -> String {
        try put(key: key, body: body, contentType: nil, metadata: [:])
    }

    public func setMetadata(key: String, contentType: String, metadata: [String: String], manifest: String?)
        throws(ObjectStoreError)
    {
        try post(key: key, contentType: contentType, metadata: metadata, manifest: manifest)
    }

    /// Fewer than one listing page (10 000): one listing shows all of a session's parts, and
    /// that nothing else is below their prefix.
    public var maximumParts: Int { 9_999 }

    public func beginUpload(key: String) throws(ObjectStoreError) -> UploadSession {
        UploadSession(key: key, id: manifestPartsPrefix + String(UInt64.random(in: 0...UInt64.max), radix: 16) + "/")
    }

    public static func partName(_ number: Int) -> String {
        let digits = String(number)
        return String(repeating: "0", count: max(0, 8 - digits.count)) + digits
    }

    public func uploadPart(_ session: UploadSession, number: Int, body: PutBody) throws(ObjectStoreError) -> String {
        try putPart(key: session.id + Self.partName(number), body: body)
    }

    public func discardPart(_ session: UploadSession, number: Int) {
        try? delete(key: session.id + Self.partName(number))
    }

    public func finishUpload(
        _ session: UploadSession, partETags: [String], size: Int64, partSize: Int64,
        destination: () throws(ObjectStoreError) -> String, contentType: String?, metadata: [String: String]
    ) throws(ObjectStoreError) -> FinishedUpload {
        // The parts are checked before the manifest replaces the old version: a failure here
        // deletes only the new parts, and the key keeps what it held.
        do {
            try verifyParts(prefix: session.id, etags: partETags, size: size, partSize: partSize)
        } catch {
            abortUpload(session)
            throw error
        }
        // A conflict copy names the same parts: nothing is sent twice.
        let target = try destination()
        try putManifest(key: target, partPrefix: session.id, contentType: contentType, metadata: metadata)
        let expected = manifestETag(partETags: partETags)
        // The manifest names parts the listing already shows; this check only reports a server
        // that disagrees (the parts stay: the manifest points at them now).
        do {
            try verifyManifest(key: target, size: size, etag: expected)
        } catch where error.isRetryable {}
        return FinishedUpload(key: target, etag: expected, manifest: containerName + "/" + session.id)
    }

    public func abortUpload(_ session: UploadSession) {
        deleteAll(prefix: session.id)
    }

    public func uploadETag(partETags: [String]) -> String { manifestETag(partETags: partETags) }

    /// Lists the part prefix until it shows exactly the parts of this upload with their ETags
    /// and sizes (listings may lag behind fresh PUTs), a few times before giving up.
    private func verifyParts(prefix: String, etags: [String], size: Int64, partSize: Int64) throws(ObjectStoreError) {
        var delay: UInt32 = 100_000
        var seen = ""
        for attempt in 1...6 {
            let page = try list(prefix: prefix, delimiter: nil, marker: nil, limit: maximumParts + 1)
            let listed = page.entries
            var matches = listed.count == etags.count && page.nextMarker == nil
            if matches {
                for (index, entry) in listed.enumerated() {
                    guard case .object(let part) = entry, part.key.isSameKey(as: prefix + Self.partName(index + 1)),
                        part.etag == etags[index],
                        part.size == min(partSize, size - Int64(index) * partSize)
                    else {
                        matches = false
                        break
                    }
                }
            }
            if matches { return }
            seen = "\(listed.count) of \(etags.count) parts as uploaded"
            if attempt < 6 {
                usleep(delay)
                delay *= 2
            }
        }
        throw ObjectStoreError(.invalidResponse, "the parts below '\(prefix)' do not list as uploaded (\(seen))")
    }

    private func verifyManifest(key: String, size: Int64, etag: String) throws(ObjectStoreError) {
        var delay: UInt32 = 100_000
        for attempt in 1...6 {
            let info = try head(key: key)
            if info.size == size && info.etag == etag { return }
            if attempt == 6 {
                throw ObjectStoreError(
                    .invalidResponse,
                    "the manifest of '\(key)' shows \(info.size) bytes with ETag \(info.etag), expected \(size) bytes "
                        + "with ETag \(etag)")
            }
            usleep(delay)
            delay *= 2
        }
    }
}
