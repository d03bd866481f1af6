import FSCore
import Locking
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The spool directory: one local file per file open for writing, uploaded at close/fsync.
///
/// Subtleties:
/// 1. The bytes of a file whose upload failed (or is queued by write-back) stay here, with a
///    note in the upload journal (`UploadJournal`, `uploads.journal`) naming the key, content
///    type, metadata (mode, owner, mtime) and the ETag the bytes replace; a later mount of the
///    same container stores them, with the same attributes, or as a conflict copy when another
///    client changed the object meanwhile. (Earlier versions wrote a `.pending` note beside each
///    data file; such notes are still read.)
/// 2. A full disk is ENOSPC from `write`, not a lost close: every write goes to the spool first.
/// 3. Spool files of an earlier process without a note were never acknowledged as stored; they
///    are not uploaded, but kept in `lost+found/` (a note may have failed to be written on a
///    full disk) and logged. What is found is found when the directory is taken, before this
///    process makes files of its own there.
/// 4. Attribute changes of closed files not stored yet (see `Filesystem+Attributes`) have a
///    `PROCESS-INODE.attributes` note each, in the same encoding; a later mount stores them (a POST) if
///    the object is still the version they were made on.
/// 5. A second live mount of the same URL uses `directory.PID`. A later mount adopts such
///    directories once their process is gone (their lock is free) and recovers them too.
package final class Spool: Sendable {
    package let directory: String
    /// The descriptors holding the locks of `directory` and of adopted directories (empty once
    /// released).
    private let lockDescriptors: Locked<[Int32]>
    /// What earlier processes left in `directory` and the adopted directories (data path, note),
    /// less the spools a successor keeps (`keeping`).
    package let leftovers: [(data: String, upload: PendingUpload?)]
    /// Of the spools kept (`keeping`), those with a note: an upload of them is owed.
    package let keptOwed: Set<String>
    /// The attribute notes earlier processes left (note path, what it says).
    package let attributeLeftovers: [(note: String, change: PendingUpload)]
    /// Directories of earlier processes this one adopted (their lock was free).
    package let adopted: [String]
    /// The notes of this directory's data files (subtlety 1).
    package let uploads: UploadJournal

    /// The delete journal of a spool directory (`DeleteJournal`).
    package static func deleteJournalPath(in directory: String) -> String { directory + "/deletes.journal" }

    /// Takes `directory` for this process (an exclusive lock on its `.lock`, held until `unlock`).
    /// When another live mount of the same URL holds it, a private `directory.PID` is used instead,
    /// so neither mount ever touches the other's spool files.
    /// `journalFile`: a journal's file at a path (tests pass a double that loses unsynced writes).
    /// `keeping`: data files a dead worker's handles are still attached to, which the worker
    /// that replaces it takes over (issue 40): not leftovers.
    package init(
        directory requested: String, journalFile: (String) -> any JournalFile = { DiskJournalFile(path: $0) },
        keeping: Set<String> = []
    ) throws(FSError) {
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
        var locks = [fd]
        uploads = UploadJournal(directory: directory, file: journalFile(directory + "/" + UploadJournal.fileName)) { name in
            access(directory + "/" + name, F_OK) == 0
        }
        var (found, attributes) = Spool.scan(directory, journal: uploads.leftovers)
        var adopted: [String] = []
        for sibling in Spool.siblings(of: requested) where sibling != directory {
            let siblingLock = Spool.lock(sibling)
            guard siblingLock >= 0 else { continue }  // its mount is alive
            locks.append(siblingLock)
            adopted.append(sibling)
            let journal = UploadJournal.parse(journalFile(sibling + "/" + UploadJournal.fileName).contents())
            let (data, notes) = Spool.scan(sibling, journal: UploadJournal.decoded(journal))
            found += data
            attributes += notes
        }
        leftovers = found.filter { !keeping.contains($0.data) }
        keptOwed = Set(found.filter { keeping.contains($0.data) && $0.upload != nil }.map(\.data))
        attributeLeftovers = attributes
        self.adopted = adopted
        lockDescriptors = Locked(locks)
    }

    /// Gives the directories up (at unmount), so that a later `Filesystem` can take them.
    package func unlock() {
        for fd in lockDescriptors.withLock({ fds in defer { fds = [] }; return fds }) { close(fd) }
    }

    /// `requested.PID` directories beside `requested`.
    private static func siblings(of requested: String) -> [String] {
        let parent = requested.lastIndex(of: "/").map { String(requested[..<$0]) } ?? "."
        let base = requested.split(separator: "/").last.map(String.init) ?? requested
        return entries(of: parent).filter { name in
            name.hasPrefix(base + ".") && name.dropFirst(base.count + 1).allSatisfy(\.isNumber)
        }.map { parent + "/" + $0 }
    }

    private static func entries(of directory: String) -> [String] {
        guard let dir = opendir(directory) else { return [] }
        defer { closedir(dir) }
        var names: [String] = []
        // The name is read in place: a record is only `d_reclen` bytes long, and copying the whole
        // `dirent` (`entry.pointee`) read past the end of glibc's buffer (a crash in a /tmp of a
        // thousand names).
        let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
        while let entry = readdir(dir) {
            let name = (UnsafeRawPointer(entry) + nameOffset).assumingMemoryBound(to: CChar.self)
            names.append(String(cString: name))
        }
        return names
    }

    /// Data files in `directory` with their notes (nil: no note), oldest first: those with a
    /// `.pending` note of an earlier version (by its time), then those the journal names (in its
    /// order), then those without a note; and the attribute notes.
    private static func scan(_ directory: String, journal: [(name: String, note: PendingUpload)])
        -> (data: [(data: String, upload: PendingUpload?)], attributes: [(note: String, change: PendingUpload)])
    {
        var data: [String] = []
        var notes: [String: String] = [:]
        var attributes: [(note: String, change: PendingUpload)] = []
        for name in entries(of: directory) {
            let path = directory + "/" + name
            if name.hasSuffix(".data") { data.append(name) }
            if name.contains(".pending.new") || name.contains(attributeNoteSuffix + ".new") {
                unlink(path)  // a note never finished
            }
            if name.hasSuffix(".pending") {
                notes[String(name.dropLast(".pending".count)) + ".data"] = Spool.read(path)
            }
            if name.hasSuffix(attributeNoteSuffix) {
                if let change = Spool.read(path).flatMap(PendingUpload.init(decoding:)) {
                    attributes.append((path, change))
                } else {
                    unlink(path)
                }
            }
        }
        // Earlier versions' notes, oldest first by the time they were last written.
        func age(_ name: String) -> (Int, Int, String) {
            var st = stat()
            let note = directory + "/" + String(name.dropLast(".data".count)) + ".pending"
            guard stat(note, &st) == 0 else { return (0, 0, name) }
            return (st.st_mtim.tv_sec, st.st_mtim.tv_nsec, name)
        }
        let present = Set(data)
        let journaled = journal.filter { present.contains($0.name) }
        let inJournal = Set(journaled.map(\.name))
        let legacy = data.filter { !inJournal.contains($0) }.compactMap { name in
            notes[name].flatMap(PendingUpload.init(decoding:)).map { (name: name, note: $0, age: age(name)) }
        }.sorted { $0.age < $1.age }
        let noted = inJournal.union(legacy.map(\.name))
        let uploads: [(data: String, upload: PendingUpload?)] =
            legacy.map { (directory + "/" + $0.name, $0.note) } + journaled.map { (directory + "/" + $0.name, $0.note) }
            + data.filter { !noted.contains($0) }.sorted().map { (directory + "/" + $0, nil) }
        return (uploads, attributes)
    }

    package static let attributeNoteSuffix = ".attributes"

    /// Names this process's attribute notes apart from those an earlier process left here
    /// (inode numbers repeat across processes; a leftover is recovered while this one runs).
    private let attributeNotePrefix = String(UInt64.random(in: 0...UInt64.max), radix: 16) + "-"

    /// Where the attribute note of `inode` is.
    package func attributeNotePath(_ inode: InodeNumber) -> String {
        directory + "/" + attributeNotePrefix + String(inode) + Self.attributeNoteSuffix
    }

    /// Moves a data file no note describes to `lost+found/` beside it; returns the new path.
    package static func keepLost(dataPath: String) -> String? {
        let parent = dataPath.lastIndex(of: "/").map { String(dataPath[..<$0]) } ?? "."
        let name = dataPath.split(separator: "/").last.map(String.init) ?? dataPath
        let lost = parent + "/lost+found"
        guard makeDirectories(lost) else { return nil }
        let destination = lost + "/" + name
        return rename(dataPath, destination) == 0 ? destination : nil
    }

    private static func unusable(_ directory: String) -> FSError {
        FSError(
            .ioError,
            "cannot use the spool directory \(directory): \(String(cString: strerror(errno))); "
                + "choose another with -o cache_dir=")
    }

    /// Locks `directory/.lock` until `unlock` (or the end of the process); returns the descriptor, or -1.
    private static func lock(_ directory: String) -> Int32 {
        let fd = open(directory + "/.lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
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

    /// Makes everything written in the spool directory durable (its filesystem synced: notes
    /// written without a sync, and the renames that put them in place).
    package func sync() -> Bool {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return glibcSyncfs(fd) == 0
    }

    /// Creates a new empty spool file, opened read-write.
    package func create() throws(FSError) -> (path: String, fd: Int32) {
        let path = directory + "/" + String(UInt64.random(in: 0...UInt64.max), radix: 16) + ".data"
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Spool.error("create spool file \(path)") }
        uploads.dataFileMade()
        return (path, fd)
    }

    package static func error(_ what: String) -> FSError {
        let code = errno
        return FSError(code == ENOSPC || code == EDQUOT ? .noSpace : .ioError, "\(what): \(String(cString: strerror(code)))")
    }

    /// What a `.pending` note records: where the bytes go and how they are stored.
    package struct PendingUpload: Equatable {
        package var key: String
        package var contentType: String
        package var metadata: [String: String]
        /// The ETag of the object the spool's bytes replace ("" for a new name); nil in notes
        /// written before it was kept. An object found with another ETag (or gone) was changed
        /// by another client meanwhile: the bytes then go to a conflict copy.
        package var base: String?

        /// Fields separated by NUL, which neither keys nor headers contain: the key, the content
        /// type, then `name=value` per metadata header, and `@base=ETAG` (`@` is no header
        /// character). A note holding only a key (as written before attributes were kept) is read
        /// with the default content type.
        package var encoded: [UInt8] {
            var fields = [key, contentType] + metadata.sorted { $0.key < $1.key }.map { $0.key + "=" + $0.value }
            if let base { fields.append("@base=" + base) }
            return Array(fields.joined(separator: "\0").utf8)
        }

        /// Byte for byte (`encoded`): Swift's `String ==` calls two Unicode normalisations of a
        /// key equal, and a note must be rewritten when a rename changes one into the other.
        package static func == (a: PendingUpload, b: PendingUpload) -> Bool { a.encoded == b.encoded }

        package init(key: String, contentType: String, metadata: [String: String], base: String?) {
            self.key = key
            self.contentType = contentType
            self.metadata = metadata
            self.base = base
        }

        package init?(decoding text: String) {
            let fields = text.split(separator: "\0", omittingEmptySubsequences: false).map(String.init)
            guard let key = fields.first, !key.isEmpty else { return nil }
            self.key = key
            contentType = fields.count > 1 && !fields[1].isEmpty ? fields[1] : "application/octet-stream"
            metadata = [:]
            for field in fields.dropFirst(2) {
                guard let equals = field.firstIndex(of: "=") else { continue }
                let name = String(field[..<equals])
                let value = String(field[field.index(after: equals)...])
                if name == "@base" { base = value } else { metadata[name] = value }
            }
        }
    }

    package static func read(_ path: String) -> String? {
        readBytes(path).flatMap { $0.isEmpty ? nil : String(decoding: $0, as: UTF8.self) }
    }

    /// The bytes of the file at `path`; nil when it cannot be opened.
    package static func readBytes(_ path: String) -> [UInt8]? {
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
        return bytes
    }

    /// Journals `upload` as what the data file `dataPath` (one of this directory's) is owed;
    /// `sync`: durable before this returns (one sync for every close that arrived meanwhile),
    /// else it survives the process, and a power cut once the next synced note is. Returns
    /// whether the note is written.
    @discardableResult
    package func writePendingNote(dataPath: String, upload: PendingUpload, sync: Bool = true) -> Bool {
        uploads.write(Self.name(of: dataPath), note: upload, sync: sync)
    }

    /// The data file's name in its directory.
    private static func name(of path: String) -> String {
        path.split(separator: "/").last.map(String.init) ?? path
    }

    /// Writes a note: a new file, renamed over the old one, so that a crash leaves one whole note
    /// or the other. `sync`: on the disk before this returns (else it survives the process, not a
    /// power cut). Returns whether the note is written.
    @discardableResult
    package static func writeNote(_ note: String, _ upload: PendingUpload, sync: Bool) -> Bool {
        // A fresh file, never one a link points at, and one per writer: two threads may journal
        // one spool at once (a write-back close and a failed upload of the queue); each renames
        // a whole note over the old one. (Leftovers of a crash are swept at the next mount.)
        let temporary = note + ".new." + String(UInt64.random(in: 0...UInt64.max), radix: 36)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return false }
        let bytes = upload.encoded
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        // The note's time orders the recovery (oldest first): the clock to the nanosecond, as
        // the kernel's own stamp is coarse (notes written within a few ms would tie).
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        _ = futimens(fd, [now, now])
        let synced = !sync || fsync(fd) == 0
        close(fd)
        guard written == bytes.count && synced && rename(temporary, note) == 0 else {
            unlink(temporary)
            return false
        }
        // The rename (and the data file's own name, made when the spool was) are entries of the
        // directory: durable once it is synced, not with the note's bytes. Without this, a power
        // cut could leave only `.new` (swept as unfinished) beside bytes a close acknowledged.
        return !sync || DiskJournalFile.syncDirectory(of: note)
    }

    /// Removes the note only: the spool's bytes are owed to nobody any more (unlinked, replaced).
    package func removeNote(dataPath: String) {
        uploads.remove(Self.name(of: dataPath))
        unlink(String(dataPath.dropLast(".data".count)) + ".pending")
    }

    /// Removes a data file (its journal note counts for nothing then) and an earlier version's
    /// note beside it.
    package static func remove(dataPath: String) {
        unlink(dataPath)
        unlink(String(dataPath.dropLast(".data".count)) + ".pending")
    }
}

/// glibc's syncfs(2), which its Swift module leaves out (it is declared under _GNU_SOURCE).
@_silgen_name("syncfs")
private func glibcSyncfs(_ fd: Int32) -> Int32
