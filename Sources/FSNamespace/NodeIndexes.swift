import FSCore
import ObjectStore


/// The names in each directory, as a table per directory of the inode numbers the names lead
/// to: open addressing with linear probing, 8 bytes a slot (the inode number, the top byte a
/// tag from the name's hash), the names read from the nodes (`NodeStore.name(of:)`). As a
/// `[ExactString: InodeNumber]` a directory of 200 000 names took 12.6 MiB, and 19 MiB while it
/// grew (24 bytes a slot, its last doubling at 196 608 names; heaptrack); this takes 2 MiB.
/// Tables are up to seven eighths full (9 to 18 bytes a name, 12 on average; at three quarters
/// 11 to 21, 15): a probe is one word, compared by its tag, and the probes of a lookup are
/// neighbours in memory, so a long run costs little.
/// A node must be in the store while its name is in a table, and keep that name (InodeTable
/// takes it out first when it moves or goes).
package struct ChildIndex {
    private var tables: [InodeNumber: Table] = [:]

    private struct Table {
        /// 0: empty; else tag << 56 | inode.
        package var slots: [UInt64]
        package var count = 0

        package init(capacity: Int) { slots = Array(repeating: 0, count: capacity) }
    }

    private static let inodeBits: UInt64 = (1 << 56) - 1

    private static func hash(_ name: String) -> UInt64 {
        var hasher = Hasher()
        var name = name
        name.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
        return UInt64(bitPattern: Int64(hasher.finalize()))
    }

    /// The name of a node in a table: in the store (see above).
    private static func name(_ inode: InodeNumber, in nodes: NodeStore) -> String {
        guard let name = nodes.name(of: inode) else { preconditionFailure("INTERNAL ERROR: inode \(inode) named in a directory is gone") }
        return name
    }

    private static func same(_ inode: InodeNumber, _ name: String, in nodes: NodeStore) -> Bool {
        guard let other = nodes.name(of: inode) else { return false }
        return other.utf8.elementsEqual(name.utf8)
    }

    /// Where `name` is in `table`, or the empty slot where it would go.
    private static func find(_ name: String, hash: UInt64, in table: Table, nodes: NodeStore) -> (index: Int, found: Bool) {
        let mask = table.slots.count - 1
        let tag = hash >> 56
        var index = Int(truncatingIfNeeded: hash) & mask
        while true {
            let slot = table.slots[index]
            if slot == 0 { return (index, false) }
            if slot >> 56 == tag && same(slot & inodeBits, name, in: nodes) { return (index, true) }
            index = (index + 1) & mask
        }
    }

    package func inode(_ parent: InodeNumber, _ name: String, in nodes: NodeStore) -> InodeNumber? {
        guard let table = tables[parent] else { return nil }
        let (index, found) = Self.find(name, hash: Self.hash(name), in: table, nodes: nodes)
        return found ? table.slots[index] & Self.inodeBits : nil
    }

    package func isEmpty(_ parent: InodeNumber) -> Bool { tables[parent] == nil }

    /// `name` in `parent` leads to `inode` (whatever it led to before).
    package mutating func set(_ parent: InodeNumber, _ name: String, _ inode: InodeNumber, in nodes: NodeStore) {
        precondition(inode > 0 && inode <= Self.inodeBits, "INTERNAL ERROR: inode \(inode) out of range")
        var table = tables.removeValue(forKey: parent) ?? Table(capacity: 8)
        if (table.count + 1) * 8 > table.slots.count * 7 { table = Self.grown(table, nodes: nodes) }
        let hash = Self.hash(name)
        let (index, found) = Self.find(name, hash: hash, in: table, nodes: nodes)
        if !found { table.count += 1 }
        table.slots[index] = (hash >> 56) << 56 | inode
        tables[parent] = table
    }

    /// Takes `name` out of `parent`; returns the inode it led to.
    @discardableResult
    package mutating func remove(_ parent: InodeNumber, _ name: String, in nodes: NodeStore) -> InodeNumber? {
        guard var table = tables.removeValue(forKey: parent) else { return nil }
        defer { if table.count > 0 { tables[parent] = table } }
        var (index, found) = Self.find(name, hash: Self.hash(name), in: table, nodes: nodes)
        guard found else { return nil }
        let inode = table.slots[index] & Self.inodeBits
        // Backward shift: a name further on whose probe passed this slot moves into it.
        let mask = table.slots.count - 1
        var next = index
        while true {
            next = (next + 1) & mask
            let slot = table.slots[next]
            if slot == 0 { break }
            let home = Int(truncatingIfNeeded: Self.hash(Self.name(slot & Self.inodeBits, in: nodes))) & mask
            if LinearProbing.moves(home: home, freed: index, at: next) {
                table.slots[index] = slot
                index = next
            }
        }
        table.slots[index] = 0
        table.count -= 1
        return inode
    }

    /// Every name in `parent` with the inode it leads to.
    package func list(_ parent: InodeNumber, in nodes: NodeStore) -> [(name: ExactString, inode: InodeNumber)] {
        guard let table = tables[parent] else { return [] }
        return table.slots.compactMap { slot in
            slot == 0 ? nil : (Self.name(slot & Self.inodeBits, in: nodes).exact, slot & Self.inodeBits)
        }
    }

    private static func grown(_ table: Table, nodes: NodeStore) -> Table {
        var bigger = Table(capacity: table.slots.count * 2)
        let mask = bigger.slots.count - 1
        for slot in table.slots where slot != 0 {
            var index = Int(truncatingIfNeeded: hash(name(slot & inodeBits, in: nodes))) & mask
            while bigger.slots[index] != 0 { index = (index + 1) & mask }
            bigger.slots[index] = slot
            bigger.count += 1
        }
        return bigger
    }
}

