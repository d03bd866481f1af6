import Dispatch
import Locking
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Stores a spool file under a key: one verified PUT up to the threshold, a DLO multipart upload
/// above it.
///
/// Subtleties:
/// 1. Parts go to `.cssp-parts/<uploadId>/<n>` (n zero-padded to 8 digits: a DLO concatenates in
///    name order), never below the key itself, where they would make the key look like a file and
///    a directory at once. Renaming a multipart file only moves its manifest.
/// 2. The manifest is written last, then verified: its size, and its ETag against the MD5 of the
///    parts' ETags. A manifest's view of its parts follows container listings, which may lag, so
///    a mismatch is retried a few times before the upload counts as failed.
/// 3. A failed upload deletes the parts it wrote; the spool keeps the bytes.
struct Uploader {
    let store: any ObjectStore
    let pool: BackgroundPool
    let threshold: Int64
    let partSize: Int64
    let concurrency: Int
    /// Manifests whose parts are never deleted (see `SharedParts`).
    let sharedParts: SharedParts
    /// Where a running upload shows its progress (`mount.cssp --status`).
    let transfers: Transfers

    struct Result {
        /// Where it was stored: the key, or the conflict copy `Check.destination` named.
        var key: String
        var etag: String
        var manifest: String?
    }

    /// The check against a lost update (issue 22): right before its last request (the PUT, or
    /// the manifest after the parts), an upload asks where it may go.
    struct Check {
        /// The key while it still holds the version the bytes replace (or holds these bytes
        /// already), else a conflict copy's name; one HEAD (`Filesystem.uploadDestination`).
        var destination: () throws(ObjectStoreError) -> String
        /// The bytes replace no stored version: where the server honours `If-None-Match`, a
        /// single PUT carries it instead of a HEAD first, and `destination` is asked only when
        /// the server refuses it.
        var expectsAbsent: Bool
    }

    /// Stores `size` bytes of the spool at `path` under `key`. `early` holds parts sent while the
    /// file was written; each is reused if `generations` (the spool's per-part write generations
    /// as of the snapshot being stored) shows no write into it since.
    func upload(
        path: String, size: Int64, key: String, contentType: String, metadata: [String: String],
        early: EarlyParts? = nil, generations: [Int: UInt64] = [:], check: Check? = nil
    ) throws(ObjectStoreError) -> Result {
        // The parts sent while the file was written showed as their own upload until now; this
        // upload goes on from what they sent (parts sent again after a later write count twice,
        // up to the total).
        early?.stopShowing()
        let continues = size > threshold && early?.partSize == Self.partSize(for: size, configured: partSize)
        let progress = (continues ? early?.progress : nil) ?? TransferProgress()
        progress.setTotal(size)
        let id = transfers.begin(key: key, progress: progress)
        defer { transfers.end(id) }
        let sent = early?.finish() ?? [:]
        if size <= threshold {
            if let early { deleteAll(prefix: early.partPrefix) }
            let body = PutBody.file(path: path, offset: 0, length: size, progress: progress)
            let conditional = check?.expectsAbsent == true && store.honoursIfNoneMatch
            var target = key
            if let check, !conditional { target = try check.destination() }
            do {
                let etag = try store.put(
                    key: target, body: body, contentType: contentType, metadata: metadata, onlyIfAbsent: conditional)
                return Result(key: target, etag: etag, manifest: nil)
            } catch where error.code == .preconditionFailed && conditional {
                // Something is at the key: another client's object, or this upload's own first
                // attempt whose answer was lost (then `destination` keeps the key).
                target = try check!.destination()
                let etag = try store.put(key: target, body: body, contentType: contentType, metadata: metadata)
                return Result(key: target, etag: etag, manifest: nil)
            }
        }
        let partSize = Self.partSize(for: size, configured: self.partSize)
        // Early parts of another size cannot serve (the file outgrew the part count).
        if let unusable = early, unusable.partSize != partSize { deleteAll(prefix: unusable.partPrefix) }
        let early = early.flatMap { $0.partSize == partSize ? $0 : nil }
        let partPrefix = early?.partPrefix ?? Filesystem.partsPrefix + String(UInt64.random(in: 0...UInt64.max), radix: 16) + "/"
        let count = Int((size + partSize - 1) / partSize)
        var reused: [String?] = Array(repeating: nil, count: count)
        if early != nil {
            for (index, part) in sent where index < count && Int64(index + 1) * partSize <= size {
                if part.generation == generations[index] ?? 0 { reused[index] = part.etag }
            }
            // Early parts past the end (the file shrank) would be concatenated by the manifest.
            for index in sent.keys where index >= count {
                try? store.delete(key: partPrefix + Uploader.partName(index + 1))
            }
        }
        let etags = Locked<[String?]>(reused)
        let store = self.store
        let missing = (0..<count).filter { reused[$0] == nil }
        let failure = pool.forEach(missing.count, width: concurrency) { (position) throws(ObjectStoreError) in
            let index = missing[position]
            let offset = Int64(index) * partSize
            let etag = try store.putPart(
                key: partPrefix + Uploader.partName(index + 1),
                body: .file(path: path, offset: offset, length: min(partSize, size - offset), progress: progress))
            etags.withLock { $0[index] = etag }
        }
        // The parts are checked before the manifest replaces the old version: a failure here
        // deletes only the new parts, and the key keeps what it held.
        let partETags: [String]
        do throws(ObjectStoreError) {
            if let failure { throw failure }
            partETags = etags.withLock { $0.compactMap { $0 } }
            try verifyParts(prefix: partPrefix, etags: partETags, size: size, partSize: partSize)
        } catch {
            deleteAll(prefix: partPrefix)
            throw error
        }
        // A conflict copy names the same parts: nothing is sent twice.
        let target = try check?.destination() ?? key
        try store.putManifest(key: target, partPrefix: partPrefix, contentType: contentType, metadata: metadata)
        let expected = store.manifestETag(partETags: partETags)
        // The manifest names parts the listing already shows; this check only reports a server
        // that disagrees (the parts stay: the manifest points at them now). The manifest is
        // stored: a check that cannot be made (the server away) does not make the upload fail,
        // else the next upload would find this version and take it for another client's.
        do {
            try verify(key: target, size: size, etag: expected)
        } catch where error.isRetryable {}
        return Result(key: target, etag: expected, manifest: store.containerName + "/" + partPrefix)
    }

