import BlockCache
import Foundation
import Locking
import Logging
import ObjectStore
import ObjectStoreTesting
import Synchronization

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// Byte order, as listings sort.
func byteOrder(_ a: String, _ b: String) -> Bool { a.utf8.lexicographicallyPrecedes(b.utf8) }

extension String {
    func startsWithBytes(_ prefix: String) -> Bool { utf8.starts(with: prefix.utf8) }
}

/// A dictionary keyed by strings compared as bytes (see `ExactString`): the model's names are
/// keys, and two spellings of "é" are two of them.
struct ExactDictionary<Value>: Sequence {
    private var storage: [ExactString: Value] = [:]

    init() {}
    init(_ elements: [String: Value]) { for (key, value) in elements { storage[key.exact] = value } }

    subscript(key: String) -> Value? {
        get { storage[key.exact] }
        set { storage[key.exact] = newValue }
    }

    var keys: [String] { storage.keys.map(\.string) }
    var values: Dictionary<ExactString, Value>.Values { storage.values }

    mutating func removeValue(forKey key: String) -> Value? { storage.removeValue(forKey: key.exact) }

    func makeIterator() -> AnyIterator<(key: String, value: Value)> {
        var inner = storage.makeIterator()
        return AnyIterator { inner.next().map { (key: $0.key.string, value: $0.value) } }
    }
}

/// A clock the test moves: cache ages (`dir_timeout`, `attr_timeout`) pass without waiting.
final class ManualClock: Sendable {
    private let seconds = Locked<Double>(1_000)
    var now: Double { seconds.withLock { $0 } }
    func advance(_ by: Double) { seconds.withLock { $0 += by } }
}

/// One object of the reference: what POSIX says a name holds. A class, because its identity is
/// the inode: a handle keeps writing to it after a rename or an unlink.
final class ModelObject {
    let kind: NodeKind
    var bytes: [UInt8] = []
    var mode: UInt16
    var uid: UInt32
    var gid: UInt32
    /// nil: set by the filesystem to "now" (a write), so not compared.
    var mtime: Timestamp?
    /// Another tool wrote it without a time the mount reads (issue 38): the first stat's mtime
    /// is what every later stat must show until something writes it.
    var mtimeFromFirstStat = false
    var target = ""

    init(kind: NodeKind, mode: UInt16, uid: UInt32, gid: UInt32) {
        self.kind = kind
        self.mode = mode
        self.uid = uid
        self.gid = gid
    }

    /// Another object with the same content and attributes (what an operation would make of it).
    convenience init(copying other: ModelObject) {
        self.init(kind: other.kind, mode: other.mode, uid: other.uid, gid: other.gid)
        bytes = other.bytes
        mtime = other.mtime
        target = other.target
    }
}

/// The reference tree: path (no leading slash; "" is the root, never stored) to object.
struct ReferenceTree {
    var objects = ExactDictionary<ModelObject>()

    static func parent(_ path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "" }
        return String(path[..<slash])
    }

    static func name(_ path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return path }
        return String(path[path.index(after: slash)...])
    }

    static func join(_ directory: String, _ name: String) -> String { directory.isEmpty ? name : directory + "/" + name }

    func isDirectory(_ path: String) -> Bool { path.isEmpty || objects[path]?.kind == .directory }

    func children(of directory: String) -> [String] {
        objects.keys.filter { Self.parent($0).isSameKey(as: directory) && !$0.isEmpty }.map(Self.name).sorted(by: byteOrder)
    }

    var directories: [String] { [""] + objects.filter { $0.value.kind == .directory }.map(\.key).sorted(by: byteOrder) }

    /// Moves `from` and everything below it to `to` (which is free, or was removed by the caller).
    mutating func move(_ from: String, to: String) {
        for path in objects.keys.sorted(by: byteOrder) where path.isSameKey(as: from) || path.startsWithBytes(from + "/") {
            objects[to + path.dropFirst(from.count)] = objects.removeValue(forKey: path)
        }
    }
}

/// What the kernel does around the filesystem: resolves paths with lookups, keeps a dentry cache
/// and lookup counts, and forgets. Operations go through it as a program's system calls would.
final class KernelSimulator {
    var fs: Filesystem
    /// path -> inode of names the kernel has looked up (and not expired).
    var dentries = ExactDictionary<InodeNumber>(["": Filesystem.rootInode])
    /// Lookups the kernel holds per inode (to be forgotten).
    var lookups: [InodeNumber: UInt64] = [:]

    /// Names the filesystem asked the kernel to forget (`meta_max_entries`), not carried out yet.
    let askedToForget = Locked<[(parent: InodeNumber, name: String)]>([])

    init(_ fs: Filesystem) {
        self.fs = fs
        fs.kernelCache.install(forgetEntry: { [askedToForget] parent, name in askedToForget.withLock { $0.append((parent, name)) } })
    }

    /// Carries out what the filesystem asked to forget so far, as the kernel does between two
    /// system calls: the entry goes, and the inode is forgotten unless it is open (`keeping`).
    /// Returns how many were forgotten.
    func forgetAsked(keeping: Set<InodeNumber>) -> Int {
        let asked: [(parent: InodeNumber, name: String)] = askedToForget.withLock { a in
            defer { a = [] }
            return a
        }
        var forgotten = 0
        for (parent, name) in asked {
            guard let inode = fs.names.withLock({ $0.inodes.child(parent, name)?.inode }), let count = lookups[inode] else { continue }
            for path in dentries.keys where dentries[path] == inode { dentries[path] = nil }
            guard !keeping.contains(inode) else { continue }
            fs.forget(inode, count: count)
            lookups[inode] = nil
            forgotten += 1
        }
        return forgotten
    }

    func counted(_ path: String, _ inode: InodeNumber) {
        dentries[path] = inode
        lookups[inode, default: 0] += 1
    }

    func resolve(_ path: String) throws(FSError) -> InodeNumber {
        if let known = dentries[path] { return known }
        let parent = try resolve(ReferenceTree.parent(path))
        let attributes = try fs.lookup(parent: parent, name: ReferenceTree.name(path))
        counted(path, attributes.inode)
        return attributes.inode
    }

    func parentOf(_ path: String) throws(FSError) -> InodeNumber {
        let inode = try resolve(ReferenceTree.parent(path))
        guard try fs.getattr(inode).kind == .directory else { throw FSError(.notADirectory, "parent is not a directory") }
        return inode
    }

