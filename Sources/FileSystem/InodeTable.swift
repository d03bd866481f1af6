import ObjectStore

/// One name the filesystem knows: its identity (inode, parent, name, key, kind) and what the
/// server, a listing or a local change said about it.
///
/// Kept small (issue 21: a node per entry the kernel holds, 200 000 after an `ls -l` of a large
/// directory): fields most nodes never set live in one box made when one is first set (`Rare`,
/// copied on write, so that a `Node` stays a value), and an MD5 ETag is 16 bytes.
struct Node {
    var inode: InodeNumber
    var parent: InodeNumber
    var name: String
    var kind: NodeKind
    /// The object key of a file or symlink; the key prefix ("…/" or "") of a directory.
    var key: String
    var size: Int64
    var etag: String {
        get { packedEtag.string }
        set { packedEtag = PackedETag(newValue) }
    }
    private var packedEtag: PackedETag
    /// The server's time of the last change.
    var lastModified: Timestamp
    var stored = StoredAttributes()
    /// The content type without csspfs's parameters.
    var baseContentType = ""
    /// When size/etag were last confirmed by the server (the filesystem's clock); 0 = never.
    var confirmedAt: Double = 0
    /// Lookups the kernel holds (see `InodeTable`).
    fileprivate(set) var lookups: UInt64 = 0
    /// What holds the node besides the kernel: its spool (open for writing, or an upload still
    /// owed) and owed attributes, one pin each.
    fileprivate(set) var pins: Int32 = 0
    /// Attribute changes (chmod, chown, utimes) of a closed file not stored yet: they are in
    /// `stored`, journaled, and stored by the next upload, rename or flush (see
    /// `Filesystem+Attributes`). What the server says about this version must not overwrite
    /// them; another version (another client's PUT) voids them (`Node.apply`, `Node.merge`).
    /// Set only by `InodeTable.oweAttributes`.
    var attributesOwed = false
    /// Whether a name in the tree leads to the node (false once unlinked or replaced).
    fileprivate(set) var linked = true
    /// When the object's full metadata was last known (a HEAD, or our own upload); 0 = never
    /// (a listing shows no metadata).
    var metadataKnownAt: Double = 0
    /// The `StoreClock` tick as of which the node is described: the latest acknowledgement of a
    /// change of ours, or the `askedAt` of the latest answer taken. Older answers are refused.
    /// (The attribute rule's state, with the three below; see `Node+Merge`.)
    var describedAsOf: UInt64 = 0
    private var rare: Rare?

    /// The fields few nodes set. Shared between copies of a node until one writes.
    private final class Rare {
        var manifest: String? = nil
        var localVersion: UInt64 = 0
        var changedAt: Timestamp? = nil
        var accessedAt: Timestamp? = nil
        var cachedEtag: String? = nil
        var symlinkTarget: String? = nil
        var extraMetadata: [String: String] = [:]
        var attributeVersion: UInt64 = 0
        var acknowledgedVersion: UInt64 = 0
        var acknowledgedTime = Timestamp.zero

