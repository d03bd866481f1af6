import FileSystem
import FuseAdapter
import Testing

/// The supervisor's shared logs (issue 40), mapped in the test process as the supervisor maps
/// them. One suite, serialized: the logs are the process's.
@Suite(.serialized)
struct SupervisorLogTests {
    static func reader(_ inode: InodeNumber) -> AdoptedHandle {
        AdoptedHandle(inode: inode, key: "k\(inode)", size: Int64(inode), etag: "e\(inode)", manifest: nil)
    }

    /// A rewrite replaces the log only once it is whole: a worker that dies in the middle of one
    /// (the next worker's appends are pointed at the old log, as the supervisor does) leaves
    /// every record of the old log to its successor; one that finishes leaves exactly the new.
    @Test func aWorkerKilledWhileItWritesTheLogAgainLeavesTheOldOneWhole() throws {
        try #require(SupervisorLogs.mapForTesting())
        let log = SupervisorHandleLog()
        log.restart()
        log.commit(true)
        for handle: UInt64 in 1...3 { #expect(log.opened(handle, Self.reader(handle))) }
        log.released(2)
        #expect(SupervisorHandleLog.recorded() == [1: Self.reader(1), 3: Self.reader(3)])
        // The rewrite begins, writes part of the new log, and the worker dies.
        log.restart()
        #expect(log.opened(3, Self.reader(3)))
        #expect(SupervisorHandleLog.recorded() == [1: Self.reader(1), 3: Self.reader(3)])
        SupervisorLogs.settle()
        // Its successor appends to the old log, which it read.
        #expect(log.opened(4, Self.reader(4)))
        #expect(SupervisorHandleLog.recorded() == [1: Self.reader(1), 3: Self.reader(3), 4: Self.reader(4)])
        // A rewrite that ends replaces it, and appends go on after it.
        log.restart()
        #expect(log.opened(4, Self.reader(4)))
        log.commit(true)
        #expect(log.opened(5, Self.reader(5)))
        #expect(SupervisorHandleLog.recorded() == [4: Self.reader(4), 5: Self.reader(5)])
        // One given up (the new log did not fit) keeps the old log, and appends go to it.
        log.restart()
        #expect(log.opened(6, Self.reader(6)))
        log.commit(false)
        #expect(log.opened(7, Self.reader(7)))
        #expect(SupervisorHandleLog.recorded() == [4: Self.reader(4), 5: Self.reader(5), 7: Self.reader(7)])
    }

    /// The node log keeps the same promise, and a handle on a spool comes back with all it
    /// carries (the spool, whether it writes, the stored form of the node's attributes).
    @Test func theNodeLogAndSpoolRecordsComeBackWhole() throws {
        try #require(SupervisorLogs.mapForTesting())
        let nodes = SupervisorNodeLog()
        nodes.restart()
        nodes.commit(true)
        #expect(nodes.named(5, parent: 1, name: "d", kind: .directory))
        #expect(nodes.named(6, parent: 5, name: "é f", kind: .file))
        nodes.restart()
        #expect(nodes.named(5, parent: 1, name: "d", kind: .directory))
        SupervisorLogs.settle()
        #expect(Set(SupervisorNodeLog.recorded().map(\.inode)) == [5, 6])
        let handles = SupervisorHandleLog()
        handles.restart()
        handles.commit(true)
        let spool = AdoptedSpool(
            path: "/var/cache/x/1f.data", writable: true, dirty: true, contentType: "text/plain;cssp-mode=0600",
            metadata: ["mode": "0600", "mtime": "1795954430.509976430"], recordedAt: Timestamp(seconds: 1_795_954_430, nanoseconds: 7))
        let writer = AdoptedHandle(inode: 6, key: "d/é f", size: 11, etag: "", manifest: nil, spool: spool)
        #expect(handles.opened(9, writer))
        #expect(SupervisorHandleLog.recorded() == [9: writer])
    }
}
