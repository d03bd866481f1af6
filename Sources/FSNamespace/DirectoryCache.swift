import Dispatch
import FSCore
import ObjectStore

/// Remembered directory listings and the lookup heuristics around them. A value type with no I/O
/// and no lock, held in `NamespaceTables`.
///
/// The rules it owns:
/// 1. A complete listing is remembered for `dir_timeout` and answers lookups and readdir.
/// 2. Our own changes are applied to a remembered listing in place (`record`), and every change
///    in a directory bumps its change count. They are also journaled for `journalSeconds`: a
///    listing that completes later is remembered with them applied again. A change made after
///    the listing started replaces what it says of the name (it may predate the change); one
///    made before only adds a name the listing lacks (a container listing lags behind the
///    writes it follows), since what the listing shows of it may be another client's newer
///    version. A change before it that the listing already shows (the name there, or gone) is
///    marked shown and no longer applied: the store caught up, and a later listing that
///    differs shows another client's change. What a node learned since a listing (a HEAD) and
///    gives back to it is a correction, not a change made here: it replaces what a later listing
///    says of the name and never adds the name to one that lacks it. Only a listing that started before a change no longer journaled is refused, and
///    one older than the listing remembered already. Creates from several processes in one
///    directory then keep one listing current instead of listing the directory for each name.
/// 3. A directory that is renamed, removed or forgotten loses its listing and journal (`drop`),
///    since the keys in it name the old place.
/// 4. An answer about a name asked before a change made here (a readdir's listing taken before
///    an upload was stored, a HEAD sent before it) must not make a new node for the name: the
///    node that knew better may be gone (the kernel forgot it). `changeSince` says what this
///    mount made of the name after the answer's change count, or that it cannot know.
/// 5. At most `nameLimit` names are remembered in listings (`meta_max_entries`): past it the
///    listings remembered longest ago are dropped, the newest never. A dropped listing leaves what
///    was recorded in it since (its changes, for readers still reading it) and answers nothing.
package struct DirectoryCache {
    package struct Listing {
        package var entries: EntryTable
        package var completedAt: Double
        /// The `StoreClock` tick taken before its first request (the attribute rule, `Node+Merge`).
        package var askedAt: UInt64
        /// Dropped under the bound (rule 5): only its changes are left, and it answers nothing.
        package var dropped = false
        /// Listings are numbered as they are remembered (0: not yet), the newest highest.
        fileprivate var number: UInt64 = 0
    }

    /// Remembered listings by directory, and how many names they hold (rule 5).
    private struct Listings {
        private var byDirectory: [InodeNumber: Listing] = [:]
        package private(set) var names = 0
        private var remembered: UInt64 = 0

        package subscript(directory: InodeNumber) -> Listing? {
            get { byDirectory[directory] }
            set {
                names -= byDirectory[directory]?.entries.count ?? 0
                var listing = newValue
                if listing?.number == 0 {
                    remembered += 1
                    listing?.number = remembered
                }
                byDirectory[directory] = listing
                names += listing?.entries.count ?? 0
            }
        }

        /// A change made here, applied in place (the listing's name count stays).
        package mutating func apply(_ name: ExactString, _ entry: DirectoryEntry?, in directory: InodeNumber) {
            byDirectory[directory]?.entries[name] = entry
        }

        /// The listings still answering, the first remembered first.
        package var byAge: [InodeNumber] {
            byDirectory.filter { !$0.value.dropped }.sorted { $0.value.number < $1.value.number }.map(\.key)
        }
    }

    /// One change made here (rule 2): the change count it made, when, and the name's entry
    /// after it (nil: removed).
    private struct Change {
        package var count: UInt64
        package var at: Double
        package var name: ExactString
        package var entry: DirectoryEntry?
        /// A listing that started after it showed it: not applied to later listings (rule 2),
        /// kept for the answers from before it (rule 4).
        package var shown = false
        /// What this mount learned of a name it did not change (`correct`): it replaces what a
        /// later listing says of the name, and never adds a name that listing lacks.
        package var correction = false
    }

    /// How long a change made here is applied again to later listings (rule 2).
    package let journalSeconds: Double
    /// At most this many changes are journaled per directory; older ones are forgotten sooner.
    package static let journalLimit = 10_000

    private var listings = Listings()
    /// At most this many names in remembered listings (rule 5; 0: no bound).
    package let nameLimit: Int
    /// When each directory was last looked in (a lookup, a readdir, a change), as a count of
    /// uses: the directories used longest ago give up their names first (`Filesystem+Bound`).
    private var used: [InodeNumber: UInt64] = [:]
    private var uses: UInt64 = 0
    /// Changes made here per directory (see rule 2); absent = 0.
    private var changes: [InodeNumber: UInt64] = [:]
    /// Recent changes per directory, oldest first (rule 2).
    private var journals: [InodeNumber: [Change]] = [:]
    /// Per directory, the count of the newest change no longer journaled (absent = 0).
    private var forgottenUpTo: [InodeNumber: UInt64] = [:]
    /// Per directory, the latest journaled change of each name (rule 4).
    private var latest: [InodeNumber: [ExactString: Change]] = [:]
    /// Changes recorded since every journal was last pruned (directories nobody changes or lists
    /// again would keep theirs otherwise).
    private var recordedSincePrune = 0
    /// When the names of each directory were last used (`noteNamesUsed`).
    private var usedAt: [InodeNumber: Double] = [:]
    /// When a lookup last had to ask the server about one name in a directory.
    package var lastResolved: [InodeNumber: Double] = [:]
    /// Directories being listed for lookups right now (one listing at a time each): the group
    /// is left when the listing ends, and lookups in the directory wait for it.
    package var listingForLookup: [InodeNumber: DispatchGroup] = [:]
    /// Inode numbers readdir showed for names that had no node yet (d_ino), per directory: the
    /// node a later lookup makes takes the same number.
    private var reserved: [InodeNumber: [ExactString: InodeNumber]] = [:]
    /// Numbers of forgotten nodes reserved for their names (`reserveForgotten`), oldest first
    /// from `forgottenStart`.
    private var forgotten: [(InodeNumber, ExactString, InodeNumber)] = []
    private var forgottenStart = 0
    private var forgottenLimit: Int { nameLimit > 0 ? max(4096, nameLimit / 10) : 25_000 }

    package init(journalSeconds: Double = 5, nameLimit: Int = 0) {
        self.journalSeconds = journalSeconds
        self.nameLimit = nameLimit
    }

    /// Names in the listings remembered now (rule 5).
    package var rememberedNames: Int { listings.names }

    /// `directory` is being looked in.
    package mutating func touch(_ directory: InodeNumber) {
        uses += 1
        used[directory] = uses
    }

    /// The names of `directory` were used at `now` (the filesystem's clock): it was read, a
    /// file in it was looked up, or something in it changed here. Passing through it on the way
    /// to a subdirectory is not a use (`Poller` lists the directories used).
    package mutating func noteNamesUsed(_ directory: InodeNumber, now: Double) {
        usedAt[directory] = now
    }

    /// Directories whose names were used at `time` or later (polling, `Poller`).
    package func usedSince(_ time: Double) -> [InodeNumber] { usedAt.compactMap { $0.value >= time ? $0.key : nil } }

    /// Every remembered listing expires (the container changed, who knows where): the next
    /// lookup or readdir lists again. Its entries stay, as any expired listing's do (`anyListing`),
    /// and so do the changes made here, the reserved numbers and the uses.
    package mutating func expireAllListings() {
        for directory in listings.byAge { listings[directory]?.completedAt = -.infinity }
    }

    /// The remembered listing of `directory` expires (polling: no poll keeps it true any more).
    package mutating func expireListing(_ directory: InodeNumber) {
        listings[directory]?.completedAt = -.infinity
    }

    /// Directories looked in, the one used longest ago first.
    package var directoriesByUse: [InodeNumber] { used.sorted { $0.value < $1.value }.map(\.key) }

    /// Drops the listings remembered longest ago until at most nine tenths of `nameLimit` names are
    /// remembered, keeping the newest (rule 5). Returns the names dropped.
    @discardableResult
    package mutating func bound() -> Int {
        guard nameLimit > 0, listings.names > nameLimit else { return 0 }
        let before = listings.names
        for directory in listings.byAge.dropLast() where listings.names > nameLimit - nameLimit / 10 {
            guard var listing = listings[directory] else { continue }
            listing.entries = listing.entries.changesOnly
            listing.dropped = true
            listings[directory] = listing
        }
        return before - listings.names
    }

    /// The number readdir shows for `name` in `directory` without a node: reserved once, with
    /// `allocate`, then the same until the directory is dropped, unless `isFree` says a node
    /// holds it (one reserved by `reserve`, whose node lives on under no name or another).
    package mutating func reservedInode(
        _ directory: InodeNumber, _ name: String, isFree: (InodeNumber) -> Bool, allocate: () -> InodeNumber
    ) -> InodeNumber {
        if let number = reserved[directory]?[name.exact], isFree(number) { return number }
        let number = allocate()
        reserved[directory, default: [:]][name.exact] = number
        return number
    }

    /// Reserves `number`, a node's that readdir showed, for `name`: if the node goes before a
    /// lookup, the node that lookup makes takes the number.
    package mutating func reserve(_ directory: InodeNumber, _ name: String, _ number: InodeNumber) {
        reserved[directory, default: [:]][name.exact] = number
    }

    /// Keeps the number of a node the kernel forgot for the next node of its name (readdir may
    /// have shown it: d_ino = st_ino), for the latest `forgottenLimit` such names only.
    package mutating func reserveForgotten(_ directory: InodeNumber, _ name: String, _ number: InodeNumber) {
        reserve(directory, name, number)
        forgotten.append((directory, name.exact, number))
        guard forgotten.count - forgottenStart > forgottenLimit else { return }
        let (oldDirectory, oldName, oldNumber) = forgotten[forgottenStart]
        forgottenStart += 1
        if reserved[oldDirectory]?[oldName] == oldNumber { reserved[oldDirectory]?[oldName] = nil }
        if forgottenStart >= forgottenLimit {
            forgotten.removeFirst(forgottenStart)
            forgottenStart = 0
        }
    }

    /// Takes the number reserved for `name`, if any: a node is being made for it, which owns the
    /// number from now on.
    package mutating func takeReservation(_ directory: InodeNumber, _ name: String) -> InodeNumber? {
        reserved[directory]?.removeValue(forKey: name.exact)
    }

    /// The remembered listing of `directory` if it is younger than `maximumAge`.
    package func listing(_ directory: InodeNumber, now: Double, maximumAge: Double) -> Listing? {
        guard let listing = listings[directory], !listing.dropped, now - listing.completedAt <= maximumAge else { return nil }
        return listing
    }

    /// Any remembered listing of `directory`, however old, or what is left of it (rule 5).
    package func anyListing(_ directory: InodeNumber) -> Listing? { listings[directory] }

    /// Changes journaled now, in every directory.
    package var journaledChanges: Int { journals.values.reduce(0) { $0 + $1.count } }

    /// The change count to pass to `remember` for a listing that starts now.
    package func changeCount(_ directory: InodeNumber) -> UInt64 { changes[directory] ?? 0 }

    /// `entries` of a complete listing that started at change count `startedAt`, with the
    /// changes journaled here applied (rule 2). Remembered unless a change made after it
    /// started is no longer journaled, or the listing remembered already is newer; returns the
    /// entries and whether they were remembered.
    /// `current(name)`: what this mount knows of a name now (its node), which describes a name
    /// made before the listing started better than the journal's entry (another client may have
    /// written it since, and this mount read that).
    /// `confirmed`: names for which a HEAD after the listing agreed with it against a change
    /// made here before it started (another client removed the name made here): the listing
    /// is right about them, no lag, and they count as shown.
    package mutating func remember(
        _ entries: EntryTable, for directory: InodeNumber, now: Double, startedAt: UInt64, askedAt: UInt64,
        stillListed: Set<ExactString> = [], confirmed: Set<ExactString> = [],
        current: (ExactString) -> DirectoryEntry? = { _ in nil }
    ) -> (entries: EntryTable, remembered: Bool) {
        prune(directory, now: now, slack: 1)
        var table = entries
        let journal = journals[directory] ?? []
        // Names as changes made before the listing started left them: the listing shows each,
        // in that version or a newer one another client wrote, unless it lags behind: then a
        // name made here is added, and one removed here is taken out.
        var before: [ExactString: DirectoryEntry?] = [:]
        for change in journal
        where change.count <= startedAt && !change.shown && !change.correction && !confirmed.contains(change.name) {
            before[change.name] = change.entry
        }
        for (name, entry) in before {
            if let entry {
                if table[name] == nil { table[name] = current(name) ?? entry }
            } else if table[name] != nil {
                table[name] = nil
            }
        }
        for change in journal where change.count > startedAt && (!change.correction || table[change.name] != nil) {
            table[change.name] = change.entry
        }
        guard startedAt >= forgottenUpTo[directory] ?? 0, askedAt >= listings[directory]?.askedAt ?? 0 else {
            return (table, false)
        }
        listings[directory] = Listing(entries: table, completedAt: now, askedAt: askedAt)
        bound()
        // The listing shows these changes already: they are not applied to later listings
        // (an older listing still under way is not remembered over this one).
        // (`stillListed`: names removed here that the store listed, which the reader skipped.)
        let shown = Set(before.compactMap { name, entry in
            (entry != nil) == (entries[name] != nil || stillListed.contains(name)) ? name : nil
        }).union(confirmed)
        if !shown.isEmpty, var journal = journals[directory] {
            for index in journal.indices where journal[index].count <= startedAt && shown.contains(journal[index].name) {
                journal[index].shown = true
            }
            journals[directory] = journal
        }
        return (table, true)
    }

    /// Files made here before a listing that started at change count `startedAt` and that it
    /// lacks: a listing lagging behind this mount's writes, or another client's removal since.
    /// Only a HEAD tells which (`Poller`). (A name removed here that the store still
    /// lists is left out of the listing's pages by its reader: not checked.)
    package func madeHereButNotListed(_ directory: InodeNumber, by entries: EntryTable, startedAt: UInt64) -> [ExactString] {
        var latest: [ExactString: DirectoryEntry?] = [:]
        for change in journals[directory] ?? [] where change.count <= startedAt && !change.shown && !change.correction {
            latest[change.name] = change.entry
        }
        return latest.compactMap { name, entry in
            guard let entry, entry.kind != .directory, entries[name] == nil else { return nil }
            return name
        }
    }

    /// A new, empty directory made here: its listing is known.
    package mutating func rememberEmpty(_ directory: InodeNumber, now: Double, askedAt: UInt64) {
        forgetChanges(directory)
        listings[directory] = Listing(entries: EntryTable.empty, completedAt: now, askedAt: askedAt)
    }

    /// Counts every change made here and every failed one, in any directory: a listing fetched
    /// ahead (`ListingsAhead`) is used only while it has not moved.
    package private(set) var generation: UInt64 = 0

    /// A change we made to `name` in `directory` (nil entry: removed), at `now`.
    /// `correction`: not a change made here but what this mount learned of the name since the
    /// listing (a HEAD): see `Change.correction`.
    package mutating func record(_ directory: InodeNumber, name: String, entry: DirectoryEntry?, now: Double, correction: Bool = false) {
        generation += 1
        let count = changeCount(directory) + 1
        changes[directory] = count
        listings.apply(name.exact, entry, in: directory)
        touch(directory)
        noteNamesUsed(directory, now: now)
        let change = Change(count: count, at: now, name: name.exact, entry: entry, correction: correction)
        journals[directory, default: []].append(change)
        latest[directory, default: [:]][name.exact] = change
        prune(directory, now: now)
        recordedSincePrune += 1
        if recordedSincePrune >= 1_000 {
            recordedSincePrune = 0
            for other in Array(journals.keys) { prune(other, now: now) }
        }
    }

    /// What this mount made of a name since an answer about it (rule 4).
    package enum Since: Equatable {
        /// Nothing: the answer stands.
        case nothing
        /// This entry (nil: removed) after the answer: it describes the name better.
        case changed(DirectoryEntry?)
        /// Changes after the answer are no longer journaled: it may describe an older version.
        case unknown
    }

    /// Whether every change this mount made in `directory` after change count `count` is still
    /// journaled (rule 4 can tell an answer asked then from what was made since).
    package func knowsChanges(_ directory: InodeNumber, since count: UInt64) -> Bool {
        count >= forgottenUpTo[directory] ?? 0
    }

    /// What this mount made of `name` in `directory` after change count `count` (rule 4).
    package func changeSince(_ directory: InodeNumber, _ name: String, count: UInt64) -> Since {
        guard changeCount(directory) > count else { return .nothing }
        guard count >= forgottenUpTo[directory] ?? 0 else { return .unknown }
        guard let change = latest[directory]?[name.exact], change.count > count else { return .nothing }
        return .changed(change.entry)
    }

    /// Names whose last change made here (still journaled) removed them: a listing that lags
    /// behind may still show them.
    package func removedHere(_ directory: InodeNumber, now: Double) -> Set<ExactString> {
        var last: [ExactString: Bool] = [:]
        for change in journals[directory] ?? [] where now - change.at <= journalSeconds {
            last[change.name] = change.entry == nil && !change.shown
        }
        return Set(last.compactMap { $0.value ? $0.key : nil })
    }

    /// An operation on `name` in `directory` failed part-way: the store may hold the old state,
    /// the new one or a mix, so the listing goes and so do that name's journaled changes;
    /// listings under way are refused. The other names' changes stay journaled.
    package mutating func forget(_ name: String, in directory: InodeNumber) {
        generation += 1
        let kept = journals[directory]?.filter { $0.name != name.exact }
        forgetChanges(directory)
        journals[directory] = kept
        listings[directory] = nil
    }

    /// Forgets the listing of `directory` (renamed, removed, forgotten).
    package mutating func drop(_ directory: InodeNumber) {
        forgetChanges(directory)
        listings[directory] = nil
        lastResolved[directory] = nil
        reserved[directory] = nil
        used[directory] = nil
        usedAt[directory] = nil
    }

    /// A change that no listing in progress may be remembered over: counted, and every change
    /// journaled before it forgotten.
    private mutating func forgetChanges(_ directory: InodeNumber) {
        let count = changeCount(directory) + 1
        changes[directory] = count
        journals[directory] = nil
        latest[directory] = nil
        forgottenUpTo[directory] = count
    }

    /// Forgets the changes older than `journalSeconds`, and those beyond `journalLimit`, once
    /// `slack` times that has gone by: a journal is not copied at every change.
    /// (`slack` 1: exactly, as a listing is remembered.)
    private mutating func prune(_ directory: InodeNumber, now: Double, slack: Double = 1.25) {
        guard let journal = journals[directory], let first = journal.first,
            now - first.at > journalSeconds * slack || Double(journal.count) > Double(Self.journalLimit) * slack
        else { return }
        let kept = journal.drop { now - $0.at > journalSeconds }.suffix(Self.journalLimit)
        let forgotten = journal[..<kept.startIndex]
        // (Never lowered: `forget` may have put older changes of other names back.)
        if let last = forgotten.last { forgottenUpTo[directory] = max(forgottenUpTo[directory] ?? 0, last.count) }
        // An answer asked before these is `unknown` now (rule 4).
        for change in forgotten where latest[directory]?[change.name]?.count == change.count {
            latest[directory]?[change.name] = nil
        }
        if latest[directory]?.isEmpty == true { latest[directory] = nil }
        journals[directory] = kept.isEmpty ? nil : Array(kept)
    }
}

