import FSCore
import FSFiles
import FSJournal
import FSNamespace
import Metrics

// The bound on remembered names (issue 21, `meta_max_entries`; the rules are `BoundState`'s in
// FSNamespace): when a pass runs and which names it asks the kernel to forget are the namespace
// room's decisions; the facade runs the pass on a pool thread and asks the kernel.
extension Filesystem {
    /// After an operation that may have added nodes: starts a pass if there are too many
    /// (rules 2 and 3). Without a kernel to ask (tests of the core that install none), nothing.
    /// `followUp`: the check a second after a pass (rule 3).
    func boundNodes(followUp: Bool = false) {
        let limit = configuration.maximumEntries
        guard limit > 0, kernelCache.forgetsEntries else { return }
        let now = now()
        guard names.withLock({ $0.startBoundPass(limit: limit, now: now, followUp: followUp) }) else { return }
        if !pool.submit({ [self] in forgetPass() }) { names.withLock { $0.bound.running = false } }
    }

    /// Asks the kernel to forget names until nine tenths of the bound are left (rule 2).
    private func forgetPass() {
        let limit = configuration.maximumEntries
        let forget = withTables { s, f in
            s.namesToForget(limit: limit, held: f.handles.remoteInodes.union(s.spools.keys))
        }
        for (parent, name) in forget { kernelCache.forgetEntry(parent, name) }
        configuration.metrics.entriesForgotten.add(Int64(forget.count))
        let fruitless = names.withLock { $0.endBoundPass() }
        // 1 s, then 2, 4, 8, 16 s while the kernel forgets nothing (rule 3).
        if !forget.isEmpty { pool.submit(after: Double(1 << fruitless)) { [self] in boundNodes(followUp: true) } }
    }
}