        func copy() -> Rare {
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
    var manifest: String? {
        get { rare?.manifest }
        set { setRare(\.manifest, newValue, default: nil) }
    }
    /// Bumped when this mount stores new bytes or gives the file a spool: a read handle opened
    /// before reads what was written here since (another client's change is ESTALE instead).
    var localVersion: UInt64 {
        get { rare?.localVersion ?? 0 }
        set { setRare(\.localVersion, newValue, default: 0) }
    }
    /// ctime and atime as this mount changed them (nil: the modification time stands in; an
    /// object store keeps neither).
    var changedAt: Timestamp? {
        get { rare?.changedAt }
        set { setRare(\.changedAt, newValue, default: nil) }
    }
    var accessedAt: Timestamp? {
        get { rare?.accessedAt }
        set { setRare(\.accessedAt, newValue, default: nil) }
    }
    /// The ETag of the content the kernel's page cache may hold for this inode.
    var cachedEtag: String? {
        get { rare?.cachedEtag }
        set { setRare(\.cachedEtag, newValue, default: nil) }
    }
    var symlinkTarget: String? {
        get { rare?.symlinkTarget }
        set { setRare(\.symlinkTarget, newValue, default: nil) }
    }
    /// `X-Object-Meta-*` of the object other than ours, kept across our updates.
    var extraMetadata: [String: String] {
        get { rare?.extraMetadata ?? [:] }
        set { setRare(\.extraMetadata, newValue, default: [:]) }
    }
    /// Bumped by every local attribute change (chmod, chown, utimes, a write's mtime): names the
    /// change that an upload, a POST or a COPY stores (`settleAttributes`, `acknowledge`).
    var attributeVersion: UInt64 {
        get { rare?.attributeVersion ?? 0 }
        set { setRare(\.attributeVersion, newValue, default: 0) }
    }
    /// The latest `attributeVersion` the store acknowledged (or that was given up): while it
    /// is behind, a local change is not stored yet and no answer of the same version may undo it.
    /// Only `acknowledge`, `admits` and `forgetWhatWasSaid` write it.
    var acknowledgedVersion: UInt64 {
        get { rare?.acknowledgedVersion ?? 0 }
        set { setRare(\.acknowledgedVersion, newValue, default: 0) }
    }
    /// This host's clock when the store last acknowledged a change of ours: an answer asked
    /// earlier shows a newer version only if the server dated it later.
    var acknowledgedTime: Timestamp {
        get { rare?.acknowledgedTime ?? .zero }
        set { setRare(\.acknowledgedTime, newValue, default: .zero) }
    }

    init(
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
enum PackedETag: Equatable {
    case md5(UInt64, UInt64)
    case other(String)

    init(_ etag: String) {
        if let (high, low) = PackedEntries.digest(etag) {
            self = .md5(high, low)
        } else {
            self = .other(etag)
        }
    }

    var string: String {
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
///    root lives forever. Inode numbers are never reused, so the generation is always 0.
/// 2. A name leads to at most one node. A name whose kind changes (file -> directory) gets a new
///    node; the old one is unhooked and lives until the kernel forgets it.
/// 3. Identity (inode, parent, name, key, kind) changes only through `insert`, `link`, `unhook`
///    and `move`; `update` changes attributes and keeps identity whatever the closure does.
/// 4. `move` of a directory re-keys every node whose key lies below the old prefix, linked or
///    not (a pinned file whose upload is owed must go to the new key), and reports them.
struct InodeTable {
    static let root: InodeNumber = 1

    private(set) var nodes = NodeStore()
    private var children: [InodeNumber: [ExactString: InodeNumber]] = [:]
    private var nextInode: InodeNumber = 2
    /// Directories dropped since the last `takeRemovedDirectories` (their listings must go too).
    private var removedDirectories: [InodeNumber] = []

    init(rootKey: String, rootTime: Timestamp) {
        var root = Node(inode: Self.root, parent: Self.root, name: "", kind: .directory, key: rootKey, lastModified: rootTime)
        root.lookups = 1
        nodes[Self.root] = root
    }

    subscript(inode: InodeNumber) -> Node? { nodes[inode] }

    /// The node `name` in `parent` leads to.
    func child(_ parent: InodeNumber, _ name: String) -> Node? {
        children[parent]?[name.exact].flatMap { nodes[$0] }
    }

    /// Every name in `parent` with its node.
    func children(of parent: InodeNumber) -> [ExactString: InodeNumber] { children[parent] ?? [:] }

    /// Changes attributes of `inode` (identity and counts stay whatever `body` does); returns the result.
    @discardableResult
    mutating func update(_ inode: InodeNumber, _ body: (inout Node) -> Void) -> Node? {
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
    mutating func insert(_ template: Node) -> Node {
        var node = template
        node.inode = nextInode
        nextInode += 1
        node.lookups = 1
        node.pins = 0
        node.attributesOwed = false
        node.linked = true
        unhook(parent: node.parent, name: node.name)
        nodes[node.inode] = node
        children[node.parent, default: [:]][node.name.exact] = node.inode
        return node
    }

    /// The node for `name` in `parent` as a listing or HEAD describes it: the node the name leads
    /// to if it has the same kind (its key updated), else a new one. Counts `lookups` kernel lookups.
    /// `reserved`: the number readdir already showed for the name (`reserveInode`), used when it
    /// is free, so that d_ino and st_ino agree.
    mutating func link(
        parent: InodeNumber, name: String, kind: NodeKind, key: String, lookups: UInt64, reserved: InodeNumber? = nil
    ) -> Node {
        if let inode = children[parent]?[name.exact], var node = nodes[inode], node.kind == kind {
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
        unhook(parent: parent, name: name)
        nodes[node.inode] = node
        children[parent, default: [:]][name.exact] = node.inode
        collectIfUnused(node.inode)
        return node
    }

    /// A number for a name readdir shows before any node exists for it (see `link`).
    mutating func reserveInode() -> InodeNumber {
        defer { nextInode += 1 }
        return nextInode
    }

    /// The kernel dropped `count` lookups.
    mutating func forget(_ inode: InodeNumber, count: UInt64) {
        guard inode != Self.root, var node = nodes[inode] else { return }
        precondition(node.lookups >= count, "INTERNAL ERROR: forget \(count) of inode \(inode) with \(node.lookups)")
        node.lookups -= count
        nodes[inode] = node
        collectIfUnused(inode)
    }

    /// Counts one more kernel lookup of a node already known (readdirplus of a local file).
    mutating func countLookup(_ inode: InodeNumber) {
        nodes[inode]?.lookups += 1
    }

    /// A spool holds the node: it lives until `unpin`, whatever the kernel forgets.
    mutating func pin(_ inode: InodeNumber) {
        nodes[inode]?.pins += 1
    }

    /// The node's attributes are owed to the server: it lives (pinned once) until `settleAttributes`.
    mutating func oweAttributes(_ inode: InodeNumber) {
        guard var node = nodes[inode], !node.attributesOwed else { return }
        node.attributesOwed = true
        node.pins += 1
        nodes[inode] = node
    }

    /// The owed attributes are stored as they are now (or the object is gone): the pin
    /// `oweAttributes` took goes, and no change waits for the store's acknowledgement any more
    /// (the attribute rule). Callers check that the node did not change since what was stored.
    mutating func settleAttributes(_ inode: InodeNumber) {
        guard let node = nodes[inode], node.attributesOwed else { return }
        nodes[inode]?.attributesOwed = false
        nodes[inode]?.acknowledgedVersion = node.attributeVersion
        unpin(inode)
    }

    /// Nodes whose attributes are owed.
    var nodesOwingAttributes: [Node] { nodes.compactMap { $0.value.attributesOwed ? $0.value : nil } }

    mutating func unpin(_ inode: InodeNumber) {
        guard var node = nodes[inode] else { return }
        precondition(node.pins > 0, "INTERNAL ERROR: unpin of inode \(inode) that no spool holds")
        node.pins -= 1
        nodes[inode] = node
        collectIfUnused(inode)
    }

    /// The name is gone (unlink, rmdir, replaced by a rename): the node it led to lives on while the
    /// kernel or a spool holds it, reachable by inode only. Returns that node.
    @discardableResult
    mutating func unhook(parent: InodeNumber, name: String) -> Node? {
        guard let inode = children[parent]?[name.exact] else { return nil }
        children[parent]![name.exact] = nil
        if children[parent]!.isEmpty { children[parent] = nil }
        nodes[inode]?.linked = false
        let node = nodes[inode]
        collectIfUnused(inode)
        collectIfUnused(parent)
        return node
    }

    /// Renames `inode` to `name` in `newParent` with `key`, replacing what that name led to. A
    /// directory's descendants (every node keyed below its old prefix) get keys below the new
    /// one. Returns the inodes whose keys changed.
    @discardableResult
    mutating func move(_ inode: InodeNumber, to newParent: InodeNumber, name: String, key: String) -> [InodeNumber] {
        guard var node = nodes[inode] else { return [] }
        if children[node.parent]?[node.name.exact] == inode {
            children[node.parent]![node.name.exact] = nil
            if children[node.parent]!.isEmpty { children[node.parent] = nil }
        }
        if children[newParent]?[name.exact] != inode { unhook(parent: newParent, name: name) }
        let oldParent = node.parent
        let oldKey = node.key
        node.parent = newParent
        node.name = name
        node.key = key
        node.linked = true
        nodes[inode] = node
        children[newParent, default: [:]][name.exact] = inode
        var moved = [inode]
        if node.kind == .directory && !oldKey.isSameKey(as: key) {
            for (other, var descendant) in nodes where other != inode && descendant.key.utf8.starts(with: oldKey.utf8) {
                descendant.key = key + String(descendant.key.utf8.dropFirst(oldKey.utf8.count))!
                nodes[other] = descendant
                moved.append(other)
            }
        }
        collectIfUnused(oldParent)
        return moved
    }

    /// Directories dropped since the last call.
    mutating func takeRemovedDirectories() -> [InodeNumber] {
        defer { removedDirectories = [] }
        return removedDirectories
    }

    /// Rule 1, the only place a node is dropped.
    private mutating func collectIfUnused(_ inode: InodeNumber) {
        guard inode != Self.root, let node = nodes[inode], node.lookups == 0, node.pins == 0,
            children[inode]?.isEmpty ?? true
        else { return }
        nodes[inode] = nil
        children[inode] = nil
        if node.kind == .directory { removedDirectories.append(inode) }
        if children[node.parent]?[node.name.exact] == inode {
            children[node.parent]![node.name.exact] = nil
            if children[node.parent]!.isEmpty { children[node.parent] = nil }
            collectIfUnused(node.parent)
        }
    }
}

/// Nodes by inode number: slots in chunks of `chunkSize` (a freed slot is reused) and a table
/// from inode numbers to slots. As a dictionary of 296-byte nodes, 200 000 nodes took 159 MiB
/// (its load factor and doubling; heaptrack); as one array of slots, the array's doubling held
/// up to twice the nodes' size (41 MiB at 100 000 nodes of 208 bytes, heaptrack); a chunk is
/// allocated whole, once, so at most one chunk is spare. The table's slots are 4 bytes.
struct NodeStore: Sequence {
    static let chunkSize = 1024
    private var chunks: [[Node?]] = []
    private var used = 0
    private var index: [InodeNumber: Int32] = [:]
    private var free: [Int32] = []

    var count: Int { index.count }

    private func node(at slot: Int32) -> Node? { chunks[Int(slot) / Self.chunkSize][Int(slot) % Self.chunkSize] }

    private mutating func set(_ slot: Int32, _ node: Node?) {
        chunks[Int(slot) / Self.chunkSize][Int(slot) % Self.chunkSize] = node
    }

    subscript(inode: InodeNumber) -> Node? {
        get { index[inode].flatMap { node(at: $0) } }
        set {
            if let slot = index[inode] {
                set(slot, newValue)
                if newValue == nil {
                    index[inode] = nil
                    free.append(slot)
                }
            } else if let newValue {
                let slot: Int32
                if let reused = free.popLast() {
                    slot = reused
                } else {
                    if used == chunks.count * Self.chunkSize {
                        chunks.append(Array(repeating: nil, count: Self.chunkSize))
                    }
                    slot = Int32(used)
                    used += 1
                }
                set(slot, newValue)
                index[inode] = slot
            }
        }
    }

    func makeIterator() -> AnyIterator<(key: InodeNumber, value: Node)> {
        var inner = index.makeIterator()
        let store = self
        return AnyIterator {
            guard let (inode, slot) = inner.next() else { return nil }
            return (key: inode, value: store.node(at: slot)!)
        }
    }
}

