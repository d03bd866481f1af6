import Foundation
import ObjectStoreTesting
import Locking
import Logging
import Synchronization
import Testing

@testable import BlockCache

/// The cache on its own: round trips, the size cap, eviction order, versions, persistence and
/// damaged files. Each test uses its own database in a fresh temporary directory.
struct BlockCacheTests {
    static let block = 64 << 10

    /// A clock the test moves by hand (microseconds).
    final class Clock: Sendable {
        let value = Atomic<Int64>(1_000_000_000)
        func advance(seconds: Int64) { value.add(seconds * 1_000_000, ordering: .relaxed) }
        var now: @Sendable () -> Int64 { { self.value.load(ordering: .relaxed) } }
    }

    /// Keeps warnings so tests can check that a rebuild was announced.
    final class Warnings: Sendable {
        let messages = Mutex<[String]>([])
        var logger: Logger {
            Logger(label: "test") { _ in Handler(sink: self) }
        }
        struct Handler: LogHandler {
            let sink: Warnings
            var logLevel: Logger.Level = .debug
            var metadata: Logger.Metadata = [:]
            subscript(metadataKey key: String) -> Logger.Metadata.Value? {
                get { metadata[key] }
                set { metadata[key] = newValue }
            }
            func log(event: LogEvent) {
                if event.level >= .warning { sink.messages.withLock { $0.append("\(event.message)") } }
            }
        }
    }

    let directory: String = {
        let path = TestScratch.directory + "cssp-cache-test-" + UUID().uuidString
        try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }()
    var path: String { directory + "/blocks.db" }

    func open(
        capacity: Int64 = 1 << 30, blockSize: Int = block, clock: Clock = Clock(), warnings: Warnings = Warnings(),
        boot: String = "this boot"
    ) -> BlockCache {
        BlockCache.open(
            path: path, capacity: capacity, blockSize: blockSize, logger: warnings.logger, clock: clock.now, boot: boot)!
    }

