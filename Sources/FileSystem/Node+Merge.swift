import ObjectStore

/// The attribute merge rules: what a HEAD, a listing entry or both say about an object, merged
/// into what a node knows. Pure functions of the node, the answers and the time, so that each
/// rule is pinned by a table test (`NodeMergeTests`). Local changes made since `version` win, and
/// so do attributes still owed to the server (`attributesOwed`).
extension Node {
    static let ownMetadataNames: Set<String> = ["mtime", "mode", "uid", "gid", StoredAttributes.symlinkTargetHeader]

    /// Owed attributes belong to the version they were made on: when the server holds another
    /// one (another client replaced the object), the other client's change came later and wins.
    mutating func voidOwedAttributes(ifStoredAs serverETag: String) {
        if attributesOwed && !etag.isEmpty && serverETag != etag { attributesOwed = false }
    }

    /// Takes what a HEAD said; the stored attributes only if no local change happened since the
    /// HEAD was sent (`seenAtVersion`).
    mutating func apply(_ info: ObjectInfo, seenAtVersion version: UInt64, now: Double) {
        voidOwedAttributes(ifStoredAs: info.etag)
        let sameVersion = !etag.isEmpty && etag == info.etag
        size = info.size
        etag = info.etag
        // A HEAD's Last-Modified is whole seconds (Swift rounds the object's time up); a listing
        // has microseconds. Keep the listing's time when they agree: a time that changes under
        // the kernel makes it drop the file's page cache (and `ls -l` would jitter).
        let headTime = Timestamp(info.lastModified)
        if !(sameVersion && headTime.agrees(with: lastModified)) { lastModified = headTime }
        if attributeVersion == version && !attributesOwed { stored = StoredAttributes.of(info) }
        baseContentType = StoredAttributes.parse(contentType: info.contentType).base
        manifest = info.manifest
        extraMetadata = info.metadata.filter { !Node.ownMetadataNames.contains($0.key) }
        metadataKnownAt = now
        if kind == .symlink, let target = info.metadata[StoredAttributes.symlinkTargetHeader] {
            symlinkTarget = target
        }
        confirmedAt = now
    }

    /// The attribute merge rule: what a listing entry (and a HEAD's `info`, if any) says, merged
    /// into what the node knows. Local changes since `version` win over both.
    mutating func merge(
        _ entry: DirectoryEntry, info: ObjectInfo?, markerChecked: Bool, version: UInt64, fresh: Bool, now: Double
    ) {
        switch entry.kind {
        case .file, .symlink, .fifo, .socket:
            if let info {
                voidOwedAttributes(ifStoredAs: info.etag)
            } else if entry.size > 0 {
                // (A zero-byte entry may be a DLO manifest, whose listed ETag is not its own.)
                voidOwedAttributes(ifStoredAs: entry.etag)
            }
            let unchanged = attributeVersion == version && !attributesOwed
            if let info {
                if etag != entry.etag && info.etag == entry.etag {
                    // What the listing showed, so that `apply` keeps its precise time.
                    etag = entry.etag
                    lastModified = entry.lastModified
                }
                apply(info, seenAtVersion: version, now: now)
            } else if !fresh && (entry.size > 0 || etag != entry.etag || confirmedAt == 0) {
                let parsed = StoredAttributes.parse(contentType: entry.contentType)
                // The version the node describes already (a HEAD's whole-second time agrees with
                // the listing's): its time stays, and so do attributes a HEAD read from metadata
                // headers. A time that changes under the kernel makes it drop its page cache.
                let sameVersion = etag == entry.etag && lastModified.agrees(with: entry.lastModified)
                if !sameVersion { lastModified = entry.lastModified }
                size = entry.size
                etag = entry.etag
                // A listing shows a DLO manifest with size 0: anything larger is a plain object.
                if entry.size > 0 { manifest = nil }
                if unchanged && !(sameVersion && metadataKnownAt > 0) { stored = parsed.attributes }
                baseContentType = parsed.base
                confirmedAt = now
            }
        case .directory:
            let unchanged = attributeVersion == version
            if let info {
                if unchanged { stored = StoredAttributes.of(info) }
                confirmedAt = now
            } else if markerChecked {
                if unchanged { stored = StoredAttributes() }
                confirmedAt = now
            }
        }
    }
}
