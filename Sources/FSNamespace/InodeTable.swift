import FSCore
import ObjectStore

/// One name the filesystem knows: its identity (inode, parent, name, key, kind) and what the
/// server, a listing or a local change said about it.
///
/// Kept small (issue 21: a node per entry the kernel holds, 200 000 after an `ls -l` of a large
/// directory): fields most nodes never set live in one box made when one is first set (`Rare`,
/// copied on write, so that a `Node` stays a value), and an MD5 ETag is 16 bytes.
package struct Node {
    package var inode: InodeNumber
    package var parent: InodeNumber
    package var name: String
    package var kind: NodeKind
    /// The object key of a file or symlink; the key prefix ("…/" or "") of a directory.
    package var key: String
    package var size: Int64
    package var etag: String {
        get { packedEtag.string }
        set { packedEtag = PackedETag(newValue) }
    }
    private var packedEtag: PackedETag
    /// The server's time of the last change.
    package var lastModified: Timestamp
    package var stored = StoredAttributes()
    /// The content type without csspfs's parameters.
    package var baseContentType = ""
    /// When size/etag were last confirmed by the server (the filesystem's clock); 0 = never.
    package var confirmedAt: Double = 0
    /// Lookups the kernel holds (see `InodeTable`).
    package fileprivate(set) var lookups: UInt64 = 0
    /// What holds the node besides the kernel: its spool (open for writing, or an upload still
    /// owed) and owed attributes, one pin each.
    package fileprivate(set) var pins: Int32 = 0
    /// Attribute changes (chmod, chown, utimes) of a closed file not stored yet: they are in
    /// `stored`, journaled, and stored by the next upload, rename or flush (see
    /// `Filesystem+Attributes`). What the server says about this version must not overwrite
    /// them; another version (another client's PUT) voids them (`Node.apply`, `Node.merge`).
    /// Set only by `InodeTable.oweAttributes`.
    package var attributesOwed = false
    /// Whether a name in the tree leads to the node (false once unlinked or replaced).
    package fileprivate(set) var linked = true
    /// When the object's full metadata was last known (a HEAD, or our own upload); 0 = never
    /// (a listing shows no metadata).
    package var metadataKnownAt: Double = 0
    /// The `StoreClock` tick as of which the node is described: the latest acknowledgement of a
    /// change of ours, or the `askedAt` of the latest answer taken. Older answers are refused.
    /// (The attribute rule's state, with the three below; see `Node+Merge`.)
    package var describedAsOf: UInt64 = 0
    private var rare: Rare?

    /// The fields few nodes set. Shared between copies of a node until one writes.
    private final class Rare {
        package var manifest: String? = nil
        package var localVersion: UInt64 = 0
        package var changedAt: Timestamp? = nil
        package var accessedAt: Timestamp? = nil
        package var cachedEtag: String? = nil
        package var symlinkTarget: String? = nil
        package var extraMetadata: [String: String] = [:]
        package var attributeVersion: UInt64 = 0
        package var acknowledgedVersion: UInt64 = 0
        package var acknowledgedTime = Timestamp.zero

        package func copy() -> Rare {
            let copy = Rare()
            copy.manifest = manifest
            copy.localVersion = localVersion
            copy.changedAt = changedAt
            copy.accessedAt = accessedAt
            copy.cachedEtag = cachedEtag
            copy.symlinkTarget = symlinkTarget
            copy.extraMetadata = extraMetadata
            copy.attributeVersion = attributeVersion
            copy.acknowledgedVersion = acknowledgedVersion
            copy.acknowledgedTime = acknowledgedTime
            return copy
        }
    }

    /// Writes `value` to a rare field; no box is made to hold a field's default.
    private mutating func setRare<T: Equatable>(_ field: ReferenceWritableKeyPath<Rare, T>, _ value: T, default: T) {
        if rare == nil {
            if value == `default` { return }
            rare = Rare()
        } else if !isKnownUniquelyReferenced(&rare) {
            rare = rare!.copy()
        }
        rare![keyPath: field] = value
    }

    /// `container/prefix` of a DLO manifest.
    package var manifest: String? {
        get { rare?.manifest }
        set { setRare(\.manifest, newValue, default: nil) }
    }
    /// Bumped when this mount stores new bytes or gives the file a spool: a read handle opened
    /// before reads what was written here since (another client's change is ESTALE instead).
    package var localVersion: UInt64 {
        get { rare?.localVersion ?? 0 }
        set { setRare(\.localVersion, newValue, default: 0) }
    }
    /// ctime and atime as this mount changed them (nil: the modification time stands in; an
    /// object store keeps neither).
    package var changedAt: Timestamp? {
        get { rare?.changedAt }
        set { setRare(\.changedAt, newValue, default: nil) }
    }
    package var accessedAt: Timestamp? {
        get { rare?.accessedAt }
        set { setRare(\.accessedAt, newValue, default: nil) }
    }
    /// The ETag of the content the kernel's page cache may hold for this inode.
    package var cachedEtag: String? {
        get { rare?.cachedEtag }
        set { setRare(\.cachedEtag, newValue, default: nil) }
    }
    package var symlinkTarget: String? {
        get { rare?.symlinkTarget }
        set { setRare(\.symlinkTarget, newValue, default: nil) }
    }
    /// `X-Object-Meta-*` of the object other than ours, kept across our updates.
    package var extraMetadata: [String: String] {
        get { rare?.extraMetadata ?? [:] }
        set { setRare(\.extraMetadata, newValue, default: [:]) }
    }
    /// Bumped by every local attribute change (chmod, chown, utimes, a write's mtime): names the
    /// change that an upload, a POST or a COPY stores (`settleAttributes`, `acknowledge`).
    package var attributeVersion: UInt64 {
        get { rare?.attributeVersion ?? 0 }
        set { setRare(\.attributeVersion, newValue, default: 0) }
    }
    /// The latest `attributeVersion` the store acknowledged (or that was given up): while it
    /// is behind, a local change is not stored yet and no answer of the same version may undo it.
    /// Only `acknowledge`, `admits` and `forgetWhatWasSaid` write it.
    package var acknowledgedVersion: UInt64 {
        get { rare?.acknowledgedVersion ?? 0 }
        set { setRare(\.acknowledgedVersion, newValue, default: 0) }
    }
    /// This host's clock when the store last acknowledged a change of ours: an answer asked
    /// earlier shows a newer version only if the server dated it later.
    package var acknowledgedTime: Timestamp {
        get { rare?.acknowledgedTime ?? .zero }
        set { setRare(\.acknowledgedTime, newValue, default: .zero) }
    }

    package init(
        inode: InodeNumber, parent: InodeNumber, name: String, kind: NodeKind, key: String, size: Int64 = 0,
        etag: String = "", lastModified: Timestamp = .zero
    ) {
        self.inode = inode
        self.parent = parent
        self.name = name
        self.kind = kind
        self.key = key
        self.size = size
        self.packedEtag = PackedETag(etag)
        self.lastModified = lastModified
    }
}

