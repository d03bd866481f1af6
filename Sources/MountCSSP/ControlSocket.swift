import Dispatch
import MountCSSPConfig

#if canImport(Glibc)
import Glibc
#endif

/// The running daemon's control socket, which `mount.cssp --stats MOUNTPOINT` and `--status`
/// ask. One request per connection: a command line (`stats`, `status`), then the answer until
/// the daemon closes the connection.
///
/// Where it lives (man page, FILES): `/run/csspfs/` for root's mounts; for another user's
/// `/run/user/UID/csspfs/`, or `CACHE_DIR/run/` when there is no `/run/user/UID`. The directory
/// is 0700 and the socket 0600, and the daemon also checks the peer's uid (the mount's owner
/// or root), since a socket is the one file the owner's umask could leave open. Its name is a
/// hash of the mountpoint: a socket path has room for 107 bytes, a mountpoint may not.
enum ControlSocket {
    static func name(mountpoint: String) -> String {
        let hex = String(stableHash(mountpoint), radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex + ".sock"
    }

    /// The directory of the sockets of `uid`'s mounts; `cacheDirectory` is the fallback.
    static func directory(uid: uid_t, cacheDirectory: String?) -> String? {
        if uid == 0 { return "/run/csspfs" }
        var st = stat()
        if stat("/run/user/\(uid)", &st) == 0 && st.st_uid == uid { return "/run/user/\(uid)/csspfs" }
        return cacheDirectory.map { $0 + "/run" }
    }

    /// Where a client looks for the socket of the mount at `mountpoint` owned by `owner`.
    static func candidates(mountpoint: String, owner: uid_t, callerCacheDirectory: String?) -> [String] {
        var directories: [String] = []
        if let first = directory(uid: owner, cacheDirectory: nil) { directories.append(first) }
        if let cache = callerCacheDirectory { directories.append(cache + "/run") }
        return directories.map { $0 + "/" + name(mountpoint: mountpoint) }
    }

    static func address(_ path: String) -> sockaddr_un? {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return address
    }
}

/// FNV-1a, 64 bits: short, stable across versions and runs (Swift's `Hasher` is seeded per
/// process), no collisions among one host's mounts and URLs.
func stableHash(_ text: String) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in text.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
    return hash
}

/// Serves the control socket on a thread of its own until `stop`.
final class ControlServer: @unchecked Sendable {
    let path: String
    private let fd: Int32
    private let owner: uid_t
    private let handler: @Sendable (String) -> String
    private let done = DispatchSemaphore(value: 0)

    /// Binds `path` (a stale socket of a dead daemon there is replaced). Throws a line for the log.
    init(path: String, handler: @escaping @Sendable (String) -> String) throws {
        self.path = path
        self.owner = getuid()
        self.handler = handler
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw ControlSocketError("cannot create \(directory): \(String(cString: strerror(errno)))")
        }
        var st = stat()
        guard lstat(directory, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR, st.st_uid == getuid(),
            st.st_mode & 0o077 == 0
        else {
            throw ControlSocketError("\(directory) must be a directory of uid \(getuid()) with mode 0700")
        }
        guard var address = ControlSocket.address(path) else {
            throw ControlSocketError("socket path too long: \(path)")
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ControlSocketError("socket: \(String(cString: strerror(errno)))") }
        unlink(path)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0, chmod(path, 0o600) == 0, listen(fd, 8) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw ControlSocketError("cannot serve \(path): \(reason)")
        }
        self.fd = fd
    }

    func start() {
        Thread.detached { [self] in
            while true {
                let client = accept(fd, nil, nil)
                if client < 0 {
                    if errno == EINTR || errno == ECONNABORTED { continue }
                    break
                }
                _ = fcntl(client, F_SETFD, FD_CLOEXEC)
                // A drain may take minutes: each connection has its own thread.
                Thread.detached { [self] in
                    serve(client)
                    close(client)
                }
            }
            done.signal()
        }
    }

    /// Stops serving and removes the socket.
    func stop() {
        unlink(path)
        shutdown(fd, Int32(SHUT_RDWR))
        done.wait()
        close(fd)
    }

    private func serve(_ client: Int32) {
        // struct ucred (glibc shows it only with _GNU_SOURCE).
        struct PeerCredentials {
            var pid: pid_t = 0
            var uid: uid_t = 0
            var gid: gid_t = 0
        }
        var credentials = PeerCredentials()
        var length = socklen_t(MemoryLayout<PeerCredentials>.size)
        guard getsockopt(client, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0,
            credentials.uid == owner || credentials.uid == 0
        else { return }
        // A client that sends nothing must not hold the server: two seconds for its line.
        var timeout = timeval(tv_sec: 2, tv_usec: 0)
        setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while line.count < 256, read(client, &byte, 1) == 1, byte != 10 { line.append(byte) }
        let answer = Array(handler(String(decoding: line, as: UTF8.self)).utf8)
        var offset = 0
        while offset < answer.count {
            let n = answer.withUnsafeBytes { write(client, $0.baseAddress! + offset, $0.count - offset) }
            if n <= 0 { return }
            offset += n
        }
    }
}

