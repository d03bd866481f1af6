/// Key <-> path helpers shared by every layer that maps keys to names.
public enum ObjectKey {
    /// The delimiter that turns keys into a directory tree.
    public static let delimiter = "/"

    /// The content type some tools give zero-byte objects that stand for directories.
    public static let directoryContentType = "application/directory"

    /// Whether a content type (possibly with parameters) names a directory marker.
    public static func isDirectoryContentType(_ contentType: String) -> Bool {
        let base = contentType.split(separator: ";", maxSplits: 1).first ?? ""
        return base.trimmingSpaces().lowercased() == directoryContentType
    }

    /// The key prefix of the directory `path` (`""` for the root, else `path + "/"`).
    public static func prefix(ofDirectory path: String) -> String {
        path.isEmpty ? "" : path + delimiter
    }

    /// The key of `name` inside the directory whose prefix is `prefix`.
    public static func key(_ name: String, inDirectoryPrefix prefix: String) -> String {
        prefix + name
    }
}

extension Substring {
    func trimmingSpaces() -> Substring {
        var s = self
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return s
    }
}
