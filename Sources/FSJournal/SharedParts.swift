import FSCore
import Locking

#if canImport(Glibc)
import Glibc
#endif

/// Manifests whose parts two keys may point at: a rename of a multipart file that failed after
/// its new manifest may have been written, and before the old one was deleted. Such parts are
/// never deleted, since an overwrite or unlink of one name would take the other's bytes; a few
/// orphaned parts below `.cssp-parts/` are the price. Kept across mounts in `shared-parts` in
/// the spool directory, one manifest per line, appended and synced before the failure is returned.
package final class SharedParts: Sendable {
    package let path: String
    private let manifests: Locked<Set<String>>

    package init(directory: String) {
        path = directory + "/shared-parts"
        let lines = Spool.read(path)?.split(separator: "\n").map(String.init) ?? []
        manifests = Locked(Set(lines))
    }

    package func contains(_ manifest: String) -> Bool { manifests.withLock { $0.contains(manifest) } }

    package func mark(_ manifest: String) {
        let added = manifests.withLock { $0.insert(manifest).inserted }
        guard added else { return }
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let line = Array((manifest + "\n").utf8)
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        _ = fsync(fd)
    }
}