/// Inode numbers to node slots (`NodeStore`): open addressing with linear probing, 8 bytes a
/// slot (the number as 32 bits), up to 80 % full. As a dictionary, 200 000 nodes took 6.3 MiB
/// and 9.4 MiB while it grew (its last doubling at 196 608); this takes 2 MiB. Numbers past
/// 32 bits (a mount hands out four billion first) are kept in a dictionary beside it.
package struct SlotIndex: Sequence {
    /// 0: empty.
    private var keys: [UInt32] = []
    private var values: [Int32] = []
    private var narrowCount = 0
    private var wide: [InodeNumber: Int32] = [:]

    package var count: Int { narrowCount + wide.count }

    private func home(_ inode: UInt32) -> Int {
        // Times an odd number: on the low bits a permutation, so a run of consecutive numbers
        // (inodes are handed out in order) never collides, and spread out.
        Int(truncatingIfNeeded: UInt64(inode) &* 0x9E37_79B9_7F4A_7C15) & (keys.count - 1)
    }

    private func find(_ inode: UInt32) -> (index: Int, found: Bool) {
        let mask = keys.count - 1
        var index = home(inode)
        while true {
            if keys[index] == inode { return (index, true) }
            if keys[index] == 0 { return (index, false) }
            index = (index + 1) & mask
        }
    }

    package subscript(inode: InodeNumber) -> Int32? {
        get {
            guard let inode = UInt32(exactly: inode) else { return wide[inode] }
            guard narrowCount > 0 else { return nil }
            let (index, found) = find(inode)
            return found ? values[index] : nil
        }
        set {
            precondition(inode != 0, "INTERNAL ERROR: inode 0 in the slot index")
            guard let narrow = UInt32(exactly: inode) else {
                wide[inode] = newValue
                return
            }
            if let newValue {
                if keys.isEmpty || (narrowCount + 1) * 5 > keys.count * 4 { grow() }
                let (index, found) = find(narrow)
                if !found {
                    keys[index] = narrow
                    narrowCount += 1
                }
                values[index] = newValue
            } else if narrowCount > 0 {
                var (index, found) = find(narrow)
                guard found else { return }
                // Backward shift: a key further on whose probe passed this slot moves into it.
                let mask = keys.count - 1
                var next = index
                while true {
                    next = (next + 1) & mask
                    let key = keys[next]
                    if key == 0 { break }
                    if LinearProbing.moves(home: home(key), freed: index, at: next) {
                        keys[index] = key
                        values[index] = values[next]
                        index = next
                    }
                }
                keys[index] = 0
                narrowCount -= 1
            }
        }
    }

    private mutating func grow() {
        let (oldKeys, oldValues) = (keys, values)
        keys = Array(repeating: 0, count: Swift.max(16, oldKeys.count * 2))
        values = Array(repeating: 0, count: keys.count)
        for (key, value) in zip(oldKeys, oldValues) where key != 0 {
            let (index, _) = find(key)
            keys[index] = key
            values[index] = value
        }
    }

    package func makeIterator() -> AnyIterator<(InodeNumber, Int32)> {
        var position = 0
        let (keys, values) = (self.keys, self.values)
        var wide = self.wide.makeIterator()
        return AnyIterator {
            while position < keys.count {
                defer { position += 1 }
                if keys[position] != 0 { return (InodeNumber(keys[position]), values[position]) }
            }
            return wide.next().map { ($0.key, $0.value) }
        }
    }
}

/// Deletion from a table with linear probing, by backward shift (no tombstones): after a slot is
/// freed, each entry further on moves into it unless that would put it before its home.
package enum LinearProbing {
    /// Whether the entry at `at`, whose home slot is `home`, moves into the slot freed at
    /// `freed`: it stays when its home lies cyclically in (freed, at].
    package static func moves(home: Int, freed: Int, at: Int) -> Bool {
        let stays = freed <= at ? (freed < home && home <= at) : (freed < home || home <= at)
        return !stays
    }
}
