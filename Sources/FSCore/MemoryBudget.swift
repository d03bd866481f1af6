import BlockCache
import Synchronization

/// The bytes of fetched data the mount holds in memory at once: every GET buffer of a reader
/// counts from its allocation until the last block of it is dropped (the reader moved on, the
/// cache writer stored it). Read-ahead asks first and is skipped when the budget is spent (the
/// back-pressure: 64 parallel readers share it instead of each growing its own window); a read
/// the kernel waits for always gets its bytes, so every reader makes progress.
///
/// Freed buffers kept for reuse (`BufferRecycler`) still hold their bytes of the budget; when it
/// runs short they are freed first.
public final class MemoryBudget: Sendable {
    public let limit: Int64
    private let used = Atomic<Int64>(0)
    private let highest = Atomic<Int64>(0)
    /// Where the budget's buffers go when freed.
    public let recycler: BufferRecycler

    public init(limit: Int64, recycler: BufferRecycler = .shared) {
        self.limit = limit
        self.recycler = recycler
    }

    /// Bytes held now, and the most held at once since the mount started.
    public var inUse: Int64 { used.load(ordering: .relaxed) }
    public var peak: Int64 { highest.load(ordering: .relaxed) }

    /// Takes `bytes` if they fit within the limit, or within `ceiling` if lower (work that
    /// may wait, like a background pull, leaves the rest to readers).
    package func tryReserve(_ bytes: Int64, upTo ceiling: Int64 = .max) -> Bool {
        let bound = min(ceiling, limit)
        if take(bytes, upTo: bound) { return true }
        recycler.drain()
        return take(bytes, upTo: bound)
    }

    private func take(_ bytes: Int64, upTo bound: Int64) -> Bool {
        var current = used.load(ordering: .relaxed)
        while true {
            guard current + bytes <= bound else { return false }
            let (exchanged, original) = used.compareExchange(
                expected: current, desired: current + bytes, ordering: .relaxed)
            if exchanged {
                notePeak(current + bytes)
                return true
            }
            current = original
        }
    }

    /// Takes `bytes` whatever the limit (a read someone waits for).
    package func reserve(_ bytes: Int64) {
        if used.load(ordering: .relaxed) + bytes > limit { recycler.drain() }
        notePeak(used.add(bytes, ordering: .relaxed).newValue)
    }

    package func release(_ bytes: Int64) {
        used.subtract(bytes, ordering: .relaxed)
    }

    private func notePeak(_ value: Int64) {
        var seen = highest.load(ordering: .relaxed)
        while value > seen {
            let (exchanged, original) = highest.compareExchange(expected: seen, desired: value, ordering: .relaxed)
            if exchanged { return }
            seen = original
        }
    }
}
