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
    package internal(set) var lookups: UInt64 = 0
    /// What holds the node besides the kernel: its spool (open for writing, or an upload still
    /// owed) and owed attributes, one pin each.
    package internal(set) var pins: Int32 = 0
    /// Attribute changes (chmod, chown, utimes) of a closed file not stored yet: they are in
    /// `stored`, journaled, and stored by the next upload, rename or flush (see
    /// `Filesystem+Attributes`). What the server says about this version must not overwrite
    /// them; another version (another client's PUT) voids them (`Node.apply`, `Node.merge`).
    /// Set only by `InodeTable.oweAttributes`.
    package var attributesOwed = false
    /// Whether a name in the tree leads to the node (false once unlinked or replaced).
    package internal(set) var linked = true
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