/// An ETag: 32 lower-case hex digits (an MD5, as Swift makes for every plain object) as two
/// words, anything else as it is.
package enum PackedETag: Equatable {
    case md5(UInt64, UInt64)
    case other(String)

    package init(_ etag: String) {
        if let (high, low) = PackedEntries.digest(etag) {
            self = .md5(high, low)
        } else {
            self = .other(etag)
        }
    }

    package var string: String {
        switch self {
        case .md5(let high, let low): PackedEntries.hex(high, low)
        case .other(let text): text
        }
    }
}

/// Every node the filesystem knows, the names that lead to them, and the kernel's lookup counts.
/// A value type with no I/O and no lock: `Filesystem.State` holds it under its mutex, and nothing
/// outside this file writes the node or name tables.
///
/// The rules it owns (each in one place):
/// 1. A node lives while the kernel holds a lookup on it, a spool pins it (its bytes are not
///    stored yet), or a living node is linked below it (a pinned file keeps its directory). The
///    root lives forever. A number is never given to another name, and to the same name again
///    only once its node is gone (the kernel forgot it: readdir showed the number as d_ino,
///    `reserved` in `link`); the generation is always 0 (no NFS export).
/// 2. A name leads to at most one node. A name whose kind changes (file -> directory) gets a new
///    node; the old one is unhooked and lives until the kernel forgets it.
/// 3. Identity (inode, parent, name, key, kind) changes only through `insert`, `link`, `unhook`
///    and `move`; `update` changes attributes and keeps identity whatever the closure does.
/// 4. `move` of a directory re-keys every node whose key lies below the old prefix, linked or
///    not (a pinned file whose upload is owed must go to the new key), and reports them.
package struct InodeTable {
    package static let root: InodeNumber = 1

    package private(set) var nodes = NodeStore()
    private var children = ChildIndex()
    private var nextInode: InodeNumber = 2
    /// Directories dropped since the last `takeRemovedDirectories` (their listings must go too).
    private var removedDirectories: [InodeNumber] = []
    /// Files, symlinks and special files dropped while a name still led to them (the kernel
    /// forgot them), since the last
    /// `takeForgottenNames`: readdir may have shown their numbers (d_ino), which the next node
    /// of the name takes (DirectoryCache `reserve`).
    private var forgottenNames: [(parent: InodeNumber, name: String, inode: InodeNumber)] = []

    package init(rootKey: String, rootTime: Timestamp) {
        var root = Node(inode: Self.root, parent: Self.root, name: "", kind: .directory, key: rootKey, lastModified: rootTime)
        root.lookups = 1
        nodes[Self.root] = root
    }

    package subscript(inode: InodeNumber) -> Node? { nodes[inode] }

    /// The node `name` in `parent` leads to.
    package func child(_ parent: InodeNumber, _ name: String) -> Node? {
        children.inode(parent, name, in: nodes).flatMap { nodes[$0] }
    }

    /// Every name in `parent` with its node.
    package func children(of parent: InodeNumber) -> [(name: ExactString, inode: InodeNumber)] { children.list(parent, in: nodes) }

    /// Changes attributes of `inode` (identity and counts stay whatever `body` does); returns the result.
    @discardableResult
    package mutating func update(_ inode: InodeNumber, _ body: (inout Node) -> Void) -> Node? {
        guard let old = nodes[inode] else { return nil }
        var node = old
        body(&node)
        node.inode = old.inode
        node.parent = old.parent
        node.name = old.name
        node.kind = old.kind
        node.key = old.key
        node.lookups = old.lookups
        node.pins = old.pins
        // The merge rules may void owed attributes; nothing makes them owed here.
        node.attributesOwed = old.attributesOwed && node.attributesOwed
        node.linked = old.linked
        nodes[inode] = node
        if old.attributesOwed && !node.attributesOwed { unpin(inode) }
        return node
    }

    /// A name just made here (create, mkdir, symlink): a new node with one kernel lookup, replacing
    /// whatever the name led to.
    package mutating func insert(_ template: Node) -> Node {
        var node = template
        node.inode = nextInode
        nextInode += 1
        node.lookups = 1
        node.pins = 0
        node.attributesOwed = false
        node.linked = true
        unhook(parent: node.parent, name: node.name, collectingParent: false)
        nodes[node.inode] = node
        children.set(node.parent, node.name, node.inode, in: nodes)
        return node
    }

    /// The node for `name` in `parent` as a listing or HEAD describes it: the node the name leads
    /// to if it has the same kind (its key updated), else a new one. Counts `lookups` kernel lookups.
    /// `reserved`: the number readdir already showed for the name (`reserveInode`), used when it
    /// is free, so that d_ino and st_ino agree.
    package mutating func link(
        parent: InodeNumber, name: String, kind: NodeKind, key: String, lookups: UInt64, reserved: InodeNumber? = nil
    ) -> Node {
        if let inode = children.inode(parent, name, in: nodes), var node = nodes[inode], node.kind == kind {
            node.lookups += lookups
            node.key = key
            nodes[inode] = node
            return node
        }
        var number = nextInode
        if let reserved, nodes[reserved] == nil, reserved < nextInode, reserved != Self.root {
            number = reserved
        } else {
            nextInode += 1
        }
        var node = Node(inode: number, parent: parent, name: name, kind: kind, key: key)
        node.lookups = lookups
        unhook(parent: parent, name: name, collectingParent: false)
        nodes[node.inode] = node
        children.set(parent, name, node.inode, in: nodes)
        collectIfUnused(node.inode)
        return node
    }

    /// A number for a name readdir shows before any node exists for it (see `link`).
    package mutating func reserveInode() -> InodeNumber {
        defer { nextInode += 1 }
        return nextInode
    }

    /// The kernel dropped `count` lookups.
    package mutating func forget(_ inode: InodeNumber, count: UInt64) {
        guard inode != Self.root, var node = nodes[inode] else { return }
        precondition(node.lookups >= count, "INTERNAL ERROR: forget \(count) of inode \(inode) with \(node.lookups)")
        node.lookups -= count
        nodes[inode] = node
        collectIfUnused(inode)
    }

    /// Counts one more kernel lookup of a node already known (readdirplus of a local file).
    package mutating func countLookup(_ inode: InodeNumber) {
        nodes[inode]?.lookups += 1
    }

    /// A spool holds the node: it lives until `unpin`, whatever the kernel forgets.
    package mutating func pin(_ inode: InodeNumber) {
        nodes[inode]?.pins += 1
    }

    /// The node's attributes are owed to the server: it lives (pinned once) until `settleAttributes`.
    package mutating func oweAttributes(_ inode: InodeNumber) {
        guard var node = nodes[inode], !node.attributesOwed else { return }
        node.attributesOwed = true
        node.pins += 1
        nodes[inode] = node
    }

    /// The owed attributes are stored as they are now (or the object is gone): the pin
    /// `oweAttributes` took goes, and no change waits for the store's acknowledgement any more
    /// (the attribute rule). Callers check that the node did not change since what was stored.
    package mutating func settleAttributes(_ inode: InodeNumber) {
        guard let node = nodes[inode], node.attributesOwed else { return }
        nodes[inode]?.attributesOwed = false
        nodes[inode]?.acknowledgedVersion = node.attributeVersion
        unpin(inode)
    }

    /// Nodes whose attributes are owed.
    package var nodesOwingAttributes: [Node] { nodes.compactMap { $0.value.attributesOwed ? $0.value : nil } }

    package mutating func unpin(_ inode: InodeNumber) {
        guard var node = nodes[inode] else { return }
        precondition(node.pins > 0, "INTERNAL ERROR: unpin of inode \(inode) that no spool holds")
        node.pins -= 1
        nodes[inode] = node
        collectIfUnused(inode)
    }

    /// The name is gone (unlink, rmdir, replaced by a rename): the node it led to lives on while the
    /// kernel or a spool holds it, reachable by inode only. Returns that node.
    /// `collectingParent`: false when the name is about to lead somewhere else (the directory
    /// must not go in between, as it would if that name was all that held it).
    @discardableResult
    package mutating func unhook(parent: InodeNumber, name: String, collectingParent: Bool = true) -> Node? {
        guard let inode = children.remove(parent, name, in: nodes) else { return nil }
        nodes[inode]?.linked = false
        let node = nodes[inode]
        collectIfUnused(inode)
        if collectingParent { collectIfUnused(parent) }
        return node
    }

    /// Renames `inode` to `name` in `newParent` with `key`, replacing what that name led to. A
    /// directory's descendants (every node keyed below its old prefix) get keys below the new
    /// one. Returns the inodes whose keys changed.
    @discardableResult
    package mutating func move(_ inode: InodeNumber, to newParent: InodeNumber, name: String, key: String) -> [InodeNumber] {
        guard var node = nodes[inode] else { return [] }
        if children.inode(node.parent, node.name, in: nodes) == inode { children.remove(node.parent, node.name, in: nodes) }
        if children.inode(newParent, name, in: nodes) != inode { unhook(parent: newParent, name: name, collectingParent: false) }
        let oldParent = node.parent
        let oldKey = node.key
        // The descendants and their keys before the move (a file's key below its directory's
        // is made from it when read: NodeStore), shortest first, so that a directory has its new
        // key before the files in it get theirs.
        var descendants: [(inode: InodeNumber, key: String)] = []
        if node.kind == .directory && !oldKey.isSameKey(as: key) {
            for (other, descendant) in nodes where other != inode && descendant.key.utf8.starts(with: oldKey.utf8) {
                descendants.append((other, descendant.key))
            }
            descendants.sort { $0.key.utf8.count < $1.key.utf8.count }
        }
        node.parent = newParent
        node.name = name
        node.key = key
        node.linked = true
        nodes[inode] = node
        children.set(newParent, name, inode, in: nodes)
        var moved = [inode]
        for (other, oldDescendantKey) in descendants {
            nodes[other]?.key = key + String(oldDescendantKey.utf8.dropFirst(oldKey.utf8.count))!
            moved.append(other)
        }
        collectIfUnused(oldParent)
        return moved
    }

    /// Up to `count` names whose nodes the kernel may be asked to forget (`meta_max_entries`,
    /// `Filesystem+Bound`): files, symlinks and special files the kernel holds that nothing
    /// pins (a spool, owed attributes) and `held` does not name (open), from `directories` in
    /// that order. Directories are never chosen: the kernel forgets a directory entry even when
    /// a process works in it, whose getcwd then fails.
    package func forgettable(
        _ count: Int, in directories: [InodeNumber], held: Set<InodeNumber>
    ) -> [(parent: InodeNumber, name: String)] {
        var chosen: [(parent: InodeNumber, name: String)] = []
        for directory in directories where chosen.count < count {
            for (name, inode) in children.list(directory, in: nodes) where chosen.count < count && !held.contains(inode) {
                guard let node = nodes[inode], node.kind != .directory, node.lookups > 0, node.pins == 0 else { continue }
                chosen.append((directory, name.string))
            }
        }
        return chosen
    }

    /// Directories dropped since the last call.
    package mutating func takeRemovedDirectories() -> [InodeNumber] {
        defer { removedDirectories = [] }
        return removedDirectories
    }

    /// Nodes dropped while a name led to them, since the last call.
    package mutating func takeForgottenNames() -> [(parent: InodeNumber, name: String, inode: InodeNumber)] {
        defer { forgottenNames = [] }
        return forgottenNames
    }

    /// Rule 1, the only place a node is dropped.
    private mutating func collectIfUnused(_ inode: InodeNumber) {
        guard inode != Self.root, let node = nodes[inode], node.lookups == 0, node.pins == 0, children.isEmpty(inode)
        else { return }
        // Out of its directory's table first: the table reads the names of the nodes in it.
        let wasLinked = children.inode(node.parent, node.name, in: nodes) == inode
        if wasLinked { children.remove(node.parent, node.name, in: nodes) }
        nodes[inode] = nil
        if node.kind == .directory { removedDirectories.append(inode) }
        // (Not a directory's: its listing and change count go with its number, and an answer
        // asked under the old node must not count as one about the new.)
        if wasLinked && node.kind != .directory { forgottenNames.append((node.parent, node.name, inode)) }
        if wasLinked { collectIfUnused(node.parent) }
    }
}

