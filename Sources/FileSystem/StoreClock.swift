import Synchronization

/// Orders what the store said against what this mount did (the attribute rule, `Node+Merge`).
///
/// A tick is taken right before a request whose answer may describe a node is sent (the answer's
/// `askedAt`), and right after the store acknowledged one of this mount's changes (the node's
/// `describedAsOf`). Ticks only grow, so an answer asked before an acknowledgement has the
/// smaller tick, whichever thread took them. Wall-clock and test-clock time cannot order these:
/// two of them may fall in the same microsecond, and a test clock stands still.
final class StoreClock: Sendable {
    private let last = Atomic<UInt64>(0)

    /// A new tick, larger than every tick taken before.
    func tick() -> UInt64 { last.add(1, ordering: .sequentiallyConsistent).newValue }
}
