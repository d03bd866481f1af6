import Dispatch
import Locking
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

struct BackgroundPoolTests {
    struct Failure: Error, Equatable { var index: Int }

    @Test func forEachRunsEveryIndexOnce() {
        let pool = BackgroundPool(width: 4)
        let seen = Locked<[Int]>([])
        let failure: Failure? = pool.forEach(100, width: 4) { (index) throws(Failure) in
            seen.withLock { $0.append(index) }
        }
        #expect(failure == nil)
        #expect(seen.withLock { $0.sorted() } == Array(0..<100))
        pool.shutdown(deadline: 5)
    }

    @Test func forEachStopsAtTheFirstError() {
        let pool = BackgroundPool(width: 2)
        let failure: Failure? = pool.forEach(50, width: 2) { (index) throws(Failure) in
            if index == 3 { throw Failure(index: 3) }
        }
        #expect(failure == Failure(index: 3))
        pool.shutdown(deadline: 5)
    }

    /// A job that itself runs a parallel loop (a retried multipart upload) must finish even when
    /// every pool thread is busy: the caller does the work itself.
    @Test func aNestedLoopOnABusyPoolFinishes() {
        let pool = BackgroundPool(width: 1)
        let done = DispatchSemaphore(value: 0)
        let count = Locked(0)
        pool.submit {
            let _: Failure? = pool.forEach(20, width: 4) { (_) throws(Failure) in count.withLock { $0 += 1 } }
            done.signal()
        }
        done.wait()
        #expect(count.withLock { $0 } == 20)
        pool.shutdown(deadline: 5)
    }

    @Test func shutdownRefusesNewWorkAndWaitsForRunningJobs() {
        let pool = BackgroundPool(width: 2)
        let started = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let finished = Locked(false)
        pool.submit {
            started.signal()
            release.wait()
            finished.withLock { $0 = true }
        }
        started.wait()
        #expect(!pool.shutdown(deadline: 0.05), "a running job holds shutdown until its deadline")
        #expect(!pool.submit {})
        release.signal()
        #expect(pool.waitUntilIdle(timeout: 10))
        #expect(finished.withLock { $0 })
    }
}
