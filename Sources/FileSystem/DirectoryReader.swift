import Locking
import ObjectStore
import Synchronization

/// One open directory: the listing streamed page by page as readdir asks for more.
final class DirectoryReader: Sendable {
    let prefix: String
    /// nil for a remembered listing, which never fetches.
    private let store: (any ObjectStore)?
    private let pageSize: Int
    /// A name never shown (the multipart parts prefix at the container root).
    private let hidden: String?

    private struct State {
        var builder: DirectoryBuilder
        var entries: [DirectoryEntry] = []
        var marker: String? = nil
        var complete = false
    }

    /// Protects the listing progress. The kernel serialises readdir per open directory, so fetching
    /// outside the lock never races with another fetch of the same reader.
    private let state: Locked<State>

    /// Whether the entries come from a remembered listing rather than from the server.
    let isRemembered: Bool
    /// The directory's change count when the listing started (see `DirectoryCache`).
    let startedAt: UInt64

    init(store: any ObjectStore, prefix: String, pageSize: Int, hidden: String?, startedAt: UInt64) {
        self.startedAt = startedAt
        self.store = store
        self.pageSize = pageSize
        self.hidden = hidden
        self.prefix = prefix
        self.state = Locked(State(builder: DirectoryBuilder(prefix: prefix)))
        isRemembered = false
    }

    /// A reader of a listing already known (complete, in order).
    init(prefix: String, remembered entries: [DirectoryEntry], startedAt: UInt64) {
        self.startedAt = startedAt
        self.store = nil
        self.pageSize = 0
        self.hidden = nil
        self.prefix = prefix
        self.state = Locked(State(builder: DirectoryBuilder(prefix: prefix), entries: entries, complete: true))
        isRemembered = true
    }

    /// Entries from `index` on (fetching the next page when needed), and whether the listing is complete.
    func entries(from index: Int, resolvingWith filesystem: Filesystem) throws(FSError) -> ([DirectoryEntry], Bool) {
        while true {
            let (available, complete, marker, builder) = state.withLock { s in
                (index < s.entries.count ? Array(s.entries[index..<min(s.entries.count, index + 512)]) : [], s.complete, s.marker, s.builder)
            }
            if !available.isEmpty || complete { return (available, complete) }
            guard let store else { return ([], true) }
            let page: ListPage
            do {
                page = try store.list(prefix: prefix, delimiter: "/", marker: marker, limit: pageSize)
            } catch {
                throw FSError(storeError: error, operation: "readdir", path: prefix)
            }
            var next = builder
            let (ready, collisions) = next.add(page.entries, isLastPage: page.nextMarker == nil)
            var resolved = ready.filter { entry in hidden.map { !entry.name.isSameKey(as: $0) } ?? true }
            for collision in collisions {
                let resolution = try filesystem.resolve(collision, prefix: prefix)
                resolved += DirectoryBuilder.entries(for: collision, resolution: resolution, prefix: prefix)
            }
            state.withLock { s in
                s.builder = next
                s.entries += resolved
                s.marker = page.nextMarker
                s.complete = page.nextMarker == nil
            }
        }
    }

    /// Every entry, if the whole listing has been read.
    func completeEntries() -> [DirectoryEntry]? {
        state.withLock { $0.complete ? $0.entries : nil }
    }
}