/// Nodes by inode number: slots in chunks of `chunkSize` (a freed slot is reused) and a table
/// from inode numbers to slots (`SlotIndex`). As a dictionary of 296-byte nodes, 200 000 nodes
/// took 159 MiB (its load factor and doubling; heaptrack); as one array of slots, the array's
/// doubling held up to twice the nodes' size (41 MiB at 100 000 nodes of 208 bytes, heaptrack);
/// a chunk is allocated whole, once, so at most one chunk is spare.
///
/// A node like most (no rare field set, an MD5 ETag or none, times in nanoseconds, small
/// counts) is kept as a `ThinNode` of 80 bytes (a `Node` is 216), and a file's key is not kept
/// when it is its parent directory's key and its name (the key is made again when the node is
/// read). The rest are kept whole, in a table by slot. A node reads back exactly as it was
/// stored.
package struct NodeStore: Sequence {
    package static let chunkSize = 1024
    private var chunks: [[ThinNode]] = []
    /// The nodes not kept thin, by slot (their slot says `ThinNode.whole`).
    private var wholes: [Int32: Node] = [:]
    private var used = 0
    private var index = SlotIndex()
    private var free: [Int32] = []
    /// The keys of thin nodes whose key is not made from their directory's, by slot.
    private var keys: [Int32: String] = [:]
    /// The styles of thin nodes (a mount sees a few; past 65 536 of them, nodes
    /// of a new one are kept whole). Kept for the mount's life.
    private var styles = NumberedStyles(limit: 1 << 16)

    /// A slot as read: its node thin or whole. (Not stored as such: an enum's tag would make a
    /// slot 88 bytes, not 80.)
    private enum Slot {
        case empty
        case thin(ThinNode)
        case whole(Node)
    }

    package var count: Int { index.count }

    /// Bytes a node takes in its chunk (for tests: thin nodes are what most entries cost).
    package static var slotBytes: Int { MemoryLayout<ThinNode>.stride }

    /// The nodes kept thin (for tests; walks every slot).
    package var thinCount: Int {
        index.reduce(0) { count, entry in
            if case .thin = slot(entry.1) { return count + 1 }
            return count
        }
    }

    private func slot(_ number: Int32) -> Slot {
        let thin = chunks[Int(number) / Self.chunkSize][Int(number) % Self.chunkSize]
        if thin.isEmpty { return .empty }
        if thin.isWhole {
            guard let node = wholes[number] else { preconditionFailure("INTERNAL ERROR: slot \(number) lost its whole node") }
            return .whole(node)
        }
        return .thin(thin)
    }

    private func node(at number: Int32, inode: InodeNumber) -> Node? {
        switch slot(number) {
        case .empty: return nil
        case .whole(let node): return node
        case .thin(let thin):
            var key = keys[number] ?? ""
            if thin.keyIsDerived {
                // A linked node keeps its directory (InodeTable rule 1); an unlinked one keeps its key.
                guard let parentKey = storedKey(of: thin.parent) else {
                    preconditionFailure("INTERNAL ERROR: the directory \(thin.parent) of linked inode \(inode) is gone")
                }
                key = parentKey + thin.name
            }
            return thin.node(inode: inode, key: key, style: styles[thin.style])
        }
    }

    /// The name of `inode` (without making the whole node).
    package func name(of inode: InodeNumber) -> String? {
        guard let number = index[inode] else { return nil }
        switch slot(number) {
        case .empty: return nil
        case .whole(let node): return node.name
        case .thin(let thin): return thin.name
        }
    }

    /// The key of `inode` as stored: a directory's is always kept whole.
    private func storedKey(of inode: InodeNumber) -> String? {
        guard let number = index[inode] else { return nil }
        switch slot(number) {
        case .empty: return nil
        case .whole(let node): return node.key
        case .thin(let thin): return thin.keyIsDerived ? nil : keys[number] ?? ""
        }
    }

    private mutating func set(_ number: Int32, _ node: Node?, inode: InodeNumber) {
        var value = ThinNode.empty
        keys[number] = nil
        // (Every node made or changed comes here: the table of whole nodes only when it has one.)
        if chunks[Int(number) / Self.chunkSize][Int(number) % Self.chunkSize].isWhole { wholes[number] = nil }
        if let node {
            if var thin = ThinNode(node, style: { styles.number($0) }) {
                // A linked file's key below its directory's is made again when read; an unlinked
                // node's parent may go, so its key is kept.
                if node.kind != .directory, node.linked, inode != node.parent, let parentKey = storedKey(of: node.parent),
                    node.key.utf8.count == parentKey.utf8.count + node.name.utf8.count,
                    node.key.utf8.starts(with: parentKey.utf8), node.key.utf8.reversed().starts(with: node.name.utf8.reversed())
                {
                    thin.keyIsDerived = true
                } else {
                    keys[number] = node.key
                }
                value = thin
            } else {
                value = .whole
                wholes[number] = node
            }
        }
        chunks[Int(number) / Self.chunkSize][Int(number) % Self.chunkSize] = value
    }

    package subscript(inode: InodeNumber) -> Node? {
        get { index[inode].flatMap { node(at: $0, inode: inode) } }
        set {
            if let number = index[inode] {
                set(number, newValue, inode: inode)
                if newValue == nil {
                    index[inode] = nil
                    free.append(number)
                }
            } else if let newValue {
                let number: Int32
                if let reused = free.popLast() {
                    number = reused
                } else {
                    if used == chunks.count * Self.chunkSize {
                        chunks.append(Array(repeating: ThinNode.empty, count: Self.chunkSize))
                    }
                    number = Int32(used)
                    used += 1
                }
                set(number, newValue, inode: inode)
                index[inode] = number
            }
        }
    }

    package func makeIterator() -> AnyIterator<(key: InodeNumber, value: Node)> {
        var inner = index.makeIterator()
        let store = self
        return AnyIterator {
            guard let (inode, slot) = inner.next() else { return nil }
            return (key: inode, value: store.node(at: slot, inode: inode)!)
        }
    }
}


