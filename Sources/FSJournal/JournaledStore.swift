import FSCore
import ObjectStore

/// The store as this mount must see it while deletes are owed (`DeleteQueue`): keys whose
/// delete is journaled are gone from listings and HEADs, and a write to such a key waits until
/// its delete is done (the store never sees the delete after the newer write). Everything else
/// passes through unchanged; with nothing owed it costs one check per call.
///
/// Subtleties:
/// 1. A directory is listed (common prefix `d/`) while any key below it exists. When deletes
///    below it are owed, one more listing of `d/` (as many keys as are owed there, plus one)
///    says whether anything else is left.
/// 2. A directory object `d` (application/directory) beside an owed marker `d/` is hidden too:
///    the queue deletes it with the marker.
/// 3. A listing page that lost entries to the filter is filled from the next page, so that a
///    caller asking for `limit` entries (rmdir's emptiness check asks for two) is not told the
///    listing ended early.
/// 4. GETs are not filtered: a file unlinked while open stays readable, as on a local disk.
/// 5. Only the version a delete names is hidden (`DeleteQueue` subtlety 5): another client's
///    newer version, which the delete will leave, shows at once.
/// 6. What an earlier mount owed (`RecoveredWork`) is stored before its key is read, listed or
///    written: those names are never served in the state before the journal.
/// 7. A delete owed when a request was sent hides its version from the answer even when it was
///    sent meanwhile: the store may have answered before the delete reached it, and the queue
///    forgets a key once its delete is done (core model seed 7041: a HEAD after a rename showed
///    the old name, deleted a moment later). Listings are filtered with the deletes owed
///    before or after each page as well.
package final class JournaledStore: ObjectStore {
    package let wrapped: any ObjectStore
    package let deletes: DeleteQueue
    /// nil in the store recovery itself writes through (`RecoveredWork` subtlety 3).
    package let recovered: RecoveredWork?

    package init(_ wrapped: any ObjectStore, deletes: DeleteQueue, recovered: RecoveredWork? = nil) {
        self.wrapped = wrapped
        self.deletes = deletes
        self.recovered = recovered
    }

    /// Subtlety 6 for one key.
    private func recover(_ key: String) throws(ObjectStoreError) {
        guard let recovered, !recovered.isEmpty else { return }
        try recovered.settle(key)
    }

    package var containerName: String { wrapped.containerName }
    package var bulkDeleteLimit: Int? { wrapped.bulkDeleteLimit }
    package var honoursIfNoneMatch: Bool { wrapped.honoursIfNoneMatch }

    package func headContainer() throws(ObjectStoreError) -> ContainerInfo { try wrapped.headContainer() }

    /// Whether the listing entry is a key (or directory) whose delete is owed, or was owed when
    /// the listing was asked for (`before`, subtlety 7).
    private func isHidden(_ entry: ListEntry, before: [ExactString: String]) throws(ObjectStoreError) -> Bool {
        switch entry {
        case .object(let summary):
            let marker = summary.key + "/"
            if ObjectKey.isDirectoryContentType(summary.contentType) && (before[marker.exact] != nil || deletes.isPending(marker)) {
                return true
            }
            return try isDeleted(summary, before: before)
        case .commonPrefix(let prefix):
            let owed = max(deletes.pendingCount(withPrefix: prefix), before.keys.count { $0.string.utf8.starts(with: prefix.utf8) })
            guard owed > 0 else { return false }
            // Subtlety 1: anything left below it that is not owed?
            var marker: String? = nil
            repeat {
                let page = try wrapped.list(prefix: prefix, delimiter: nil, marker: marker, limit: min(10_000, owed + 1))
                for case .object(let summary) in page.entries where try !isDeleted(summary, before: before) { return false }
                marker = page.nextMarker
            } while marker != nil
            return true
        }
    }

    /// Whether the listed object is a version whose delete is owed (subtlety 5), or was owed
    /// when the listing was asked for (subtlety 7): a listing that disagrees with the version the
    /// delete names is checked with a HEAD.
    private func isDeleted(_ summary: ObjectSummary, before: [ExactString: String]) throws(ObjectStoreError) -> Bool {
        guard let version = deletes.pendingVersion(summary.key) ?? before[summary.key.exact] else { return false }
        if version.isEmpty || version == summary.etag { return true }
        // A DLO manifest lists with size 0: anything longer is another version.
        if version.hasPrefix(DeleteEntry.manifestTag) && summary.size > 0 { return false }
        do {
            let info = try wrapped.head(key: summary.key)
            return DeleteEntry.version(etag: info.etag, manifest: info.manifest) == version
        } catch where error.code == .notFound {
            return true
        }
    }

    package func list(prefix: String, delimiter: String?, marker: String?, endMarker: String?, limit: Int)
        throws(ObjectStoreError) -> ListPage
    {
        if let recovered, !recovered.isEmpty { try recovered.settle(listing: prefix, delimiter: delimiter) }
        // With deletes owed below the prefix, the page is filtered here (subtlety 3), then cut.
        guard endMarker != nil, deletes.pendingVersions(withPrefix: prefix).isEmpty else {
            return try list(prefix: prefix, delimiter: delimiter, marker: marker, limit: limit).ending(before: endMarker)
        }
        return try wrapped.list(prefix: prefix, delimiter: delimiter, marker: marker, endMarker: endMarker, limit: limit)
    }

    package func list(prefix: String, delimiter: String?, marker: String?, limit: Int) throws(ObjectStoreError) -> ListPage {
        if let recovered, !recovered.isEmpty { try recovered.settle(listing: prefix, delimiter: delimiter) }
        let before = deletes.pendingVersions(withPrefix: prefix)
        guard !before.isEmpty else { return try wrapped.list(prefix: prefix, delimiter: delimiter, marker: marker, limit: limit) }
        let owed = before.count
        // Subtlety 3: asked for enough to fill `limit` after the owed ones are left out, and for
        // more from the next page if that was not enough; what is returned stops at `limit`,
        // with the marker after the last entry returned.
        let ask = min(10_000, limit + owed)
        var entries: [ListEntry] = []
        var page = try wrapped.list(prefix: prefix, delimiter: delimiter, marker: marker, limit: ask)
        while true {
            for (index, entry) in page.entries.enumerated() {
                if try !isHidden(entry, before: before) { entries.append(entry) }
                if entries.count == limit {
                    // (By position: names compared as Strings took "é" and "e\u{301}" for one,
                    // and ended the listing before the second spelling; core model seed 23.)
                    let more = page.nextMarker != nil || index < page.entries.count - 1
                    return ListPage(entries: entries, nextMarker: more ? entry.name : nil)
                }
            }
            guard let next = page.nextMarker else { return ListPage(entries: entries, nextMarker: nil) }
            page = try wrapped.list(prefix: prefix, delimiter: delimiter, marker: next, limit: ask)
        }
    }

    package func head(key: String) throws(ObjectStoreError) -> ObjectInfo {
        try recover(key)
        // Subtlety 7: the versions owed before the request count as well as those owed after.
        let owedBefore = deletes.isEmpty ? nil : deletes.pendingVersion(key)
        let markerOwedBefore = deletes.isEmpty ? false : deletes.isPending(key + "/")
        let info = try wrapped.head(key: key)
        guard owedBefore != nil || markerOwedBefore || !deletes.isEmpty else { return info }
        let version = DeleteEntry.version(etag: info.etag, manifest: info.manifest)
        let owed = [owedBefore, deletes.pendingVersion(key)].contains { $0 != nil && ($0!.isEmpty || $0 == version) }
        let markerOwed = markerOwedBefore || deletes.isPending(key + "/")
        if owed || (ObjectKey.isDirectoryContentType(info.contentType) && markerOwed) {
            throw ObjectStoreError(.notFound, "'\(key)' is deleted (the delete is queued)", httpStatus: 404)
        }
        return info
    }

    package func get(key: String, range: ByteRange?, sink: (UnsafeRawBufferPointer) -> Void) throws(ObjectStoreError)
        -> ObjectInfo
    {
        try recover(key)
        return try wrapped.get(key: key, range: range, sink: sink)
    }

    /// Before the store is asked to write `key`: what an earlier mount owed of it, and its owed
    /// delete, first.
    private func settle(_ key: String) throws(ObjectStoreError) {
        try recover(key)
        guard !deletes.isEmpty else { return }
        do {
            try deletes.settle(key)
        } catch {
            throw ObjectStoreError(.transient, error.message)
        }
    }

    package func put(key: String, body: PutBody, contentType: String?, metadata: [String: String], onlyIfAbsent: Bool)
        throws(ObjectStoreError) -> String
    {
        try settle(key)
        return try wrapped.put(key: key, body: body, contentType: contentType, metadata: metadata, onlyIfAbsent: onlyIfAbsent)
    }

    package var maximumParts: Int { wrapped.maximumParts }

    package func beginUpload(key: String) throws(ObjectStoreError) -> UploadSession { try wrapped.beginUpload(key: key) }
    package func beginUpload(key: String, contentType: String?, metadata: [String: String]) throws(ObjectStoreError)
        -> UploadSession
    {
        try wrapped.beginUpload(key: key, contentType: contentType, metadata: metadata)
    }
    package var fixesUploadMetadataAtBegin: Bool { wrapped.fixesUploadMetadataAtBegin }

    package func uploadPart(_ session: UploadSession, number: Int, body: PutBody) throws(ObjectStoreError) -> String {
        try wrapped.uploadPart(session, number: number, body: body)
    }

    package func discardPart(_ session: UploadSession, number: Int) { wrapped.discardPart(session, number: number) }

    /// The key the upload is finished under is settled first, as before a PUT.
    package func finishUpload(
        _ session: UploadSession, partETags: [String], size: Int64, partSize: Int64,
        destination: () throws(ObjectStoreError) -> String, contentType: String?, metadata: [String: String]
    ) throws(ObjectStoreError) -> FinishedUpload {
        try wrapped.finishUpload(
            session, partETags: partETags, size: size, partSize: partSize,
            destination: { () throws(ObjectStoreError) -> String in
                let key = try destination()
                try settle(key)
                return key
            }, contentType: contentType, metadata: metadata)
    }

    package func abortUpload(_ session: UploadSession) { wrapped.abortUpload(session) }

    package func uploadETag(partETags: [String]) -> String { wrapped.uploadETag(partETags: partETags) }

    package func putManifest(key: String, manifest: String, contentType: String?, metadata: [String: String])
        throws(ObjectStoreError)
    {
        try settle(key)
        try wrapped.putManifest(key: key, manifest: manifest, contentType: contentType, metadata: metadata)
    }

    package func copy(from source: String, to destination: String, contentType: String?, metadata: [String: String]?)
        throws(ObjectStoreError)
    {
        try recover(source)
        try settle(destination)
        try wrapped.copy(from: source, to: destination, contentType: contentType, metadata: metadata)
    }

    package func delete(key: String) throws(ObjectStoreError) {
        try recover(key)
        try wrapped.delete(key: key)
    }

    package func bulkDelete(keys: [String]) throws(ObjectStoreError) -> [String] {
        try wrapped.bulkDelete(keys: keys)
    }

    package func setMetadata(key: String, contentType: String, metadata: [String: String], manifest: String?)
        throws(ObjectStoreError)
    {
        try settle(key)
        try wrapped.setMetadata(key: key, contentType: contentType, metadata: metadata, manifest: manifest)
    }

    package func etag(ofFile path: String, offset: Int64, length: Int64) -> String? {
        wrapped.etag(ofFile: path, offset: offset, length: length)
    }
}
