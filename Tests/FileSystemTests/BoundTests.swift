import Foundation
import Locking
import Logging
import ObjectStore
import ObjectStoreTesting
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// Metadata in bounded memory (`meta_max_entries`, `Filesystem+Bound`).
struct BoundTests {
    let root = Filesystem.rootInode
    let caller = Caller(uid: 1000, gid: 100)

    /// The kernel around the filesystem, as far as the bound needs it: the lookups it holds per
    /// name (readdirplus and lookup count them), and a queue of the names the filesystem asked
    /// it to forget, which `forgetAsked` carries out as the kernel would (an inode in `open` is
    /// kept: its entry goes, its lookups stay until close).
    final class Kernel: Sendable {
        let fs: Filesystem
        let held = Locked<[String: (inode: InodeNumber, count: UInt64)]>([:])
        let asked = Locked<[(parent: InodeNumber, name: String)]>([])
        let everAsked = Locked<[(parent: InodeNumber, name: String)]>([])

        init(_ fs: Filesystem) {
            self.fs = fs
            fs.kernelCache.install(forgetEntry: { [asked, everAsked] parent, name in
                asked.withLock { $0.append((parent, name)) }
                everAsked.withLock { $0.append((parent, name)) }
            })
        }

        static func key(_ parent: InodeNumber, _ name: String) -> String { "\(parent)/\(name)" }

        func counted(_ parent: InodeNumber, _ name: String, _ inode: InodeNumber) {
            held.withLock { $0[Self.key(parent, name), default: (inode, 0)].count += 1 }
        }

        /// readdirplus of the whole directory; every entry sent with attributes is a lookup held.
        func readdirplus(_ directory: InodeNumber) throws {
            let handle = try fs.opendir(directory)
            defer { fs.releasedir(handle: handle) }
            var offset: Int64 = 0
            var more = true
            while more {
                more = false
                try fs.readdirplus(directory, handle: handle, offset: offset) { name, _, _, attributes, next in
                    offset = next
                    more = true
                    if let attributes { counted(directory, name, attributes.inode) }
                    return true
                }
            }
        }

        func lookup(_ parent: InodeNumber, _ name: String) throws -> Attributes {
            let attributes = try fs.lookup(parent: parent, name: name)
            counted(parent, name, attributes.inode)
            return attributes
        }

        /// The pass under way has ended; the names it asked for are forgotten (but `open` ones).
        func forgetAsked(keeping open: Set<InodeNumber> = []) {
            _ = fs.pool.waitUntilIdle(timeout: 30)
            let names: [(parent: InodeNumber, name: String)] = asked.withLock { a in
                defer { a = [] }
                return a
            }
            for (parent, name) in names {
                let key = Self.key(parent, name)
                guard let entry = held.withLock({ $0[key] }), !open.contains(entry.inode) else { continue }
                held.withLock { $0[key] = nil }
                fs.forget(entry.inode, count: entry.count)
            }
        }
    }

