import FSCore
import ObjectStore

/// Every node the filesystem knows, the names that lead to them, and the kernel's lookup counts.
/// A value type with no I/O and no lock: `NamespaceTables` holds it under the `names` lock, and nothing
/// outside this file writes the node or name tables (a node's lookup count, pins and link are
/// written only here too: their setters are internal to FSNamespace, which writes them nowhere else).
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
    /// Where the numbers the kernel holds are recorded for a worker that replaces this one
    /// (issue 40): written at each change of what they name, before the reply that tells the
    /// kernel (this table is changed under the namespace lock, and replies follow).
    package var log: (any NodeLog)?
    /// Nodes taken over from a dead worker (`adopt`): the kernel holds at least one lookup of
    /// each, maybe more than counted here, so a forget takes what there is.
    private var adopted: Set<InodeNumber> = []
    /// Adopted nodes no answer has described yet (their attributes are unknown).
    package private(set) var undescribed: Set<InodeNumber> = []

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
        noteNamed(node)
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
            let known = node.lookups > 0
            node.lookups += lookups
            node.key = key
            nodes[inode] = node
            undescribed.remove(inode)
            if !known && lookups > 0 { noteNamed(node) }
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
        if lookups > 0 { noteNamed(node) }
        collectIfUnused(node.inode)
        return node
    }

    /// Takes over the numbers a dead worker left the kernel holding (issue 40): each becomes a
    /// node of its name again, parents first, keyed below its parent's key, with one lookup
    /// (the kernel's true count may be higher: `forget` takes what there is) and attributes to
    /// be described (`undescribed`). Records whose parent is unknown, or whose name already
    /// leads elsewhere, are left out: the kernel gets ESTALE for those numbers.
    package mutating func adopt(_ records: [AdoptedNode]) {
        var pending: [InodeNumber: AdoptedNode] = [:]
        for record in records where record.inode != Self.root { pending[record.inode] = record }
        var progress = true
        while progress && !pending.isEmpty {
            progress = false
            for (inode, record) in pending {
                guard let parent = nodes[record.parent], parent.kind == .directory else { continue }
                pending[inode] = nil
                progress = true
                guard nodes[inode] == nil, children.inode(record.parent, record.name, in: nodes) == nil else { continue }
                let key = parent.key + record.name + (record.kind == .directory ? "/" : "")
                var node = Node(inode: inode, parent: record.parent, name: record.name, kind: record.kind, key: key)
                node.lookups = 1
                nodes[inode] = node
                children.set(record.parent, record.name, inode, in: nodes)
                adopted.insert(inode)
                undescribed.insert(inode)
                nextInode = max(nextInode, inode + 1)
            }
        }
    }

    /// A number a dead worker left the kernel holding for a file no name leads to any more
    /// (unlinked or replaced while open) whose spool a handle still holds (issue 40): a node of
    /// no name, keyed `key`, which lives while its spool pins it or the kernel holds it. False
    /// when the number names another node.
    package mutating func adoptUnlinked(_ inode: InodeNumber, key: String) -> Bool {
        guard inode != Self.root, nodes[inode] == nil else { return false }
        let name = key.split(separator: "/").last.map(String.init) ?? key
        var node = Node(inode: inode, parent: Self.root, name: name, kind: .file, key: key)
        node.lookups = 1
        node.linked = false
        nodes[inode] = node
        adopted.insert(inode)
        nextInode = max(nextInode, inode + 1)
        return true
    }

    /// An adopted node an answer described.
    package mutating func markDescribed(_ inode: InodeNumber) { undescribed.remove(inode) }

    /// Records that the kernel holds `node` under its name; a full log is written again whole.
    private mutating func noteNamed(_ node: Node) {
        guard let log, node.inode != Self.root else { return }
        if log.named(node.inode, parent: node.parent, name: node.name, kind: node.kind) { return }
        log.restart()
        var complete = true
        for (inode, node) in nodes where inode != Self.root && node.lookups > 0 && node.linked {
            guard log.named(inode, parent: node.parent, name: node.name, kind: node.kind) else {
                complete = false
                break
            }
        }
        log.commit(complete)
    }

    /// New nodes are numbered from `first` on (a worker that replaces a dead one, whose
    /// numbers the kernel may still hold); never lower than now.
    package mutating func numberFrom(_ first: InodeNumber) { nextInode = max(nextInode, first) }

    /// A number for a name readdir shows before any node exists for it (see `link`).
    package mutating func reserveInode() -> InodeNumber {
        defer { nextInode += 1 }
        return nextInode
    }

    /// The kernel dropped `count` lookups.
    package mutating func forget(_ inode: InodeNumber, count: UInt64) {
        guard inode != Self.root else { return }
        guard var node = nodes[inode] else {
            // A number a dead worker gave that this one did not take over: the kernel let go.
            log?.unnamed(inode)
            return
        }
        let count = adopted.contains(inode) ? min(count, node.lookups) : count
        precondition(node.lookups >= count, "INTERNAL ERROR: forget \(count) of inode \(inode) with \(node.lookups)")
        node.lookups -= count
        nodes[inode] = node
        if node.lookups == 0 { log?.unnamed(inode) }
        collectIfUnused(inode)
    }

    /// Counts one more kernel lookup of a node already known (readdirplus of a local file).
    package mutating func countLookup(_ inode: InodeNumber) {
        guard var node = nodes[inode] else { return }
        node.lookups += 1
        nodes[inode] = node
        if node.lookups == 1 { noteNamed(node) }
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
        if let node, node.lookups > 0 { log?.unnamed(inode) }
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
        if node.lookups > 0 { noteNamed(node) }
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
        adopted.remove(inode)
        undescribed.remove(inode)
        if node.kind == .directory { removedDirectories.append(inode) }
        // (Not a directory's: its listing and change count go with its number, and an answer
        // asked under the old node must not count as one about the new.)
        if wasLinked && node.kind != .directory { forgottenNames.append((node.parent, node.name, inode)) }
        if wasLinked { collectIfUnused(node.parent) }
    }
}
