import BlockCache
import Dispatch
import Foundation
#if canImport(Glibc)
import Glibc
#endif
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

/// Regression tests of the hostile-network issue (issue 10) at the filesystem core.
struct HostileNetworkTests {
    let root = Filesystem.rootInode

    func makeFilesystem(_ store: any ObjectStore, spool: String) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = spool
        configuration.pendingRetrySeconds = 3600
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func write(_ fs: Filesystem, _ handle: UInt64, _ text: String, at offset: Int64 = 0) throws {
        try Array(text.utf8).withUnsafeBytes { try fs.write(handle: handle, offset: offset, bytes: $0) }
    }

    /// Item 2: once a write into the spool failed (a full `cache_dir`), close must not store the
    /// bytes written so far as the whole file. Close reports the error, the previous version
    /// stays, and the bytes are kept in `lost+found/`, not uploaded later.
    @Test func aFileWhoseWriteFailedIsNotStoredAtClose() throws {
        let store = FakeObjectStore()
        let spool = TestScratch.directory + "cssp-hostile-spool-" + UUID().uuidString
        let fs = makeFilesystem(store, spool: spool)
        defer { fs.shutdown() }
        let f = try fs.storeFile(root, "f", Array("the previous version".utf8))
        let opened = try fs.open(f.inode, writable: true, truncate: true)
        try write(fs, opened.handle, "a new beginning")
        // From now on the spool's writes fail as on a full disk (/dev/full answers ENOSPC).
        let spoolDescriptor = try #require(fs.files.withLock { $0.openFiles[f.inode]?.fd })
        let full = Glibc.open("/dev/full", O_WRONLY)
        #expect(dup2(full, spoolDescriptor) == spoolDescriptor)
        Glibc.close(full)
        let writeError = #expect(throws: FSError.self) { try write(fs, opened.handle, ", and the rest", at: 15) }
        #expect(writeError?.code == .noSpace)
        let closeError = #expect(throws: FSError.self) { try fs.flush(handle: opened.handle) }
        #expect(closeError?.code == .noSpace)
        fs.release(handle: opened.handle)
        #expect(store.object("f")?.bytes == Array("the previous version".utf8))
        #expect(fs.files.withLock { $0.openFiles[f.inode] } == nil, "the spool is kept for an upload")
        let kept = (try? FileManager.default.contentsOfDirectory(atPath: spool + "/lost+found")) ?? []
        #expect(kept.count == 1, "the bytes written are not kept aside")
        #expect(!((try? FileManager.default.contentsOfDirectory(atPath: spool)) ?? []).contains { $0.hasSuffix(".pending") })
    }