/// A `Node` as `NodeStore` keeps most, in 80 bytes (a `Node` is about 216): without its inode
/// (the store's index has it) and its key (the store keeps it aside, or makes it from the
/// directory's: `keyIsDerived`), its rare fields (none set), an MD5 ETag as two words, times in
/// nanoseconds, its content type, mode and owners as a style number, its parent, `describedAsOf`,
/// lookups and pins when they fit their narrower fields (else the node is kept whole), and
/// `metadataKnownAt` as a flag (0, or when size and ETag were confirmed: a HEAD sets both).
private struct ThinNode {
    private var parentNumber: UInt32
    private var described: UInt32
    package var name: String
    package var size: Int64
    package var etag: (UInt64, UInt64)
    package var lastModified: Int64
    package var mtime: Int64
    package var confirmedAt: Double
    package var style: UInt32
    private var lookupCount: UInt16
    private var flags: UInt16

    private enum Flag {
        package static let kind: UInt16 = 0x07
        package static let hasEtag: UInt16 = 1 << 3
        package static let hasMtime: UInt16 = 1 << 4
        package static let attributesOwed: UInt16 = 1 << 5
        package static let linked: UInt16 = 1 << 6
        package static let keyIsDerived: UInt16 = 1 << 7
        /// `metadataKnownAt` is `confirmedAt` (else 0; a node with another is kept whole).
        package static let metadataKnown: UInt16 = 1 << 8
        /// The pins, 0 to 15.
        package static let pinShift: UInt16 = 12
    }

