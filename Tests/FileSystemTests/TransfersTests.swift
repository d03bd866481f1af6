import Dispatch
import Foundation
import Locking
import Logging
import ObjectStore
import ObjectStoreTesting
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// Issue 11: what `mount.cssp --status` and the upload gauges of `--stats` show.
struct TransfersTests {
    let root = Filesystem.rootInode
    let caller = Caller(uid: 1, gid: 1)

    let temporary = TemporaryDirectory("cssp-transfers-spool")

    func makeFilesystem(_ store: any ObjectStore) -> Filesystem {
        var configuration = FilesystemConfiguration()
        configuration.spoolDirectory = temporary.child("spool")
        configuration.multipartThreshold = 1 << 20
        configuration.partSize = 1 << 20
        configuration.uploadConcurrency = 1
        configuration.pendingRetrySeconds = 3600
        return try! Filesystem(store: store, configuration: configuration, logger: Logger(label: "test"))
    }

    /// A multipart upload held at its third part shows two parts done of the whole file, in the
    /// report and in the gauges; once stored, nothing is in progress.
    @Test func anUploadInProgressShowsItsBytesDoneAndItsTotal() throws {
        let size = 4 << 20
        let reached = DispatchSemaphore(value: 0)
        let go = DispatchSemaphore(value: 0)
        let store = FaultInjectingStore(FakeObjectStore()) { call in
            if call.operation == .putPart && call.index == 2 {
                reached.signal()
                go.wait()
            }
            return .none
        }
        let fs = makeFilesystem(store)
        defer { fs.shutdown() }
        let (_, opened) = try fs.create(parent: root, name: "big.bin", mode: 0o644, caller: caller)
        try [UInt8](repeating: 7, count: size).withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        let closed = DispatchSemaphore(value: 0)
        let result = Locked<Result<Void, FSError>?>(nil)
        DispatchQueue.global().async {
            let outcome: Result<Void, FSError>
            do throws(FSError) {
                try fs.flush(handle: opened.handle)
                outcome = .success(())
            } catch {
                outcome = .failure(error)
            }
            result.withLock { $0 = outcome }
            closed.signal()
        }
        reached.wait()
        let running = fs.transfers.running
        #expect(running.count == 1)
        #expect(running.first?.key == "big.bin")
        #expect(running.first?.done == 2 << 20)
        #expect(running.first?.total == Int64(size))
        let report = fs.transfers.report()
        #expect(report.contains("uploads in progress: 1\n  big.bin: 2.0 MiB of 4.0 MiB (50%)"), "\(report)")
        let metrics = fs.configuration.metrics.registry.render()
        #expect(metrics.contains("cssp_uploads_in_progress 1\n"))
        #expect(metrics.contains("cssp_upload_bytes_done 2097152\n"))
        #expect(metrics.contains("cssp_upload_bytes_total 4194304\n"))
        go.signal()
        go.signal()
        closed.wait()
        if case .failure(let error) = result.withLock({ $0! }) { Issue.record("close failed: \(error.message)") }
        fs.release(handle: opened.handle)
        #expect(fs.transfers.running.isEmpty)
        #expect(fs.transfers.report().hasPrefix("uploads in progress: 0\nuploads owed: 0\n"))
    }

    /// An upload that failed is owed: listed with its tries, its last error and when it is tried
    /// again (at the next close while a handle is open, then on the retry schedule), until stored.
    @Test func anOwedUploadIsListedWithItsTriesAndLastError() throws {
        let fake = FakeObjectStore()
        let fs = makeFilesystem(fake)
        defer { fs.shutdown() }
        let (attributes, opened) = try fs.create(parent: root, name: "owed.txt", mode: 0o644, caller: caller)
        try Array("owed".utf8).withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
        fake.failNextPuts(2)
        #expect(throws: FSError.self) { try fs.flush(handle: opened.handle) }
        var report = fs.transfers.report()
        #expect(
            report.contains("uploads owed: 1\n  owed.txt: 4 B, 1 try failed, next at the next close or fsync of the open file; last error: "),
            "\(report)")
        fs.release(handle: opened.handle)
        let owed = fs.transfers.owed
        #expect(owed.count == 1)
        #expect(owed.first?.key == "owed.txt")
        #expect(owed.first?.tries == 2)
        #expect(owed.first?.size == 4)
        report = fs.transfers.report()
        // The retry waits pendingRetrySeconds × 2^(tries-1), at most 60 s, ± 20 %.
        #expect(report.contains("uploads owed: 1\n  owed.txt: 4 B, 2 tries failed, next in "), "\(report)")
        #expect(report.contains(" s; last error: upload 'owed.txt': injected PUT failure (HTTP 503)\n"), "\(report)")
        #expect(fs.configuration.metrics.registry.render().contains("cssp_pending_uploads 1\n"))
        // Opened and closed again: stored, no longer owed.
        let again = try fs.open(attributes.inode, writable: true, truncate: false)
        try fs.flush(handle: again.handle)
        fs.release(handle: again.handle)
        #expect(fs.transfers.owed.isEmpty)
        #expect(fs.configuration.metrics.registry.render().contains("cssp_pending_uploads 0\n"))
        #expect(try fake.getBytes(key: "owed.txt", range: nil) == Array("owed".utf8))
    }

    @Test func sizesAndDurationsReadAsPeopleWriteThem() {
        #expect(Transfers.bytes(0) == "0 B")
        #expect(Transfers.bytes(1023) == "1023 B")
        #expect(Transfers.bytes(1536) == "1.5 KiB")
        #expect(Transfers.bytes(3 << 30) == "3.0 GiB")
        #expect(Transfers.seconds(0.2) == "1 s")
        #expect(Transfers.seconds(75) == "75 s")
        #expect(Transfers.seconds(125) == "2 min 5 s")
        #expect(Transfers.seconds(3700) == "1 h 1 min")
    }
}
