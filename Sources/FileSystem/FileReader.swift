import Dispatch
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Reads one open file: ranged GETs with an in-memory, chunked read-ahead.
///
/// Subtleties:
/// 1. The kernel sends reads of a sequential reader concurrently and slightly out of order, so
///    "sequential" means "starts where some recent read ended", not strict succession.
/// 2. A chunk being fetched is shared: a second read of it waits for the first fetch instead of
///    issuing its own GET (`Chunk.wait`).
/// 3. Random access (a read far from the last one) fetches exactly the bytes asked for and starts
///    no read-ahead, so 4 KiB random reads cost 4 KiB GETs, not 8 MiB ones.
/// 4. No lock is held during network I/O. Lock order: `FileReader.state`, then `Chunk.state`.
final class FileReader: Sendable {
    let key: String
    let size: Int64
    let etag: String
    let isManifest: Bool
    private let store: any ObjectStore
    private let chunkSize: Int64
    private let readAheadChunks: Int

    private struct State {
        /// Chunks fetched or being fetched, by index.
        var chunks: [Int64: Chunk] = [:]
        /// Ends of the last few reads (to recognise a sequential reader).
        var recentEnds: [Int64] = [0]
        var sequentialRun = 0
    }

    /// Protects the chunk table and the access pattern.
    private let state = Mutex(State())

    init(store: any ObjectStore, key: String, size: Int64, etag: String, isManifest: Bool, chunkSize: Int, readAheadChunks: Int) {
        self.store = store
        self.key = key
        self.size = size
        self.etag = etag
        self.isManifest = isManifest
        self.chunkSize = Int64(chunkSize)
        self.readAheadChunks = readAheadChunks
    }

