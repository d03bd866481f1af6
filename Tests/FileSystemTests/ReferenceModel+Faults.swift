import Foundation
import Locking
import ObjectStore
import ObjectStoreTesting

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// An operation on names or attributes during which one store call fails.
struct ArmedFault {
    /// The paths the operation names (with everything below them: its region).
    var roots: [String]
    /// The tree before the operation, and as it would be had the operation succeeded.
    var before: ReferenceTree
    var after: ReferenceTree
    /// Faults injected before this operation (a larger count means this one's fault hit).
    var injectedBefore: Int
}

/// What the filesystem shows for one path.
struct ObservedObject: CustomStringConvertible {
    var kind: NodeKind
    var mode: UInt16
    var uid: UInt32
    var gid: UInt32
    var mtime: Timestamp
    var bytes: [UInt8] = []
    var target = ""

    var description: String {
        "a \(kind) \(String(mode, radix: 8)) \(uid):\(gid) mtime \(mtime)"
            + (kind == .file ? " of \(bytes.count) bytes \(bytes.prefix(8))" : "") + (kind == .symlink ? " -> \(target)" : "")
    }

    /// Whether this is `object` (attributes, and content where it has one).
    func matches(_ object: ModelObject) -> Bool {
        guard kind == object.kind, uid == object.uid, gid == object.gid else { return false }
        if kind != .symlink && mode != object.mode { return false }
        if let mtime = object.mtime, mtime != self.mtime { return false }
        return bytes == object.bytes && target == object.target
    }
}

extension ReferenceModelRun {
    /// One operation that changes names or attributes (rename, unlink, rmdir, mkdir, symlink,
    /// mknod, chmod, utimens, truncate) while one of its store calls fails, before reaching the
    /// store or after it (the answer lost). The operation either succeeds as a whole, or returns
    /// EIO and leaves each path it names as it was or as the operation would have left it: nothing
    /// it keeps is lost, nothing outside its paths changes, and what the filesystem shows is what
    /// the store holds (later checks, expiries and remounts compare with the store).
    func operationUnderFault() throws {
        let index = Int.random(in: 0..<6, using: &random)
        let lost = chance(0.5)
        pendingFault = (index, lost ? .after(.transient) : .before(.transient))
        switch Int.random(in: 0..<12, using: &random) {
        case 0..<3: try renamePath()
        case 3: try unlinkPath()
        case 4: try rmdirPath()
        case 5: try mkdirPath()
        case 6: try symlinkPath()
        case 7: try mknodSpecial()
        case 8: try chmodPath()
        case 9: try utimensPath()
        case 10: try truncatePath()
        default: return try readUnderFault()
        }
        pendingFault = nil
        faulty.heal()
        traceFaultedCalls()
        let checks = deferredChecks ?? []
        deferredChecks = nil
        let settled = armed
        armed = nil
        if let settled, faultFailed { try reconcile(settled) }
        faultFailed = false
        for check in checks { try check() }
    }

    /// A program opens a file and reads it while one store call fails (a GET cut off half-way, a
    /// HEAD or GET refused): it gets the file's bytes or EIO, never other bytes, and nothing
    /// half-fetched is kept: the next read gets the whole file.
    func readUnderFault() throws {
        pendingFault = nil
        guard let path = existingPath([.file]) else { return }
        let index = Int.random(in: 0..<4, using: &random)
        let fault: FaultInjectingStore.Fault = chance(0.6) ? .halfway(.transient) : .before(.transient)
        try step("read \(path) while store call \(index) of the read fails (\(fault))") {
            let object = tree.objects[path]!
            let injectedBefore = faulty.injected.count
            injectIntoThisThread(call: index, fault)
            defer {
                faulty.heal()
                traceFaultedCalls()
            }
            do {
                let inode = try kernel.resolve(path)
                let opened = try kernel.fs.open(inode, writable: false, truncate: false)
                defer { kernel.fs.release(handle: opened.handle) }
                let content = try readAll(opened.handle)
                if content != object.bytes {
                    throw fail("read of \(path) under a fault gave \(content.count) bytes \(content.prefix(16)), expected \(object.bytes.count) bytes \(object.bytes.prefix(16))")
                }
            } catch let error as FSError {
                guard error.code == .ioError, faulty.injected.count > injectedBefore else {
                    throw fail("read of \(path) under a fault: \(error.code) (\(error.message)), expected the bytes or EIO")
                }
                trace.append("  -> EIO (\(error.message))")
            }
        }
        try check(path)
    }

