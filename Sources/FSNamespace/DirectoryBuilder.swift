import FSCore
import ObjectStore

/// Turns delimiter-listing pages of one directory prefix into directory entries, page by page.
///
/// Why this is subtle:
/// 1. Three conventions make directories: common prefixes (`a/` rolled up by the delimiter),
///    zero-byte `a/` marker objects (rolled up too), and `a` objects of type application/directory.
///    A directory's own marker (the key equal to the prefix) is not an entry of itself.
/// 2. An object `x` and a prefix `x/` can both exist. They are not adjacent in the listing: keys
///    like `x-1` or `x.txt` sort between them (`-` and `.` come before `/`). So a file is held back
///    until the listing has passed `x/`, and only then released as a plain file.
/// 3. Such a collision needs the server to decide (is `x` a DLO manifest whose parts are `x/…`?),
///    so the builder reports it and the caller resolves it with `Collision.Resolution`.
/// 4. Names that cannot be path components (empty from `a//b`, `.`, `..`, over 255 bytes) are
///    skipped and counted, never shown under a mangled name.
package struct DirectoryBuilder {
    package let prefix: String
    private var heldFiles: [ExactString: ObjectSummary] = [:]
    /// Names already emitted as directories (a later `x/` merges into an application/directory `x`).
    private var emittedDirectories: Set<ExactString> = []
    package private(set) var skippedNames = 0
    /// Whether the listing showed an object at the prefix itself (the directory's `dir/` marker).
    package private(set) var sawMarker = false

    /// A file and a directory with the same name.
    package struct Collision: Equatable {
        package var name: String
        package var file: ObjectSummary

        package enum Resolution: Equatable {
            /// The directory is only the file's own DLO parts: show the file, hide the directory.
            case fileWins
            /// Show the directory under the name, and the file as `name` + `shadowSuffix`.
            case directoryWins
        }
    }

    /// Appended to the name of a file hidden by a directory of the same name.
    package static let shadowSuffix = "~object"

    package init(prefix: String) { self.prefix = prefix }

    /// Adds one page; returns the entries now certain, and collisions the caller must resolve.
    package mutating func add(_ page: [ListEntry], isLastPage: Bool) -> (entries: [DirectoryEntry], collisions: [Collision]) {
        var entries: [DirectoryEntry] = []
        var collisions: [Collision] = []
        for item in page {
            switch item {
            case .commonPrefix(let full):
                guard let name = component(of: full, trailingSlash: true) else { continue }
                if let file = heldFiles.removeValue(forKey: name.exact) {
                    collisions.append(Collision(name: name, file: file))
                } else if emittedDirectories.insert(name.exact).inserted {
                    entries.append(Self.directory(name, key: full))
                }
            case .object(let summary):
                if summary.key.isSameKey(as: prefix) { sawMarker = true }
                guard !summary.key.isSameKey(as: prefix), let name = component(of: summary.key, trailingSlash: false) else {
                    continue
                }
                if ObjectKey.isDirectoryContentType(summary.contentType) {
                    if emittedDirectories.insert(name.exact).inserted {
                        entries.append(Self.directory(name, key: summary.key + "/"))
                    }
                } else {
                    heldFiles[name.exact] = summary
                }
            }
        }
        // Release held files the listing has moved past: `x/` would have come before `last`.
        // In name order, so that readdir shows a directory the same way every time.
        let last = page.last.map { Array($0.name.utf8) }
        var released: [(ExactString, ObjectSummary)] = []
        for (name, summary) in heldFiles {
            let directoryName = Array((prefix + name.string + "/").utf8)
            if isLastPage || (last.map { directoryName.lexicographicallyPrecedes($0) } ?? false) {
                released.append((name, summary))
            }
        }
        for (name, summary) in released.sorted(by: { $0.0 < $1.0 }) {
            heldFiles[name] = nil
            entries.append(Self.file(name.string, summary))
        }
        return (entries, collisions)
    }

    /// The entries for a resolved collision.
    package static func entries(for collision: Collision, resolution: Collision.Resolution, prefix: String) -> [DirectoryEntry] {
        switch resolution {
        case .fileWins:
            return [file(collision.name, collision.file)]
        case .directoryWins:
            let directoryEntry = directory(collision.name, key: prefix + collision.name + "/")
            let alias = collision.name + shadowSuffix
            guard alias.utf8.count <= 255 else { return [directoryEntry] }
            return [directoryEntry, file(alias, collision.file)]
        }
    }

    package static func file(_ name: String, _ summary: ObjectSummary) -> DirectoryEntry {
        let parsed = StoredAttributes.parse(contentType: summary.contentType)
        return DirectoryEntry(
            name: name, kind: NodeKind.of(baseContentType: parsed.base), key: summary.key, size: summary.size,
            etag: summary.etag, lastModified: Timestamp(summary.lastModified), contentType: summary.contentType,
            knownParse: parsed)
    }

    package static func directory(_ name: String, key: String) -> DirectoryEntry {
        DirectoryEntry(name: name, kind: .directory, key: key, size: 0, etag: "", lastModified: .zero, contentType: "")
    }

    /// The path component of a listing name below `prefix`, or nil when it cannot be one.
    private mutating func component(of full: String, trailingSlash: Bool) -> String? {
        guard full.utf8.starts(with: prefix.utf8) else {
            skippedNames += 1
            return nil
        }
        var rest = Substring(full.utf8.dropFirst(prefix.utf8.count))
        if trailingSlash {
            guard rest.hasSuffix("/") else { return nil }
            rest = rest.dropLast()
        }
        guard Self.isValidName(rest) else {
            skippedNames += 1
            return nil
        }
        return String(rest)
    }

    package static func isValidName<S: StringProtocol>(_ name: S) -> Bool {
        !name.isEmpty && name != "." && name != ".." && name.utf8.count <= 255 && !name.contains("/")
            && !name.utf8.contains(0)
    }

    /// Decides a collision from the HEAD of the file and the start of the listing under `name/`:
    /// the file wins only when it is a DLO manifest of this container and everything under
    /// `name/` belongs to its parts.
    package static func resolve(
        key: String, manifest: String?, container: String, childrenPreview: [ListEntry]
    ) -> Collision.Resolution {
        guard let manifest, manifest.hasPrefix(container + "/") else { return .directoryWins }
        let partPrefix = String(manifest.dropFirst(container.count + 1))
        guard partPrefix.utf8.starts(with: (key + "/").utf8) else { return .directoryWins }
        let onlyParts = childrenPreview.allSatisfy { entry in
            entry.name.utf8.starts(with: partPrefix.utf8) || partPrefix.utf8.starts(with: entry.name.utf8)
        }
        return onlyParts ? .fileWins : .directoryWins
    }
}

