import Dispatch
import FSCore
import FSJournal
import Locking
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Stores a spool file under a key: one verified PUT up to the threshold, an upload session in
/// parts above it (the store's `beginUpload` ... `finishUpload`; on Swift a DLO, see
/// `ManifestStore`).
///
/// Subtleties:
/// 1. Parts go up in parallel, `concurrency` at a time; parts sent while the file was written
///    (`EarlyParts`) are reused where no write touched them since.
/// 2. A failed upload drops the parts it wrote when they cannot serve; the spool keeps the bytes.
/// 3. Deleting the parts of a replaced or removed Swift manifest (`deleteParts`) is this mount's
///    decision: only parts it may own, never shared ones.
package struct Uploader {
    package let store: any ObjectStore
    package let pool: BackgroundPool
    package let threshold: Int64
    package let partSize: Int64
    package let concurrency: Int
    /// Manifests whose parts are never deleted (see `SharedParts`).
    package let sharedParts: SharedParts
    /// Where a running upload shows its progress (`mount.cssp --status`).
    package let transfers: Transfers

    /// What an upload stored: under the key, or the conflict copy `Check.destination` named.
    package typealias Result = FinishedUpload

    /// The check against a lost update (issue 22): right before its last request (the PUT, or
    /// the manifest after the parts), an upload asks where it may go.
    package struct Check {
        /// The key while it still holds the version the bytes replace (or holds these bytes
        /// already), else a conflict copy's name; one HEAD (`uploadDestination`).
        package var destination: () throws(ObjectStoreError) -> String
        /// The bytes replace no stored version: where the server honours `If-None-Match`, a
        /// single PUT carries it instead of a HEAD first, and `destination` is asked only when
        /// the server refuses it.
        package var expectsAbsent: Bool

        package init(destination: @escaping () throws(ObjectStoreError) -> String, expectsAbsent: Bool) {
            self.destination = destination
            self.expectsAbsent = expectsAbsent
        }
    }

    /// Stores `size` bytes of the spool at `path` under `key`. `early` holds parts sent while the
    /// file was written; each is reused if `generations` (the spool's per-part write generations
    /// as of the snapshot being stored) shows no write into it since.
    package func upload(
        path: String, size: Int64, key: String, contentType: String, metadata: [String: String],
        early: EarlyParts? = nil, generations: [Int: UInt64] = [:], check: Check? = nil
    ) throws(ObjectStoreError) -> Result {
        // The parts sent while the file was written showed as their own upload until now; this
        // upload goes on from what they sent (parts sent again after a later write count twice,
        // up to the total).
        early?.stopShowing()
        let continues = size > threshold && early?.partSize == partSize(for: size)
        let progress = (continues ? early?.progress : nil) ?? TransferProgress()
        progress.setTotal(size)
        let id = transfers.begin(key: key, progress: progress)
        defer { transfers.end(id) }
        let sent = early?.finish() ?? [:]
        if size <= threshold {
            if let early { store.abortUpload(early.session) }
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
        let partSize = self.partSize(for: size)
        // Early parts of another size cannot serve (the file outgrew the part count).
        if let unusable = early, unusable.partSize != partSize { store.abortUpload(unusable.session) }
        let early = early.flatMap { $0.partSize == partSize ? $0 : nil }
        let session: UploadSession
        if let early {
            session = early.session
        } else {
            session = try store.beginUpload(key: key, contentType: contentType, metadata: metadata)
        }
        let count = Int((size + partSize - 1) / partSize)
        var reused: [String?] = Array(repeating: nil, count: count)
        if early != nil {
            for (index, part) in sent where index < count && Int64(index + 1) * partSize <= size {
                if part.generation == generations[index] ?? 0 { reused[index] = part.etag }
            }
            // Early parts past the end (the file shrank) would be part of the object.
            for index in sent.keys where index >= count { store.discardPart(session, number: index + 1) }
        }
        let etags = Locked<[String?]>(reused)
        let store = self.store
        let missing = (0..<count).filter { reused[$0] == nil }
        let failure = pool.forEach(missing.count, width: concurrency) { (position) throws(ObjectStoreError) in
            let index = missing[position]
            let offset = Int64(index) * partSize
            let etag = try store.uploadPart(
                session, number: index + 1,
                body: .file(path: path, offset: offset, length: min(partSize, size - offset), progress: progress))
            etags.withLock { $0[index] = etag }
        }
        if let failure {
            store.abortUpload(session)
            throw failure
        }
        let finished = try store.finishUpload(
            session, partETags: etags.withLock { $0.compactMap { $0 } }, size: size, partSize: partSize,
            destination: { () throws(ObjectStoreError) -> String in try check?.destination() ?? key },
            contentType: contentType, metadata: metadata)
        return finished
    }

    /// The ETag an upload of `size` bytes of `path` leaves on the server (a DLO manifest's, over
    /// the parts it would cut), nil when the store cannot say.
    package func expectedETag(path: String, size: Int64) -> String? {
        guard size > threshold else { return store.etag(ofFile: path, offset: 0, length: size) }
        let partSize = self.partSize(for: size)
        var parts: [String] = []
        var offset: Int64 = 0
        while offset < size {
            guard let etag = store.etag(ofFile: path, offset: offset, length: min(partSize, size - offset)) else { return nil }
            parts.append(etag)
            offset += partSize
        }
        return store.uploadETag(partETags: parts)
    }

    /// The part size of an upload of `size` bytes: the configured one, grown while the store
    /// would take no more parts.
    package func partSize(for size: Int64) -> Int64 {
        Self.partSize(for: size, configured: partSize, maximumParts: Int64(store.maximumParts))
    }

    /// `configured`, grown (in whole MiB) when `size` would need more than `maximumParts` parts.
    package static func partSize(for size: Int64, configured: Int64, maximumParts: Int64) -> Int64 {
        guard (size + configured - 1) / configured > maximumParts else { return configured }
        let needed = (size + maximumParts - 1) / maximumParts
        return (needed + (1 << 20) - 1) / (1 << 20) * (1 << 20)
    }

    /// Deletes the parts of a DLO manifest (`container/prefix`) when they are ours to delete: our
    /// own parts prefix, or the SDK's layout below the key itself.
    package func deleteParts(manifest: String, ofKey key: String) {
        let container = store.containerName + "/"
        guard manifest.utf8.starts(with: container.utf8) else { return }
        let prefix = String(manifest.dropFirst(container.count))
        guard prefix.utf8.starts(with: manifestPartsPrefix.utf8) || prefix.utf8.starts(with: (key + "/").utf8),
            prefix.hasSuffix("/"), prefix.count > manifestPartsPrefix.count, !sharedParts.contains(manifest)
        else { return }
        store.deleteAll(prefix: prefix)
    }

    package init(store: any ObjectStore, pool: BackgroundPool, threshold: Int64, partSize: Int64, concurrency: Int, sharedParts: SharedParts, transfers: Transfers) {
        self.store = store
        self.pool = pool
        self.threshold = threshold
        self.partSize = partSize
        self.concurrency = concurrency
        self.sharedParts = sharedParts
        self.transfers = transfers
    }
}