    private static let kinds: [NodeKind] = [.file, .directory, .symlink, .fifo, .socket]
    /// Kinds of slots that hold no thin node (see `NodeStore`).
    private static let emptyMarker: UInt16 = 6
    private static let wholeMarker: UInt16 = 7

    /// An empty slot; a slot whose node `NodeStore` keeps whole.
    package static let empty = ThinNode(marker: emptyMarker)
    package static let whole = ThinNode(marker: wholeMarker)

    private init(marker: UInt16) {
        parentNumber = 0
        described = 0
        name = ""
        size = 0
        etag = (0, 0)
        lastModified = 0
        mtime = 0
        confirmedAt = 0
        style = 0
        lookupCount = 0
        flags = marker
    }

    package var isEmpty: Bool { flags & Flag.kind == Self.emptyMarker }
    package var isWhole: Bool { flags & Flag.kind == Self.wholeMarker }

    package var parent: InodeNumber { InodeNumber(parentNumber) }
    package var describedAsOf: UInt64 { UInt64(described) }
    package var lookups: UInt64 { UInt64(lookupCount) }
    package var pins: Int32 { Int32(flags >> Flag.pinShift) }
    package var keyIsDerived: Bool {
        get { flags & Flag.keyIsDerived != 0 }
        set { flags = newValue ? flags | Flag.keyIsDerived : flags & ~Flag.keyIsDerived }
    }

