#if canImport(Glibc)
import Glibc
#endif

/// Reads small files (credentials, /run/mount/utab) with the system calls the rest of the
/// product uses: no Foundation in the binary (`scripts/check-imports`).
public enum WholeFile {
    /// The bytes of the file at `path`, at most `limit` of them; nil when it cannot be opened
    /// or read (`errno` says why).
    public static func read(_ path: String, limit: Int = 16 << 20) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while bytes.count < limit {
            let want = min(buffer.count, limit - bytes.count)
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, want) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { return nil }
            if n == 0 { break }
            bytes += buffer[0..<n]
        }
        return bytes
    }

    /// The file at `path` as text (UTF-8, invalid bytes replaced); nil as for `read`.
    public static func text(_ path: String) -> String? {
        read(path).map { String(decoding: $0, as: UTF8.self) }
    }
}