    /// Item 7: parallel sequential readers share one memory budget. Each one's read-ahead window
    /// would hold up to 8 MiB; with a 4 MiB budget, what is held at once stays within the budget
    /// plus one fetch per reader (the reads the kernel waits for always get their bytes), every
    /// reader still gets the right bytes, and everything is given back when they are done.
    @Test(arguments: [Int64(4 << 20), Int64.max])
    func parallelReadersShareOneMemoryBudget(limit: Int64) throws {
        let store = FakeObjectStore()
        let readers = 8
        let fileSize = 12 << 20
        var contents: [[UInt8]] = []
        for index in 0..<readers {
            // A random piece of a prime length, repeated: a byte at a wrong offset shows.
            var generator = SeededGenerator(seed: UInt64(index + 1))
            let piece = (0..<4093).map { _ in UInt8.random(in: 0...255, using: &generator) }
            var bytes: [UInt8] = []
            while bytes.count < fileSize { bytes += piece }
            bytes.removeLast(bytes.count - fileSize)
            contents.append(bytes)
            store.seed("f\(index)", bytes)
        }
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = TestScratch.directory + "cssp-hostile-spool-" + UUID().uuidString
        configuration.readFetchSize = 1 << 20
        configuration.readAheadWindow = 8 << 20
        let recycler = BufferRecycler(limit: 8 << 20, minimum: 256 << 10, idle: .seconds(60))
        let budget = MemoryBudget(limit: limit, recycler: recycler)
        configuration.memoryBudget = budget
        // GETs take 20 ms, as from a server farther away than this machine: windows fill up.
        let far = FaultInjectingStore(store) { call in
            if call.operation == .get { usleep(20_000) }
            return .none
        }
        let fs = try Filesystem(store: far, configuration: configuration, logger: Logger(label: "test"))
        defer { fs.shutdown() }
        let inodes = try (0..<readers).map { try fs.lookup(parent: root, name: "f\($0)").inode }
        let results = Locked<[Int: [UInt8]]>([:])
        // One thread each, so that all of them read at once: `concurrentPerform` runs as many at
        // once as there are cores (two in CI), and two readers never spend more than the bound.
        let done = DispatchGroup()
        for index in 0..<readers {
            done.enter()
            Thread {
                let bytes = try? fs.readWhole(inodes[index], chunk: 128 << 10)
                results.withLock { $0[index] = bytes }
                done.leave()
            }.start()
        }
        done.wait()
        for index in 0..<readers { #expect(results.withLock { $0[index] } == contents[index], "reader \(index)") }
        fs.shutdown()
        // Buffers kept for reuse still hold their share; everything else was given back.
        #expect(budget.inUse == Int64(recycler.bytesHeld), "\(budget.inUse) bytes never given back")
        recycler.drain()
        #expect(budget.inUse == 0, "\(budget.inUse) bytes never given back")
        let bound = (4 << 20) + Int64(readers) * (1 << 20)
        if limit == 4 << 20 {
            #expect(budget.peak <= bound, "peak \(budget.peak >> 20) MiB")
        } else {
            // Without a budget the same readers hold more than that bound: it is the budget's doing.
            #expect(budget.peak > bound, "peak \(budget.peak >> 20) MiB")
        }
    }

    /// Item 7, as the kernel reads: many files read at once through a few FUSE threads, in
    /// whole 1 MiB blocks of the block cache, each file's reads arriving in turn. A file waiting
    /// for its next turn used to keep the block it was last served (and the one before), so 24
    /// readers held 24–48 MiB whatever the budget. Now, once the budget is spent, a served
    /// block is dropped at once: what is held stays within the budget plus one block per thread
    /// plus what the cache writer has queued.
    @Test func manyReadersOnFewThreadsStayWithinTheBudget() throws {
        let store = FakeObjectStore()
        let files = 24, blocks = 6, threads = 4
        let blockSize = 1 << 20
        for index in 0..<files { store.seed("f\(index)", [UInt8](repeating: UInt8(index), count: blocks * blockSize)) }
        let directory = TestScratch.directory + "cssp-hostile-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = directory + "/spool"
        configuration.readAheadWindow = 4 << 20
        let limit: Int64 = 4 << 20
        let budget = MemoryBudget(limit: limit)
        configuration.memoryBudget = budget
        configuration.blockCache = BlockCache.open(
            path: directory + "/blocks.db", capacity: 1 << 30, blockSize: blockSize, logger: Logger(label: "test"))
        configuration.cacheIdentity = "fake://" + store.containerName
        let far = FaultInjectingStore(store) { call in
            if call.operation == .get { usleep(5_000) }
            return .none
        }
        let fs = try Filesystem(store: far, configuration: configuration, logger: Logger(label: "test"))
        defer { fs.shutdown() }
        let handles = try (0..<files).map { index in
            try fs.open(try fs.lookup(parent: root, name: "f\(index)").inode, writable: false, truncate: false).handle
        }
        defer { for handle in handles { fs.release(handle: handle) } }
        // The reads in the order the kernel sends them: block 0 of every file, then block 1, ...
        let queue = Locked((0..<(blocks * files)).map { (file: $0 % files, block: $0 / files) })
        let wrong = Locked(0)
        DispatchQueue.concurrentPerform(iterations: threads) { _ in
            while let next = queue.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) {
                var good = false
                try? fs.read(handle: handles[next.file], offset: Int64(next.block * blockSize), length: blockSize) {
                    good = $0.count == blockSize && $0.allSatisfy { $0 == UInt8(next.file) }
                }
                if !good { wrong.withLock { $0 += 1 } }
            }
        }
        #expect(wrong.withLock { $0 } == 0)
        // Blocks dropped by readers may still wait in the cache writer's queue (bounded), when
        // the disk is slower than the store.
        let bound = limit + Int64((threads + 1) * blockSize + BlockCache.maximumQueuedBytes)
        #expect(budget.peak <= bound, "held \(budget.peak >> 20) MiB at once, budget \(limit >> 20) MiB")
    }

