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

/// The upload journal (`UploadJournal`): the notes of owed uploads as appends to one file,
/// synced once for every close of a group.
struct UploadJournalTests {
    let caller = Caller(uid: 1000, gid: 100)
    let root = Filesystem.rootInode

    func note(_ key: String, base: String? = "") -> Spool.PendingUpload {
        Spool.PendingUpload(key: key, contentType: "text/plain", metadata: ["mode": "0644"], base: base)
    }

    func open(_ file: any JournalFile, directory: String = "/nonexistent", exists: (String) -> Bool = { _ in true }) -> UploadJournal {
        UploadJournal(directory: directory, file: file, exists: exists)
    }

    /// Only what was synced survives a power cut; a later synced note makes the unsynced ones
    /// before it durable too.
    @Test func aPowerCutKeepsExactlyTheSyncedNotes() {
        let file = PowerCutJournalFile()
        let journal = open(file)
        #expect(journal.write("a.data", note: note("a"), sync: true))
        #expect(journal.write("b.data", note: note("b"), sync: false))
        file.powerCut()
        #expect(open(file).leftovers.map(\.name) == ["a.data"])

        let again = open(file)
        #expect(again.write("b.data", note: note("b"), sync: false))
        #expect(again.write("a.data", note: note("a2"), sync: false))
        #expect(again.write("c.data", note: note("c"), sync: true))
        again.remove("b.data")  // not synced: b is still owed after the cut
        file.powerCut()
        let after = open(file).leftovers
        #expect(after.map(\.name) == ["b.data", "a.data", "c.data"], "oldest last record first")
        #expect(after.map(\.note.key) == ["b", "a2", "c"])
    }

    /// A sync that fails is a failed write (the close reports EIO); nothing is claimed durable.
    @Test func aFailedSyncIsReported() {
        let file = PowerCutJournalFile()
        let journal = open(file)
        file.failNextSyncs(1)
        #expect(!journal.write("a.data", note: note("a"), sync: true))
        #expect(journal.write("b.data", note: note("b"), sync: true))
        file.powerCut()
        #expect(open(file).leftovers.map(\.name) == ["a.data", "b.data"], "the retry's sync covers both")
    }

    /// The last record of a data file counts, `R` ends what it is owed, a data file that is gone
    /// counts for nothing, and a record cut short at the end is ignored.
    @Test func theLastRecordCountsAndATornEndIsIgnored() {
        let a1 = UploadJournal.record("a.data", note: note("one").encoded)
        let b = UploadJournal.record("b.data", note: note("b").encoded)
        let a2 = UploadJournal.record("a.data", note: note("two").encoded)
        let removed = Array("R\0b.data\0".utf8)
        let c = UploadJournal.record("c.data", note: note("c").encoded)
        let whole = a1 + b + a2 + removed + c
        #expect(UploadJournal.parse(whole).map(\.name) == ["a.data", "c.data"])
        for cut in 0..<c.count {
            let parsed = UploadJournal.parse(Array(whole.prefix(whole.count - c.count + cut)))
            #expect(parsed.map(\.name) == ["a.data"], "cut \(cut)")
        }
        let file = PowerCutJournalFile()
        _ = file.replace(with: whole)
        let journal = open(file) { $0 != "c.data" }
        #expect(journal.leftovers.map(\.name) == ["a.data"])
        #expect(journal.leftovers.first?.note.key == "two")
        #expect(UploadJournal.parse(file.contents()).map(\.name) == ["a.data"], "compacted at open")
    }

