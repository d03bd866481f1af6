import FSCore
import ObjectStore

/// A HEAD's answer and when it was asked (`StoreClock` tick); `info` nil: no such object.
package struct HeadAnswer: Sendable {
    package var info: ObjectInfo?
    package var askedAt: UInt64

    package init(info: ObjectInfo?, askedAt: UInt64) {
        self.info = info
        self.askedAt = askedAt
    }
}

/// The attribute merge rules: what a HEAD, a listing entry or both say about an object, merged
/// into what a node knows. Pure functions of the node, the answers and the time, so that each
/// rule is pinned by a table test (`NodeMergeTests`).
///
/// THE RULE (every answer of the store goes through `admission`, nothing else writes a node from one):
/// an answer (a listing entry, a HEAD, a GET's headers) may change a node only if
///   (a) it was asked (`askedAt`: a `StoreClock` tick taken before the request was sent) no
///       earlier than the node was last described (`describedAsOf`: the acknowledgement of this
///       mount's latest change of it, or the latest answer it took), and no change of ours is
///       still unacknowledged (`acknowledgedVersion` behind `attributeVersion`: owed attributes,
///       a POST under way); or
///   (b) it shows a newer object version (another client): another ETag, asked after the node
///       was last described (the store never goes back), or dated by the server later than both
///       the node's version and our latest acknowledged change.
/// A change of ours, once the store acknowledged it (`acknowledge`: an upload, a POST, a COPY, a
/// create), moves `describedAsOf` past every answer asked before: remembered listings, readdirs
/// under way and background HEADs from before it are unusable for the node from then on, with
/// no need to find and edit each copy. A refused answer changes nothing, except that one of the
/// node's own ETag still confirms the object (`confirmedAt`), as it always did.
/// Owed attributes belong to the version they were made on: an answer admitted by (b) voids them.
extension Node {
    package static let ownMetadataNames: Set<String> = [
        "mtime", "mode", "uid", "gid", StoredAttributes.symlinkTargetHeader, StoredAttributes.createTokenHeader,
    ]

    /// Whether a change of ours is not acknowledged by the store yet.
    package var hasUnacknowledgedChange: Bool { attributesOwed || attributeVersion != acknowledgedVersion }

    /// The rule: whether an answer asked at `askedAt`, showing `answerETag` (nil: an ETag that
    /// says nothing of the version, as a zero-byte listing entry's, maybe a DLO manifest's) dated
    /// `answerTime` by the server, may change the node; and whether it shows a newer version.
    package func admission(askedAt: UInt64, etag answerETag: String?, lastModified answerTime: Timestamp)
        -> (admitted: Bool, newer: Bool)
    {
        let otherVersion = answerETag.map { !$0.isEmpty && !etag.isEmpty && $0 != etag } ?? false
        if askedAt >= describedAsOf {
            return otherVersion ? (true, true) : (!hasUnacknowledgedChange, false)
        }
        let newer = otherVersion && answerTime > lastModified && answerTime > acknowledgedTime
        return (newer, newer)
    }

    /// Takes an admitted answer: the node is described as of it, and a newer version voids the
    /// changes of ours made on the old one (owed or under way: another client's version wins).
    private mutating func admit(askedAt: UInt64, newer: Bool) {
        describedAsOf = max(describedAsOf, askedAt)
        if newer {
            attributesOwed = false
            acknowledgedVersion = attributeVersion
        }
    }

    /// The store acknowledged a change of ours (tick `tick`, taken after the answer came): every
    /// answer asked before is refused from now on; `version`, if given, is the attribute version
    /// the change stored.
    package mutating func acknowledge(at tick: UInt64, version: UInt64? = nil) {
        describedAsOf = max(describedAsOf, tick)
        if let version { acknowledgedVersion = max(acknowledgedVersion, min(version, attributeVersion)) }
        acknowledgedTime = Timestamp.now()
    }

    /// A failed change or a conflict: what the store holds is unknown, so only answers asked from
    /// `tick` on count, and no change of ours is waiting for its acknowledgement any more.
    /// (Owed attributes stay owed: they are still to be stored.)
    package mutating func forgetWhatWasSaid(at tick: UInt64) {
        acknowledge(at: tick, version: attributesOwed ? nil : attributeVersion)
        confirmedAt = 0
        metadataKnownAt = 0
    }