    /// A block-sized buffer whose bytes are derived from `seed`.
    func bytes(_ seed: UInt8, count: Int = block) -> ByteBuffer {
        let buffer = ByteBuffer(capacity: count)
        let values = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31) &+ seed }
        values.withUnsafeBytes { buffer.append($0) }
        return buffer
    }

    func read(_ cache: BlockCache, _ object: BlockCache.Object, _ index: Int64, _ range: Range<Int> = 0..<block) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: range.count)
        let hit = out.withUnsafeMutableBytes { cache.read(object, block: index, range: range, into: $0.baseAddress!) }
        return hit ? out : nil
    }

    func expected(_ seed: UInt8, _ range: Range<Int> = 0..<block) -> [UInt8] {
        bytes(seed).withBytes(range) { [UInt8]($0) }
    }

    @Test func storedBlocksReadBackWholeAndInPart() {
        let cache = open()
        let object = BlockCache.Object(name: "s/a", etag: "e1")
        cache.store(object, block: 0, bytes: bytes(1), range: 0..<Self.block)
        #expect(read(cache, object, 0) == expected(1))  // from the write queue or the file
        cache.waitUntilWritten()
        #expect(read(cache, object, 0) == expected(1))
        #expect(read(cache, object, 0, 100..<4196) == expected(1, 100..<4196))
        #expect(cache.contains(object, block: 0))
        #expect(!cache.contains(object, block: 1))
        #expect(read(cache, object, 1) == nil)
        #expect(read(cache, BlockCache.Object(name: "s/b", etag: "e1"), 0) == nil)
    }

    @Test func aShortLastBlockAnswersOnlyWhatItHolds() {
        let cache = open()
        let object = BlockCache.Object(name: "s/short", etag: "e")
        cache.store(object, block: 3, bytes: bytes(9, count: 1000), range: 0..<1000)
        cache.waitUntilWritten()
        #expect(read(cache, object, 3, 0..<1000) == bytes(9, count: 1000).withBytes(0..<1000) { [UInt8]($0) })
        #expect(read(cache, object, 3, 0..<1001) == nil)
    }

    @Test func aNewVersionNeverReturnsOldBytesAndReplacesTheOldBlocks() {
        let cache = open()
        let old = BlockCache.Object(name: "s/f", etag: "v1")
        let new = BlockCache.Object(name: "s/f", etag: "v2")
        for index in 0..<4 { cache.store(old, block: Int64(index), bytes: bytes(UInt8(index)), range: 0..<Self.block) }
        cache.waitUntilWritten()
        #expect(read(cache, new, 0) == nil)
        #expect(!cache.contains(new, block: 1))
        cache.store(new, block: 0, bytes: bytes(200), range: 0..<Self.block)
        cache.waitUntilWritten()
        #expect(read(cache, new, 0) == expected(200))
        #expect(read(cache, old, 1) == nil)
        let stats = cache.statistics()
        #expect(stats.blocks == 1)
        #expect(stats.bytes == Int64(Self.block))
        #expect(stats.diskBytes <= cache.capacity)
    }

    @Test func theCapHoldsAndTheLeastRecentlyUsedBlocksGoFirst() {
        let clock = Clock()
        let cache = open(capacity: Int64(4 * Self.block), clock: clock)
        let object = BlockCache.Object(name: "s/big", etag: "e")
        for index in 0..<4 {
            cache.store(object, block: Int64(index), bytes: bytes(UInt8(index)), range: 0..<Self.block)
            cache.waitUntilWritten()
            clock.advance(seconds: 10)
        }
        // Block 0 is the oldest, but reading it makes block 1 the least recently used.
        #expect(read(cache, object, 0) == expected(0))
        cache.waitUntilWritten()
        clock.advance(seconds: 10)
        cache.store(object, block: 4, bytes: bytes(4), range: 0..<Self.block)
        let stats = cache.statistics()
        #expect(stats.bytes <= cache.capacity)
        #expect(stats.blocks == 4)
        #expect(stats.diskBytes <= cache.capacity)
        #expect(read(cache, object, 1) == nil)
        #expect(read(cache, object, 0) == expected(0))
        #expect(read(cache, object, 4) == expected(4))
    }

    @Test func manyWritersOnTwoConnectionsNeverExceedTheCap() {
        // Two caches on one file stand for two mounts (processes) sharing a cache directory.
        let first = open(capacity: Int64(10 * Self.block))
        let second = open(capacity: Int64(10 * Self.block))
        DispatchQueue.concurrentPerform(iterations: 16) { worker in
            let cache = worker % 2 == 0 ? first : second
            let object = BlockCache.Object(name: "s/w\(worker)", etag: "e")
            for index in 0..<8 {
                cache.store(object, block: Int64(index), bytes: bytes(UInt8(index)), range: 0..<Self.block)
            }
        }
        first.waitUntilWritten()
        let stats = second.statistics()
        #expect(stats.bytes <= Int64(10 * Self.block))
        #expect(stats.diskBytes <= Int64(10 * Self.block))
        #expect(stats.blocks > 0)
    }

    @Test func onlyTheOwnerCanReadTheCache() throws {
        let cache = open()
        cache.store(BlockCache.Object(name: "s/p", etag: "e"), block: 0, bytes: bytes(1), range: 0..<Self.block)
        cache.waitUntilWritten()
        for file in [path, path + "-wal"] {
            let mode = try #require(FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int)
            #expect(mode & 0o077 == 0, "\(file) has mode \(String(mode, radix: 8))")
        }
    }

    @Test func blocksSurviveReopening() {
        let object = BlockCache.Object(name: "s/keep", etag: "e")
        do {
            let cache = open()
            cache.store(object, block: 7, bytes: bytes(7), range: 0..<Self.block)
            cache.waitUntilWritten()
        }
        let again = open()
        #expect(read(again, object, 7) == expected(7))
    }

    @Test func aDamagedFileIsRebuiltWithAWarning() throws {
        try Data(repeating: 0x5A, count: 100_000).write(to: URL(fileURLWithPath: path))
        let warnings = Warnings()
        let cache = open(warnings: warnings)
        #expect(warnings.messages.withLock { $0.contains { $0.contains("damaged") && $0.contains("rebuilding") } })
        let object = BlockCache.Object(name: "s/x", etag: "e")
        cache.store(object, block: 0, bytes: bytes(3), range: 0..<Self.block)
        cache.waitUntilWritten()
        #expect(read(cache, object, 0) == expected(3))
    }

    @Test func anotherProgramsDatabaseIsRebuiltWithAWarning() throws {
        do {
            let foreign = try SQLiteConnection(path: path)
            try foreign.execute("CREATE TABLE notes(text TEXT); INSERT INTO notes VALUES('hello')")
        }
        let warnings = Warnings()
        let cache = open(warnings: warnings)
        #expect(warnings.messages.withLock { $0.contains { $0.contains("other program") } })
        let object = BlockCache.Object(name: "s/x", etag: "e")
        cache.store(object, block: 0, bytes: bytes(4), range: 0..<Self.block)
        #expect(cache.statistics().blocks == 1)
    }

    @Test func aDifferentBlockSizeStartsEmpty() {
        let object = BlockCache.Object(name: "s/x", etag: "e")
        do {
            let cache = open()
            cache.store(object, block: 0, bytes: bytes(5), range: 0..<Self.block)
            cache.waitUntilWritten()
        }
        let other = open(blockSize: 2 * Self.block)
        #expect(other.statistics().blocks == 0)
        #expect(read(other, object, 0) == nil)
    }

    @Test func aCapBelowOneBlockMeansNoCache() {
        #expect(BlockCache.open(path: path, capacity: 1000, blockSize: Self.block, logger: Logger(label: "t")) == nil)
    }

    /// A power cut may lose data pages whose rows survived: a cache changed in an earlier boot
    /// and not synced since (no clean unmount) starts empty; a synced one is kept.
    @Test func aCacheChangedBeforeARestartIsTrustedOnlyIfItWasSynced() {
        let object = BlockCache.Object(name: "s/boot", etag: "e")
        do {
            let cache = open(boot: "first")
            cache.store(object, block: 0, bytes: bytes(1), range: 0..<Self.block)
            cache.waitUntilWritten()
        }
        #expect(read(open(boot: "first"), object, 0) == expected(1), "a killed mount of this boot left it")
        let afterRestart = open(boot: "second")
        #expect(read(afterRestart, object, 0) == nil)
        #expect(afterRestart.statistics().blocks == 0)
        afterRestart.store(object, block: 0, bytes: bytes(2), range: 0..<Self.block)
        afterRestart.markClean()
        #expect(read(open(boot: "third"), object, 0) == expected(2))
    }

    @Test func aSmallerCapCutsTheDataFile() {
        let object = BlockCache.Object(name: "s/cut", etag: "e")
        do {
            let cache = open(capacity: Int64(8 * Self.block))
            for index in 0..<8 { cache.store(object, block: Int64(index), bytes: bytes(UInt8(index)), range: 0..<Self.block) }
            #expect(cache.statistics().blocks == 8)
        }
        let smaller = open(capacity: Int64(2 * Self.block))
        let stats = smaller.statistics()
        #expect(stats.blocks <= 2)
        #expect(stats.diskBytes <= Int64(2 * Self.block))
        let hits = (0..<8).filter { read(smaller, object, Int64($0)) != nil }
        #expect(hits.count == Int(stats.blocks))
        for index in hits { #expect(read(smaller, object, Int64(index)) == expected(UInt8(index))) }
    }

    /// A read looked up its block; before it reads the bytes, the block is evicted and another
    /// is written into the same slot (a full cache of one block). The read is a miss, not the
    /// other block's bytes.
    @Test func aReadWhoseSlotIsReusedBeforeItsPreadIsAMiss() {
        let cache = open(capacity: Int64(Self.block))
        let first = BlockCache.Object(name: "s/first", etag: "e")
        let second = BlockCache.Object(name: "s/second", etag: "e")
        cache.store(first, block: 0, bytes: bytes(1), range: 0..<Self.block)
        cache.waitUntilWritten()
        let found = DispatchSemaphore(value: 0)
        let go = DispatchSemaphore(value: 0)
        cache.afterLookup.withLock { hook in
            hook = {
                found.signal()
                go.wait()
            }
        }
        let result = Locked<[UInt8]?>(nil)
        let finished = DispatchSemaphore(value: 0)
        let reader = Thread {
            let bytes = read(cache, first, 0)
            result.withLock { $0 = bytes }
            finished.signal()
        }
        reader.start()
        found.wait()
        cache.afterLookup.withLock { $0 = nil }
        cache.store(second, block: 0, bytes: bytes(2), range: 0..<Self.block)
        cache.waitUntilWritten()
        go.signal()
        finished.wait()
        let missed = result.withLock { $0 == nil }
        #expect(missed, "the read returned bytes of another block")
        #expect(read(cache, second, 0) == expected(2))
        #expect(cache.statistics().diskBytes <= Int64(Self.block))
    }
}