    /// Once the file is large and holds mostly what is owed no more, it is replaced with what is
    /// still owed, in order (data files that are gone dropped).
    @Test func aLargeJournalIsCompactedToWhatIsStillOwed() throws {
        let directory = TestScratch.directory + "cssp-upload-journal-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        for name in ["kept1.data", "kept2.data", "gone.data"] {
            FileManager.default.createFile(atPath: directory + "/" + name, contents: Data())
        }
        let file = PowerCutJournalFile()
        let journal = open(file, directory: directory) { _ in true }
        #expect(journal.write("kept1.data", note: note("k1"), sync: true))
        #expect(journal.write("gone.data", note: note("gone"), sync: true))
        try FileManager.default.removeItem(atPath: directory + "/gone.data")
        let big = note(String(repeating: "x", count: 1000))
        var largest = 0
        for n in 0..<(UploadJournal.compactBytes / 1000 + 100) {  // more than compactBytes in all
            #expect(journal.write("churn\(n).data", note: big, sync: false))
            journal.remove("churn\(n).data")
            let size = file.contents().count
            if size < largest { break }  // compacted
            largest = size
        }
        #expect(largest > UploadJournal.compactBytes - 2 * big.encoded.count, "the last size before the compaction")
        #expect(file.contents().count < 1000, "compacted: \(file.contents().count) bytes")
        #expect(journal.write("kept2.data", note: note("k2"), sync: true))
        file.powerCut()
        #expect(open(file).leftovers.map(\.note.key) == ["k1", "k2"], "the compaction is durable, the gone data file dropped")
    }

    /// The file double of the group-commit test: the first sync waits until the test lets it go;
    /// appends and syncs are counted.
    final class HeldSyncFile: JournalFile {
        let inner = PowerCutJournalFile()
        let counts = ConditionLocked((appends: 0, syncs: 0, held: true))

        func contents() -> [UInt8] { inner.contents() }
        func append(_ bytes: [UInt8]) -> Bool {
            counts.withLock { $0.appends += 1 }
            return inner.append(bytes)
        }
        func sync() -> Bool {
            counts.withLock { $0.syncs += 1 }
            counts.withLock(when: { !$0.held || $0.syncs > 1 }) { _ in }
            return inner.sync()
        }
        func replace(with bytes: [UInt8]) -> Bool { inner.replace(with: bytes) }
    }

    /// Group commit: closes that arrive while a close's sync runs wait for one more sync, which
    /// covers them all: four closes, two syncs of the journal.
    @Test func closesThatArriveDuringASyncShareTheNextOne() throws {
        let file = HeldSyncFile()
        let fs = WriteBackDeleteTests().makeFilesystem(
            FakeObjectStore(), journalFile: { $0.hasSuffix("/" + UploadJournal.fileName) ? file as any JournalFile : DiskJournalFile(path: $0) })
        defer { fs.shutdown(deadline: 5) }
        var handles: [UInt64] = []
        for name in ["a", "b", "c", "d"] {
            let (_, opened) = try fs.create(parent: root, name: name, mode: 0o644, caller: caller)
            try Array(name.utf8).withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
            handles.append(opened.handle)
        }
        let closed = DispatchGroup()
        let failures = Locked(0)
        func close(_ handle: UInt64) {
            DispatchQueue.global().async(group: closed) {
                do { try fs.flush(handle: handle) } catch { failures.withLock { $0 += 1 } }
            }
        }
        close(handles[0])
        file.counts.withLock(when: { $0.syncs == 1 }) { _ in }  // the first close leads a sync, held
        for handle in handles.dropFirst() { close(handle) }
        file.counts.withLock(when: { $0.appends == 4 }) { _ in }  // the others have journaled
        file.counts.withLock { $0.held = false }
        closed.wait()
        #expect(failures.withLock { $0 } == 0)
        #expect(file.counts.withLock { $0.syncs } == 2)
        for handle in handles { fs.release(handle: handle) }
    }

    /// A close, chmod and rename of a queued file make no file beside its data file (a note
    /// rewritten whole made and freed an inode each time).
    @Test func writeBackNotesMakeNoFilesInTheSpool() throws {
        let spool = TestScratch.directory + "cssp-upload-journal-spool-" + UUID().uuidString
        let fs = WriteBackDeleteTests().makeFilesystem(FakeObjectStore(), spool: spool)
        defer { fs.shutdown(deadline: 5) }
        for n in 0..<20 {
            let (attributes, opened) = try fs.create(parent: root, name: ".f\(n).tmp", mode: 0o600, caller: caller)
            try Array("bytes \(n)".utf8).withUnsafeBytes { try fs.write(handle: opened.handle, offset: 0, bytes: $0) }
            try fs.flush(handle: opened.handle)
            fs.release(handle: opened.handle)
            _ = try fs.setattr(attributes.inode, AttributeChanges(mode: 0o644))
            try fs.rename(parent: root, name: ".f\(n).tmp", newParent: root, newName: "f\(n)", noReplace: false)
        }
        let names = try FileManager.default.contentsOfDirectory(atPath: fs.spool.directory)
        #expect(names.filter { $0.hasSuffix(".data") }.count == 20)
        #expect(Set(names.filter { !$0.hasSuffix(".data") }).isSubset(of: [".lock", UploadJournal.fileName, "deletes.journal"]), "\(names)")
        #expect(fs.spool.uploads.appended == 60, "a note per close, chmod and rename")
    }

    /// A data file with a `.pending` note written by an earlier version is still stored by the
    /// next mount (and a journal note of the same data file wins over it).
    @Test func notesOfAnEarlierVersionAreStillRecovered() throws {
        let spool = TestScratch.directory + "cssp-upload-journal-legacy-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: spool, withIntermediateDirectories: true)
        FileManager.default.createFile(atPath: spool + "/0123.data", contents: Data("old version's bytes".utf8))
        FileManager.default.createFile(atPath: spool + "/0123.pending", contents: Data(note("legacy").encoded))
        FileManager.default.createFile(atPath: spool + "/0456.data", contents: Data("both".utf8))
        FileManager.default.createFile(atPath: spool + "/0456.pending", contents: Data(note("stale").encoded))
        let journal = UploadJournal(directory: spool, file: DiskJournalFile(path: spool + "/" + UploadJournal.fileName)) { _ in true }
        #expect(journal.write("0456.data", note: note("journaled"), sync: true))
        let store = FakeObjectStore()
        let fs = WriteBackDeleteTests().makeFilesystem(store, spool: spool)
        defer { fs.shutdown(deadline: 5) }
        fs.recoverPendingUploads()
        #expect(store.object("legacy")?.bytes == Array("old version's bytes".utf8))
        #expect(store.object("journaled")?.bytes == Array("both".utf8))
        #expect(store.object("stale") == nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: spool).filter { $0.hasSuffix(".data") || $0.hasSuffix(".pending") } == [])
    }
}