    /// The kernel's lookup before mkdir/symlink/create: nil when the name is free.
    func existing(_ path: String) throws(FSError) -> InodeNumber? {
        do {
            return try resolve(path)
        } catch where error.code == .notFound {
            return nil
        }
    }

    func moved(_ from: String, to: String) {
        for path in dentries.keys where path.isSameKey(as: to) || path.startsWithBytes(to + "/") { dentries[path] = nil }
        for path in dentries.keys.sorted(by: byteOrder) where path.isSameKey(as: from) || path.startsWithBytes(from + "/") {
            dentries[to + path.dropFirst(from.count)] = dentries.removeValue(forKey: path)
        }
    }

    func dropped(_ path: String) {
        for p in dentries.keys where p.isSameKey(as: path) || p.startsWithBytes(path + "/") { dentries[p] = nil }
    }

    /// The dentry cache times out: every name is looked up again.
    func expire() { dentries = ExactDictionary(["": Filesystem.rootInode]) }

    /// Memory pressure: inodes without open files are forgotten.
    func evict(keeping: Set<InodeNumber>) {
        expire()
        for (inode, count) in lookups where !keeping.contains(inode) {
            fs.forget(inode, count: count)
            lookups[inode] = nil
        }
    }
}

/// A divergence between the filesystem and the reference.
struct ModelMismatch: Error, CustomStringConvertible {
    var description: String
}

/// Applies random operation sequences to a `Filesystem` over a store and to `ReferenceTree`,
/// comparing after every step. Everything random comes from one seed.
final class ReferenceModelRun {
    struct Handle {
        var number: UInt64
        var inode: InodeNumber
        var writable: Bool
        var object: ModelObject
    }

    let seed: UInt64
    var random: SeededGenerator
    /// Failed uploads are expected here (closes while the store refuses); their log lines are not.
    static let quietLogger: Logger = {
        var logger = Logger(label: "model")
        logger.logLevel = ProcessInfo.processInfo.environment["CSSP_MODEL_LOG"] != nil ? .info : .critical
        return logger
    }()
    let clock = ManualClock()
    let store = FakeObjectStore()
    /// What the filesystem talks to: the store, failing what a fault operation asks for.
    let faulty: FaultInjectingStore
    let spoolDirectory = TestScratch.directory + "cssp-model-spool-" + UUID().uuidString
    let caller = Caller(uid: 1000, gid: 100)
    var configuration = FilesystemConfiguration()
    var kernel: KernelSimulator
    var tree = ReferenceTree()
    var handles: [Handle] = []
    /// Objects whose last close failed: their bytes are owed (a retry or the next mount stores
    /// them). Another client does not touch them in this model (conflicts have their own tests).
    var owed: [ModelObject] = []
    /// Directories held open across operations (handle, inode, the directory's object; nil for
    /// the root): rewinddir on them must show the directory as it is now.
    var openDirectories: [(handle: UInt64, inode: InodeNumber, object: ModelObject?)] = []
    var trace: [String] = []
    var operations = 0
    /// The fault the next operation that changes names or attributes gets (see `operationUnderFault`).
    var pendingFault: (index: Int, fault: FaultInjectingStore.Fault)?
    /// The store calls the faulted thread made, for the trace (see `traceFaultedCalls`).
    let callsUnderFault = Locked<[String]>([])
    /// The operation running under a fault, once it chose its paths.
    var armed: ArmedFault?
    /// The armed operation failed with EIO after the fault was injected.
    var faultFailed = false
    /// While an operation runs under a fault its checks wait until the outcome is known.
    var deferredChecks: [() throws -> Void]?
    /// Names are drawn from a small pool, so that operations collide (rename over, create again);
    /// "é" precomposed and decomposed are two names, as they are two keys.
    let names = ["a", "b", "c", "d", "e f", "g", "caf\u{E9}", "cafe\u{301}"]

    init(seed: UInt64) throws {
        self.seed = seed
        faulty = FaultInjectingStore(store)
        if Self.liveTrace { faulty.afterEachAnswer { call in print("  STORE \(call)") } }
        random = SeededGenerator(seed: seed)
        configuration.spoolDirectory = spoolDirectory
        configuration.uid = 0
        configuration.gid = 0
        let clock = self.clock
        configuration.clock = { clock.now }
        configuration.readFetchSize = 64
        configuration.randomFetchSize = 64
        configuration.pendingRetrySeconds = 3600
        // Three seeds in four defer attribute changes of closed files (owed until a rename, an
        // upload, time passing or the next mount's recovery of the note); timers never fire
        // during a run: `expireCaches` stores what is owed. The rest store them at once.
        configuration.attributeWriteDelay = seed % 4 == 0 ? 0 : 3600
        // Half the runs store most files as multipart uploads (DLO manifests over parts).
        if Bool.random(using: &random) {
            configuration.multipartThreshold = 48
            configuration.partSize = 16
        }
        configuration.metadataPrefetchLimit = Bool.random(using: &random) ? 0 : 100
        // Other tools' objects (issue 38): one seed in six shows the listing's attributes; the
        // rest HEAD them, half of those keeping the answers in a metadata index across remounts.
        if seed % 6 == 5 {
            configuration.foreignAttributes = .listing
        } else if seed % 12 < 6 {
            configuration.metadataIndex = MetadataIndex.open(
                path: spoolDirectory + "-meta.db", identity: "model", logger: Self.quietLogger)
        }
        // One seed in seven lists as S3 does (issue 41): no content types, so that the kind, mode
        // and mtime of every file come from HEADs. (Not with `.listing`: over S3 every object
        // would look like another tool's.)
        if seed % 7 == 3 && configuration.foreignAttributes != .listing { store.listContentTypes(false) }
        // Two seeds in five write back (issue 20): closes journal and return; the queue never
        // runs (delay an hour: fsync, renames and the next mount's recovery store files) or
        // runs at once, beside the operations.
        if seed % 5 == 1 || seed % 5 == 3 {
            configuration.writeBack = true
            configuration.writeBackDelay = seed % 5 == 1 ? 3600 : 0
        }
        // Half the runs list ahead under small bounds (issue 21): a window of 2 listings, and a
        // whole subtree listed flat as soon as one subdirectory was read from a listing ahead
        // (in 1 to 3 lanes), so that walks, listings ahead and flat walk listings meet every
        // kind of change.
        if seed % 2 == 1 {
            configuration.listAheadWindow = 2
            configuration.walkListingAfter = 1
            configuration.walkListingMinimum = 1
            configuration.listPageSize = 3
            configuration.walkLanes = 1 + Int(seed / 2 % 3)
        }
        // A third of the runs keep no listing and trust no attribute (dir_timeout=0,
        // attr_timeout=0); the rest use the defaults, whose remembered answers the rule governs.
        if seed % 3 == 2 {
            configuration.directoryCacheSeconds = 0
            configuration.attributeCacheSeconds = 0
        }
        // Half the runs keep at most 6 names (issue 21): the kernel is asked to forget names,
        // and listings are dropped, every few operations.
        if seed % 4 >= 2 { configuration.maximumEntries = 6 }
        kernel = KernelSimulator(try Filesystem(store: faulty, configuration: configuration, logger: Self.quietLogger))
    }