    /// nil when `node` has something a thin node cannot hold; `style` numbers the node's style.
    package init?(_ node: Node, style: (NodeStyle) -> UInt32?) {
        guard node.rareFieldsUnset, let modified = PackedEntries.nanoseconds(node.lastModified),
            let parent = UInt32(exactly: node.parent), let described = UInt32(exactly: node.describedAsOf),
            let lookups = UInt16(exactly: node.lookups), node.pins >= 0, node.pins < 1 << (16 - Flag.pinShift),
            node.metadataKnownAt == 0 || node.metadataKnownAt == node.confirmedAt
        else { return nil }
        var mtime: Int64 = 0
        if let stamp = node.stored.mtime {
            guard let nanoseconds = PackedEntries.nanoseconds(stamp) else { return nil }
            mtime = nanoseconds
        }
        var digest: (UInt64, UInt64)? = nil
        switch node.packedEtagValue {
        case .md5(let high, let low): digest = (high, low)
        case .other(let text): if !text.isEmpty { return nil }
        }
        let stored = node.stored
        guard
            let number = style(
                NodeStyle(baseContentType: node.baseContentType.exact, mode: stored.mode, uid: stored.uid, gid: stored.gid))
        else { return nil }
        parentNumber = parent
        self.described = described
        name = node.name
        size = node.size
        etag = digest ?? (0, 0)
        lastModified = modified
        self.mtime = mtime
        confirmedAt = node.confirmedAt
        self.style = number
        lookupCount = lookups
        flags = UInt16(Self.kinds.firstIndex(of: node.kind)!) | UInt16(node.pins) << Flag.pinShift
        if digest != nil { flags |= Flag.hasEtag }
        if stored.mtime != nil { flags |= Flag.hasMtime }
        if node.attributesOwed { flags |= Flag.attributesOwed }
        if node.linked { flags |= Flag.linked }
        if node.metadataKnownAt != 0 { flags |= Flag.metadataKnown }
    }

