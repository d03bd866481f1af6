import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// The spool's state machine: each event from each phase, without I/O.
struct SpoolStateTests {
    func opened(writers: Int = 1, readers: Int = 0, dirty: Bool = true) -> SpoolState {
        var s = SpoolState(size: 0, dataDirty: dirty)
        for _ in 0..<writers { _ = s.attach(writable: true) }
        for _ in 0..<readers { _ = s.attach(writable: false) }
        return s
    }

    @Test func theLastCloseUploadsWhatChangedOrRetires() {
        var s = opened(writers: 1, readers: 1)
        #expect(s.detach(writable: false) == .keep)
        #expect(s.detach(writable: true) == .upload)
        var clean = opened(dirty: false)
        #expect(clean.detach(writable: true) == .retire)
        let r1 = clean.retire()
        #expect(r1)
        let r2 = clean.attach(writable: true)
        #expect(!r2, "nothing attaches to a retired spool")
    }

    @Test func anUploadClearsOnlyTheGenerationItStored() {
        var s = opened()
        let stored = s.generation
        s.generation += 1  // a write after the snapshot
        let r3 = s.uploaded(generation: stored)
        #expect(!r3)
        #expect(s.dataDirty)
        let r4 = s.uploaded(generation: s.generation)
        #expect(!r4 || s.isIdle)
        #expect(!s.dataDirty)
    }

    @Test func aFailureAfterTheLastCloseSchedulesOneRetryChain() {
        var s = opened()
        #expect(s.uploadFailed() == .keep, "a handle is open: its next flush tries again")
        #expect(s.detach(writable: true) == .upload)
        #expect(s.uploadFailed() == .scheduleRetry(tries: 1))
        #expect(s.phase == .pending(tries: 1))
        #expect(s.uploadFailed() == .keep, "a second failure schedules no second chain")
        let r5 = s.retryIsDue()
        #expect(r5)
        #expect(s.retryFailed() == .scheduleRetry(tries: 2))
        let r6 = s.retire()
        #expect(!r6, "owed bytes are never dropped")
        let r7 = s.uploaded(generation: s.generation)
        #expect(r7)
        #expect(s.phase == .active)
        let r8 = s.retryIsDue()
        #expect(!r8, "a retry that fires after the upload does nothing")
        let r9 = s.retire()
        #expect(r9)
    }

    @Test func aPendingSpoolReopenedAndClosedKeepsItsRetry() {
        var s = opened()
        _ = s.detach(writable: true)
        _ = s.uploadFailed()
        let r10 = s.attach(writable: true)
        #expect(r10)
        #expect(s.detach(writable: true) == .journal, "the scheduled retry owns the upload; the note is renewed")
    }

    @Test func aRemovedSpoolIsNeverUploadedAndRetiresAtItsLastClose() {
        var s = opened(writers: 2)
        let (_, now) = s.remove()
        #expect(!now)
        #expect(!s.needsUpload)
        #expect(s.detach(writable: true) == .keep)
        #expect(s.detach(writable: true) == .retire)
        let r11 = s.retire()
        #expect(r11)
    }

    @Test func removingAPendingSpoolEndsItsRetries() {
        var s = opened()
        _ = s.detach(writable: true)
        _ = s.uploadFailed()
        let (_, now) = s.remove()
        #expect(now)
        let r12 = s.retryIsDue()
        #expect(!r12)
        #expect(s.retryFailed() == .retire)
        let r13 = s.retire()
        #expect(r13)
    }

    /// A failed write into the spool: nothing is uploaded any more, from any phase, and the last
    /// close retires the spool (its bytes go to lost+found, see `Filesystem.retire`).
    @Test func aFailedWriteIsNeverUploaded() {
        var active = opened(writers: 2)
        active.writeFailure = FSError(.noSpace, "full")
        #expect(!active.needsUpload)
        #expect(active.detach(writable: true) == .keep)
        #expect(active.detach(writable: true) == .retire)
        let retired = active.retire()
        #expect(retired)
        var owed = opened()
        _ = owed.detach(writable: true)
        #expect(owed.uploadFailed() == .scheduleRetry(tries: 1))
        _ = owed.attach(writable: true)
        owed.writeFailure = FSError(.noSpace, "full")
        #expect(owed.detach(writable: true) == .retire, "a pending spool whose new write failed is not journaled")
        let gone = owed.retire()
        #expect(gone)
    }
}