    deinit {
        kernel.fs.shutdown()
        try? FileManager.default.removeItem(atPath: spoolDirectory)
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: spoolDirectory + "-meta.db" + suffix) }
    }

    // MARK: Random choices

    func chance(_ p: Double) -> Bool { Double.random(in: 0..<1, using: &random) < p }
    func pick<T>(_ items: [T]) -> T? { items.isEmpty ? nil : items[Int.random(in: 0..<items.count, using: &random)] }
    func bytes(_ count: Int) -> [UInt8] { (0..<count).map { _ in UInt8.random(in: 0...255, using: &random) } }

    /// A path in an existing directory, existing or not.
    func anyPath() -> String {
        let directory = pick(tree.directories.filter { $0.split(separator: "/").count < 3 }) ?? ""
        return ReferenceTree.join(directory, pick(names)!)
    }

    func existingPath(_ kinds: Set<NodeKind> = [.file, .directory, .symlink]) -> String? {
        pick(tree.objects.filter { kinds.contains($0.value.kind) }.map(\.key).sorted(by: byteOrder))
    }

    /// Mostly an existing path of these kinds, sometimes any path (to see the errors).
    func targetPath(_ kinds: Set<NodeKind>) -> String {
        if chance(0.85), let path = existingPath(kinds) { return path }
        return anyPath()
    }

    // MARK: Running

    /// `CSSP_MODEL_STORE_TRACE=1`: every operation and every store call answered (not GETs), as
    /// they happen, on standard output (the order a timing-dependent failure needs).
    static let liveTrace = ProcessInfo.processInfo.environment["CSSP_MODEL_STORE_TRACE"] != nil

    func step(_ description: String, _ body: () throws -> Void) throws {
        if Self.liveTrace { print("OP \(description)") }
        trace.append(description)
        operations += 1
        try body()
    }

    func fail(_ message: String) -> ModelMismatch {
        let shown = ProcessInfo.processInfo.environment["CSSP_MODEL_FULL_TRACE"] != nil ? trace[...] : trace.suffix(80)
        return ModelMismatch(
            description: "reference model diverged (seed \(seed), step \(trace.count)): \(message)\n"
                + "replay: CSSP_MODEL_SEED=\(seed) swift test --filter ReferenceModelTests\n"
                + "last \(shown.count) operations:\n  " + shown.joined(separator: "\n  "))
    }

    /// Runs `body` and checks that it fails with `expected` (or succeeds when nil).
    func expect<T>(_ expected: FSError.Code?, _ what: String, _ body: () throws(FSError) -> T) throws -> T? {
        do {
            let value = try body()
            if let expected { throw fail("\(what): succeeded, expected \(expected)") }
            return value
        } catch let error as FSError {
            if error.code == .ioError, let armed, faulty.injected.count > armed.injectedBefore {
                trace.append("  -> EIO (\(error.message))")
                faultFailed = true
                return nil
            }
            if error.code != expected { throw fail("\(what): \(error.code) (\(error.message)), expected \(expected.map { "\($0)" } ?? "success")") }
            return nil
        }
    }

    /// The error the reference predicts for resolving the parent of `path`.
    func parentError(_ path: String) -> FSError.Code? {
        var current = ReferenceTree.parent(path)
        var chain: [String] = []
        while !current.isEmpty {
            chain.append(current)
            current = ReferenceTree.parent(current)
        }
        for directory in chain.reversed() {
            guard let object = tree.objects[directory] else { return .notFound }
            if object.kind != .directory { return .notADirectory }
        }
        return nil
    }

    func run(operations count: Int) throws {
        while operations < count {
            try randomOperation()
            // The namespace room's record of the files being written is the files room's spools.
            let (spooled, spools) = kernel.fs.withTables { s, f in (Set(s.spools.keys), Set(f.openFiles.keys)) }
            if spooled != spools { throw fail("the namespace room records spools \(spooled.sorted()), the files room has \(spools.sorted())") }
            trace.append("    open handles: \(handles.map(\.number))")
            let forgotten = kernel.forgetAsked(keeping: Set(handles.map(\.inode) + openDirectories.map(\.inode)))
            if forgotten > 0 { trace.append("    the kernel forgot \(forgotten) names (meta_max_entries)") }
            clock.advance(Double.random(in: 0...0.4, using: &random))
        }
        try checkEverything()
        try remount()
        try checkEverything()
    }

    func randomOperation() throws {
        let roll = Int.random(in: 0..<110, using: &random)
        switch roll {
        case 0..<10: try openForWriting()
        case 10..<20: try writeThroughHandle()
        case 20..<25: try readThroughHandle()
        case 25..<33: try closeHandle()
        case 33..<35: try fsyncHandle()
        case 35..<39: try truncatePath()
        case 39..<43: try chmodPath()
        case 43..<46: try utimensPath()
        case 46..<56: try renamePath()
        case 56..<61: try unlinkPath()
        case 61..<64: try rmdirPath()
        case 64..<70: try mkdirPath()
        case 70..<71: try symlinkPath()
        case 71..<72: try mknodSpecial()
        case 72..<76: try listDirectory()
        case 76..<78: try rewindOpenDirectory()
        case 78..<84: try statPath()
        case 84..<87: try expireCaches()
        case 87..<89: try evictInodes()
        case 89..<91: try remount()
        case 91..<94: try outOfBandPut()
        case 94..<96: try outOfBandDelete()
        case 96..<98: try closeWhileUploadsFail()
        case 98..<102: try operationUnderFault()
        case 102..<104: try walkTree()
        case 104..<106: try storeOwedAttributesSoon()
        case 106..<110: try pollTick()
        default: try checkEverything()
        }
    }

    // MARK: Operations

    func openForWriting() throws {
        let path = targetPath([.file])
        let truncate = chance(0.4)
        let keepOpen = chance(0.5)
        // Every random choice is made before the filesystem answers, so a seed replays the same
        // operations whatever the background threads did.
        let mode: UInt16 = [0o644, 0o600, 0o640][Int.random(in: 0..<3, using: &random)]
        try step("open \(path) for writing\(truncate ? ", O_TRUNC" : "")\(keepOpen ? "" : ", write, close")") {
            var expected = parentError(path)
            if expected == nil, let object = tree.objects[path], object.kind != .file {
                expected = object.kind == .directory ? .isADirectory : .invalidArgument
            }
            let opened: (UInt64, InodeNumber)? = try expect(expected, "open \(path)") { () throws(FSError) in
                let parent = try kernel.parentOf(path)
                if let inode = try kernel.existing(path) {
                    if try kernel.fs.getattr(inode).kind == .directory { throw FSError(.isADirectory, "open of a directory") }
                    return (try kernel.fs.open(inode, writable: true, truncate: truncate).handle, inode)
                }
                let (attributes, opened) = try kernel.fs.create(parent: parent, name: ReferenceTree.name(path), mode: mode, caller: caller)
                kernel.counted(path, attributes.inode)
                let object = ModelObject(kind: .file, mode: mode, uid: caller.uid, gid: caller.gid)
                tree.objects[path] = object
                return (opened.handle, attributes.inode)
            }
            guard let (number, inode) = opened, let object = tree.objects[path] else { return }
            if truncate {
                object.bytes = []
                object.mtime = nil
            }
            handles.append(Handle(number: number, inode: inode, writable: true, object: object))
            if !keepOpen {
                try write(handleIndex: handles.count - 1)
                try close(handleIndex: handles.count - 1)
            }
        }
        try check(path)
    }

    func write(handleIndex: Int) throws {
        let handle = handles[handleIndex]
        let size = handle.object.bytes.count
        let offset = chance(0.3) ? size : Int.random(in: 0...(size + 8), using: &random)
        let data = bytes(Int.random(in: 1...(chance(0.2) ? 120 : 24), using: &random))
        trace.append("  write \(data.count) bytes at \(offset) through handle \(handle.number)")
        _ = try expect(nil, "write through handle \(handle.number)") { () throws(FSError) in
            let raw = UnsafeMutableRawBufferPointer.allocate(byteCount: data.count, alignment: 1)
            defer { raw.deallocate() }
            data.withUnsafeBytes { raw.copyMemory(from: $0) }
            try kernel.fs.write(handle: handle.number, offset: Int64(offset), bytes: UnsafeRawBufferPointer(raw))
        }
        if handle.object.bytes.count < offset + data.count {
            handle.object.bytes += [UInt8](repeating: 0, count: offset + data.count - handle.object.bytes.count)
        }
        handle.object.bytes.replaceSubrange(offset..<(offset + data.count), with: data)
        handle.object.mtime = nil
    }

    func close(handleIndex: Int) throws {
        let handle = handles.remove(at: handleIndex)
        trace.append("  close handle \(handle.number)")
        if handle.writable { _ = try expect(nil, "close (flush) of handle \(handle.number)") { () throws(FSError) in try kernel.fs.flush(handle: handle.number) } }
        kernel.fs.release(handle: handle.number)
        // Write-back: queued until the queue, an fsync or the next mount stores it; another
        // client leaves it alone, as it does an owed upload.
        if configuration.writeBack && handle.writable { owed.append(handle.object) }
    }

    func writeThroughHandle() throws {
        guard let index = pick(Array(handles.indices.filter { handles[$0].writable })) else { return try openForWriting() }
        try step("write through handle \(handles[index].number)") { try write(handleIndex: index) }
        try checkHandles()
    }

    func readThroughHandle() throws {
        if handles.isEmpty || chance(0.3) {
            // Another program opens a file for reading and keeps it open.
            guard let path = existingPath([.file]) else { return }
            try step("open \(path) read-only") {
                let object = tree.objects[path]!
                let opened = try expect(nil, "open \(path) read-only") { () throws(FSError) in
                    let inode = try kernel.resolve(path)
                    return (try kernel.fs.open(inode, writable: false, truncate: false).handle, inode)
                }
                if let (number, inode) = opened { handles.append(Handle(number: number, inode: inode, writable: false, object: object)) }
            }
        }
        try step("read through every handle") { try checkHandles() }
    }

    func closeHandle() throws {
        guard let index = pick(Array(handles.indices)) else { return try openForWriting() }
        try step("close handle \(handles[index].number)") { try close(handleIndex: index) }
        try checkPathsOfOpenObjects()
    }

    func fsyncHandle() throws {
        guard let handle = pick(handles.filter(\.writable)) else { return }
        try step("fsync handle \(handle.number)") {
            _ = try expect(nil, "fsync") { () throws(FSError) in try kernel.fs.flush(handle: handle.number) }
        }
        try checkPathsOfOpenObjects()
    }

    func truncatePath() throws {
        let path = targetPath([.file])
        let size = Int.random(in: 0...60, using: &random)
        try step("truncate \(path) to \(size)") {
            var expected = parentError(path) ?? (tree.objects[path] == nil ? .notFound : nil)
            if expected == nil, tree.objects[path]!.kind == .directory { expected = .isADirectory }
            if expected == nil, tree.objects[path]!.kind == .symlink { return }  // truncate follows symlinks
            if expected == nil, [.fifo, .socket].contains(tree.objects[path]!.kind) { expected = .invalidArgument }
            if expected == nil {
                arm([path]) { tree in
                    let object = ModelObject(copying: tree.objects[path]!)
                    object.bytes = Array(object.bytes.prefix(size)) + [UInt8](repeating: 0, count: max(0, size - object.bytes.count))
                    object.mtime = nil
                    tree.objects[path] = object
                }
            }
            let done: Void? = try expect(expected, "truncate \(path)") { () throws(FSError) in
                _ = try kernel.fs.setattr(try kernel.resolve(path), AttributeChanges(size: Int64(size)))
            }
            guard done != nil, let object = tree.objects[path] else { return }
            object.bytes = Array(object.bytes.prefix(size)) + [UInt8](repeating: 0, count: max(0, size - object.bytes.count))
            object.mtime = nil
        }
        try check(path)
    }

    func chmodPath() throws {
        let path = targetPath([.file, .directory, .fifo, .socket])
        let mode: UInt16 = [0o600, 0o644, 0o755, 0o700, 0o640][Int.random(in: 0..<5, using: &random)]
        let chown = chance(0.3)
        try step("ch\(chown ? "own 7:8 and chmod" : "mod") \(String(mode, radix: 8)) \(path)") {
            let expected = parentError(path) ?? (tree.objects[path] == nil ? .notFound : nil)
            if expected == nil, tree.objects[path]!.kind == .symlink { return }
            if expected == nil {
                arm([path]) { tree in
                    let object = ModelObject(copying: tree.objects[path]!)
                    object.mode = mode
                    if chown { (object.uid, object.gid) = (7, 8) }
                    tree.objects[path] = object
                }
            }
            let done: Void? = try expect(expected, "chmod \(path)") { () throws(FSError) in
                _ = try kernel.fs.setattr(
                    try kernel.resolve(path), AttributeChanges(mode: mode, uid: chown ? 7 : nil, gid: chown ? 8 : nil))
            }
            guard done != nil, let object = tree.objects[path] else { return }
            object.mode = mode
            if chown { (object.uid, object.gid) = (7, 8) }
        }
        try check(path)
    }

    func utimensPath() throws {
        let path = targetPath([.file, .directory, .fifo, .socket])
        let time = Timestamp(seconds: Int64.random(in: 1_000_000_000...1_800_000_000, using: &random), nanoseconds: Int32.random(in: 0..<1_000_000_000, using: &random))
        try step("utimens \(path) \(time)") {
            let expected = parentError(path) ?? (tree.objects[path] == nil ? .notFound : nil)
            if expected == nil, tree.objects[path]!.kind == .symlink { return }
            if expected == nil {
                arm([path]) { tree in
                    let object = ModelObject(copying: tree.objects[path]!)
                    object.mtime = time
                    tree.objects[path] = object
                }
            }
            let done: Void? = try expect(expected, "utimens \(path)") { () throws(FSError) in
                _ = try kernel.fs.setattr(try kernel.resolve(path), AttributeChanges(modified: time))
            }
            if done != nil { tree.objects[path]?.mtime = time }
        }
        try check(path)
    }

    func renamePath() throws {
        let from = targetPath([.file, .directory, .symlink, .fifo, .socket])
        var to = anyPath()
        if chance(0.4), let existing = existingPath([tree.objects[from]?.kind ?? .file]) { to = existing }
        try step("rename \(from) -> \(to)") {
            var expected = parentError(from) ?? (tree.objects[from] == nil ? .notFound : nil) ?? parentError(to)
            let source = tree.objects[from]
            let target = tree.objects[to]
            if expected == nil, let source, !from.isSameKey(as: to) {
                // The kernel refuses moving a directory below itself, and onto an ancestor (not empty).
                if to.startsWithBytes(from + "/") { return }
                if from.startsWithBytes(to + "/") { expected = .notEmpty }
                if expected == nil, let target {
                    switch (source.kind == .directory, target.kind == .directory) {
                    case (true, false): expected = .notADirectory
                    case (false, true): expected = .isADirectory
                    case (true, true): if !tree.children(of: to).isEmpty { expected = .notEmpty }
                    case (false, false): break
                    }
                }
            }
            if expected == .notEmpty && from.startsWithBytes(to + "/") { return }  // the kernel's own check
            if expected == nil {
                arm([from, to]) { tree in
                    guard !from.isSameKey(as: to) else { return }
                    tree.objects[to] = nil
                    tree.move(from, to: to)
                }
            }
            let done: Void? = try expect(expected, "rename \(from) -> \(to)") { () throws(FSError) in
                let sourceParent = try kernel.parentOf(from)
                let targetParent = try kernel.parentOf(to)
                try kernel.fs.rename(
                    parent: sourceParent, name: ReferenceTree.name(from), newParent: targetParent,
                    newName: ReferenceTree.name(to), noReplace: false)
            }
            guard done != nil, !from.isSameKey(as: to) else { return }
            tree.objects[to] = nil
            tree.move(from, to: to)
            kernel.moved(from, to: to)
        }
        try check(from)
        try check(to)
        try checkPathsOfOpenObjects()
    }

    func unlinkPath() throws {
        let path = targetPath([.file, .symlink, .fifo, .socket])
        try step("unlink \(path)") {
            var expected = parentError(path) ?? (tree.objects[path] == nil ? .notFound : nil)
            if expected == nil, tree.objects[path]!.kind == .directory { expected = .isADirectory }
            if expected == nil { arm([path]) { $0.objects[path] = nil } }
            let done: Void? = try expect(expected, "unlink \(path)") { () throws(FSError) in
                try kernel.fs.unlink(parent: try kernel.parentOf(path), name: ReferenceTree.name(path))
            }
            guard done != nil else { return }
            tree.objects[path] = nil
            kernel.dropped(path)
        }
        try check(path)
        try checkHandles()
    }

    func rmdirPath() throws {
        let path = targetPath([.directory])
        try step("rmdir \(path)") {
            var expected = parentError(path) ?? (tree.objects[path] == nil ? .notFound : nil)
            if expected == nil, tree.objects[path]!.kind != .directory { expected = .notADirectory }
            if expected == nil, !tree.children(of: path).isEmpty { expected = .notEmpty }
            if expected == nil { arm([path]) { $0.objects[path] = nil } }
            let done: Void? = try expect(expected, "rmdir \(path)") { () throws(FSError) in
                try kernel.fs.rmdir(parent: try kernel.parentOf(path), name: ReferenceTree.name(path))
            }
            guard done != nil else { return }
            tree.objects[path] = nil
            kernel.dropped(path)
        }
        try check(path)
    }

    func mkdirPath() throws {
        let path = anyPath()
        let mode: UInt16 = chance(0.5) ? 0o755 : 0o700
        try step("mkdir \(path) \(String(mode, radix: 8))") {
            let expected = parentError(path) ?? (tree.objects[path] == nil ? nil : .exists)
            if expected == nil {
                arm([path]) { $0.objects[path] = ModelObject(kind: .directory, mode: mode, uid: self.caller.uid, gid: self.caller.gid) }
            }
            let done: Void? = try expect(expected, "mkdir \(path)") { () throws(FSError) in
                let parent = try kernel.parentOf(path)
                if try kernel.existing(path) != nil { throw FSError(.exists, "exists (the kernel's lookup)") }
                let attributes = try kernel.fs.mkdir(parent: parent, name: ReferenceTree.name(path), mode: mode, caller: caller)
                kernel.counted(path, attributes.inode)
            }
            if done != nil { tree.objects[path] = ModelObject(kind: .directory, mode: mode, uid: caller.uid, gid: caller.gid) }
        }
        try check(path)
        try check(ReferenceTree.parent(path))
    }

    /// mkfifo, or a socket's bind: an empty object of that type.
    func mknodSpecial() throws {
        let path = anyPath()
        let kind: NodeKind = chance(0.5) ? .fifo : .socket
        let mode: UInt16 = chance(0.5) ? 0o644 : 0o600
        try step("mknod \(kind) \(path) \(String(mode, radix: 8))") {
            let expected = parentError(path) ?? (tree.objects[path] == nil ? nil : .exists)
            if expected == nil {
                arm([path]) { $0.objects[path] = ModelObject(kind: kind, mode: mode, uid: self.caller.uid, gid: self.caller.gid) }
            }
            let done = try expect(expected, "mknod \(path)") { () throws(FSError) in
                let parent = try kernel.parentOf(path)
                if try kernel.existing(path) != nil { throw FSError(.exists, "exists (the kernel's lookup)") }
                let attributes = try kernel.fs.mknod(
                    parent: parent, name: ReferenceTree.name(path), mode: mode, kind: kind, caller: caller)
                kernel.counted(path, attributes.inode)
            }
            if done != nil { tree.objects[path] = ModelObject(kind: kind, mode: mode, uid: caller.uid, gid: caller.gid) }
        }
        try check(path)
    }

    func symlinkPath() throws {
        let path = anyPath()
        let target = "../t" + String(Int.random(in: 0..<1000, using: &random))
        try step("symlink \(path) -> \(target)") {
            let expected = parentError(path) ?? (tree.objects[path] == nil ? nil : .exists)
            if expected == nil {
                arm([path]) { tree in
                    let object = ModelObject(kind: .symlink, mode: 0o777, uid: self.caller.uid, gid: self.caller.gid)
                    object.target = target
                    tree.objects[path] = object
                }
            }
            let done: Void? = try expect(expected, "symlink \(path)") { () throws(FSError) in
                let parent = try kernel.parentOf(path)
                if try kernel.existing(path) != nil { throw FSError(.exists, "exists (the kernel's lookup)") }
                let attributes = try kernel.fs.symlink(parent: parent, name: ReferenceTree.name(path), target: target, caller: caller)
                kernel.counted(path, attributes.inode)
            }
            if done != nil {
                let object = ModelObject(kind: .symlink, mode: 0o777, uid: caller.uid, gid: caller.gid)
                object.target = target
                tree.objects[path] = object
            }
        }
        try check(path)
    }

    /// opendir (kept open), or rewinddir of a directory kept open since earlier operations.
    func rewindOpenDirectory() throws {
        if openDirectories.isEmpty || chance(0.3) {
            let path = pick(tree.directories)!
            // Unread, its first readdir after changes is a rewinddir's (issue 24).
            let read = chance(0.5)
            try step("opendir \(path.isEmpty ? "/" : path) and keep it open\(read ? "" : ", unread")") {
                let opened = try expect(nil, "opendir \(path)") { () throws(FSError) in
                    let inode = try kernel.resolve(path)
                    return (try kernel.fs.opendir(inode), inode)
                }
                guard let (handle, inode) = opened else { return }
                openDirectories.append((handle, inode, path.isEmpty ? nil : tree.objects[path]))
                if read { _ = try readDirectory(handle, inode, from: 0) }
            }
            return
        }
        let index = Int.random(in: 0..<openDirectories.count, using: &random)
        let open = openDirectories[index]
        let closing = chance(0.3)
        try step("rewinddir of directory handle \(open.handle)\(closing ? ", closedir" : "")") {
            // Where the directory is now (renamed with it); a removed one is not compared.
            let path: String? = open.object == nil ? "" : tree.objects.first(where: { $0.value === open.object })?.key
            if let path {
                let shown = try readDirectoryInodes(open.handle, open.inode, from: 0)
                let names = shown.map(\.name)
                let expected = tree.children(of: path)
                if names.sorted(by: byteOrder).map({ Array($0.utf8) }) != expected.map({ Array($0.utf8) }) {
                    throw fail("rewinddir of \(path.isEmpty ? "/" : path) shows \(names.sorted(by: byteOrder)), expected \(expected)")
                }
                try checkInodes(shown, in: path, inode: open.inode)
            }
            if closing {
                kernel.fs.releasedir(handle: open.handle)
                openDirectories.remove(at: index)
            }
        }
    }

    /// Every name readdir of an open directory handle shows from `offset`.
    func readDirectory(_ handle: UInt64, _ inode: InodeNumber, from start: Int64) throws -> [String] {
        try readDirectoryInodes(handle, inode, from: start).map(\.name)
    }

    /// Every name readdir of an open directory handle shows from `offset`, with its d_ino.
    func readDirectoryInodes(_ handle: UInt64, _ inode: InodeNumber, from start: Int64) throws -> [(name: String, inode: InodeNumber)] {
        var names: [(name: String, inode: InodeNumber)] = []
        _ = try expect(nil, "readdir of handle \(handle)") { () throws(FSError) in
            var offset = start
            while true {
                var count = 0
                try kernel.fs.readdir(inode, handle: handle, offset: offset) { name, _, number, next in
                    guard count < 5 else { return false }
                    count += 1
                    offset = next
                    if name != "." && name != ".." { names.append((name, number)) }
                    return true
                }
                if count == 0 { break }
            }
        }
        return names
    }

    func listDirectory() throws {
        let path = pick(tree.directories)!
        let plus = chance(0.6)
        try step("ls\(plus ? " -l" : "") \(path.isEmpty ? "/" : path)") { try checkListing(path, plus: plus) }
    }

    func statPath() throws {
        let path = targetPath([.file, .directory, .symlink, .fifo, .socket])
        try step("stat and read \(path)") { try check(path) }
    }

    /// `ls -lR`, then `stat` and a read of every object: a walk that leaves listings remembered
    /// and nodes described between attribute changes (the attribute rule's answers from before).
    func walkTree() throws {
        try step("walk the tree (ls -lR, then stat and read everything)") {
            for directory in tree.directories { try checkListing(directory, plus: true) }
            for path in tree.objects.keys.sorted(by: byteOrder) { try check(path) }
        }
    }

    /// attr_write_delay passes but not dir_timeout: owed attributes are stored while the listings
    /// from before them are still remembered; the kernel asks again and must see the change.
    func storeOwedAttributesSoon() throws {
        try step("attr_write_delay passes (owed attributes are stored), names and attributes expire, check everything") {
            clock.advance(1.5)
            let failed = kernel.fs.storeOwedAttributes()
            if !failed.isEmpty { throw fail("owed attributes not stored: \(failed)") }
            kernel.expire()
            for path in tree.objects.keys.sorted(by: byteOrder) { try check(path) }
        }
    }

    /// A poll tick (issue 22, `poll_s`), a third of the time with its requests failing: it may
    /// show other clients' changes sooner, and never anything but the store with this mount's
    /// changes (the names it asks the kernel to forget are forgotten; some listings are checked).
    func pollTick() throws {
        let faulted = chance(0.3)
        try step("a poll tick" + (faulted ? " whose requests fail" : "")) {
            if faulted {
                faulty.inject { call in
                    [.list, .head, .headContainer].contains(call.operation) ? .before(.transient) : .none
                }
            }
            defer { if faulted { faulty.heal() } }
            kernel.fs.pollOnce()
        }
        let forgotten = kernel.forgetAsked(keeping: Set(handles.map(\.inode) + openDirectories.map(\.inode)))
        if forgotten > 0 { trace.append("    the kernel forgot \(forgotten) names the poll found changed") }
        for directory in tree.directories where chance(0.3) { try checkListing(directory, plus: chance(0.5)) }
    }

    func expireCaches() throws {
        try step("time passes (dentries, listings and attributes expire, owed attributes are stored)") {
            clock.advance(10)
            kernel.expire()
            let failed = kernel.fs.storeOwedAttributes()
            if !failed.isEmpty { throw fail("owed attributes not stored: \(failed)") }
        }
    }

    func evictInodes() throws {
        try step("the kernel forgets every inode without an open file") {
            kernel.evict(keeping: Set(handles.map(\.inode) + openDirectories.map(\.inode)))
        }
    }

    func remount() throws {
        try step("unmount (closing every handle) and mount again") {
            while !handles.isEmpty { try close(handleIndex: handles.count - 1) }
            for open in openDirectories { kernel.fs.releasedir(handle: open.handle) }
            openDirectories = []
            kernel.fs.shutdown()
            kernel = KernelSimulator(try Filesystem(store: faulty, configuration: configuration, logger: Self.quietLogger))
            // Half the time the background recovery has run; else what the last mount owed is
            // stored as the operations touch its names (and stays owed for faults and other
            // clients until a later mount's recovery).
            if chance(0.5) {
                trace.append("  the recovery stores what the last mount owed")
                kernel.fs.recoverPendingUploads()
                owed = []
            }
        }
    }

    /// The store refuses every upload while a handle is flushed and closed: close may report EIO,
    /// and the bytes must still be stored later (by a retry, or by the next mount's recovery).
    func closeWhileUploadsFail() throws {
        guard let index = pick(Array(handles.indices.filter { handles[$0].writable })) else { return }
        let handle = handles.remove(at: index)
        try step("close handle \(handle.number) while the store refuses uploads") {
            faulty.inject { call in
                switch call.operation {
                case .put, .putPart, .putManifest, .post: return .before(.transient)
                default: return .none
                }
            }
            defer { faulty.heal() }
            do {
                try kernel.fs.flush(handle: handle.number)
            } catch let error as FSError {
                guard error.code == .ioError else { throw fail("close with failing uploads: \(error.code), expected EIO") }
                trace.append("  close: EIO (the bytes stay in the spool, owed)")
            }
            kernel.fs.release(handle: handle.number)
            owed.append(handle.object)
        }
        try checkPathsOfOpenObjects()
        for (path, object) in tree.objects where object === handle.object { try check(path) }
    }

    /// Another client writes a file (never one open here).
    func outOfBandPut() throws {
        let path = chance(0.5) ? (existingPath([.file]) ?? anyPath()) : anyPath()
        guard !handles.contains(where: { $0.object === tree.objects[path] }), parentError(path) == nil,
            !owed.contains(where: { $0 === tree.objects[path] }),
            tree.objects[path]?.kind ?? .file == .file
        else { return }
        let data = bytes(Int.random(in: 0...40, using: &random))
        // As other tools write (issue 38): swiftclient an mtime with six decimals, rclone nine
        // and a mode as an octal st_mode, curl nothing; none in the content type.
        let mtime = Timestamp(
            seconds: Int64.random(in: 1_500_000_000...1_600_000_000, using: &random),
            nanoseconds: Int32.random(in: 0..<1000, using: &random) * 1000)
        var metadata: [String: String] = [:]
        let style = Int.random(in: 0..<3, using: &random)
        if style == 0 { metadata["mtime"] = String(mtime.description.dropLast(3)) }
        if style == 1 { metadata = ["mtime": mtime.description, "mode": "100600"] }
        let fromHeaders = configuration.foreignAttributes == .head
        try step("another client PUTs \(data.count) bytes at \(path) with metadata \(metadata)") {
            // A delete of the key this mount sent already may have checked the version before
            // this PUT and delete it after, as any DELETE would (DeleteQueue subtlety 5): the
            // other client writes once the mount's delete of the key is done. (A PUT while the
            // delete is still queued is WriteBackDeleteTests' subject.)
            try? kernel.fs.deletes.settle(path)
            store.seed(path, data, metadata: metadata)
            let object = ModelObject(kind: .file, mode: fromHeaders && style == 1 ? 0o600 : 0o644, uid: 0, gid: 0)
            object.mtime = fromHeaders && style != 2 ? mtime : nil
            object.mtimeFromFirstStat = object.mtime == nil
            object.bytes = data
            tree.objects[path] = object
            clock.advance(10)
            kernel.expire()
        }
        try check(path)
    }

    /// Another client deletes a file (never one open here).
    func outOfBandDelete() throws {
        guard let path = existingPath([.file]), !handles.contains(where: { $0.object === tree.objects[path] }),
            !owed.contains(where: { $0 === tree.objects[path] })
        else { return }
        try step("another client DELETEs \(path)") {
            try? store.delete(key: path)
            tree.objects[path] = nil
            clock.advance(10)
            kernel.expire()
        }
        try check(path)
    }

    // MARK: Checks

    func checkEverything() throws {
        try step("check the whole tree") {
            for directory in tree.directories { try checkListing(directory, plus: false) }
            for path in tree.objects.keys.sorted(by: byteOrder) { try check(path) }
        }
    }

    func checkListing(_ directory: String, plus: Bool) throws {
        guard let inode = try expect(nil, "resolve directory \(directory)", { () throws(FSError) in try kernel.resolve(directory) })
        else { return }
        var seen: [String] = []
        var shownInodes: [(String, InodeNumber)] = []
        _ = try expect(nil, "list \(directory)") { () throws(FSError) in
            let handle = try kernel.fs.opendir(inode)
            defer { kernel.fs.releasedir(handle: handle) }
            var offset: Int64 = 0
            while true {
                var count = 0
                if plus {
                    try kernel.fs.readdirplus(inode, handle: handle, offset: offset) { name, _, _, attributes, next in
                        guard count < 5 else { return false }
                        count += 1
                        offset = next
                        if name != "." && name != ".." {
                            seen.append(name)
                            if let attributes { kernel.counted(ReferenceTree.join(directory, name), attributes.inode) }
                        }
                        return true
                    }
                } else {
                    try kernel.fs.readdir(inode, handle: handle, offset: offset) { name, _, number, next in
                        guard count < 5 else { return false }
                        count += 1
                        offset = next
                        if name != "." && name != ".." {
                            seen.append(name)
                            shownInodes.append((name, number))
                        }
                        return true
                    }
                }
                if count == 0 { break }
            }
        }
        let expected = tree.children(of: directory)
        let shown = seen.sorted(by: byteOrder)
        if shown.map({ Array($0.utf8) }) != expected.map({ Array($0.utf8) }) {
            throw fail("ls \(directory.isEmpty ? "/" : directory) shows \(shown), expected \(expected)")
        }
        try checkInodes(shownInodes, in: directory, inode: inode)
    }

    /// d_ino is the inode a lookup of the name gives (ls -i, find and du compare them).
    func checkInodes(_ shownInodes: [(name: String, inode: InodeNumber)], in directory: String, inode: InodeNumber) throws {
        for (name, number) in shownInodes {
            let path = ReferenceTree.join(directory, name)
            let looked = try expect(nil, "lookup of listed \(path)") { () throws(FSError) in
                let found = try kernel.fs.lookup(parent: inode, name: name).inode
                kernel.counted(path, found)
                return found
            }
            if let looked, looked != number { throw fail("readdir shows \(path) as inode \(number), stat as \(looked)") }
        }
    }

    /// Compares what stat, readlink and a read of `path` show with the reference.
    func check(_ path: String) throws {
        if deferredChecks != nil { return deferredChecks!.append { [unowned self] in try check(path) } }
        if path.isEmpty { return try checkListing("", plus: false) }
        guard let object = tree.objects[path] else {
            if parentError(path) == nil {
                _ = try expect(.notFound, "lookup of the removed \(path)") { () throws(FSError) in try kernel.resolve(path) }
            }
            return
        }
        guard let attributes = try expect(nil, "stat \(path)", { () throws(FSError) in try kernel.fs.getattr(try kernel.resolve(path)) })
        else { return }
        if attributes.kind != object.kind { throw fail("\(path) is a \(attributes.kind), expected a \(object.kind)") }
        if object.kind != .symlink && attributes.permissions != object.mode {
            throw fail("\(path) has mode \(String(attributes.permissions, radix: 8)), expected \(String(object.mode, radix: 8))")
        }
        if attributes.uid != object.uid || attributes.gid != object.gid {
            throw fail("\(path) is owned by \(attributes.uid):\(attributes.gid), expected \(object.uid):\(object.gid)")
        }
        if object.mtime == nil && object.mtimeFromFirstStat {
            object.mtime = attributes.modified
            object.mtimeFromFirstStat = false
        }
        if let mtime = object.mtime, attributes.modified != mtime {
            throw fail("\(path) has mtime \(attributes.modified), expected \(mtime)")
        }
        switch object.kind {
        case .directory:
            try checkListing(path, plus: false)
        case .symlink:
            let target = try expect(nil, "readlink \(path)") { () throws(FSError) in try kernel.fs.readlink(attributes.inode) }
            if target != object.target { throw fail("readlink \(path) is \(target ?? "-"), expected \(object.target)") }
        case .fifo, .socket:
            if attributes.size != 0 { throw fail("\(path), a \(object.kind), has size \(attributes.size)") }
        case .file:
            if attributes.size != Int64(object.bytes.count) {
                throw fail("\(path) has size \(attributes.size), expected \(object.bytes.count)")
            }
            let content = try expect(nil, "read \(path)") { () throws(FSError) in
                let opened = try kernel.fs.open(attributes.inode, writable: false, truncate: false)
                defer { kernel.fs.release(handle: opened.handle) }
                return try readAll(opened.handle)
            }
            if let content, content != object.bytes {
                throw fail("\(path) reads \(content.count) bytes \(content.prefix(16)), expected \(object.bytes.count) bytes \(object.bytes.prefix(16))")
            }
        }
    }

    func readAll(_ handle: UInt64) throws(FSError) -> [UInt8] {
        var bytes: [UInt8] = []
        let chunk = Int.random(in: 7...64, using: &random)
        while true {
            var got = 0
            try kernel.fs.read(handle: handle, offset: Int64(bytes.count), length: chunk) { piece in
                got = piece.count
                bytes.append(contentsOf: piece)
            }
            if got == 0 { return bytes }
        }
    }

    /// Every open handle reads what its object holds (renamed or unlinked or not).
    func checkHandles() throws {
        if deferredChecks != nil { return deferredChecks!.append { [unowned self] in try checkHandles() } }
        for handle in handles {
            // A read-only handle reads the object; once no name leads to its file (unlinked,
            // replaced by a rename), the object may be gone: ENOENT or ESTALE then (the man page's
            // CONSISTENCY), never wrong bytes.
            if !handle.writable && !tree.objects.values.contains(where: { $0 === handle.object }) {
                do {
                    let content = try readAll(handle.number)
                    if content != handle.object.bytes { throw fail("handle \(handle.number) of a removed file reads \(content.count) bytes \(content.prefix(8)), expected \(handle.object.bytes.count) \(handle.object.bytes.prefix(8))") }
                } catch let error as FSError where error.code == .notFound || error.code == .stale {}
                continue
            }
            let content = try expect(nil, "read through handle \(handle.number)") { () throws(FSError) in try readAll(handle.number) }
            if let content, content != handle.object.bytes {
                throw fail("handle \(handle.number) reads \(content.count) bytes \(content.prefix(16)), expected \(handle.object.bytes.count) bytes \(handle.object.bytes.prefix(16))")
            }
        }
    }

    /// Where open objects live now (after renames), the tree shows them.
    func checkPathsOfOpenObjects() throws {
        if deferredChecks != nil { return deferredChecks!.append { [unowned self] in try checkPathsOfOpenObjects() } }
        for (path, object) in tree.objects where handles.contains(where: { $0.object === object }) { try check(path) }
    }
}
