import Locking
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The spool directory: one local file per file open for writing, uploaded at close/fsync.
///
/// Subtleties:
/// 1. The bytes of a file whose upload failed stay here (with a `.pending` note naming the key,
///    content type and metadata: mode, owner, mtime) until they are stored; a later mount of the
///    same container retries them first, with the same attributes.
/// 2. A full disk is ENOSPC from `write`, not a lost close: every write goes to the spool first.
/// 3. Spool files of an earlier process without a `.pending` note were never acknowledged to a
///    writer (no successful close), so they are removed at start.
final class Spool: Sendable {
    let directory: String
    /// The descriptor holding the directory's lock (-1 once released).
    private let lockDescriptor: Atomic<Int32>

    /// Takes `directory` for this process (an exclusive lock on its `.lock`, held until exit). When
    /// another live mount of the same URL holds it, a private `directory.PID` is used instead, so
    /// neither mount ever touches the other's spool files.
    init(directory requested: String) throws(FSError) {
        var directory = requested
        guard Spool.makeDirectories(directory) else { throw Spool.unusable(directory) }
        var fd = Spool.lock(directory)
        if fd < 0 {
            directory = requested + "." + String(getpid())
            guard Spool.makeDirectories(directory) else { throw Spool.unusable(directory) }
            fd = Spool.lock(directory)
            guard fd >= 0 else { throw Spool.unusable(directory) }
        }
        self.directory = directory
        lockDescriptor = Atomic(fd)
    }

    /// Gives the directory up (at unmount), so that a later `Filesystem` in this process can take it.
    func unlock() {
        let fd = lockDescriptor.exchange(-1, ordering: .relaxed)
        if fd >= 0 { close(fd) }
    }

    private static func unusable(_ directory: String) -> FSError {
        FSError(
            .ioError,
            "cannot use the spool directory \(directory): \(String(cString: strerror(errno))); "
                + "choose another with -o cache_dir=")
    }

    /// Locks `directory/.lock` until `unlock` (or the end of the process); returns the descriptor, or -1.
    private static func lock(_ directory: String) -> Int32 {
        let fd = open(directory + "/.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return -1 }
        if flock(fd, LOCK_EX | LOCK_NB) == 0 { return fd }
        close(fd)
        return -1
    }

    private static func makeDirectories(_ path: String) -> Bool {
        var current = ""
        for component in path.split(separator: "/") {
            current += "/" + component
            if mkdir(current, 0o700) != 0 && errno != EEXIST { return false }
        }
        return access(path, W_OK) == 0
    }

    /// Creates a new empty spool file, opened read-write.
    func create() throws(FSError) -> (path: String, fd: Int32) {
        let path = directory + "/" + String(UInt64.random(in: 0...UInt64.max), radix: 16) + ".data"
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Spool.error("create spool file \(path)") }
        return (path, fd)
    }

    static func error(_ what: String) -> FSError {
        let code = errno
        return FSError(code == ENOSPC || code == EDQUOT ? .noSpace : .ioError, "\(what): \(String(cString: strerror(code)))")
    }

    /// What a `.pending` note records: where the bytes go and how they are stored.
    struct PendingUpload: Equatable {
        var key: String
        var contentType: String
        var metadata: [String: String]

        /// Fields separated by NUL, which neither keys nor headers contain: the key, the content
        /// type, then `name=value` per metadata header. A note holding only a key (as written
        /// before attributes were kept) is read with the default content type.
        var encoded: [UInt8] {
            let fields = [key, contentType] + metadata.sorted { $0.key < $1.key }.map { $0.key + "=" + $0.value }
            return Array(fields.joined(separator: "\0").utf8)
        }

        init(key: String, contentType: String, metadata: [String: String]) {
            self.key = key
            self.contentType = contentType
            self.metadata = metadata
        }

        init?(decoding text: String) {
            let fields = text.split(separator: "\0", omittingEmptySubsequences: false).map(String.init)
            guard let key = fields.first, !key.isEmpty else { return nil }
            self.key = key
            contentType = fields.count > 1 && !fields[1].isEmpty ? fields[1] : "application/octet-stream"
            metadata = [:]
            for field in fields.dropFirst(2) {
                guard let equals = field.firstIndex(of: "=") else { continue }
                metadata[String(field[..<equals])] = String(field[field.index(after: equals)...])
            }
        }
    }

    /// Files of earlier processes: pending uploads and abandoned data files.
    func leftovers() -> (pending: [(data: String, upload: PendingUpload)], abandoned: [String]) {
        guard let dir = opendir(directory) else { return ([], []) }
        defer { closedir(dir) }
        var data: Set<String> = []
        var notes: [String: String] = [:]
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
            if name.hasSuffix(".data") { data.insert(name) }
            if name.hasSuffix(".pending.new") { unlink(directory + "/" + name) }  // a note never finished
            if name.hasSuffix(".pending") {
                let base = String(name.dropLast(".pending".count))
                notes[base + ".data"] = Spool.read(directory + "/" + name)
            }
        }
        var pending: [(String, PendingUpload)] = []
        var abandoned: [String] = []
        for name in data.sorted() {
            if let note = notes[name], let upload = PendingUpload(decoding: note) {
                pending.append((directory + "/" + name, upload))
            } else {
                abandoned.append(directory + "/" + name)
            }
        }
        return (pending, abandoned)
    }

    static func read(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 8192)
        while true {
            let n = Glibc.read(fd, &buffer, buffer.count)
            guard n > 0 else { break }
            bytes += buffer[0..<n]
        }
        return bytes.isEmpty ? nil : String(decoding: bytes, as: UTF8.self)
    }

    /// Writes the note that marks `dataPath` as an upload still owed (a new file, renamed over
    /// the old note, so that a crash leaves one whole note or the other).
    static func writePendingNote(dataPath: String, upload: PendingUpload) {
        let note = String(dataPath.dropLast(".data".count)) + ".pending"
        let fd = open(note + ".new", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        let bytes = upload.encoded
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd) == 0
        close(fd)
        if written == bytes.count && synced { rename(note + ".new", note) } else { unlink(note + ".new") }
    }

    /// Removes the note only: the spool's bytes are owed to nobody any more (unlinked, replaced).
    static func removeNote(dataPath: String) {
        unlink(String(dataPath.dropLast(".data".count)) + ".pending")
    }

    static func remove(dataPath: String) {
        unlink(dataPath)
        unlink(String(dataPath.dropLast(".data".count)) + ".pending")
    }
}

/// A lock whose only job is to serialise a sequence of operations (held across network I/O on
/// purpose; it guards no data, so it cannot be the kind of lock STYLE forbids holding there).
final class SerialLock: Sendable {
    private let mutex = Locked<Void>(())

    func withLock<T, E: Error>(_ body: (inout Void) throws(E) -> T) throws(E) -> T {
        try mutex.withLock { (value: inout Void) throws(E) -> T in try body(&value) }
    }
}