    /// Reads up to `length` bytes at `offset` and hands them to `reply` (empty at or past EOF).
    func read(offset: Int64, length: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(FSError) {
        guard offset < size, length > 0 else {
            reply(UnsafeRawBufferPointer(start: nil, count: 0))
            return
        }
        let end = min(size, offset + Int64(length))
        let first = offset / chunkSize
        let last = (end - 1) / chunkSize

        let plan: (needed: [Chunk], mine: [Chunk], prefetch: [Chunk])? = state.withLock { s in
            let sequential = s.recentEnds.contains(offset) || s.chunks[first] != nil
            s.recentEnds.append(end)
            if s.recentEnds.count > 8 { s.recentEnds.removeFirst() }
            s.sequentialRun = sequential ? s.sequentialRun + 1 : 0
            guard sequential else { return nil }
            var needed: [Chunk] = []
            var mine: [Chunk] = []
            for index in first...last {
                if let chunk = s.chunks[index] {
                    needed.append(chunk)
                } else {
                    let chunk = Chunk(index: index)
                    s.chunks[index] = chunk
                    needed.append(chunk)
                    mine.append(chunk)
                }
            }
            var prefetch: [Chunk] = []
            // Read ahead from the second sequential read on: one read (`file`, `head -c`) is not a stream.
            let depth = min(readAheadChunks, s.sequentialRun - 1)
            let lastIndex = (size - 1) / chunkSize
            if depth > 0 {
                for index in (last + 1)...(last + Int64(depth)) where index <= lastIndex && s.chunks[index] == nil {
                    let chunk = Chunk(index: index)
                    s.chunks[index] = chunk
                    prefetch.append(chunk)
                }
            }
            // Chunks behind the reader are done with.
            for index in s.chunks.keys where index < first - 1 { s.chunks[index] = nil }
            return (needed, mine, prefetch)
        }

        guard let plan else {
            try readDirect(offset: offset, end: end, reply: reply)
            return
        }
        for chunk in plan.prefetch {
            DispatchQueue.global().async { self.load(chunk) }
        }
        for chunk in plan.mine { load(chunk) }

        var pieces: [Chunk.Data] = []
        for chunk in plan.needed {
            switch chunk.wait() {
            case .success(let data): pieces.append(data)
            case .failure(let error):
                state.withLock { s in
                    if s.chunks[chunk.index] === chunk { s.chunks[chunk.index] = nil }
                }
                throw error
            }
        }
        if pieces.count == 1 {
            let data = pieces[0]
            let start = Int(offset - data.offset)
            data.withBytes(start..<Int(end - data.offset), reply)
            return
        }
        var joined = [UInt8]()
        joined.reserveCapacity(Int(end - offset))
        for data in pieces {
            let lower = max(offset, data.offset)
            let upper = min(end, data.offset + Int64(data.count))
            data.withBytes(Int(lower - data.offset)..<Int(upper - data.offset)) { joined.append(contentsOf: $0) }
        }
        joined.withUnsafeBytes(reply)
    }

    private func readDirect(offset: Int64, end: Int64, reply: (UnsafeRawBufferPointer) -> Void) throws(FSError) {
        let bytes = try fetch(ByteRange(lower: offset, upper: end - 1))
        bytes.withBytes(0..<bytes.count, reply)
    }

    private func load(_ chunk: Chunk) {
        let lower = chunk.index * chunkSize
        let upper = min(size, lower + chunkSize) - 1
        do throws(FSError) {
            chunk.finish(.success(try fetch(ByteRange(lower: lower, upper: upper))))
        } catch {
            chunk.finish(.failure(error))
        }
    }

    private func fetch(_ range: ByteRange) throws(FSError) -> Chunk.Data {
        let data = Chunk.Data(offset: range.lower, capacity: Int(range.length))
        let info: ObjectInfo
        do {
            info = try store.get(key: key, range: range) { data.append($0) }
        } catch {
            throw FSError(storeError: error, operation: "read", path: key)
        }
        // A DLO's ETag is computed per response and may be absent on ranges: only plain objects
        // are checked. A different ETag means the object was replaced while open.
        if !isManifest && !info.etag.isEmpty && info.etag != etag {
            throw FSError(.stale, "read '\(key)': the object changed on the server while it was open")
        }
        guard data.count == Int(range.length) else {
            throw FSError(
                .ioError, "read '\(key)': expected \(range.length) bytes at \(range.lower), got \(data.count)")
        }
        return data
    }
}

/// One aligned piece of an object, fetched once and shared by the reads that need it.
final class Chunk: Sendable {
    /// Bytes of a fetched range, in one malloc'd block (a growing [UInt8] costs measurably more).
    final class Data: @unchecked Sendable {  // Written only by the fetching thread before `finish`.
        let offset: Int64
        private let storage: UnsafeMutableRawBufferPointer
        private(set) var count = 0

        init(offset: Int64, capacity: Int) {
            self.offset = offset
            storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(capacity, 1), alignment: 16)
        }

        deinit { storage.deallocate() }

        func append(_ bytes: UnsafeRawBufferPointer) {
            let n = min(bytes.count, storage.count - count)
            guard n > 0 else { return }
            (storage.baseAddress! + count).copyMemory(from: bytes.baseAddress!, byteCount: n)
            count += n
        }

        func withBytes(_ range: Range<Int>, _ body: (UnsafeRawBufferPointer) -> Void) {
            let upper = min(range.upperBound, count)
            let lower = min(range.lowerBound, upper)
            body(UnsafeRawBufferPointer(rebasing: storage[lower..<upper]))
        }
    }

    let index: Int64
    private let state = Mutex<Result<Data, FSError>?>(nil)
    private let latch = Latch()

    init(index: Int64) { self.index = index }

    func finish(_ result: Result<Data, FSError>) {
        state.withLock { $0 = result }
        latch.open()
    }

    func wait() -> Result<Data, FSError> {
        latch.wait()
        return state.withLock { $0! }
    }
}

/// A gate that opens once; waiters block until then. (Mutex has no condition variable.)
final class Latch: @unchecked Sendable {  // All fields are guarded by `mutex`.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var isOpen = false

    init() {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    func open() {
        pthread_mutex_lock(mutex)
        isOpen = true
        pthread_cond_broadcast(condition)
        pthread_mutex_unlock(mutex)
    }

    func wait() {
        pthread_mutex_lock(mutex)
        while !isOpen { pthread_cond_wait(condition, mutex) }
        pthread_mutex_unlock(mutex)
    }
}
