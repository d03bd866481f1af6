import FSCore

// What the facade shows of a node: its attributes and the listing entry that describes it.

extension Node {
    /// What `stat` shows of this node under `configuration` (umask, forced owner, the
    /// directories' time).
    package func attributes(_ configuration: FilesystemConfiguration) -> Attributes {
        let defaultMode: UInt16
        switch kind {
        case .directory: defaultMode = 0o777 & ~configuration.umask
        case .file, .fifo, .socket: defaultMode = 0o666 & ~configuration.umask
        case .symlink: defaultMode = 0o777
        }
        let size: Int64
        switch kind {
        case .directory, .fifo, .socket: size = 0
        case .file: size = self.size
        case .symlink: size = Int64(symlinkTarget?.utf8.count ?? Int(self.size))
        }
        // An object without a stored mtime shows its last-modified time to the second: a HEAD
        // says no more (a listing has microseconds), and a time must not change with the answer
        // that happened to describe the object first (issue 38).
        let fallbackTime = kind == .directory ? configuration.directoryTime : lastModified.roundedUpToSecond
        let modified = stored.mtime ?? fallbackTime
        return Attributes(
            inode: inode, kind: kind, size: size, modified: modified,
            changed: max(changedAt ?? modified, modified), accessed: accessedAt ?? modified,
            links: linked ? (kind == .directory ? 2 : 1) : 0,
            permissions: kind == .symlink ? 0o777 : (stored.mode ?? defaultMode),
            uid: configuration.forcedUID ?? stored.uid ?? configuration.uid,
            gid: configuration.forcedGID ?? stored.gid ?? configuration.gid)
    }

    /// The listing entry that describes this node as we last stored it.
    package var listingEntry: DirectoryEntry {
        DirectoryEntry(
            name: name, kind: kind, key: key, size: manifest == nil ? size : 0,
            etag: etag, lastModified: lastModified,
            contentType: stored.contentType(base: baseContentType))
    }
}
