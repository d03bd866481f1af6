import Dispatch
import Synchronization

/// Bounded parallel loops for work that blocks on the network (part uploads, deletes, renames).
enum Concurrently {
    /// Runs `body(0)`…`body(count - 1)` on at most `width` threads. After the first error no new
    /// index is started; that error is returned.
    static func forEach<E: Error>(_ count: Int, width: Int, _ body: (Int) throws(E) -> Void) -> E? {
        guard count > 0 else { return nil }
        let next = Atomic<Int>(0)
        let firstError = Mutex<E?>(nil)
        withoutActuallyEscaping(body) { body in
            let work = UncheckedSendable(body)
            DispatchQueue.concurrentPerform(iterations: max(1, min(width, count))) { _ in
                while firstError.withLock({ $0 == nil }) {
                    let index = next.add(1, ordering: .relaxed).oldValue
                    if index >= count { return }
                    do throws(E) {
                        try work.value(index)
                    } catch {
                        firstError.withLock { if $0 == nil { $0 = error } }
                    }
                }
            }
        }
        return firstError.withLock { $0 }
    }
}

/// Carries a non-Sendable closure into `concurrentPerform`, whose callers are the synchronous,
/// thread-safe filesystem methods (every closure handed here only calls the thread-safe store).
private struct UncheckedSendable<T>: @unchecked Sendable {
    let value: T
    init(_ value: T) { self.value = value }
}