struct ControlSocketError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The client side: asks the daemon of the mount at `mountpoint`.
enum ControlClient {
    /// The answer to `command`, or a line that says what is wrong.
    static func ask(_ command: String, mountpoint given: String, callerCacheDirectory: String?) -> Result<String, ControlSocketError> {
        guard let mount = mount(given) else {
            return .failure(ControlSocketError("\(given) is not a csspfs mount (see /proc/mounts)"))
        }
        let paths = ControlSocket.candidates(
            mountpoint: mount.path, owner: mount.owner, callerCacheDirectory: callerCacheDirectory)
        var problem = "no control socket found (looked for \(paths.joined(separator: ", "))): the mount's daemon is older than --stats, or gone"
        for path in paths {
            guard access(path, F_OK) == 0 else { continue }
            switch request(command, path: path) {
            case .success(let text): return .success(text)
            case .failure(let error): problem = error.description
            }
        }
        return .failure(ControlSocketError(problem))
    }

    /// The csspfs mount at `given` in /proc/mounts: the path as given (made absolute), else
    /// resolved (a hung mount is not looked at unless needed).
    static func mount(_ given: String) -> (path: String, owner: uid_t)? {
        let mounts = MountTable.csspfsMounts()
        let lexical = MountTable.absolute(given)
        return mounts.last(where: { $0.path == lexical })
            ?? MountTable.canonical(given, resolvingLast: true).flatMap { real in mounts.last { $0.path == real } }
    }

    static func request(_ command: String, path: String) -> Result<String, ControlSocketError> {
        guard var address = ControlSocket.address(path) else { return .failure(ControlSocketError("path too long: \(path)")) }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failure(ControlSocketError("socket: \(String(cString: strerror(errno)))")) }
        defer { close(fd) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            let reason = String(cString: strerror(errno))
            return .failure(
                ControlSocketError(
                    errno == EACCES
                        ? "\(path): \(reason): ask as the mount's owner or root"
                        : "\(path): \(reason): is the mount's daemon running?"))
        }
        let line = Array((command + "\n").utf8)
        guard line.withUnsafeBytes({ write(fd, $0.baseAddress!, $0.count) }) == line.count else {
            return .failure(ControlSocketError("\(path): \(String(cString: strerror(errno)))"))
        }
        var answer: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            answer += buffer[0..<n]
        }
        if answer.isEmpty {
            return .failure(ControlSocketError("\(path): the daemon closed the connection without an answer (not its owner?)"))
        }
        return .success(String(decoding: answer, as: UTF8.self))
    }
}

/// The kernel's table of mounts, and paths as it writes them.
enum MountTable {
    /// The csspfs mounts in /proc/mounts, in order (a later one on the same path hides an
    /// earlier one), with the uid that mounted each.
    static func csspfsMounts() -> [(path: String, owner: uid_t)] {
        guard let file = fopen("/proc/mounts", "r") else { return [] }
        defer { fclose(file) }
        var mounts: [(path: String, owner: uid_t)] = []
        var line = [CChar](repeating: 0, count: 8192)
        while fgets(&line, Int32(line.count), file) != nil {
            let fields = text(line).split(separator: " ")
            guard fields.count >= 4, fields[2] == "fuse.cssp" else { continue }
            var owner: uid_t = 0
            for option in fields[3].split(separator: ",") where option.hasPrefix("user_id=") {
                owner = uid_t(option.dropFirst(8)) ?? 0
            }
            mounts.append((unescape(String(fields[1])), owner))
        }
        return mounts
    }

    /// The NUL-terminated text in `chars`.
    private static func text(_ chars: [CChar]) -> String {
        chars.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }

    /// `path` as /proc/mounts shows it: resolved with realpath, or (`resolvingLast` false, for a
    /// dead mount that cannot be looked at) its parent resolved and its own name appended.
    static func canonical(_ path: String, resolvingLast: Bool) -> String? {
        var resolved = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        if resolvingLast {
            guard realpath(path, &resolved) != nil else { return nil }
            return text(resolved)
        }
        var trimmed = Substring(path)
        while trimmed.count > 1 && trimmed.hasSuffix("/") { trimmed = trimmed.dropLast() }
        guard let slash = trimmed.lastIndex(of: "/") else { return nil }
        let parent = slash == trimmed.startIndex ? "/" : String(trimmed[..<slash])
        guard realpath(parent, &resolved) != nil else { return nil }
        let base = text(resolved)
        return (base == "/" ? "" : base) + "/" + trimmed[trimmed.index(after: slash)...]
    }

    /// `path` made absolute against the current directory, `.` and `..` removed lexically.
    static func absolute(_ path: String) -> String {
        let full = path.hasPrefix("/") ? path : Arguments.currentDirectory() + "/" + path
        var parts: [Substring] = []
        for part in full.split(separator: "/") {
            switch part {
            case ".": continue
            case "..": if !parts.isEmpty { parts.removeLast() }
            default: parts.append(part)
            }
        }
        return "/" + parts.joined(separator: "/")
    }

    /// /proc/mounts writes space, tab, newline and backslash as octal escapes (`\040`).
    static func unescape(_ field: String) -> String {
        var bytes: [UInt8] = []
        let source = Array(field.utf8)
        var index = 0
        while index < source.count {
            if source[index] == UInt8(ascii: "\\"), index + 3 < source.count,
                let value = UInt8(String(decoding: source[(index + 1)...(index + 3)], as: UTF8.self), radix: 8)
            {
                bytes.append(value)
                index += 4
            } else {
                bytes.append(source[index])
                index += 1
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
