import BlockCache
import Dispatch
import FSCore
import FSJournal
import Locking
import Metrics
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Reads one open file: blocks from the block cache, else ranged GETs, with a read-ahead window
/// that grows while the reader is sequential.
///
/// Subtleties:
/// 1. The kernel sends reads of a sequential reader concurrently and slightly out of order, so
///    "sequential" means "starts where some recent read ended", not strict succession.
/// 2. Every fetch is block-aligned and stores its blocks in the cache. A block being fetched is
///    shared: a second read of it waits for the first fetch (`Block.wait`) instead of its own GET.
/// 3. From the second sequential read on, the window doubles per read, from one block up to
///    `maximumWindow` (mountpoint-s3's ramp), and blocks not cached are fetched ahead, several GETs
///    of up to `fetchSize` at once. A random read resets the window and fetches its own block(s),
///    with their aligned `groupSize` group when the file fits the cache (`neighbours`).
/// 6. A DLO's bytes are cached only when the response names the ETag the open confirmed: its
///    parts can change under a stable manifest, and cached bytes must match their ETag.
/// 4. Without a cache, a random read fetches exactly the bytes asked for (nothing would keep the rest).
/// 7. A file read at random that fits the cache is pulled whole in the background (`startPull`):
///    `pullWorkers` GETs of `groupSize` at a time, each taking the budget first (the pull takes
///    half of it at most: beyond that it stops, and the next random read starts it again where
///    it stopped), while the reads that wait are served as before (a read of a block being
///    pulled waits for that GET). One reader per object version pulls at a time (`pulling`,
///    shared by the mount's readers). A pull ends with its reader (the handle's release): a
///    program that read a few bytes and closed the file does not download the rest.
/// 5. No lock is held during network or cache I/O. Lock order: `FileReader.state`, then `Block.state`.
package final class FileReader: Sendable {
    package let key: String
    /// Runs read-ahead and page-cache stores.
    private let pool: BackgroundPool
    package let size: Int64
    package let etag: String
    package let isManifest: Bool
    /// `container/prefix` of a DLO manifest: a replaced DLO names other parts (uploads use a new
    /// prefix each), which is how a replaced one is recognised (its ETag varies per response).
    package let manifest: String?
    private let store: any ObjectStore
    private let cache: BlockCache?
    private let cacheObject: BlockCache.Object
    private let blockSize: Int64
    private let fetchSize: Int64
    /// What a random read fetches around a missing block (`neighbours`).
    private let groupSize: Int64
    private let maximumWindow: Int64
    /// Shared by every reader of the mount (see `MemoryBudget`).
    private let budget: MemoryBudget
    /// Blocks of reads served from the cache, and not.
    private let cacheHits: Counter?
    private let cacheMisses: Counter?
    /// Object versions being pulled whole by the mount's readers (subtlety 7).
    private let pulling: PullRegistry
    /// GETs a pull keeps running at once.
    package static let pullWorkers = 3
    /// Stores a random reader's fetched range in the kernel's page cache, and the mount's
    /// `KernelCache`, which bounds the stores waiting.
    private let kernel: (cache: KernelCache, store: @Sendable (Int64, UnsafeRawBufferPointer) -> Void)?

    private struct State {
        /// Blocks fetched or being fetched for this handle, by index.
        package var blocks: [Int64: Block] = [:]
        /// Ends of the last few reads (to recognise a sequential reader).
        package var recentEnds: [Int64] = [0]
        package var sequentialRun = 0
        /// Bytes read ahead of a sequential reader; 0 when random.
        package var window: Int64 = 0
        /// Read-ahead has been started for blocks below this index.
        package var aheadEnd: Int64 = 0
        /// The pull (subtlety 7): whether this reader runs it, its workers, the next block to look at.
        package var pulls = false
        package var pullWorkers = 0
        package var pullNext: Int64 = 0
    }

    /// Protects the block table and the access pattern.
    private let state = Locked(State())
    /// Whether a read has been answered: from then on the handle has shown this version, and
    /// another version's bytes would mix with it (`Filesystem.read`).
    private let answered = Atomic<Bool>(false)

    /// Whether its handle was opened with the kernel's pages of the file kept: the kernel may
    /// have served some reads from them without asking (`Filesystem.read`).
    package let keptPages: Bool
    /// When the handle was opened (the filesystem's clock): a handle held open longer than
    /// `attr_timeout` takes a version the mount learned of later (`Filesystem.read`).
    package let openedAt: Double

    /// Whether any read of this reader has been answered (even at EOF).
    package var hasAnswered: Bool { answered.load(ordering: .acquiring) }

    package init(
        store: any ObjectStore, pool: BackgroundPool, key: String, size: Int64, etag: String, manifest: String?,
        cache: BlockCache?, cacheName: String, fetchSize: Int, groupSize: Int, maximumWindow: Int,
        budget: MemoryBudget = MemoryBudget(limit: .max), pulling: PullRegistry = PullRegistry(),
        metrics: MountMetrics? = nil,
        kernel: (cache: KernelCache, store: @Sendable (Int64, UnsafeRawBufferPointer) -> Void)? = nil,
        keptPages: Bool = false, openedAt: Double = 0
    ) {
        self.keptPages = keptPages
        self.openedAt = openedAt
        self.budget = budget
        self.pulling = pulling
        self.cacheHits = cache == nil || etag.isEmpty ? nil : metrics?.cacheHits
        self.cacheMisses = cache == nil || etag.isEmpty ? nil : metrics?.cacheMisses
        self.kernel = kernel
        self.store = store
        self.pool = pool
        self.key = key
        self.size = size
        self.etag = etag
        self.isManifest = manifest != nil
        self.manifest = manifest
        // An object without an ETag has no version to check cached blocks against.
        self.cache = etag.isEmpty ? nil : cache
        self.cacheObject = BlockCache.Object(name: cacheName, etag: etag)
        self.blockSize = Int64(cache?.blockSize ?? min(fetchSize, 1 << 20))
        self.fetchSize = max(Int64(fetchSize) / blockSize, 1) * blockSize
        self.groupSize = max(Int64(groupSize) / blockSize, 1) * blockSize
        self.maximumWindow = Int64(maximumWindow)
    }

    /// The version this reader reads, as a worker that replaces this one takes it over.
    package func adopted(as inode: InodeNumber) -> AdoptedHandle {
        AdoptedHandle(inode: inode, key: key, size: size, etag: etag, manifest: manifest)
    }

    /// Reads up to `length` bytes at `offset` and hands them to `reply` (empty at or past EOF).
    package func read(offset: Int64, length: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(FSError) {
        try readVersion(offset: offset, length: length) { bytes in
            answered.store(true, ordering: .releasing)
            reply(bytes)
        }
    }

    private func readVersion(offset: Int64, length: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(FSError) {
        guard offset < size, length > 0 else {
            reply(UnsafeRawBufferPointer(start: nil, count: 0))
            return
        }
        let end = min(size, offset + Int64(length))
        let first = offset / blockSize
        let last = (end - 1) / blockSize

        let (sequential, known): (Bool, [Int64: Block]) = state.withLock { s in
            let sequential = s.recentEnds.contains(offset) || s.blocks[first] != nil
            s.recentEnds.append(end)
            if s.recentEnds.count > 8 { s.recentEnds.removeFirst() }
            s.sequentialRun = sequential ? s.sequentialRun + 1 : 0
            if s.sequentialRun >= 2 {
                s.window = min(maximumWindow, max(blockSize, s.window * 2))
            } else if !sequential {
                s.window = 0
            }
            var known: [Int64: Block] = [:]
            for index in first...last { known[index] = s.blocks[index] }
            // Blocks behind the reader are done with. The one just behind is kept for reads the
            // kernel sends out of order, unless the memory budget is spent.
            let keep = budget.inUse > budget.limit ? first : first - 1
            for index in s.blocks.keys where index < keep { s.blocks[index] = nil }
            return (sequential, known)
        }
        if cache == nil && !sequential && known.isEmpty {
            try readDirect(offset: offset, end: end, reply: reply)
            return
        }

        if first == last, let block = known[first] {
            // The common case of a sequential reader: one block already fetched or being fetched,
            // replied from the GET's buffer without another copy.
            if sequential { readAhead(after: last) }
            cacheMisses?.add()
            switch block.wait() {
            case .success(let bytes):
                let lower = bytes.range.lowerBound + Int(offset - first * blockSize)
                bytes.buffer.withBytes(lower..<(lower + Int(end - offset)), reply)
                dropServed(first...last, end: end)
                return
            case .failure(let error):
                state.withLock { s in
                    if s.blocks[first] === block { s.blocks[first] = nil }
                }
                throw error
            }
        }
        let output = budget.recycler.take(byteCount: Int(end - offset))
        defer { budget.recycler.give(output) }
        // Which part of block `index` this read needs, and where it goes in `output`.
        func slice(_ index: Int64) -> (range: Range<Int>, at: Int) {
            let lower = max(offset, index * blockSize)
            let upper = min(end, (index + 1) * blockSize)
            return (Int(lower - index * blockSize)..<Int(upper - index * blockSize), Int(lower - offset))
        }
        var waiting: [Int64: Block] = known
        var missing: [Int64] = []
        for index in first...last where known[index] == nil {
            let (range, at) = slice(index)
            if let cache, cache.read(cacheObject, block: index, range: range, into: output.baseAddress! + at) {
                cacheHits?.add()
                continue
            }
            missing.append(index)
        }
        cacheMisses?.add(Int64(missing.count + known.count))
        // The group around a random read is speculative: it takes the budget first, like read-ahead.
        // While the file is pulled whole, a miss fetches only its own blocks: the pull brings the rest.
        let pulled = state.withLock { $0.pullWorkers > 0 }
        var neighbours = sequential || pulled ? [] : neighbours(of: missing)
        if !neighbours.isEmpty && !budget.tryReserve(Int64(neighbours.count) * blockSize) { neighbours = [] }
        let mine: [Int64] = state.withLock { s in
            var mine: [Int64] = []
            for index in missing {
                if let block = s.blocks[index] {
                    waiting[index] = block
                } else {
                    let block = Block(index: index)
                    s.blocks[index] = block
                    waiting[index] = block
                    mine.append(index)
                }
            }
            return mine
        }
        let extra: [Int64: Block] = state.withLock { s in
            var extra: [Int64: Block] = [:]
            for index in neighbours where s.blocks[index] == nil {
                let block = Block(index: index)
                s.blocks[index] = block
                extra[index] = block
            }
            return extra
        }
        budget.release(Int64(neighbours.count - extra.count) * blockSize)
        if sequential { readAhead(after: last) }
        if !sequential && !mine.isEmpty && fitsTheCache { startPull() }
        for run in Self.runs(mine + extra.keys, longest: Int((sequential ? fetchSize : groupSize) / blockSize)) {
            // A random reader waits for the cache writer rather than lose its blocks: they are
            // what its next reads hit. (Read-ahead never waits; its blocks are dropped instead.)
            let speculative = Int64(run.count { extra[$0] != nil }) * blockSize
            load(run.map { waiting[$0] ?? extra[$0]! }, waitForCache: !sequential, reserved: speculative)
        }
        if !extra.isEmpty {
            state.withLock { s in
                for (index, block) in extra where s.blocks[index] === block { s.blocks[index] = nil }
            }
        }
        for (index, block) in waiting {
            switch block.wait() {
            case .success(let bytes):
                let (range, at) = slice(index)
                bytes.buffer.withBytes((bytes.range.lowerBound + range.lowerBound)..<(bytes.range.lowerBound + range.upperBound)) {
                    (output.baseAddress! + at).copyMemory(from: $0.baseAddress!, byteCount: $0.count)
                }
            case .failure(let error):
                state.withLock { s in
                    if s.blocks[index] === block { s.blocks[index] = nil }
                }
                throw error
            }
        }
        if !sequential {
            // A random read's blocks are not kept in memory: the cache has them.
            state.withLock { s in
                for index in mine where s.blocks[index] === waiting[index] { s.blocks[index] = nil }
            }
        }
        reply(UnsafeRawBufferPointer(output))
        dropServed(first...last, end: end)
    }

    /// Once the memory budget is spent, a block whose end a read reached is dropped at once
    /// rather than when the reader moves past it: the kernel keeps the pages it was sent, and
    /// 64 readers each keeping a served block held 64 MiB beyond the budget. A read of it that
    /// arrives late is served again from the cache or the store.
    private func dropServed(_ blocks: ClosedRange<Int64>, end: Int64) {
        guard budget.inUse > budget.limit else { return }
        state.withLock { s in
            for index in blocks where min(size, (index + 1) * blockSize) <= end { s.blocks[index] = nil }
        }
    }

    /// Starts fetches of the blocks in the read-ahead window past block `last` that are neither
    /// cached nor already being fetched.
    private func readAhead(after last: Int64) {
        let lastIndex = (size - 1) / blockSize
        let candidates: [Int64] = state.withLock { s in
            guard s.window > 0 else { return [] }
            let target = min(lastIndex, last + s.window / blockSize)
            let start = max(s.aheadEnd, last + 1)
            guard start <= target else { return [] }
            // Fetch in whole GETs of `fetchSize` (one 1 MiB GET per 1 MiB read costs the server
            // far more), unless nothing is ahead of the reader yet or the end is in reach.
            let perFetch = fetchSize / blockSize
            guard target - start + 1 >= perFetch || start == last + 1 || target == lastIndex else { return [] }
            s.aheadEnd = target + 1
            return (start...target).filter { s.blocks[$0] == nil }
        }
        guard !candidates.isEmpty else { return }
        let uncached = cache.map { cache in candidates.filter { !cache.contains(cacheObject, block: $0) } } ?? candidates
        let runs: [[Block]] = state.withLock { s in
            var runs: [[Block]] = []
            for run in Self.runs(uncached.filter { s.blocks[$0] == nil }, longest: Int(fetchSize / blockSize)) {
                // The budget is spent: read-ahead stops here, and a later read starts it again.
                guard budget.tryReserve(Int64(run.count) * blockSize) else {
                    s.aheadEnd = min(s.aheadEnd, run.first!)
                    break
                }
                runs.append(run.map { index in
                    let block = Block(index: index)
                    s.blocks[index] = block
                    return block
                })
            }
            return runs
        }
        for run in runs {
            let reserved = Int64(run.count) * blockSize
            pool.submitOrRun { self.load(run, reserved: reserved) }
        }
    }

    /// Whether the cache can hold the file (half its size at most): then a random reader gets the
    /// neighbours of its blocks, and the whole file in the background.
    private var fitsTheCache: Bool { cache.map { size <= $0.capacity / 2 } ?? false }

    /// Starts pulling the file whole (subtlety 7), unless this or another reader pulls it already.
    private func startPull() {
        let start: Bool = state.withLock { s in
            guard s.pullWorkers == 0 else { return false }
            if !s.pulls {
                guard pulling.claim(cacheObject) else { return false }
                s.pulls = true
            }
            s.pullWorkers = Self.pullWorkers
            return true
        }
        guard start else { return }
        for _ in 0..<Self.pullWorkers {
            let started = pool.submit { [weak self] in
                while let reader = self, let (run, reserved) = reader.nextPullRun() {
                    reader.load(run, waitForCache: true, reserved: reserved)
                    reader.state.withLock { s in
                        for block in run where s.blocks[block.index] === block { s.blocks[block.index] = nil }
                    }
                }
                self?.pullWorkerEnded()
            }
            if !started { pullWorkerEnded() }
        }
    }

    private func pullWorkerEnded() {
        let done: Bool = state.withLock { s in
            s.pullWorkers -= 1
            guard s.pullWorkers == 0, s.pullNext > (size - 1) / blockSize else { return false }
            return true
        }
        if done { pulling.release(cacheObject) }
    }

    deinit {
        if state.withLock({ $0.pulls }) { pulling.release(cacheObject) }
    }

    /// The next run of blocks the pull fetches (neither cached nor being fetched), with the budget
    /// it took; nil when the file is done or half the budget is spent (the pull then stops there,
    /// and the next random read starts it again). Half: the reads it serves cannot wait, the pull
    /// can (fio's 4 readers peaked at 58-60.5 MiB RSS when the pull could take all 64 MiB).
    private func nextPullRun() -> (run: [Block], reserved: Int64)? {
        guard let cache else { return nil }
        let lastIndex = (size - 1) / blockSize
        let longest = groupSize / blockSize
        while true {
            let candidates: [Int64] = state.withLock { s in
                var found: [Int64] = []
                while s.pullNext <= lastIndex && Int64(found.count) < longest {
                    if s.blocks[s.pullNext] == nil {
                        found.append(s.pullNext)
                    } else if !found.isEmpty {
                        break
                    }
                    s.pullNext += 1
                }
                return found
            }
            guard let first = candidates.first else { return nil }
            let uncached = candidates.filter { !cache.contains(cacheObject, block: $0) }
            guard !uncached.isEmpty else { continue }
            // One GET for the first consecutive stretch; the rest is looked at again.
            let stretch = Self.runs(uncached, longest: Int(longest))[0]
            if stretch.count < uncached.count {
                state.withLock { s in s.pullNext = min(s.pullNext, uncached[stretch.count]) }
            }
            let reserved = Int64(stretch.count) * blockSize
            guard budget.tryReserve(reserved, upTo: budget.limit / 2) else {
                state.withLock { s in s.pullNext = min(s.pullNext, first) }
                return nil
            }
            let run: [Block] = state.withLock { s in
                // (A read may have taken a block meanwhile: the GET then spans its bytes too.)
                stretch.filter { s.blocks[$0] == nil }.map { index in
                    let block = Block(index: index)
                    s.blocks[index] = block
                    return block
                }
            }
            // Blocks a read took meanwhile are its own fetch's: give their budget back.
            budget.release(reserved - Int64(run.count) * blockSize)
            if run.isEmpty { continue }
            return (run, Int64(run.count) * blockSize)
        }
    }

    /// For a random read of a file the cache can hold (half its size at most): the other blocks of
    /// the aligned `groupSize` group around each missing block, not cached yet. One GET of 4 MiB
    /// (52 ms here) costs far less than four of 1 MiB (21 ms each), and a file read at random is mostly read again,
    /// so filling it in large pieces turns later reads into cache hits. Files larger than that
    /// fetch only the blocks asked for.
    private func neighbours(of missing: [Int64]) -> [Int64] {
        guard let cache, !missing.isEmpty, fitsTheCache else { return [] }
        let group = groupSize / blockSize
        let lastIndex = (size - 1) / blockSize
        let wanted = Set(missing)
        var result: [Int64] = []
        for start in Set(missing.map { $0 / group * group }) {
            for index in start..<min(start + group, lastIndex + 1) where !wanted.contains(index) {
                if !cache.contains(cacheObject, block: index) { result.append(index) }
            }
        }
        return result
    }

    /// Groups ascending block indexes into runs of consecutive ones, each at most `longest` long.
    package static func runs(_ indexes: [Int64], longest: Int) -> [[Int64]] {
        var runs: [[Int64]] = []
        for index in indexes.sorted() {
            if let previous = runs.last?.last, previous == index - 1, runs[runs.count - 1].count < longest {
                runs[runs.count - 1].append(index)
            } else {
                runs.append([index])
            }
        }
        return runs
    }

    private func readDirect(offset: Int64, end: Int64, reply: (UnsafeRawBufferPointer) -> Void) throws(FSError) {
        let (bytes, _) = try fetch(ByteRange(lower: offset, upper: end - 1), reserved: 0)
        bytes.withBytes(0..<bytes.count, reply)
    }

    /// Fetches consecutive blocks with one GET, finishes them, and offers them to the cache.
    /// `reserved`: bytes of the budget already taken for it (read-ahead, neighbours); the fetch
    /// takes what the range needs beyond that.
    private func load(_ run: [Block], waitForCache: Bool = false, reserved: Int64 = 0) {
        guard let head = run.first, let tail = run.last else { return }
        let lower = head.index * blockSize
        let upper = min(size, (tail.index + 1) * blockSize) - 1
        do throws(FSError) {
            let (buffer, versionChecked) = try fetch(ByteRange(lower: lower, upper: upper), reserved: reserved)
            func range(of block: Block) -> Range<Int> {
                let start = Int((block.index - head.index) * blockSize)
                return start..<min(buffer.count, start + Int(blockSize))
            }
            // Every waiting read first; then the cache, whose queue may make this thread wait.
            for block in run { block.finish(.success(Block.Bytes(buffer: buffer, range: range(of: block)))) }
            for block in run {
                let range = range(of: block)
                if versionChecked {
                    cache?.store(
                        cacheObject, block: block.index, bytes: buffer, range: range, waitForRoom: waitForCache,
                        streaming: !waitForCache)
                }
            }
            // Only for random readers: a sequential one is served by the kernel's own read-ahead.
            // Never on this thread: the kernel locks the pages the pending read is waiting for,
            // so storing into them before that read is answered would deadlock.
            // Few stores wait at a time (each holds its 4 MiB buffer); past that the bytes are
            // not offered: the kernel will simply ask for them.
            if waitForCache && versionChecked, let kernel, kernel.cache.reserveQueuedStore() {
                let offered = pool.submit {
                    buffer.withBytes(0..<buffer.count) { kernel.store(lower, $0) }
                    kernel.cache.endQueuedStore()
                }
                if !offered { kernel.cache.endQueuedStore() }
            }
        } catch {
            for block in run { block.finish(.failure(error)) }
        }
    }

    /// The bytes of `range`, and whether the response proved they belong to `etag`.
    private func fetch(_ range: ByteRange, reserved: Int64) throws(FSError) -> (ByteBuffer, versionChecked: Bool) {
        // The buffer holds its bytes of the budget until it is freed.
        let more = max(0, range.length - reserved)
        budget.reserve(more)
        let held = reserved + more
        let budget = self.budget
        let buffer = ByteBuffer(capacity: Int(range.length), recycler: budget.recycler) { budget.release(held) }
        let info: ObjectInfo
        do throws(ObjectStoreError) {
            info = try store.get(key: key, range: range) { buffer.append($0) }
        } catch where error.code == .rangeNotSatisfiable {
            // The range lies within the version that was opened: the object is shorter now.
            throw FSError(.stale, "read '\(key)': the object changed on the server while it was open")
        } catch {
            throw FSError(storeError: error, operation: "read", path: key)
        }
        // A DLO's ETag is computed per response and may be absent on ranges: a DLO is checked by
        // the parts its manifest names, a plain object by its ETag. A different one, or the other
        // kind of object, means the object was replaced since it was opened.
        let replaced =
            isManifest
            ? info.manifest != manifest : info.manifest != nil || (!info.etag.isEmpty && info.etag != etag)
        if replaced {
            throw FSError(.stale, "read '\(key)': the object changed on the server while it was open")
        }
        guard buffer.count == Int(range.length) else {
            throw FSError(
                .ioError, "read '\(key)': expected \(range.length) bytes at \(range.lower), got \(buffer.count)")
        }
        return (buffer, info.etag == etag)
    }
}

/// The object versions a mount's readers are pulling whole (`FileReader`, subtlety 7): one
/// reader per version pulls at a time.
package final class PullRegistry: Sendable {
    private let objects = Locked<Set<BlockCache.Object>>([])

    /// Whether the caller may pull `object` (nobody else does).
    package func claim(_ object: BlockCache.Object) -> Bool { objects.withLock { $0.insert(object).inserted } }

    package func release(_ object: BlockCache.Object) { _ = objects.withLock { $0.remove(object) } }

    package init() {}
}

/// One block of an object, fetched once and shared by the reads that need it.
package final class Block: Sendable {
    /// Where the block's bytes are: a range of the buffer of the GET that fetched it.
    package struct Bytes: Sendable {
        package var buffer: ByteBuffer
        package var range: Range<Int>
    }

    package let index: Int64
    private let state = Locked<Result<Bytes, FSError>?>(nil)
    private let latch = Latch()

    package init(index: Int64) { self.index = index }

    package func finish(_ result: Result<Bytes, FSError>) {
        state.withLock { $0 = result }
        latch.open()
    }

    package func wait() -> Result<Bytes, FSError> {
        latch.wait()
        return state.withLock { $0! }
    }
}

/// A gate that opens once; waiters block until then. (Mutex has no condition variable.)
package final class Latch: @unchecked Sendable {  // All fields are guarded by `mutex`.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var isOpen = false

    package init() {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    package func open() {
        pthread_mutex_lock(mutex)
        isOpen = true
        pthread_cond_broadcast(condition)
        pthread_mutex_unlock(mutex)
    }

    package func wait() {
        pthread_mutex_lock(mutex)
        while !isOpen { pthread_cond_wait(condition, mutex) }
        pthread_mutex_unlock(mutex)
    }
}
