import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Orders what the store said against what this mount did (the attribute rule, `Node+Merge`).
///
/// A tick is taken right before a request whose answer may describe a node is sent (the answer's
/// `askedAt`), and right after the store acknowledged one of this mount's changes (the node's
/// `describedAsOf`). Ticks only grow, so an answer asked before an acknowledgement has the
/// smaller tick, whichever thread took them. Wall-clock and test-clock time cannot order these:
/// two of them may fall in the same microsecond, and a test clock stands still.
package final class StoreClock: Sendable {
    private let last = Atomic<UInt64>(0)

    /// A new tick, larger than every tick taken before.
    package func tick() -> UInt64 { last.add(1, ordering: .sequentiallyConsistent).newValue }

    package init() {}
}

/// Seconds on the monotonic clock: every age and deadline of a mount is measured on it (or on a
/// test's clock, `FilesystemConfiguration.clock`).
package func monotonicNow() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}
