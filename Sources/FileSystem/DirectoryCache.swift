import ObjectStore

/// Remembered directory listings and the lookup heuristics around them. A value type with no I/O
/// and no lock, held in `Filesystem.State`.
///
/// The rules it owns:
/// 1. A complete listing is remembered for `dir_timeout` and answers lookups and readdir.
/// 2. Our own changes are applied to a remembered listing in place (`record`), and every change
///    in a directory bumps its change count. A listing that started before a change is never
///    remembered (`remember` refuses it): an older listing must not undo what we just did.
/// 3. A directory that is renamed, removed or forgotten loses its listing (`drop`), since the
///    keys in it name the old place.
struct DirectoryCache {
    struct Listing {
        var entries: EntryTable
        var completedAt: Double
        /// The `StoreClock` tick taken before its first request (the attribute rule, `Node+Merge`).
        var askedAt: UInt64
    }

    private var listings: [InodeNumber: Listing] = [:]
    /// Changes made here per directory (see rule 2); absent = 0.
    private var changes: [InodeNumber: UInt64] = [:]
    /// When a lookup last had to ask the server about one name in a directory.
    var lastResolved: [InodeNumber: Double] = [:]
    /// Directories being listed for lookups right now (one listing at a time each).
    var listingForLookup: Set<InodeNumber> = []
    /// Inode numbers readdir showed for names that had no node yet (d_ino), per directory: the
    /// node a later lookup makes takes the same number.
    private var reserved: [InodeNumber: [ExactString: InodeNumber]] = [:]

    /// The number readdir shows for `name` in `directory` without a node: reserved once, with
    /// `allocate`, then the same until the directory is dropped.
    mutating func reservedInode(_ directory: InodeNumber, _ name: String, allocate: () -> InodeNumber) -> InodeNumber {
        if let number = reserved[directory]?[name.exact] { return number }
        let number = allocate()
        reserved[directory, default: [:]][name.exact] = number
        return number
    }

    /// Takes the number reserved for `name`, if any: a node is being made for it, which owns the
    /// number from now on.
    mutating func takeReservation(_ directory: InodeNumber, _ name: String) -> InodeNumber? {
        reserved[directory]?.removeValue(forKey: name.exact)
    }

    /// The remembered listing of `directory` if it is younger than `maximumAge`.
    func listing(_ directory: InodeNumber, now: Double, maximumAge: Double) -> Listing? {
        guard let listing = listings[directory], now - listing.completedAt <= maximumAge else { return nil }
        return listing
    }

    /// Any remembered listing of `directory`, however old.
    func anyListing(_ directory: InodeNumber) -> Listing? { listings[directory] }

    /// The change count to pass to `remember` for a listing that starts now.
    func changeCount(_ directory: InodeNumber) -> UInt64 { changes[directory] ?? 0 }

    /// Remembers a complete listing that started at change count `startedAt`; refused (false)
    /// when the directory changed here since.
    @discardableResult
    mutating func remember(
        _ entries: EntryTable, for directory: InodeNumber, now: Double, startedAt: UInt64, askedAt: UInt64
    ) -> Bool {
        guard changeCount(directory) == startedAt else { return false }
        listings[directory] = Listing(entries: entries, completedAt: now, askedAt: askedAt)
        return true
    }

    /// A new, empty directory made here: its listing is known.
    mutating func rememberEmpty(_ directory: InodeNumber, now: Double, askedAt: UInt64) {
        changes[directory, default: 0] += 1
        listings[directory] = Listing(entries: EntryTable([]), completedAt: now, askedAt: askedAt)
    }

    /// A change we made to `name` in `directory` (nil entry: removed).
    mutating func record(_ directory: InodeNumber, name: String, entry: DirectoryEntry?) {
        changes[directory, default: 0] += 1
        listings[directory]?.entries[name.exact] = entry
    }

    /// Forgets the listing of `directory` (renamed, removed, forgotten).
    mutating func drop(_ directory: InodeNumber) {
        changes[directory, default: 0] += 1
        listings[directory] = nil
        lastResolved[directory] = nil
        reserved[directory] = nil
    }
}

extension DirectoryCache {
    /// The directory's node is gone for good (inode numbers are never reused): drop everything.
    mutating func remove(_ directory: InodeNumber) {
        listings[directory] = nil
        changes[directory] = nil
        lastResolved[directory] = nil
        reserved[directory] = nil
    }
}

/// A complete listing by name. The entries stay in the array they were read into (shared with
/// the reader that read them); a table maps names to positions, and our own changes go to an
/// overlay. (As a dictionary of entries, a 200 000-entry listing took 118 MiB; heaptrack.)
struct EntryTable {
    private let entries: [DirectoryEntry]
    private let positions: [ExactString: Int32]
    /// Names changed here since: their entry, or nil when removed.
    private var changes: [ExactString: DirectoryEntry?] = [:]

    /// A later entry of the same name wins (as in the listing).
    init(_ entries: [DirectoryEntry]) {
        self.entries = entries
        var positions: [ExactString: Int32] = [:]
        positions.reserveCapacity(entries.count)
        for (index, entry) in entries.enumerated() { positions[entry.name.exact] = Int32(index) }
        self.positions = positions
    }

    subscript(name: ExactString) -> DirectoryEntry? {
        get {
            if let change = changes[name] { return change }
            return positions[name].map { entries[Int($0)] }
        }
        set { changes[name] = .some(newValue) }
    }

    /// Every entry now (one per name), sorted by the bytes of the names.
    var sorted: [DirectoryEntry] {
        var result: [DirectoryEntry] = []
        result.reserveCapacity(entries.count + changes.count)
        for (index, entry) in entries.enumerated()
        where changes[entry.name.exact] == nil && positions[entry.name.exact] == Int32(index) {
            result.append(entry)
        }
        for case let (_, entry?) in changes { result.append(entry) }
        return result.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
    }
}