    func makeFilesystem(_ store: any ObjectStore, maximumEntries: Int, attributeWriteDelay: Double = 1) -> Filesystem {
        var configuration = FilesystemConfiguration()
        // (The seeds are other tools' objects, described here by their listings: this suite is about
        // the bound on names, not where their attributes come from; PrefetchTests and ForeignAttributeTests are.)
        configuration.foreignAttributes = .listing
        configuration.maximumEntries = maximumEntries
        configuration.metadataPrefetchLimit = 0
        configuration.listAhead = 0
        configuration.attributeWriteDelay = attributeWriteDelay
        configuration.spoolDirectory = TestScratch.directory + "cssp-bound-spool-" + UUID().uuidString
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func seed(_ store: FakeObjectStore, directories: [String], files: Int) {
        for directory in directories {
            for i in 0..<files { store.seed("\(directory)/f\(i)", text: "\(directory) \(i)") }
        }
    }

    func nodeCount(_ fs: Filesystem) -> Int { fs.names.withLock { $0.inodes.nodes.count } }

    /// `ls -l` of three directories of 40 files with a bound of 50: the kernel is asked to
    /// forget files of the directory used longest ago first, never a directory, and once it has,
    /// at most 50 nodes are left; every name still shows what the store holds.
    @Test func theKernelIsAskedToForgetTheFilesOfTheDirectoriesUsedLongestAgo() throws {
        let store = FakeObjectStore()
        seed(store, directories: ["d1", "d2", "d3"], files: 40)
        let fs = makeFilesystem(store, maximumEntries: 50)
        defer { fs.shutdown() }
        let kernel = Kernel(fs)
        var directories: [InodeNumber] = []
        for name in ["d1", "d2", "d3"] {
            let directory = try kernel.lookup(root, name).inode
            directories.append(directory)
            try kernel.readdirplus(directory)
            kernel.forgetAsked()
            #expect(nodeCount(fs) <= 50, "after ls -l of \(name)")
        }
        let asked = kernel.everAsked.withLock { $0 }
        #expect(!asked.isEmpty)
        #expect(asked.allSatisfy { directories.contains($0.parent) && $0.name.hasPrefix("f") })
        // The first pass (after d2) took d1's files before any of d2's.
        let firstOfD2 = asked.firstIndex { $0.parent == directories[1] } ?? asked.count
        #expect(asked[..<firstOfD2].count >= 30 && asked[..<firstOfD2].allSatisfy { $0.parent == directories[0] })
        // A forgotten name is looked up again and shows the store's object.
        for (i, directory) in directories.enumerated() {
            for f in [0, 17, 39] {
                #expect(try fs.text(directory, "f\(f)") == "d\(i + 1) \(f)")
            }
        }
        #expect(fs.configuration.metrics.entriesForgotten.value == Int64(asked.count))
    }

    /// Names the kernel still used when it was asked to forget them (`ls -l` still reading) are
    /// asked for again a second later although none went, then further apart (rule 3): an idle
    /// mount stayed 50 names past its bound (BoundedMountTests, once in three runs).
    @Test func namesTheKernelKeptAreAskedForAgain() throws {
        let store = FakeObjectStore()
        seed(store, directories: ["d1"], files: 80)
        let fs = makeFilesystem(store, maximumEntries: 50)
        defer { fs.shutdown() }
        let kernel = Kernel(fs)
        let directory = try kernel.lookup(root, "d1").inode
        try kernel.readdirplus(directory)
        // The kernel forgets none of them: all were in use.
        kernel.forgetAsked(keeping: Set(kernel.held.withLock { $0.values.map(\.inode) }))
        #expect(nodeCount(fs) > 50)
        // The check a second after the pass (its timer).
        fs.boundNodes(followUp: true)
        _ = fs.pool.waitUntilIdle(timeout: 30)
        #expect(!kernel.asked.withLock { $0 }.isEmpty, "not asked again")
        kernel.forgetAsked()
        #expect(nodeCount(fs) <= 50)
    }

    /// A file open for reading, one being written and one whose chmod is owed are never handed
    /// to the kernel, however far past the bound; once closed and stored they may be.
    @Test func namesOpenWrittenOrOwingAChangeAreKept() throws {
        let store = FakeObjectStore()
        seed(store, directories: ["d1", "d2", "d3"], files: 30)
        let fs = makeFilesystem(store, maximumEntries: 20, attributeWriteDelay: 3600)
        defer { fs.shutdown() }
        let kernel = Kernel(fs)
        let d1 = try kernel.lookup(root, "d1").inode
        try kernel.readdirplus(d1)
        kernel.forgetAsked()
        let askedBefore = kernel.everAsked.withLock { $0.count }
        let reading = try kernel.lookup(d1, "f1").inode
        let reader = try fs.open(reading, writable: false, truncate: false).handle
        let writing = try kernel.lookup(d1, "f2").inode
        let writer = try fs.open(writing, writable: true, truncate: false).handle
        try Array("more".utf8).withUnsafeBytes { try fs.write(handle: writer, offset: 0, bytes: $0) }
        let owing = try kernel.lookup(d1, "f3").inode
        _ = try fs.setattr(owing, AttributeChanges(mode: 0o600))
        for name in ["d2", "d3"] {
            try kernel.readdirplus(try kernel.lookup(root, name).inode)
            kernel.forgetAsked(keeping: [reading, writing])
        }
        let askedInD1 = Set(kernel.everAsked.withLock { $0 }[askedBefore...].filter { $0.parent == d1 }.map(\.name))
        #expect(askedInD1.count >= 10)
        #expect(askedInD1.isDisjoint(with: ["f1", "f2", "f3"]))
        for inode in [reading, writing, owing] { #expect(fs.names.withLock { $0.inodes[inode] } != nil) }
        #expect(try fs.getattr(owing).permissions == 0o600)
        fs.release(handle: reader)
        try fs.flush(handle: writer)
        fs.release(handle: writer)
        #expect(fs.storeOwedAttributes().isEmpty)
        try kernel.readdirplus(try kernel.lookup(root, "d2").inode)
        kernel.forgetAsked()
        let askedNow = Set(kernel.everAsked.withLock { $0 }[askedBefore...].filter { $0.parent == d1 }.map(\.name))
        #expect(askedNow.isSuperset(of: ["f1", "f2", "f3"]))
        #expect(try fs.text(d1, "f2") == "more")
    }

    /// readdir shows a file's number (its node's) and numbers for names without a node, then
    /// the directory's listing is dropped under the bound and the kernel forgets the node (asked
    /// to, or on its own): the lookups that follow make nodes of the numbers shown, so that d_ino
    /// and st_ino agree (mount model seeds 1 and 4 with meta_max_entries=8).
    @Test(arguments: [0, 4])
    func aNameForgottenAfterReaddirShowedItKeepsItsNumber(maximumEntries: Int) throws {
        let store = FakeObjectStore()
        seed(store, directories: ["d", "e"], files: 3)
        let fs = makeFilesystem(store, maximumEntries: maximumEntries)
        defer { fs.shutdown() }
        let directory = try fs.lookup(parent: root, name: "d").inode
        let file = try fs.lookup(parent: directory, name: "f1").inode
        let handle = try fs.opendir(directory)
        var shown: [String: InodeNumber] = [:]
        try fs.readdir(directory, handle: handle, offset: 0) { name, _, inode, _ in
            shown[name] = inode
            return true
        }
        fs.releasedir(handle: handle)
        #expect(shown["f1"] == file)
        // Another directory's listing: past a bound of 4 names, d's goes.
        #expect(try fs.names(in: try fs.lookup(parent: root, name: "e").inode).count == 3)
        #expect(fs.names.withLock { $0.directories.listing(directory, now: fs.now(), maximumAge: 5) == nil } == (maximumEntries > 0))
        fs.forget(file, count: 1)
        #expect(fs.names.withLock { $0.inodes[file] } == nil)
        for name in ["f0", "f1", "f2"] { #expect(try fs.lookup(parent: directory, name: name).inode == shown[name], "\(name)") }
    }

    /// Without a kernel to ask (`forgetsEntries` false) nothing is asked and nothing breaks; and
    /// with a bound of 0 nothing is bounded.
    @Test func noBoundMeansNoPass() throws {
        let store = FakeObjectStore()
        seed(store, directories: ["d"], files: 30)
        let fs = makeFilesystem(store, maximumEntries: 0)
        defer { fs.shutdown() }
        let kernel = Kernel(fs)
        try kernel.readdirplus(try kernel.lookup(root, "d").inode)
        kernel.forgetAsked()
        #expect(kernel.everAsked.withLock { $0.isEmpty })
        #expect(nodeCount(fs) == 32)
    }
}
