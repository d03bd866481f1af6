import BlockCache
import Foundation
import Locking
import Logging
import ObjectStore
import ObjectStoreTesting
import Synchronization
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// The read path with the block cache, against the in-memory store: what is fetched, what is
/// reused across "mounts" (Filesystem instances sharing a cache file), and that bytes are right.
struct FilesystemCacheTests {
    static let block = 64 << 10
    let cachePath = TestScratch.directory + "cssp-unit-cache-" + UUID().uuidString + "/blocks.db"

    func makeFilesystem(
        _ store: any ObjectStore, capacity: Int64 = 64 << 20, budget: MemoryBudget? = nil,
        _ configure: (inout FilesystemConfiguration) -> Void = { _ in }
    ) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configure(&configuration)
        if let budget { configuration.memoryBudget = budget }
        configuration.spoolDirectory = TestScratch.directory + "cssp-unit-spool-" + UUID().uuidString
        configuration.readFetchSize = 4 * Self.block
        configuration.randomFetchSize = 4 * Self.block
        configuration.readAheadWindow = 8 * Self.block
        configuration.blockCache = BlockCache.open(
            path: cachePath, capacity: capacity, blockSize: Self.block, logger: Logger(label: "test"))
        configuration.cacheIdentity = "fake://" + store.containerName
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    func content(_ count: Int, seed: Int = 0) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: ($0 &* 7) ^ ($0 >> 11) &+ seed) }
    }

    func readAll(_ fs: Filesystem, _ name: String, chunk: Int = 32 << 10) throws -> [UInt8] {
        try fs.readWhole(try fs.lookup(parent: Filesystem.rootInode, name: name).inode, chunk: chunk)
    }

    /// Opens `name`, reads, closes. `letThePullFinish`: the handle stays open until the
    /// background work the read started (the pull of the file) is done, since a pull ends with
    /// its reader.
    func read(_ fs: Filesystem, _ name: String, offset: Int64, length: Int, letThePullFinish: Bool = false) throws
        -> [UInt8]
    {
        let inode = try fs.lookup(parent: Filesystem.rootInode, name: name).inode
        let opened = try fs.open(inode, writable: false, truncate: false)
        defer { fs.release(handle: opened.handle) }
        var bytes: [UInt8] = []
        try fs.read(handle: opened.handle, offset: offset, length: length) { bytes.append(contentsOf: $0) }
        if letThePullFinish { #expect(fs.pool.waitUntilIdle(timeout: 30)) }
        return bytes
    }

    @Test func aRemountReadsCachedBlocksWithoutGets() throws {
        let store = FakeObjectStore()
        let data = content(10 * Self.block + 123)
        store.seed("f", data)
        let first = makeFilesystem(store)
        #expect(try readAll(first, "f") == data)
        first.waitForCacheWrites()
        store.resetCounts()
        let second = makeFilesystem(store)
        #expect(try readAll(second, "f") == data)
        #expect(store.counts.get == 0)
        #expect(try read(second, "f", offset: 5 * Int64(Self.block) - 10, length: 20) == Array(data[(5 * Self.block - 10)..<(5 * Self.block + 10)]))
        #expect(store.counts.get == 0)
    }

    /// A random read of a file that fits the cache fetches the aligned group of its block (4
    /// blocks here) and starts pulling the rest of the file in the background: every byte is
    /// fetched once, and then every read is a hit.
    @Test func aRandomReadOfAFileThatFitsTheCachePullsItWholeOnce() throws {
        let store = FakeObjectStore()
        let data = content(8 * Self.block)
        store.seed("f", data)
        let fs = makeFilesystem(store)
        _ = try fs.lookup(parent: Filesystem.rootInode, name: "f")
        store.resetCounts()
        let offset = 5 * Self.block + 4096
        #expect(try read(fs, "f", offset: Int64(offset), length: 4096, letThePullFinish: true) == Array(data[offset..<(offset + 4096)]))
        fs.waitForCacheWrites()
        #expect(store.counts.get == 2)
        #expect(store.counts.getBytes == Int64(8 * Self.block))
        store.resetCounts()
        for index in 0..<8 {
            let at = index * Self.block + 777
            #expect(try read(fs, "f", offset: Int64(at), length: 100) == Array(data[at..<(at + 100)]))
        }
        #expect(store.counts.get == 0)
    }

    /// The pull takes at most half the memory budget: with slow GETs, what the mount holds
    /// stays within half the budget plus the reader's own group (the whole budget without the
    /// cap), and random reads that go on get every byte right.
    @Test func aPullHoldsAtMostHalfTheMemoryBudget() throws {
        let fake = FakeObjectStore()
        let data = content(48 * Self.block)
        fake.seed("f", data)
        let store = FaultInjectingStore(fake) { call in
            if call.operation == .get { usleep(5_000) }
            return .none
        }
        let limit = Int64(16 * Self.block)
        let budget = MemoryBudget(limit: limit, recycler: BufferRecycler(limit: 0, minimum: 1, idle: .seconds(1)))
        let fs = makeFilesystem(store, budget: budget)
        defer { fs.shutdown() }
        _ = try fs.lookup(parent: Filesystem.rootInode, name: "f")
        let offset = 21 * Self.block + 4096
        #expect(try read(fs, "f", offset: Int64(offset), length: 4096, letThePullFinish: true) == Array(data[offset..<(offset + 4096)]))
        for index in [40, 3, 17, 30, 9, 45] {
            let at = index * Self.block + 99
            fs.waitForCacheWrites()
            #expect(try read(fs, "f", offset: Int64(at), length: 1000, letThePullFinish: true) == Array(data[at..<(at + 1000)]))
        }
        fs.waitForCacheWrites()
        #expect(budget.peak <= limit / 2 + Int64(4 * Self.block), "peak \(budget.peak / Int64(Self.block)) blocks")
    }

    /// Fault injection: one GET of the pull fails. Its blocks are not cached (nothing wrong
    /// is), the other runs are pulled, and later reads fetch exactly the failed run and read
    /// every byte right.
    @Test func aPullWhoseGetFailsLeavesItsBlocksToLaterReads() throws {
        let fake = FakeObjectStore()
        let data = content(16 * Self.block)
        fake.seed("f", data)
        let store = FaultInjectingStore(fake)
        let fs = makeFilesystem(store)
        _ = try fs.lookup(parent: Filesystem.rootInode, name: "f")
        // The read's own GET (blocks 4-7) passes; the first GET of the pull fails.
        let failed = Locked(false)
        store.inject { call in
            guard call.operation == .get, let range = call.range, range.lower != Int64(4 * Self.block) else { return .none }
            return failed.withLock { done in
                defer { done = true }
                return done ? .none : .before(.transient)
            }
        }
        let offset = 5 * Self.block + 4096
        #expect(try read(fs, "f", offset: Int64(offset), length: 4096, letThePullFinish: true) == Array(data[offset..<(offset + 4096)]))
        fs.waitForCacheWrites()
        store.heal()
        fake.resetCounts()
        #expect(try readAll(fs, "f", chunk: Self.block) == data)
        #expect(fake.counts.getBytes == Int64(4 * Self.block))
    }

    /// Issue 11: `cssp_cache_hits_total` and `cssp_cache_misses_total` count the blocks reads
    /// found, and did not find, in the cache.
    @Test func readsCountTheirBlocksAsCacheHitsOrMisses() throws {
        let store = FakeObjectStore()
        let data = content(8 * Self.block)
        store.seed("f", data)
        let fs = makeFilesystem(store)
        let metrics = fs.configuration.metrics
        #expect(try readAll(fs, "f", chunk: Self.block) == data)
        #expect(metrics.cacheHits.value == 0)
        #expect(metrics.cacheMisses.value == 8)
        fs.waitForCacheWrites()
        #expect(try readAll(fs, "f", chunk: Self.block) == data)
        #expect(metrics.cacheHits.value == 8)
        #expect(metrics.cacheMisses.value == 8)
    }

    /// The group around a random read is speculative, like read-ahead: with the memory budget
    /// spent (by other readers) only the block asked for is fetched.
    @Test func aRandomReadFetchesOnlyItsBlockWhenTheMemoryBudgetIsSpent() throws {
        let store = FakeObjectStore()
        let data = content(8 * Self.block)
        store.seed("f", data)
        let fs = makeFilesystem(store)
        let budget = fs.configuration.memoryBudget
        budget.reserve(budget.limit)
        defer { budget.release(budget.limit) }
        _ = try fs.lookup(parent: Filesystem.rootInode, name: "f")
        store.resetCounts()
        let offset = 5 * Self.block + 4096
        #expect(try read(fs, "f", offset: Int64(offset), length: 4096) == Array(data[offset..<(offset + 4096)]))
        #expect(store.counts.getBytes == Int64(Self.block))
    }

    @Test func aRandomReadOfAFileLargerThanHalfTheCacheFetchesOnlyItsBlock() throws {
        let store = FakeObjectStore()
        let data = content(8 * Self.block)
        store.seed("f", data)
        let fs = makeFilesystem(store, capacity: Int64(6 * Self.block))
        _ = try fs.lookup(parent: Filesystem.rootInode, name: "f")
        store.resetCounts()
        let offset = 5 * Self.block + 4096
        #expect(try read(fs, "f", offset: Int64(offset), length: 4096) == Array(data[offset..<(offset + 4096)]))
        #expect(store.counts.getBytes == Int64(Self.block))
        #expect(try read(fs, "f", offset: Int64(offset + 20_000), length: 4096) == Array(data[(offset + 20_000)..<(offset + 24_096)]))
        #expect(store.counts.get == 1)
    }

    @Test func randomReadersOfferTheirFetchToTheKernelSequentialOnesDoNot() throws {
        let store = FakeObjectStore()
        let data = content(8 * Self.block)
        store.seed("f", data)
        let fs = makeFilesystem(store)
        let stored = Locked<[(InodeNumber, Int64, [UInt8])]>([])
        let done = DispatchSemaphore(value: 0)
        fs.kernelCache.install(
            store: { inode, offset, bytes in
                stored.withLock { $0.append((inode, offset, [UInt8](bytes))) }
                done.signal()
            }, invalidate: { _, _ in })
        let inode = try fs.lookup(parent: Filesystem.rootInode, name: "f").inode
        _ = try read(fs, "f", offset: Int64(5 * Self.block + 10), length: 100, letThePullFinish: true)
        #expect(done.wait(timeout: .now() + 10) == .success)
        // The read's group, and the rest of the file, which the pull brought.
        let offers = stored.withLock { $0 }.sorted { $0.1 < $1.1 }
        #expect(offers.map(\.0) == [inode, inode])
        #expect(offers.map(\.1) == [0, Int64(4 * Self.block)])
        #expect(offers.map(\.2) == [Array(data[0..<(4 * Self.block)]), Array(data[(4 * Self.block)..<(8 * Self.block)])])
        // A sequential reader is left to the kernel's own read-ahead.
        #expect(try readAll(fs, "f") == data)
        #expect(stored.withLock { $0.count } == 2)
    }

    /// A random reader's bytes reach the kernel from the pool, after its read is answered. An
    /// open that finds another version (the kernel drops the file's pages once it is answered)
    /// is answered only when no store of the old version can land after it: those bytes would
    /// be what its reads get, cut to the new size. (The mount model, seed 4 on c614a74: "a fresh
    /// read gave 2 bytes, neither the old 45 nor the new 2".)
    @Test func noStoreOfAnOldVersionLandsAfterAnOpenOfTheNewOne() throws {
        let store = FakeObjectStore()
        let old = content(45, seed: 1)
        store.seed("f", old)
        let fs = makeFilesystem(store) { $0.attributeCacheSeconds = 0 }
        defer { fs.shutdown() }
        let events = Locked<[String]>([])
        let storing = DispatchSemaphore(value: 0)
        let opened = DispatchSemaphore(value: 0)
        let stored = DispatchSemaphore(value: 0)
        fs.kernelCache.install(
            store: { _, _, bytes in
                storing.signal()
                // A slow store (a busy pool, a page the kernel holds locked): the open of the
                // new version goes first if it may; one that waits for this store never comes.
                _ = opened.wait(timeout: .now() + 1)
                events.withLock { $0.append("stored \(bytes.count) bytes") }
                stored.signal()
            }, invalidate: { _, _ in })
        let inode = try fs.lookup(parent: Filesystem.rootInode, name: "f").inode
        // (Not at 0: a read there is the start of a sequential one, which the kernel's own
        // read-ahead serves.)
        #expect(try read(fs, "f", offset: 10, length: 100) == Array(old[10...]))
        #expect(storing.wait(timeout: .now() + 10) == .success)
        store.seed("f", content(2, seed: 2))
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            defer { done.signal() }
            guard let result = try? fs.open(inode, writable: false, truncate: false) else {
                events.withLock { $0.append("open failed") }
                return
            }
            events.withLock { $0.append(result.keepCache ? "opened keeping the pages" : "opened, pages dropped") }
            opened.signal()
            fs.release(handle: result.handle)
        }
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(stored.wait(timeout: .now() + 10) == .success)
        #expect(events.withLock { $0 } == ["stored 45 bytes", "opened, pages dropped"])
    }

    @Test func aChangedObjectIsNeverServedFromOldBlocks() throws {
        let store = FakeObjectStore()
        let old = content(3 * Self.block, seed: 1)
        store.seed("f", old)
        let first = makeFilesystem(store)
        #expect(try readAll(first, "f") == old)
        first.waitForCacheWrites()
        let new = content(3 * Self.block, seed: 2)
        store.seed("f", new)
        let second = makeFilesystem(store)
        #expect(try readAll(second, "f") == new)
        #expect(try read(second, "f", offset: 100, length: 100) == Array(new[100..<200]))
    }

    @Test func concurrentReadersOfOneFileGetIdenticalBytes() throws {
        let store = FakeObjectStore()
        let data = content(40 * Self.block + 777)
        store.seed("f", data)
        let fs = makeFilesystem(store)
        _ = try fs.lookup(parent: Filesystem.rootInode, name: "f")
        let results = Locked<[Int: [UInt8]]>([:])
        DispatchQueue.concurrentPerform(iterations: 8) { reader in
            // Half read sequentially in odd-sized chunks, half jump around.
            let bytes: [UInt8]
            if reader % 2 == 0 {
                bytes = (try? readAll(fs, "f", chunk: 12_345 + reader * 1000)) ?? []
            } else {
                var assembled = [UInt8](repeating: 0, count: data.count)
                var order = Array(stride(from: 0, to: data.count, by: 50_000))
                order.shuffle()
                for offset in order {
                    let piece = (try? read(fs, "f", offset: Int64(offset), length: 50_000)) ?? []
                    assembled.replaceSubrange(offset..<(offset + piece.count), with: piece)
                }
                bytes = assembled
            }
            results.withLock { $0[reader] = bytes }
        }
        for reader in 0..<8 { #expect(results.withLock { $0[reader] } == data, "reader \(reader)") }
    }

    @Test func evictionKeepsTheCapWhileReading() throws {
        let store = FakeObjectStore()
        let data = content(30 * Self.block)
        store.seed("f", data)
        let fs = makeFilesystem(store, capacity: Int64(6 * Self.block))
        #expect(try readAll(fs, "f") == data)
        fs.waitForCacheWrites()
        let stats = try #require(fs.configuration.blockCache).statistics()
        #expect(stats.bytes <= Int64(6 * Self.block))
        #expect(stats.blocks > 0)
    }

    @Test func whatWasJustWrittenIsReadBackWithoutAGet() throws {
        let store = FakeObjectStore()
        let data = content(5 * Self.block + 99)
        let fs = makeFilesystem(store)
        let (_, opened) = try fs.create(parent: Filesystem.rootInode, name: "w", mode: 0o644, caller: Caller(uid: 0, gid: 0))
        try data.withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        try fs.flush(handle: opened.handle)
        fs.release(handle: opened.handle)
        fs.waitForCacheWrites()
        store.resetCounts()
        let fresh = makeFilesystem(store)
        #expect(try readAll(fresh, "w") == data)
        #expect(store.counts.get == 0)
    }
}