    package var kind: NodeKind { Self.kinds[Int(flags & Flag.kind)] }
    package var hasEtag: Bool { flags & Flag.hasEtag != 0 }
    package var attributesOwed: Bool { flags & Flag.attributesOwed != 0 }
    package var linked: Bool { flags & Flag.linked != 0 }
    package var metadataKnownAt: Double { flags & Flag.metadataKnown != 0 ? confirmedAt : 0 }

    /// The whole node again.
    package func node(inode: InodeNumber, key: String, style: NodeStyle) -> Node {
        var node = Node(
            inode: inode, parent: parent, name: name, kind: kind, key: key, size: size,
            lastModified: PackedEntries.timestamp(lastModified))
        let stored = StoredAttributes(
            mode: style.mode, uid: style.uid, gid: style.gid,
            mtime: flags & Flag.hasMtime != 0 ? PackedEntries.timestamp(mtime) : nil)
        node.restore(
            etag: hasEtag ? .md5(etag.0, etag.1) : .other(""), stored: stored, baseContentType: style.baseContentType.string,
            confirmedAt: confirmedAt, metadataKnownAt: metadataKnownAt, describedAsOf: describedAsOf,
            lookups: lookups, pins: pins, attributesOwed: attributesOwed, linked: linked)
        return node
    }
}

extension Node {
    fileprivate var rareFieldsUnset: Bool { rare == nil }
    fileprivate var packedEtagValue: PackedETag { packedEtag }

    fileprivate mutating func restore(
        etag: PackedETag, stored: StoredAttributes, baseContentType: String, confirmedAt: Double,
        metadataKnownAt: Double, describedAsOf: UInt64, lookups: UInt64, pins: Int32, attributesOwed: Bool, linked: Bool
    ) {
        packedEtag = etag
        self.stored = stored
        self.baseContentType = baseContentType
        self.confirmedAt = confirmedAt
        self.metadataKnownAt = metadataKnownAt
        self.describedAsOf = describedAsOf
        self.lookups = lookups
        self.pins = pins
        self.attributesOwed = attributesOwed
        self.linked = linked
    }
}

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
