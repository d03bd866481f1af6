import FSCore
import Logging
import ObjectStore

#if canImport(Glibc)
import Glibc
#endif

// The lost-update check and conflict copies (issue 22: no silent lost update), made by the
// uploader of the store the bytes go to.
extension Uploader {
    /// The check every upload of bytes makes right before its last request (issue 22: no silent
    /// lost update): bytes that replace the version `base` go to `key` only while the object
    /// there is still that version, a new name's (`base` empty) only while nothing is there.
    package func lostUpdateCheck(key: String, base: String, bytes: (path: String, size: Int64), logger: Logger) -> Check {
        Check(
            destination: { () throws(ObjectStoreError) in
                try self.uploadDestination(key: key, base: base, bytes: bytes, logger: logger)
            },
            expectsAbsent: base.isEmpty)
    }

    /// Where an upload of bytes that replace `base` goes: `key` while the object there is
    /// still that version (or still absent for a new name) or already holds these `bytes`, else
    /// a conflict copy beside it, so that neither another client's newer version nor ours is lost.
    package func uploadDestination(
        key: String, base: String, bytes: (path: String, size: Int64), logger: Logger
    ) throws(ObjectStoreError) -> String {
        let current: String?
        do {
            current = try store.head(key: key).etag
        } catch where error.code == .notFound {
            current = nil
        }
        if current == (base.isEmpty ? nil : base) { return key }
        // An earlier attempt whose answer was lost may have stored these very bytes: that is
        // this mount's version, not another client's.
        if let current, expectedETag(path: bytes.path, size: bytes.size) == current {
            logger.notice("'\(key)' holds this mount's bytes already (an earlier upload's answer was lost)")
            return key
        }
        let conflict = try freeConflictKey(Self.conflictKey(for: key, at: Timestamp.now()))
        let change = current == nil ? "deleted" : "replaced"
        logger.warning(
            "conflict: '\(key)' was \(change) by another client since this mount read or wrote it; storing this mount's version as '\(conflict)'")
        return conflict
    }

    /// `name`, or `name-2`, `name-3`, … the first where nothing is: two conflicts of one key in
    /// one second must not overwrite each other (the two-mount model found the second copy
    /// replacing the first).
    package func freeConflictKey(_ name: String) throws(ObjectStoreError) -> String {
        for n in 1...1_000 {
            let candidate = n == 1 ? name : name + "-\(n)"
            do {
                _ = try store.head(key: candidate)
            } catch where error.code == .notFound {
                return candidate
            }
        }
        throw ObjectStoreError(.invalidRequest, "1 000 conflict copies of '\(name)' exist already")
    }

    /// `KEY.cssp-conflict-YYYYMMDDTHHMMSSZ`, in UTC.
    package static func conflictKey(for key: String, at time: Timestamp) -> String {
        key + ".cssp-conflict-" + time.utc(compact: true)
    }
}