    /// Takes what a HEAD said, if the rule admits it (returned). `foreign`: where another tool's
    /// object's attributes come from (with `.listing`, not from its metadata headers).
    @discardableResult
    package mutating func apply(_ info: ObjectInfo, askedAt: UInt64, now: Double, foreign: ForeignAttributes = .head) -> Bool {
        let headTime = Timestamp(info.lastModified)
        let verdict = admission(askedAt: askedAt, etag: info.etag, lastModified: headTime)
        guard verdict.admitted else {
            if info.etag == etag { confirmedAt = now }
            return false
        }
        admit(askedAt: askedAt, newer: verdict.newer)
        let sameVersion = !etag.isEmpty && etag == info.etag
        size = info.size
        etag = info.etag
        // A HEAD's Last-Modified is whole seconds (Swift rounds the object's time up); a listing
        // has microseconds. Keep the listing's time when they agree: a time that changes under
        // the kernel makes it drop the file's page cache (and `ls -l` would jitter).
        if !(sameVersion && headTime.agrees(with: lastModified)) { lastModified = headTime }
        if !hasUnacknowledgedChange { stored = StoredAttributes.of(info, foreign: foreign) }
        baseContentType = StoredAttributes.parse(contentType: info.contentType).base
        manifest = info.manifest
        extraMetadata = info.metadata.filter { !Node.ownMetadataNames.contains($0.key) }
        metadataKnownAt = now
        if kind == .symlink {
            // Another version's target is read again unless the headers carry it.
            symlinkTarget = info.metadata[StoredAttributes.symlinkTargetHeader] ?? (sameVersion ? symlinkTarget : nil)
        }
        confirmedAt = now
        return true
    }

    /// What a listing entry (asked at `listedAt`) and a HEAD's answer, if any, say, merged into
    /// what the node knows under the rule. `fresh`: the node was confirmed within attr_timeout.
    /// A listing entry of another version of another tool's object makes the node forget its
    /// metadata (`metadataKnownAt`): with `foreign_attrs=head`, getattr HEADs it before the
    /// next report (`Filesystem.awaitsHead`).
    package mutating func merge(
        _ entry: DirectoryEntry, listedAt: UInt64, head: HeadAnswer?, fresh: Bool, now: Double,
        foreign: ForeignAttributes = .head
    ) {
        switch entry.kind {
        case .file, .symlink, .fifo, .socket:
            if let head, let info = head.info {
                // A version new to the node that both describe: the listing's precise time (a
                // version it knew keeps the time the kernel saw).
                let newToTheNode = etag != entry.etag
                if apply(info, askedAt: head.askedAt, now: now, foreign: foreign), newToTheNode, info.etag == entry.etag,
                    lastModified.agrees(with: entry.lastModified)
                {
                    lastModified = entry.lastModified
                }
            } else if !fresh && (entry.size > 0 || etag != entry.etag || confirmedAt == 0) {
                // (A zero-byte entry may be a DLO manifest, whose listed ETag is not its own.)
                let verdict = admission(
                    askedAt: listedAt, etag: entry.size > 0 ? entry.etag : nil, lastModified: entry.lastModified)
                guard verdict.admitted else {
                    if entry.etag == etag { confirmedAt = now }
                    return
                }
                admit(askedAt: listedAt, newer: verdict.newer)
                let parsed = entry.parsedContentType
                // The version the node describes already (a HEAD's whole-second time agrees with
                // the listing's): its time stays, and so do attributes a HEAD read from metadata
                // headers. A time that changes under the kernel makes it drop its page cache.
                let sameVersion = etag == entry.etag && lastModified.agrees(with: entry.lastModified)
                if !sameVersion { lastModified = entry.lastModified }
                // Another version, or another tool's object whose metadata may have changed with
                // its time: what a HEAD said is not known of it (with foreign_attrs=head, getattr
                // asks again before it reports).
                if etag != entry.etag || (!sameVersion && parsed.attributes.mtime == nil) { metadataKnownAt = 0 }
                // A listing does not carry a symlink's target: another version's is read again.
                if kind == .symlink && etag != entry.etag { symlinkTarget = nil }
                size = entry.size
                etag = entry.etag
                // A listing shows a DLO manifest with size 0: anything larger is a plain object.
                if entry.size > 0 { manifest = nil }
                if !hasUnacknowledgedChange && !(sameVersion && metadataKnownAt > 0) { stored = parsed.attributes }
                baseContentType = parsed.base
                confirmedAt = now
            }
        case .directory:
            // A directory's attributes live on its marker: only a HEAD of it (an answer, or none
            // for no marker) describes them.
            guard let head else { return }
            if admission(askedAt: head.askedAt, etag: nil, lastModified: .zero).admitted {
                admit(askedAt: head.askedAt, newer: false)
                stored = head.info.map { StoredAttributes.of($0) } ?? StoredAttributes()
            }
            confirmedAt = now
        }
    }
}
