import Dispatch
import Locking

/// Bytes in one malloc'd block: filled by one thread, then only read, by any number of threads.
/// (A growing `[UInt8]` costs measurably more per byte; this is written once, in place.)
public final class ByteBuffer: @unchecked Sendable {  // No lock: `append` happens before publication.
    private let storage: UnsafeMutableRawBufferPointer
    public private(set) var count = 0

    /// Called once the buffer is freed (a memory budget gives its bytes back).
    private let onFree: (@Sendable () -> Void)?
    private let recycler: BufferRecycler

    public init(capacity: Int, recycler: BufferRecycler = .shared, onFree: (@Sendable () -> Void)? = nil) {
        storage = recycler.take(byteCount: max(capacity, 1))
        self.recycler = recycler
        self.onFree = onFree
    }

    deinit {
        recycler.give(storage, onFree: onFree)
    }

    public var capacity: Int { storage.count }

    /// Appends what fits; the rest is dropped (callers size the buffer from the range they asked for).
    public func append(_ bytes: UnsafeRawBufferPointer) {
        let n = min(bytes.count, storage.count - count)
        guard n > 0 else { return }
        (storage.baseAddress! + count).copyMemory(from: bytes.baseAddress!, byteCount: n)
        count += n
    }

    /// Fills the buffer to `count` bytes with `body`, which returns how many it wrote.
    public func fill(_ body: (UnsafeMutableRawBufferPointer) -> Int) {
        count += body(UnsafeMutableRawBufferPointer(rebasing: storage[count...]))
    }

    /// Calls `body` with the bytes in `range`, clipped to what was filled.
    public func withBytes<R, E: Error>(_ range: Range<Int>, _ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        let upper = min(range.upperBound, count)
        let lower = min(range.lowerBound, upper)
        return try body(UnsafeRawBufferPointer(rebasing: storage[lower..<upper]))
    }
}

/// Keeps the storage of recently freed large buffers for the next buffer of the same size.
///
/// The daemon's mmap threshold is fixed (a freed transfer buffer leaves the process), so every
/// new 1 or 4 MiB buffer used to start as untouched pages: the kernel zeroes each one, and on a
/// virtual machine whose host lends memory lazily the first touch costs more still. A cold read
/// of 1 GiB spent a quarter of the daemon's CPU on those faults. Recycled storage is resident
/// and warm. What is kept is bounded (`limit` bytes) and freed after `idle` without use, so an
/// idle mount gives it back; only exact sizes are matched, so a buffer never holds more
/// resident memory than its budget reservation. Kept storage keeps its buffer's reservation
/// (`onFree` runs when the storage is freed or taken over), so a memory budget still bounds
/// what its buffers keep resident; a budget that runs short calls `drain()`. Storage given
/// without an `onFree` (reply buffers) is kept within the same `limit`.
///
/// Buffers of a page or more are 4096-aligned: the block cache writes such blocks with O_DIRECT.
public final class BufferRecycler: Sendable {
    public static let shared = BufferRecycler(limit: 8 << 20, minimum: 256 << 10, idle: .seconds(2))

    private struct Entry: @unchecked Sendable {  // The storage is owned by the recycler alone.
        let storage: UnsafeMutableRawBufferPointer
        let since: ContinuousClock.Instant
        /// What the buffer that used the storage last holds (a budget reservation).
        let onFree: (@Sendable () -> Void)?

        func free() {
            storage.deallocate()
            onFree?()
        }
    }
    private struct State {
        var entries: [Entry] = []  // Oldest first.
        var bytes = 0
        var trimScheduled = false
    }

    private let limit: Int
    private let minimum: Int
    private let idle: Duration
    private let state = Locked(State())

    /// Keeps at most `limit` bytes, of buffers of at least `minimum` bytes, for `idle` each.
    public init(limit: Int, minimum: Int, idle: Duration) {
        self.limit = limit
        self.minimum = minimum
        self.idle = idle
    }

    /// Bytes held for reuse now.
    public var bytesHeld: Int { state.withLock { $0.bytes } }

    /// Storage of `byteCount` bytes, recycled if some of exactly that size is kept. Hand it back
    /// with `give`.
    public func take(byteCount: Int) -> UnsafeMutableRawBufferPointer {
        if byteCount >= minimum {
            let reused: Entry? = state.withLock { state in
                guard let index = state.entries.lastIndex(where: { $0.storage.count == byteCount }) else { return nil }
                state.bytes -= byteCount
                return state.entries.remove(at: index)
            }
            if let reused {
                // The new owner brings its own reservation.
                reused.onFree?()
                return reused.storage
            }
        }
        return .allocate(byteCount: byteCount, alignment: byteCount >= 4096 ? 4096 : 16)
    }

    /// Keeps `storage` (from `take`) for reuse, or frees it. `onFree` runs when the storage is
    /// freed or taken by the next buffer.
    public func give(_ storage: UnsafeMutableRawBufferPointer, onFree: (@Sendable () -> Void)? = nil) {
        let entry = Entry(storage: storage, since: .now, onFree: onFree)
        guard storage.count >= minimum, storage.count <= limit else { return entry.free() }
        var freed: [Entry] = []
        let scheduleTrim: Bool = state.withLock { state in
            state.entries.append(entry)
            state.bytes += storage.count
            while state.bytes > limit {
                let oldest = state.entries.removeFirst()
                state.bytes -= oldest.storage.count
                freed.append(oldest)
            }
            defer { state.trimScheduled = true }
            return !state.trimScheduled
        }
        for entry in freed { entry.free() }
        if scheduleTrim { scheduleTrimming() }
    }

    /// Frees everything kept (a memory budget ran short).
    public func drain() {
        let freed: [Entry] = state.withLock { state in
            defer {
                state.entries = []
                state.bytes = 0
            }
            return state.entries
        }
        for entry in freed { entry.free() }
    }

    /// Frees what has not been reused for `idle` before `now`; returns how many bytes are left.
    @discardableResult
    public func trim(now: ContinuousClock.Instant = .now) -> Int { trim(now: now, fromTimer: false) }

    /// The timer's trim ends the schedule, in the same lock, when nothing is left.
    private func trim(now: ContinuousClock.Instant, fromTimer: Bool) -> Int {
        var freed: [Entry] = []
        let left: Int = state.withLock { state in
            state.entries.removeAll { entry in
                guard now - entry.since >= idle else { return false }
                state.bytes -= entry.storage.count
                freed.append(entry)
                return true
            }
            if fromTimer && state.bytes == 0 { state.trimScheduled = false }
            return state.bytes
        }
        for entry in freed { entry.free() }
        return left
    }

    private func scheduleTrimming() {
        let (seconds, attoseconds) = idle.components
        let delay = DispatchTimeInterval.nanoseconds(Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000))
        DispatchQueue.global(qos: .utility).asyncAfter(deadline: .now() + delay) { [self] in
            if trim(now: .now, fromTimer: true) > 0 { scheduleTrimming() }
        }
    }
}