/// Large buffers hand their storage to the next buffer of the same size, within bounds.
struct BufferRecyclerTests {
    static let mebibyte = 1 << 20

    func filled(_ count: Int, _ recycler: BufferRecycler, byte: UInt8 = 7) -> ByteBuffer {
        let buffer = ByteBuffer(capacity: count, recycler: recycler)
        buffer.fill { space in
            space.initializeMemory(as: UInt8.self, repeating: byte)
            return space.count
        }
        return buffer
    }

    @Test func aFreedBufferIsReusedByTheNextOfItsSizeOnly() {
        let recycler = BufferRecycler(limit: 8 * Self.mebibyte, minimum: 256 << 10, idle: .seconds(60))
        var freed: [Int: UnsafeRawPointer] = [:]
        for count in [Self.mebibyte, 2 * Self.mebibyte] {
            let buffer = filled(count, recycler)
            freed[count] = buffer.withBytes(0..<1) { $0.baseAddress! }
        }
        #expect(recycler.bytesHeld == 3 * Self.mebibyte)

        let other = ByteBuffer(capacity: 3 * Self.mebibyte, recycler: recycler)
        #expect(recycler.bytesHeld == 3 * Self.mebibyte)
        let same = ByteBuffer(capacity: Self.mebibyte, recycler: recycler)
        #expect(recycler.bytesHeld == 2 * Self.mebibyte)
        same.fill { space in
            #expect(UnsafeRawPointer(space.baseAddress!) == freed[Self.mebibyte])
            return 0
        }
        // A recycled buffer starts empty, whatever its storage held.
        #expect(same.count == 0)
        #expect(same.capacity == Self.mebibyte)
        withExtendedLifetime(other) {}
    }

