import Dispatch
import Locking

#if canImport(Glibc)
import Glibc
#endif

/// The filesystem's own threads for background work: read-ahead, early parts, upload retries,
/// cache seeding, background HEADs, parallel part uploads, deletes and renames. Owned by
/// `Filesystem`, bounded (`width` threads, started on demand), ended by `shutdown(deadline:)`.
///
/// Subtleties:
/// 1. Jobs may block on the network; they run on the pool's own threads, never on Swift's
///    cooperative pool or Dispatch's global queues (whose width is not ours to use up).
/// 2. `forEach` runs on the caller's thread as well as on idle pool threads, and the caller
///    waits only for helpers that took an index: a pool thread may call `forEach` (a retried
///    upload sends its parts in parallel) without waiting for threads that are all busy.
/// 3. After `shutdown`, new jobs are refused (`submit` returns false), queued and delayed ones
///    are dropped, and `shutdown` waits for the running ones until its deadline.
package final class BackgroundPool: Sendable {
    private struct State {
        package var queue: [@Sendable () -> Void] = []
        package var threads = 0
        package var idle = 0
        package var running = 0
        package var stopped = false
    }

    package let width: Int
    /// The queue and the counts (a leaf lock: no job runs under it).
    private let state = ConditionLocked(State())
    /// Delays `submit(after:)`: a serial queue of the pool's own, whose blocks only enqueue.
    private let timer = DispatchQueue(label: "csspfs.background-pool.timer")

    package init(width: Int) {
        self.width = max(1, width)
    }

    /// Runs `job` on a pool thread; false after `shutdown`.
    @discardableResult
    package func submit(_ job: @escaping @Sendable () -> Void) -> Bool {
        let start: Bool? = state.withLock { s in
            guard !s.stopped else { return nil }
            s.queue.append(job)
            guard s.idle < s.queue.count && s.threads < width else { return false }
            s.threads += 1
            return true
        }
        guard let start else { return false }
        if start { startThread { [self] in work() } }
        return true
    }

    /// Runs `job` on a pool thread, or on this one once the pool is shut down: for work a
    /// caller waits for (a read-ahead block, an early part), which must happen either way.
    package func submitOrRun(_ job: @escaping @Sendable () -> Void) {
        if !submit(job) { job() }
    }

    /// Runs `job` on a pool thread after `seconds`, unless the pool is shut down by then (the
    /// pool's own timer queue only enqueues it; no work runs there).
    package func submit(after seconds: Double, _ job: @escaping @Sendable () -> Void) {
        timer.asyncAfter(deadline: .now() + seconds) { [self] in submit(job) }
    }

    private func work() {
        while true {
            state.withLock { $0.idle += 1 }
            let job: (@Sendable () -> Void)? = state.withLock(when: { !$0.queue.isEmpty || $0.stopped }) { s in
                s.idle -= 1
                guard !s.queue.isEmpty else {
                    s.threads -= 1
                    return nil
                }
                s.running += 1
                return s.queue.removeFirst()
            } ?? nil
            guard let job else { return }
            job()
            state.withLock { $0.running -= 1 }
        }
    }

    /// Runs `body(0)`…`body(count - 1)` on the calling thread and up to `width - 1` pool threads.
    /// After the first error no new index starts; that error is returned.
    package func forEach<E: Error>(_ count: Int, width: Int, _ body: (Int) throws(E) -> Void) -> E? {
        guard count > 0 else { return nil }
        return withoutActuallyEscaping(body) { body in
            let loop = ParallelLoop<E>(count: count, body: body)
            for _ in 0..<max(0, min(width, count) - 1) { submit { loop.run() } }
            loop.run()
            return loop.finish()
        }
    }

    /// Refuses new jobs, drops queued ones, and waits until the running ones end or `seconds`
    /// pass. Returns whether every job ended.
    @discardableResult
    package func shutdown(deadline seconds: Double) -> Bool {
        state.withLock { s in
            s.stopped = true
            s.queue.removeAll()
        }
        return waitUntilIdle(timeout: seconds)
    }

    /// Waits until no job is queued or running, at most `timeout` seconds (tests, shutdown).
    @discardableResult
    package func waitUntilIdle(timeout: Double = .infinity) -> Bool {
        state.withLock(when: { $0.running == 0 && $0.queue.isEmpty }, timeout: timeout) { _ in true } ?? false
    }

    /// Starts `count` workers running `body` on the pool, each inside `group`; `unstarted`
    /// takes back the count of one the pool refused (it is shutting down).
    package func startWorkers(
        _ count: Int, in group: DispatchGroup, _ body: @escaping @Sendable () -> Void, unstarted: () -> Void
    ) {
        for _ in 0..<count {
            group.enter()
            let started = submit {
                body()
                group.leave()
            }
            if !started {
                unstarted()
                group.leave()
            }
        }
    }
}

/// Starts a detached thread running `body`.
package func startThread(_ body: @escaping @Sendable () -> Void) {
    final class Box: @unchecked Sendable {
        package let body: @Sendable () -> Void
        package init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }
    let box = Unmanaged.passRetained(Box(body)).toOpaque()
    var thread = pthread_t()
    let result = pthread_create(&thread, nil, { raw in
        let box = Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue()
        box.body()
        return nil
    }, box)
    precondition(result == 0, "INTERNAL ERROR: cannot start a background thread (\(result))")
    pthread_detach(thread)
}

/// One `forEach`: indices handed out one by one; the caller waits only for helpers that took
/// one. The body is dropped before `forEach` returns, so a helper that starts late finds no work
/// and no closure (the body does not outlive the call).
private final class ParallelLoop<E: Error>: @unchecked Sendable {
    private struct State {
        package var next = 0
        package var inFlight = 0
        package var failure: E?
        package var body: ((Int) throws(E) -> Void)?
    }
    private let count: Int
    /// Guards the loop's progress; `body` is only called outside it.
    private let state: ConditionLocked<State>

    package init(count: Int, body: @escaping (Int) throws(E) -> Void) {
        self.count = count
        state = ConditionLocked(State(body: body))
    }

    package func run() {
        while let outcome = runOne() {
            state.withLock { s in
                s.inFlight -= 1
                if s.failure == nil, case .failed(let error) = outcome { s.failure = error }
            }
        }
    }

    private enum Outcome {
        case done
        case failed(E)
    }

    /// Claims one index and runs it; nil when there is none left. Its reference to the body ends
    /// when it returns, before `inFlight` counts the index as done (`finish` relies on that).
    private func runOne() -> Outcome? {
        let claimed: (Int, (Int) throws(E) -> Void)? = state.withLock { s in
            guard s.failure == nil, s.next < count, let body = s.body else { return nil }
            s.next += 1
            s.inFlight += 1
            return (s.next - 1, body)
        }
        guard let (index, body) = claimed else { return nil }
        do throws(E) {
            try body(index)
            return .done
        } catch {
            return .failed(error)
        }
    }

    /// Waits for the indices under way on helper threads, drops the body; returns the first error.
    package func finish() -> E? {
        state.withLock(when: { $0.inFlight == 0 }) { s in
            s.body = nil
            s.next = count
            return s.failure
        } ?? nil
    }
}
