import FSCore
import FSFiles
import FSJournal
import FSNamespace
import Metrics

/// Metadata in bounded memory (issue 21, `meta_max_entries`). A node is kept for every name the
/// kernel holds (InodeTable rule 1), and the kernel keeps what it looked up until memory runs
/// short, so without a bound a walk of a huge container keeps every name it passed.
///
/// The rules:
/// 1. Names in remembered listings: at most `maximumEntries` (DirectoryCache rule 5; the
///    listings remembered longest ago go, the newest stays).
/// 2. Nodes: past `maximumEntries`, the kernel is asked to forget names (`KernelCache.forgetEntry`)
///    until nine tenths are left: the files, symlinks and special files of the directories used
///    longest ago first; never a directory, a file open here, or a node a spool or owed
///    attributes pin (`InodeTable.forgettable`). The kernel forgets (FORGET) each inode it no
///    longer uses, and rule 1 drops the node; one it still uses stays. A name forgotten is
///    looked up again when asked for, from a remembered listing or the store, and shows what
///    the store holds plus this mount's changes (DirectoryCache rules 2 and 4 hold whatever
///    node is gone).
/// 3. The kernel is asked from a pool thread, never a request's (it takes the directory's lock,
///    which a lookup there may hold), one pass at a time. A pass starts when the nodes exceed
///    the bound and a twentieth of the bound was added since the last pass began, or a second
///    went by (names the kernel keeps are not asked for again at every operation). A second
///    after a pass that asked for names, another runs if the nodes are still past the bound
///    but fewer than when it began (the kernel forgets as it can; an idle mount gets there
///    too). If none went, it is asked again after 2, 4, 8 and 16 s, then no more until the
///    next operation adds nodes: a name `ls -l` was still using when it was asked for stays
///    otherwise (an idle mount 50 names past a bound of 200, once in three runs of
///    BoundedMountTests), while names the kernel will not forget, such as a file mapped after
///    its close, are not asked for every second.
extension Filesystem {
    /// After an operation that may have added nodes: starts a pass if there are too many
    /// (rules 2 and 3). Without a kernel to ask (tests of the core that install none), nothing.
    /// `followUp`: the check a second after a pass (rule 3).
    func boundNodes(followUp: Bool = false) {
        let limit = configuration.maximumEntries
        guard limit > 0, kernelCache.forgetsEntries else { return }
        let start = names.withLock { s -> Bool in
            let count = s.inodes.nodes.count
            guard count > limit else { return false }
            let now = now()
            var fruitless = 0
            let due: Bool
            if followUp {
                fruitless = count < s.bound.lastPass.count ? 0 : s.bound.fruitless + 1
                due = fruitless <= BoundState.retries
            } else {
                due = count >= s.bound.lastPass.count + max(1, limit / 20) || now - s.bound.lastPass.at >= 1
            }
            guard !s.bound.running, due else { return false }
            s.bound = BoundState(running: true, lastPass: (count, now), fruitless: fruitless)
            return true
        }
        guard start else { return }
        if !pool.submit({ [self] in forgetPass() }) { names.withLock { $0.bound.running = false } }
    }

    /// Asks the kernel to forget names until nine tenths of the bound are left (rule 2).
    private func forgetPass() {
        let limit = configuration.maximumEntries
        let forget = withTables { s, f -> [(parent: InodeNumber, name: String)] in
            let excess = s.inodes.nodes.count - (limit - limit / 10)
            guard excess > 0 else { return [] }
            let held = f.handles.remoteInodes.union(f.openFiles.keys)
            return s.inodes.forgettable(excess, in: s.directories.directoriesByUse, held: held)
        }
        for (parent, name) in forget { kernelCache.forgetEntry(parent, name) }
        configuration.metrics.entriesForgotten.add(Int64(forget.count))
        let fruitless = names.withLock { s in
            s.bound.running = false
            return s.bound.fruitless
        }
        // 1 s, then 2, 4, 8, 16 s while the kernel forgets nothing (rule 3).
        if !forget.isEmpty { pool.submit(after: Double(1 << fruitless)) { [self] in boundNodes(followUp: true) } }
    }
}