    /// Called by an operation once it chose its paths and expects to succeed: injects the pending
    /// fault into the operation's own store calls (the calling thread's), unless the paths hold an
    /// open, owed or listed-open object (their outcome under a fault is another test's subject).
    /// `intended` makes the tree the operation would leave (replacing objects it changes).
    func arm(_ roots: [String], _ intended: (inout ReferenceTree) -> Void) {
        guard let (index, fault) = pendingFault else { return }
        pendingFault = nil
        let busy = handles.map(\.object) + owed + openDirectories.compactMap(\.object)
        let region = tree.objects.filter { path, _ in roots.contains { inRegion(path, $0) } }
        if region.contains(where: { _, object in busy.contains { $0 === object } }) {
            trace.append("  (no fault: the operation's paths hold open files)")
            return
        }
        var after = tree
        intended(&after)
        armed = ArmedFault(roots: roots, before: tree, after: after, injectedBefore: faulty.injected.count)
        deferredChecks = []
        injectIntoThisThread(call: index, fault)
        trace.append("  (store call \(index) of this operation \(fault == .before(.transient) ? "fails" : "loses its answer"))")
    }

    /// Fails call number `index` (from 0) that this thread makes from now on: the operation's own
    /// calls, not a background HEAD's (so that a seed replays the same faults).
    func injectIntoThisThread(call index: Int, _ fault: FaultInjectingStore.Fault) {
        let thread = pthread_self()
        let calls = Locked(0)
        let seen = callsUnderFault
        faulty.inject { call in
            guard pthread_equal(pthread_self(), thread) != 0 else { return .none }
            return calls.withLock { n in
                defer { n += 1 }
                seen.withLock { $0.append("\(call)\(n == index ? ": \(fault)" : "")") }
                return n == index ? fault : .none
            }
        }
    }

    /// Adds the store calls the faulted thread made to the trace. A seed does not always replay
    /// the same faults (whether an earlier operation's background HEAD or listing answered first
    /// decides which calls an operation still makes itself), so a failure's trace says exactly
    /// which call failed.
    func traceFaultedCalls() {
        let calls = callsUnderFault.withLock { calls in
            defer { calls = [] }
            return calls
        }
        if !calls.isEmpty { trace.append("  store calls: " + calls.joined(separator: ", ")) }
    }

    func inRegion(_ path: String, _ root: String) -> Bool { path.isSameKey(as: root) || path.startsWithBytes(root + "/") }

