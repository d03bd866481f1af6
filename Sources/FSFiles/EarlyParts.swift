import Dispatch
import FSCore
import FSJournal
import Locking
import ObjectStore
import Synchronization

/// Parts of a large file uploaded while it is still being written, so that close has only the
/// rest to send (a `cp` of 1 GiB otherwise writes the spool first and uploads all of it at close).
///
/// Subtleties:
/// 1. A part is uploaded early once the writer has written past its end and the file is over
///    the multipart threshold. Only whole parts go early; the last part always waits for close.
/// 2. Every write records, per part it touches, the spool generation it made (`SpoolFile`'s
///    `partGenerations`). An early upload remembers the generation it started from; at close a
///    part is reused only if no write touched it since, else it is sent again. A write racing an
///    upload can only make the part look stale, never current.
/// 3. The parts belong to this pipeline's own upload session. Once the upload is finished with them the
///    pipeline is spent (`Filesystem.commit` drops it); later writes start a new one. A writer
///    that took the pipeline just before may still call `advance`: `finish` seals it first, and
///    a sealed pipeline starts nothing.
/// 4. Lock order: `SpoolFile.state`, then `EarlyParts.state`. No lock is held during an upload.
package final class EarlyParts: Sendable {
    package let session: UploadSession
    package let partSize: Int64
    private let store: any ObjectStore
    private let concurrency: Int
    private let pool: BackgroundPool
    private let group = DispatchGroup()
    /// The parts' progress, shown as an upload in progress of the bytes written so far.
    package let progress = TransferProgress()
    private let transfers: Transfers
    private let shown: Int

    package struct Part {
        package var etag: String
        /// The spool generation of the part's last write when the upload started.
        package var generation: UInt64
    }

    private struct State {
        package var done: [Int: Part] = [:]
        package var running: Set<Int> = []
        /// An upload took the parts over (`finish`): nothing more goes below the prefix, which a
        /// manifest may name from now on.
        package var sealed = false
    }

    /// Protects finished and running parts.
    private let state = Locked(State())

    package init(store: any ObjectStore, session: UploadSession, partSize: Int64, concurrency: Int, pool: BackgroundPool, transfers: Transfers) {
        self.transfers = transfers
        shown = transfers.begin(key: session.key, progress: progress)
        self.store = store
        self.pool = pool
        self.partSize = partSize
        self.concurrency = concurrency
        self.session = session
    }

    /// Starts uploads of whole parts below `writtenEnd` that are neither done nor running, at most
    /// `concurrency` at a time. `generation(index)` is the part's last write generation.
    package func advance(path: String, writtenEnd: Int64, generation: (Int) -> UInt64) {
        if writtenEnd > progress.bytesTotal { progress.setTotal(writtenEnd) }
        let complete = Int(writtenEnd / partSize)
        let starting: [(Int, UInt64)] = state.withLock { s in
            var starting: [(Int, UInt64)] = []
            // (A writer may hold this pipeline still when the upload at close took it over.)
            guard !s.sealed else { return [] }
            for index in 0..<complete where s.done[index] == nil && !s.running.contains(index) {
                guard s.running.count < concurrency else { break }
                s.running.insert(index)
                // Counted while the lock is held: `finish` waits for every upload that started
                // before it sealed the pipeline.
                group.enter()
                starting.append((index, generation(index)))
            }
            return starting
        }
        for (index, generation) in starting {
            pool.submitOrRun { [self] in
                upload(index, generation: generation, path: path)
                group.leave()
            }
        }
    }

    private func upload(_ index: Int, generation: UInt64, path: String) {
        let etag = try? store.uploadPart(
            session, number: index + 1,
            body: .file(path: path, offset: Int64(index) * partSize, length: partSize, progress: progress))
        state.withLock { s in
            s.running.remove(index)
            // A failed part is simply sent again at close.
            if let etag { s.done[index] = Part(etag: etag, generation: generation) }
        }
    }

    /// The upload at close (or the end of the file) takes over: no longer listed in `Transfers`.
    package func stopShowing() {
        transfers.end(shown)
    }

    deinit { transfers.end(shown) }

    /// Seals the pipeline (no upload starts from now on: a part sent after the upload was
    /// finished would change the stored object on Swift, whose manifest names a prefix), waits for running uploads; then the parts
    /// that may be reused as they are.
    package func finish() -> [Int: Part] {
        state.withLock { $0.sealed = true }
        group.wait()
        return state.withLock { $0.done }
    }
}