    /// Item 7: during an outage every failed file waits for its retry. Its spool's descriptor is
    /// closed meanwhile (a thousand owed files would exhaust descriptors, and EMFILE breaks curl
    /// and SQLite for everything); reading or writing the file opens it again.
    @Test func owedFilesHoldNoDescriptor() throws {
        let store = FakeObjectStore()
        let spool = TestScratch.directory + "cssp-hostile-spool-" + UUID().uuidString
        let fs = makeFilesystem(store, spool: spool)
        defer { fs.shutdown() }
        var inodes: [InodeNumber] = []
        for index in 0..<20 {
            let (attributes, opened) = try fs.create(parent: root, name: "f\(index)", mode: 0o644, caller: Caller(uid: 1, gid: 1))
            try write(fs, opened.handle, "owed \(index)")
            store.failNextPuts(2)
            #expect(throws: FSError.self) { try fs.flush(handle: opened.handle) }
            fs.release(handle: opened.handle)
            inodes.append(attributes.inode)
        }
        let spools = fs.files.withLock { s in inodes.compactMap { s.openFiles[$0] } }
        #expect(spools.count == 20, "every file is owed")
        #expect(spools.filter(\.isDescriptorOpen).isEmpty, "\(spools.filter(\.isDescriptorOpen).count) descriptors open")
        #expect(try fs.readWhole(inodes[3], chunk: 4) == Array("owed 3".utf8))
        let opened = try fs.open(inodes[5], writable: true, truncate: false)
        try write(fs, opened.handle, " and more", at: 6)
        try fs.flush(handle: opened.handle)
        fs.release(handle: opened.handle)
        #expect(store.object("f5")?.bytes == Array("owed 5 and more".utf8))
    }
}


/// Freed buffers kept for reuse count against the memory budget until they are freed or reused.
struct RecycledBufferBudgetTests {
    static let mebibyte: Int64 = 1 << 20

    func buffer(_ budget: MemoryBudget, forced: Bool = false) -> ByteBuffer? {
        if forced {
            budget.reserve(Self.mebibyte)
        } else {
            guard budget.tryReserve(Self.mebibyte) else { return nil }
        }
        let buffer = ByteBuffer(capacity: Int(Self.mebibyte), recycler: budget.recycler) { budget.release(Self.mebibyte) }
        buffer.fill { $0.count }
        return buffer
    }

    @Test func keptStorageHoldsItsShareUntilTheNextBufferTakesItOver() throws {
        let recycler = BufferRecycler(limit: 8 << 20, minimum: 256 << 10, idle: .seconds(60))
        let budget = MemoryBudget(limit: 4 * Self.mebibyte, recycler: recycler)
        _ = try #require(buffer(budget))
        #expect(recycler.bytesHeld == Int(Self.mebibyte))
        #expect(budget.inUse == Self.mebibyte)
        // The next buffer reserves its own share and takes the storage: one share again.
        let next = try #require(buffer(budget))
        #expect(recycler.bytesHeld == 0)
        #expect(budget.inUse == Self.mebibyte)
        withExtendedLifetime(next) {}
    }

    @Test(arguments: [false, true])
    func aBudgetThatRunsShortFreesWhatIsKept(forced: Bool) throws {
        let recycler = BufferRecycler(limit: 8 << 20, minimum: 256 << 10, idle: .seconds(60))
        let budget = MemoryBudget(limit: 4 * Self.mebibyte, recycler: recycler)
        var live = try (0..<4).map { _ in try #require(buffer(budget)) }
        live.removeAll()
        #expect(budget.inUse == 4 * Self.mebibyte)
        #expect(recycler.bytesHeld == 4 << 20)
        // Full: a read-ahead (tryReserve) or a read someone waits for (reserve) frees the kept
        // storage instead of being refused or going over the limit.
        let more = try #require(buffer(budget, forced: forced))
        #expect(budget.inUse == Self.mebibyte)
        #expect(budget.peak <= 4 * Self.mebibyte)
        withExtendedLifetime(more) {}
    }
}

/// The fault injector models a slow server by waiting in its decision: two requests must be
/// able to wait at once, or every test that models latency this way runs its requests serially.
struct FaultInjectorConcurrencyTests {
    @Test func twoDecisionsThatWaitRunAtOnce() {
        let fake = FakeObjectStore()
        fake.seed("a", [1])
        let inside = ConditionLocked(0)
        let metWhileWaiting = Locked(0)
        let store = FaultInjectingStore(fake) { _ in
            inside.withLock { $0 += 1 }
            // Each decision waits for the other to be inside too (10 s at most).
            if inside.withLock(when: { $0 >= 2 }, timeout: 10, { _ in true }) != nil {
                metWhileWaiting.withLock { $0 += 1 }
            }
            return .none
        }
        DispatchQueue.concurrentPerform(iterations: 2) { _ in _ = try? store.head(key: "a") }
        #expect(metWhileWaiting.withLock { $0 } == 2)
    }
}