extension DirectoryCache {
    /// The directory's node is gone for good (inode numbers are never reused): drop everything.
    package mutating func remove(_ directory: InodeNumber) {
        listings[directory] = nil
        changes[directory] = nil
        journals[directory] = nil
        latest[directory] = nil
        forgottenUpTo[directory] = nil
        lastResolved[directory] = nil
        reserved[directory] = nil
        used[directory] = nil
        usedAt[directory] = nil
    }
}

/// A complete listing by name. The entries stay in the array they were read into (shared with
/// the reader that read them); a table maps names to positions, and our own changes go to an
/// overlay. (As a dictionary of entries, a 200 000-entry listing took 118 MiB; heaptrack.)
/// A remembered listing: its entries (packed, see `PackedEntries`) by name, with the changes
/// made here since.
package struct EntryTable {
    private let entries: PackedEntries
    /// Positions in `entries` in the order of the names' bytes, ties by position; nil when the
    /// listing is in that order already (the usual case: it costs nothing then).
    private let order: [Int32]?
    /// Names changed here since: their entry, or nil when removed.
    private var changes: [ExactString: DirectoryEntry?] = [:]

    package static let empty = EntryTable(PackedEntries(prefix: ""))

    /// A later entry of the same name wins (as in the listing).
    package init(_ entries: PackedEntries) {
        self.entries = entries
        var inOrder = true
        for position in entries.indices.dropFirst()
        where Self.compare(entries, position - 1, position) != .ascending {
            inOrder = false
            break
        }
        order =
            inOrder
            ? nil
            : (0..<Int32(entries.count)).sorted { a, b in
                switch Self.compare(entries, Int(a), Int(b)) {
                case .ascending: true
                case .descending: false
                case .same: a < b
                }
            }
    }

    private enum Comparison { case ascending, same, descending }

    private static func compare(_ entries: PackedEntries, _ a: Int, _ b: Int) -> Comparison {
        entries.withName(a) { first in entries.withName(b) { second in compare(first, second) } }
    }

    private static func compare(_ first: UnsafeBufferPointer<UInt8>, _ second: UnsafeBufferPointer<UInt8>) -> Comparison {
        let common = min(first.count, second.count)
        for i in 0..<common where first[i] != second[i] { return first[i] < second[i] ? .ascending : .descending }
        return first.count == second.count ? .same : first.count < second.count ? .ascending : .descending
    }

    private func position(at rank: Int) -> Int { order.map { Int($0[rank]) } ?? rank }

    /// The position of the listing's entry for `name` (the last of that name), if any.
    private func position(of name: ExactString) -> Int? {
        var text = name.string
        return text.withUTF8 { wanted -> Int? in
            // The first rank whose name sorts after `wanted`; the one before it, if equal, wins.
            var low = 0
            var high = entries.count
            while low < high {
                let middle = (low + high) / 2
                let comparison = entries.withName(position(at: middle)) { Self.compare($0, wanted) }
                if comparison == .descending { high = middle } else { low = middle + 1 }
            }
            guard low > 0 else { return nil }
            let found = position(at: low - 1)
            return entries.withName(found) { Self.compare($0, wanted) } == .same ? found : nil
        }
    }

    package subscript(name: ExactString) -> DirectoryEntry? {
        get {
            if let change = changes[name] { return change }
            return position(of: name).map { entries[$0] }
        }
        set { changes[name] = .some(newValue) }
    }

    /// Names in the listing itself (a name listed twice counts twice; changes made here do not count).
    package var count: Int { entries.count }

    /// Only the changes made here (rule 5): the listing's own entries are dropped.
    package var changesOnly: EntryTable {
        var table = EntryTable(PackedEntries(prefix: entries.prefix))
        table.changes = changes
        return table
    }

    /// Entries of names the listing itself lacks (made here since, or not listed yet), sorted.
    package var addedHere: [DirectoryEntry] {
        changes.compactMap { name, entry in position(of: name) == nil ? entry : nil }
            .sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
    }

    /// Up to `count` entries after `name`'s in the order of the names' bytes, as they are now
    /// (changes made here included); none when the listing itself lacks `name`.
    package func following(_ name: ExactString, count: Int) -> [DirectoryEntry] {
        guard count > 0, let found = position(of: name) else { return [] }
        var rank = order.map { $0.firstIndex(of: Int32(found)) ?? entries.count } ?? found
        var result: [DirectoryEntry] = []
        while rank + 1 < entries.count && result.count < count {
            rank += 1
            let entry = entries[position(at: rank)]
            if let change = changes[entry.name.exact] {
                if let changed = change { result.append(changed) }
            } else {
                result.append(entry)
            }
        }
        return result
    }

    /// Whether the listing itself has `name` (whatever changed here since).
    package func listed(_ name: ExactString) -> Bool { position(of: name) != nil }

    /// Every entry now (one per name), sorted by the bytes of the names.
    package var sorted: PackedEntries {
        // In order, each name once, nothing changed: the entries as they are (no copy; this runs
        // under the filesystem's lock for every readdir of a remembered listing).
        if order == nil && changes.isEmpty { return entries }
        var changed = changes.compactMap { $0.value }.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }[...]
        var result = PackedEntries(prefix: entries.prefix)
        for rank in 0..<entries.count {
            let position = position(at: rank)
            // Of names listed more than once, the last (the next rank holds the same name).
            if rank + 1 < entries.count, Self.compare(entries, position, self.position(at: rank + 1)) == .same { continue }
            let entry = entries[position]
            while let next = changed.first, next.name.utf8.lexicographicallyPrecedes(entry.name.utf8) {
                result.append(next)
                changed.removeFirst()
            }
            if changes[entry.name.exact] == nil { result.append(entry) }
        }
        result.append(contentsOf: changed)
        return result
    }
}