    /// After an operation failed under a fault: what the filesystem shows of its paths must be
    /// allowed, and becomes the reference from now on.
    func reconcile(_ armed: ArmedFault) throws {
        trace.append("  reconcile \(armed.roots) with what the filesystem shows")
        // The kernel's dentries of these names time out (entry_timeout); the filesystem's own
        // caches must not: it knows the operation failed.
        for root in armed.roots { kernel.dropped(root) }
        var observed: [(path: String, object: ObservedObject)] = []
        for root in armed.roots where !observed.contains(where: { $0.path.isSameKey(as: root) }) {
            try observe(root, into: &observed)
        }
        func region(_ tree: ReferenceTree) -> ExactDictionary<ModelObject> {
            var objects = ExactDictionary<ModelObject>()
            for (path, object) in tree.objects where armed.roots.contains(where: { inRegion(path, $0) }) { objects[path] = object }
            return objects
        }
        let before = region(armed.before)
        let after = region(armed.after)
        func candidates(_ path: String) -> [ModelObject] { [before[path], after[path]].compactMap { $0 } }
        // Every path shows what it held before, or what the operation would have made of it.
        var adopted: [(String, ModelObject)] = []
        var used: [ModelObject] = []
        for (path, shown) in observed {
            guard let match = candidates(path).first(where: { shown.matches($0) }) else {
                throw fail(
                    "after a failed operation \(path) is \(shown); allowed: "
                        + (candidates(path).isEmpty ? "nothing" : candidates(path).map { "\(ObservedObject(model: $0))" }.joined(separator: " or ")))
            }
            // A copy half-way (a rename's COPY done, its DELETE not) shows one object at two names.
            let object = used.contains(where: { $0 === match }) ? ModelObject(copying: match) : match
            used.append(match)
            adopted.append((path, object))
        }
        // Nothing the operation keeps is lost: every file it leaves somewhere is at its old place
        // or its new one (possibly with its old attributes or content).
        for (path, kept) in after where kept.kind != .directory {
            let origins = before.filter { $0.value === kept }.map(\.key) + [path]
            // An object the operation replaced (chmod, truncate) may show as it was.
            let formerSelf = before.contains(where: { $0.value === kept }) ? [] : before[path].map { [$0] } ?? []
            // Something the operation makes (mkdir, symlink) may be missing: it failed.
            if origins.count == 1 && formerSelf.isEmpty { continue }
            let shown = observed.contains { seen in
                origins.contains { seen.path.isSameKey(as: $0) } && ([kept] + formerSelf).contains { seen.object.matches($0) }
            }
            if !shown { throw fail("after a failed operation \(path) (\(ObservedObject(model: kept))) is lost") }
        }
        for path in tree.objects.keys where armed.roots.contains(where: { inRegion(path, $0) }) { tree.objects[path] = nil }
        for (path, object) in adopted { tree.objects[path] = object }
        for root in armed.roots { try check(ReferenceTree.parent(root)) }
    }

    /// What stat, read, readlink and readdir show at `path` and below it.
    func observe(_ path: String, into result: inout [(path: String, object: ObservedObject)]) throws {
        let attributes: Attributes
        do {
            attributes = try kernel.fs.getattr(try kernel.resolve(path))
        } catch where error.code == .notFound {
            return
        } catch {
            throw fail("after a failed operation, stat \(path): \(error.code) (\(error.message))")
        }
        var shown = ObservedObject(
            kind: attributes.kind, mode: attributes.permissions, uid: attributes.uid, gid: attributes.gid,
            mtime: attributes.modified)
        switch attributes.kind {
        case .file:
            shown.bytes = try expect(nil, "read \(path)") { () throws(FSError) in
                let opened = try kernel.fs.open(attributes.inode, writable: false, truncate: false)
                defer { kernel.fs.release(handle: opened.handle) }
                return try readAll(opened.handle)
            } ?? []
        case .symlink:
            shown.target = try expect(nil, "readlink \(path)") { () throws(FSError) in try kernel.fs.readlink(attributes.inode) } ?? ""
        case .directory:
            let handle = try expect(nil, "opendir \(path)") { () throws(FSError) in try kernel.fs.opendir(attributes.inode) }
            guard let handle else { break }
            let names = try readDirectory(handle, attributes.inode, from: 0)
            kernel.fs.releasedir(handle: handle)
            for name in names.sorted(by: byteOrder) { try observe(ReferenceTree.join(path, name), into: &result) }
        case .fifo, .socket:
            break
        }
        result.append((path, shown))
    }
}

extension ObservedObject {
    /// The reference's object as it would be seen (for messages).
    init(model object: ModelObject) {
        self.init(
            kind: object.kind, mode: object.mode, uid: object.uid, gid: object.gid, mtime: object.mtime ?? Timestamp(seconds: 0, nanoseconds: 0),
            bytes: object.bytes, target: object.target)
    }
}
