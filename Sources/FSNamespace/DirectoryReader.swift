import Dispatch
import FSCore
import Locking
import Logging
import ObjectStore
import Synchronization

/// What a listing needs of the filesystem that reads it: the pool its pages ahead are fetched
/// on, the log, and the answer to a name that is a file and a directory at once (a HEAD).
package protocol ListingResolver: Sendable {
    var pool: BackgroundPool { get }
    var logger: Logger { get }
    func resolve(_ collision: DirectoryBuilder.Collision, prefix: String) throws(FSError)
        -> DirectoryBuilder.Collision.Resolution
}

/// One open directory: the listing streamed page by page as readdir asks for more.
package final class DirectoryReader: Sendable {
    package let prefix: String
    /// Where pages come from; nil for a listing already known, which never fetches.
    private let source: Source?

    package enum Source: Sendable {
        /// The server's delimiter listing, page by page.
        case store(any ObjectStore)
        /// One page holding the whole listing (made from a listing of a whole subtree,
        /// `WalkListing`).
        case page(ListPage)
    }
    private let pageSize: Int
    /// Whether pages are fetched ahead of the entries asked for: the next one while the entries
    /// are read (`entries`), and the one after it as soon as that one is in (`fetchPage`). Not
    /// for a reader that stops at its first page when the directory is larger.
    private let pagesAhead: Bool
    /// A name never shown (the multipart parts prefix at the container root).
    private let hidden: String?

    private struct State {
        package var builder: DirectoryBuilder
        package var entries: PackedEntries
        package var marker: String? = nil
        package var complete = false
        /// Entries in the pages fetched so far (some may be held back: `DirectoryBuilder`).
        package var listed = 0
        /// Aliases of shadowed files not yet certain (see `entries`).
        package var heldAliases: [ExactString: DirectoryEntry] = [:]
        package var tail: [TailItem]? = nil
        /// Names removed here that the store still listed (skipped, see `removedHere`).
        package var stillListed: Set<ExactString> = []
        /// The fetch of the next page running now (one at a time), left when it ends.
        package var fetch: DispatchGroup? = nil
        /// The request of the page after the one being taken in (see `fetchPage`).
        package var pageAhead: PageAhead? = nil
    }

    /// A page asked for while the page before it is taken in: queued on the pool, running (its
    /// group left when done), or in.
    private enum PageAhead {
        case queued(marker: String)
        case running(marker: String, DispatchGroup)
        case done(marker: String, ListPage)
    }

    /// What readdir shows after the listing's entries: names this mount made that the listing
    /// lacks (listed as this mount recorded them, or open files not stored yet).
    package enum TailItem {
        case listed(DirectoryEntry)
        case local(String, InodeNumber)
    }

    /// Protects the listing progress. The kernel serialises readdir per open directory, so fetching
    /// outside the lock never races with another fetch of the same reader.
    private let state: Locked<State>

    /// Whether the entries come from a remembered listing rather than from the server.
    package let isRemembered: Bool
    /// The directory's change count when the listing started (see `DirectoryCache`).
    package let startedAt: UInt64
    /// The `StoreClock` tick taken before the listing's first request (or the remembered
    /// listing's): what it says of a node counts as asked then (the attribute rule, `Node+Merge`).
    package let askedAt: UInt64

    /// Names this mount removed lately (DirectoryCache rule 2), not shown if a lagging listing
    /// still has them.
    private let removedHere: Set<ExactString>

    package init(
        store: any ObjectStore, prefix: String, pageSize: Int, hidden: String?, removedHere: Set<ExactString> = [],
        startedAt: UInt64, askedAt: UInt64, pagesAhead: Bool = true
    ) {
        self.pagesAhead = pagesAhead
        self.removedHere = removedHere
        self.startedAt = startedAt
        self.askedAt = askedAt
        self.source = .store(store)
        self.pageSize = pageSize
        self.hidden = hidden
        self.prefix = prefix
        self.state = Locked(State(builder: DirectoryBuilder(prefix: prefix), entries: PackedEntries(prefix: prefix)))
        isRemembered = false
    }

    /// A reader of a whole listing given as one page, in the order a delimiter listing has
    /// (`WalkListing`, `Poller`): read as a page from the server would be.
    package init(
        prefix: String, page: ListPage, hidden: String? = nil, removedHere: Set<ExactString> = [], startedAt: UInt64,
        askedAt: UInt64
    ) {
        self.startedAt = startedAt
        self.askedAt = askedAt
        self.source = .page(ListPage(entries: page.entries, nextMarker: nil))
        pagesAhead = false
        self.removedHere = removedHere
        self.pageSize = max(1, page.entries.count)
        self.hidden = hidden
        self.prefix = prefix
        self.state = Locked(State(builder: DirectoryBuilder(prefix: prefix), entries: PackedEntries(prefix: prefix)))
        isRemembered = false
    }

    /// A reader of a listing already known (complete, in order).
    package init(prefix: String, remembered entries: PackedEntries, startedAt: UInt64, askedAt: UInt64) {
        self.startedAt = startedAt
        self.askedAt = askedAt
        self.source = nil
        pagesAhead = false
        self.removedHere = []
        self.pageSize = 0
        self.hidden = nil
        self.prefix = prefix
        self.state = Locked(State(builder: DirectoryBuilder(prefix: prefix), entries: entries, complete: true))
        isRemembered = true
    }

    /// A reader of a listing fetched ahead (`ListingsAhead`): complete, but not
    /// remembered yet (readdir remembers it as it would its own). Names removed here lately that
    /// it still shows (it lags) are skipped, as `removedHere` does for a listing read now.
    package init(
        prefix: String, fetched entries: PackedEntries, removedHere: Set<ExactString>, startedAt: UInt64,
        askedAt: UInt64
    ) {
        self.startedAt = startedAt
        self.askedAt = askedAt
        self.source = nil
        pagesAhead = false
        self.removedHere = removedHere
        self.pageSize = 0
        self.hidden = nil
        self.prefix = prefix
        let lagging = removedHere.isEmpty ? [] : Set(entries.lazy.map(\.name.exact).filter(removedHere.contains))
        self.state = Locked(
            State(
                builder: DirectoryBuilder(prefix: prefix),
                entries: lagging.isEmpty ? entries : entries.filter { !lagging.contains($0.name.exact) },
                complete: true, stillListed: lagging))
        isRemembered = false
    }

    /// The whole listing, read through `resolver`; nil when it holds `limit` names or more
    /// before it is complete.
    package func readWhole(limit: Int, resolvingWith resolver: any ListingResolver) throws(FSError) -> PackedEntries? {
        var index = 0
        while true {
            let (batch, complete) = try entries(from: index, resolvingWith: resolver)
            index += batch.count
            if complete { break }
            if listedCount >= limit { return nil }
        }
        return completeEntries()
    }

    /// Entries from `index` on (fetching the next page when needed), and whether the listing is
    /// complete. Once a page is in, the next one is fetched in the background while the caller
    /// works through this one (issue 21: `ls` of 200 000 names waited for each of its 20 pages
    /// in turn); a failure there is dropped, and the page is asked for again here.
    package func entries(from index: Int, resolvingWith filesystem: any ListingResolver) throws(FSError) -> ([DirectoryEntry], Bool) {
        while true {
            enum Next {
                case ready([DirectoryEntry], Bool)
                case wait(DispatchGroup)
                case fetch(DispatchGroup)
            }
            let next: Next = state.withLock { s in
                if index < s.entries.count || s.complete {
                    // A readdir call takes about 30 entries; each one handed out is made from the
                    // packed listing (its key, its ETag), so a few at a time.
                    let end = min(s.entries.count, index + 32)
                    return .ready(index < end ? Array(s.entries[index..<end]) : [], s.complete)
                }
                if let running = s.fetch { return .wait(running) }
                let group = DispatchGroup()
                group.enter()
                s.fetch = group
                return .fetch(group)
            }
            switch next {
            case .ready(let entries, let complete):
                if !complete && pagesAhead { fetchAhead(filesystem) }
                return (entries, complete)
            case .wait(let running):
                running.wait()
            case .fetch(let group):
                defer { finishFetch(group) }
                guard source != nil else {
                    state.withLock { $0.complete = true }
                    continue
                }
                try fetchPage(filesystem)
            }
        }
    }

    /// Starts the fetch of the next page on the filesystem's pool, unless one runs already.
    private func fetchAhead(_ filesystem: any ListingResolver) {
        guard source != nil else { return }
        let group: DispatchGroup? = state.withLock { s in
            guard s.fetch == nil, !s.complete else { return nil }
            let group = DispatchGroup()
            group.enter()
            s.fetch = group
            return group
        }
        guard let group else { return }
        let started = filesystem.pool.submit { [self] in
            defer { finishFetch(group) }
            do throws(FSError) {
                try fetchPage(filesystem)
            } catch {
                filesystem.logger.debug("listing '\(prefix)' ahead of readdir failed: \(error.message)")
            }
        }
        if !started { finishFetch(group) }
    }

    /// Asks for the page after `marker` on the filesystem's pool (see `fetchPage`); a failure
    /// there is dropped (the page is asked for again when needed).
    private func askAhead(_ store: any ObjectStore, after marker: String, _ filesystem: any ListingResolver) {
        state.withLock { $0.pageAhead = .queued(marker: marker) }
        let queued = filesystem.pool.submit { [self] in
            let group = DispatchGroup()
            group.enter()
            defer { group.leave() }
            let start: Bool = state.withLock { s in
                guard case .queued(let asked)? = s.pageAhead, asked.isSameKey(as: marker) else { return false }
                s.pageAhead = .running(marker: marker, group)
                return true
            }
            guard start else { return }
            let page = try? store.list(prefix: prefix, delimiter: "/", marker: marker, limit: pageSize)
            state.withLock { s in
                guard case .running(let asked, _)? = s.pageAhead, asked.isSameKey(as: marker) else { return }
                s.pageAhead = page.map { .done(marker: marker, $0) }
            }
        }
        if !queued { state.withLock { $0.pageAhead = nil } }
    }

    private func finishFetch(_ group: DispatchGroup) {
        state.withLock { s in if s.fetch === group { s.fetch = nil } }
        group.leave()
    }

    /// Fetches the page after the marker and appends its entries. Only while holding `fetch`.
    /// The request of the page after it goes out as soon as this one is in, before its entries
    /// are taken in (issue 21: 90 ms between pages with 20 ms a request, 2 s of `ls` of 200 000
    /// names): the page is taken from there, or asked for here if its request has not started.
    private func fetchPage(_ filesystem: any ListingResolver) throws(FSError) {
        guard let source else { return }
        let (marker, builder, ahead) = state.withLock { s in
            defer { if case .queued? = s.pageAhead { s.pageAhead = nil } }
            return (s.marker, s.builder, s.pageAhead)
        }
        // Byte for byte: Swift's String == calls two spellings of "é" equal.
        let isMarker = { (asked: String) in marker.map(asked.isSameKey) ?? false }
        var fetched: ListPage? = nil
        switch ahead {
        case .running(let asked, let group)? where isMarker(asked):
            group.wait()
            fetched = state.withLock { s in
                guard case .done(let asked, let page)? = s.pageAhead, isMarker(asked) else { return nil }
                s.pageAhead = nil
                return page
            }
        case .done(let asked, let page)? where isMarker(asked):
            state.withLock { $0.pageAhead = nil }
            fetched = page
        default: break
        }
        let page: ListPage
        do {
            switch source {
            case .store(let store):
                if let fetched {
                    page = fetched
                } else {
                    page = try store.list(prefix: prefix, delimiter: "/", marker: marker, limit: pageSize)
                }
                if pagesAhead, let next = page.nextMarker { askAhead(store, after: next, filesystem) }
            case .page(let whole): page = whole
            }
        } catch {
            throw FSError(storeError: error, operation: "readdir", path: prefix)
        }
        var next = builder
        let (ready, collisions) = next.add(page.entries, isLastPage: page.nextMarker == nil)
        var resolved = ready.filter { entry in hidden.map { !entry.name.isSameKey(as: $0) } ?? true }
        let lagging = removedHere.isEmpty ? [] : Set(resolved.lazy.map(\.name.exact).filter(removedHere.contains))
        if !lagging.isEmpty { resolved.removeAll { lagging.contains($0.name.exact) } }
        var aliases: [DirectoryEntry] = []
        for collision in collisions {
            let resolution = try filesystem.resolve(collision, prefix: prefix)
            for entry in DirectoryBuilder.entries(for: collision, resolution: resolution, prefix: prefix) {
                if entry.kind != .directory && !entry.name.isSameKey(as: collision.name) {
                    aliases.append(entry)
                } else {
                    resolved.append(entry)
                }
            }
        }
        let lastName = page.entries.last.map(\.name)
        state.withLock { s in
            // An alias (`x~object`) waits until the listing passed where its name would be (as a
            // file or a directory, see DirectoryBuilder): a real
            // key of that name (which sorts after `x/`) takes the name instead.
            for entry in resolved { s.heldAliases[entry.name.exact] = nil }
            for alias in aliases { s.heldAliases[alias.name.exact] = alias }
            let complete = page.nextMarker == nil
            for (name, alias) in s.heldAliases
            where complete || lastName.map({ (prefix + name.string + "/").utf8.lexicographicallyPrecedes($0.utf8) }) ?? false {
                s.heldAliases[name] = nil
                resolved.append(alias)
            }
            s.builder = next
            s.entries.append(contentsOf: resolved)
            s.stillListed.formUnion(lagging)
            s.marker = page.nextMarker
            s.listed += page.entries.count
            s.complete = page.nextMarker == nil
            if s.complete { s.entries.compact() }
        }
    }

    /// The tail, made by `make` the first time (once the listing is complete), then the same for
    /// every later readdir of this reader, so that offsets into it stay valid.
    package func tail(_ make: () -> [TailItem]) -> [TailItem] {
        if let tail = state.withLock({ $0.tail }) { return tail }
        let tail = make()
        state.withLock { $0.tail = tail }
        return tail
    }

    /// Entries in the pages fetched so far.
    package var listedCount: Int { state.withLock { $0.listed } }

    /// Whether the listing read so far showed the directory's own `dir/` marker object.
    package var sawMarker: Bool { state.withLock { $0.builder.sawMarker } }

    /// The entry named `name` among those read so far, if it is there (read in the listing's
    /// order: a name the reader has not reached is not found).
    package func listedEntry(named name: String) -> DirectoryEntry? {
        state.withLock { s in s.entries.sortedPosition(of: name).map { s.entries[$0] } }
    }

    /// Up to `count` entries read so far after the one named `name`.
    package func entries(following name: String, count: Int) -> [DirectoryEntry] {
        state.withLock { s in
            guard let found = s.entries.sortedPosition(of: name) else { return [] }
            return (found + 1..<min(s.entries.count, found + 1 + count)).map { s.entries[$0] }
        }
    }

    /// Every entry, if the whole listing has been read.
    package func completeEntries() -> PackedEntries? {
        state.withLock { $0.complete ? $0.entries : nil }
    }

    /// Names removed here that the store's listing still showed (it lags behind): skipped by
    /// the entries, and a reason to keep those removals journaled.
    package var stillListed: Set<ExactString> { state.withLock { $0.stillListed } }
}
