#if canImport(Glibc)
import Glibc
#endif

/// A new, initialised pthread mutex (deallocated by its owner's deinit).
private func makeMutex() -> UnsafeMutablePointer<pthread_mutex_t> {
    let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    mutex.initialize(to: pthread_mutex_t())
    pthread_mutex_init(mutex, nil)
    return mutex
}

/// A value guarded by a pthread mutex, used through `withLock { }` only (as NIOLockedValueBox).
///
/// Why not `Synchronization.Mutex`: ThreadSanitizer cannot see the futex inside it on Linux and
/// reports every access under it as a race (checked with a four-line program), which would make
/// `swift test --sanitize=thread` useless for our own races. A pthread mutex is intercepted by
/// TSan, costs the same, and is still never held across network I/O (STYLE §4).
public final class Locked<Value>: @unchecked Sendable {
    /// Guarded by `mutex`.
    private var value: Value
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>

    public init(_ value: Value) {
        self.value = value
        mutex = makeMutex()
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with the value, holding the lock.
    public func withLock<T, E: Error>(_ body: (inout Value) throws(E) -> T) throws(E) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}

/// A value guarded by a pthread mutex with a condition: `withLock` wakes waiters when it is done,
/// and `withLock(when:)` waits until the value satisfies a predicate. The predicate reads the
/// value between waits; the body runs once, with the lock held, when it holds.
public final class ConditionLocked<Value>: @unchecked Sendable {
    /// Guarded by `mutex`.
    private var value: Value
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    public init(_ value: Value) {
        self.value = value
        mutex = makeMutex()
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        condition.deallocate()
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with the value, holding the lock; then wakes every waiter.
    public func withLock<T, E: Error>(_ body: (inout Value) throws(E) -> T) throws(E) -> T {
        pthread_mutex_lock(mutex)
        defer {
            pthread_cond_broadcast(condition)
            pthread_mutex_unlock(mutex)
        }
        return try body(&value)
    }

    /// Waits until `predicate` holds (at most `timeout` seconds; nil when it passed), then runs
    /// `body` with the lock held and wakes every waiter.
    public func withLock<T>(
        when predicate: (Value) -> Bool, timeout: Double = .infinity, _ body: (inout Value) -> T
    ) -> T? {
        var deadline = timespec()
        if timeout.isFinite {
            clock_gettime(CLOCK_MONOTONIC, &deadline)
            let total = Double(deadline.tv_sec) + Double(deadline.tv_nsec) / 1e9 + max(0, timeout)
            deadline.tv_sec = Int(total.rounded(.down))
            deadline.tv_nsec = Int((total - total.rounded(.down)) * 1e9)
        }
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        while !predicate(value) {
            if timeout.isFinite {
                if pthread_cond_timedwait(condition, mutex, &deadline) == ETIMEDOUT && !predicate(value) { return nil }
            } else {
                pthread_cond_wait(condition, mutex)
            }
        }
        defer { pthread_cond_broadcast(condition) }
        return body(&value)
    }
}