    @Test func smallBuffersAreNeverKept() {
        let recycler = BufferRecycler(limit: 8 * Self.mebibyte, minimum: 256 << 10, idle: .seconds(60))
        for _ in 0..<4 { _ = filled(64 << 10, recycler) }
        #expect(recycler.bytesHeld == 0)
    }

    @Test func whatIsKeptStaysWithinTheLimitDroppingTheOldest() {
        let recycler = BufferRecycler(limit: 3 * Self.mebibyte, minimum: 256 << 10, idle: .seconds(60))
        var live = (0..<5).map { _ in filled(Self.mebibyte, recycler) }
        live.removeAll()
        #expect(recycler.bytesHeld == 3 * Self.mebibyte)
        // A buffer larger than the limit is never kept.
        _ = filled(4 * Self.mebibyte, recycler)
        #expect(recycler.bytesHeld == 3 * Self.mebibyte)
    }

    @Test func storageIdleLongerThanItsTimeIsFreed() async throws {
        let recycler = BufferRecycler(limit: 8 * Self.mebibyte, minimum: 256 << 10, idle: .seconds(5))
        _ = filled(Self.mebibyte, recycler)
        #expect(recycler.trim(now: .now) == Self.mebibyte)
        #expect(recycler.trim(now: .now + .seconds(6)) == 0)
        #expect(recycler.bytesHeld == 0)
    }

    @Test func theRecyclersOwnTimerFreesIdleStorage() async throws {
        // Long enough that the check right after the free cannot lose a race with the timer.
        let recycler = BufferRecycler(limit: 8 * Self.mebibyte, minimum: 256 << 10, idle: .milliseconds(500))
        _ = filled(Self.mebibyte, recycler)
        #expect(recycler.bytesHeld == Self.mebibyte)
        // Waits for the timer (a condition with a deadline, not a sleep standing in for one).
        let deadline = ContinuousClock.now + .seconds(10)
        while recycler.bytesHeld > 0 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
        #expect(recycler.bytesHeld == 0)
        // After it ran dry, a new buffer starts a new timer.
        _ = filled(Self.mebibyte, recycler)
        let again = ContinuousClock.now + .seconds(10)
        while recycler.bytesHeld > 0 && ContinuousClock.now < again { try await Task.sleep(for: .milliseconds(10)) }
        #expect(recycler.bytesHeld == 0)
    }
}