    /// The most parts one upload makes: fewer than one listing page (10 000), so that one
    /// listing shows them all and that nothing else is below their prefix.
    static let maximumParts: Int64 = 9_999

    /// `configured`, grown (in whole MiB) when `size` would need more than `maximumParts` parts.
    /// The ETag an upload of `size` bytes of `path` leaves on the server (a DLO manifest's, over
    /// the parts it would cut), nil when the store cannot say.
    func expectedETag(path: String, size: Int64) -> String? {
        guard size > threshold else { return store.etag(ofFile: path, offset: 0, length: size) }
        let partSize = Self.partSize(for: size, configured: self.partSize)
        var parts: [String] = []
        var offset: Int64 = 0
        while offset < size {
            guard let etag = store.etag(ofFile: path, offset: offset, length: min(partSize, size - offset)) else { return nil }
            parts.append(etag)
            offset += partSize
        }
        return store.manifestETag(partETags: parts)
    }

    static func partSize(for size: Int64, configured: Int64) -> Int64 {
        guard (size + configured - 1) / configured > maximumParts else { return configured }
        let needed = (size + maximumParts - 1) / maximumParts
        return (needed + (1 << 20) - 1) / (1 << 20) * (1 << 20)
    }

    /// Lists the part prefix until it shows exactly the parts of this upload with their ETags
    /// and sizes (listings may lag behind fresh PUTs), a few times before giving up.
    private func verifyParts(prefix: String, etags: [String], size: Int64, partSize: Int64) throws(ObjectStoreError) {
        var delay: UInt32 = 100_000
        var seen = ""
        for attempt in 1...6 {
            let page = try store.list(prefix: prefix, delimiter: nil, marker: nil, limit: Int(Self.maximumParts) + 1)
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

    private func verify(key: String, size: Int64, etag: String) throws(ObjectStoreError) {
        var delay: UInt32 = 100_000
        for attempt in 1...6 {
            let info = try store.head(key: key)
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

    static func partName(_ number: Int) -> String {
        let digits = String(number)
        return String(repeating: "0", count: max(0, 8 - digits.count)) + digits
    }

    /// Deletes the parts of a DLO manifest (`container/prefix`) when they are ours to delete: our
    /// own parts prefix, or the SDK's layout below the key itself.
    func deleteParts(manifest: String, ofKey key: String) {
        let container = store.containerName + "/"
        guard manifest.utf8.starts(with: container.utf8) else { return }
        let prefix = String(manifest.dropFirst(container.count))
        guard prefix.utf8.starts(with: Filesystem.partsPrefix.utf8) || prefix.utf8.starts(with: (key + "/").utf8),
            prefix.hasSuffix("/"), prefix.count > Filesystem.partsPrefix.count, !sharedParts.contains(manifest)
        else { return }
        deleteAll(prefix: prefix)
    }

    /// Best-effort delete of every key below `prefix`.
    func deleteAll(prefix: String) {
        guard let keys = try? store.listAll(prefix: prefix, delimiter: nil).map(\.name) else { return }
        let store = self.store
        _ = pool.forEach(keys.count, width: 8) { (index) throws(ObjectStoreError) in
            _ = try? store.delete(key: keys[index])
        }
    }
}
