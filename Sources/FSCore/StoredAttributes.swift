import ObjectStore

/// POSIX attributes kept with an object, and how they are written.
///
/// Two places, on purpose:
/// 1. `X-Object-Meta-Mtime` (Unix seconds with fraction, as rclone and svfs write it),
///    `X-Object-Meta-Mode` (octal), `-Uid`, `-Gid`, `-Symlink-Target` (svfs's convention): what
///    other tools read. Only HEAD and GET return them.
/// 2. The same values as parameters of the Content-Type (`;cssp-mtime=…;cssp-mode=…`), which the
///    container listing does return: this is what lets `ls -l` and `rsync` see exact times and
///    modes of files csspfs wrote at the cost of one listing, without a HEAD per file.
/// When both exist the metadata headers win (another tool may have updated them).
public struct StoredAttributes: Sendable, Equatable {
    public var mode: UInt16?
    public var uid: UInt32?
    public var gid: UInt32?
    public var mtime: Timestamp?

    public init(mode: UInt16? = nil, uid: UInt32? = nil, gid: UInt32? = nil, mtime: Timestamp? = nil) {
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.mtime = mtime
    }

    package static let parameterPrefix = "cssp-"
    public static let symlinkContentType = "application/link"
    /// The freedesktop shared-mime-info names of these inode types.
    public static let fifoContentType = "inode/fifo"
    public static let socketContentType = "inode/socket"
    package static let symlinkTargetHeader = "symlink-target"
    /// `X-Object-Meta-Cssp-Create`: a random token an exclusive create's empty object carries
    /// until its first upload or attribute change, telling whose create the store kept
    /// (`Filesystem.storeExclusively`). Not kept by later writes.
    package static let createTokenHeader = "cssp-create"

    /// The content type without csspfs's parameters, and the attributes they carried.
    public static func parse(contentType: String) -> (base: String, attributes: StoredAttributes) {
        parseASCII(contentType) ?? parseCharacters(contentType)
    }

    /// `parse` for any content type, character by character.
    package static func parseCharacters(_ contentType: String) -> (base: String, attributes: StoredAttributes) {
        var attributes = StoredAttributes()
        var kept: [Substring] = []
        for (index, part) in contentType.split(separator: ";", omittingEmptySubsequences: false).enumerated() {
            let trimmed = part.drop(while: { $0 == " " })
            guard index > 0, trimmed.hasPrefix(parameterPrefix), let equals = trimmed.firstIndex(of: "=") else {
                kept.append(part)
                continue
            }
            let name = trimmed[trimmed.index(trimmed.startIndex, offsetBy: parameterPrefix.count)..<equals]
            attributes.set(String(name), String(trimmed[trimmed.index(after: equals)...]))
        }
        let base = kept.joined(separator: ";")
        // The usual base is the literal's storage, not a copy per node (issue 21).
        return (base.utf8.elementsEqual(octetStream.utf8) ? octetStream : base, attributes)
    }

    package static let octetStream = "application/octet-stream"

    /// `parse` of an ASCII content type (every one in practice), on its bytes: where a byte is a
    /// character, splitting, trimming and comparing bytes is what `parse` does with characters,
    /// at a fraction of the cost (`ls` of 200 000 names parsed each one several times; issue 21).
    /// nil for any other content type.
    package static func parseASCII(_ contentType: String) -> (base: String, attributes: StoredAttributes)? {
        let bytes = contentType.utf8
        guard bytes.allSatisfy({ $0 < 0x80 }) else { return nil }
        let semicolon = UInt8(ascii: ";")
        guard bytes.contains(semicolon) else {
            return (bytes.elementsEqual(octetStream.utf8) ? octetStream : contentType, StoredAttributes())
        }
        var attributes = StoredAttributes()
        var kept: [UInt8] = []
        kept.reserveCapacity(bytes.count)
        let prefix = Array(parameterPrefix.utf8)
        var first = true
        for part in Array(bytes).split(separator: semicolon, omittingEmptySubsequences: false) {
            defer { first = false }
            let trimmed = part.drop(while: { $0 == UInt8(ascii: " ") })
            if !first, trimmed.starts(with: prefix), let equals = trimmed.firstIndex(of: UInt8(ascii: "=")),
                equals >= trimmed.startIndex + prefix.count
            {
                let name = String(decoding: trimmed[(trimmed.startIndex + prefix.count)..<equals], as: UTF8.self)
                attributes.set(name, String(decoding: trimmed[(equals + 1)...], as: UTF8.self))
                continue
            }
            if !first { kept.append(semicolon) }
            kept.append(contentsOf: part)
        }
        let base = String(decoding: kept, as: UTF8.self)
        return (base.utf8.elementsEqual(octetStream.utf8) ? octetStream : base, attributes)
    }

    /// Attributes from `X-Object-Meta-*` (names lower-cased without the prefix).
    public static func parse(metadata: [String: String]) -> StoredAttributes {
        var attributes = StoredAttributes()
        for name in ["mtime", "mode", "uid", "gid"] {
            if let value = metadata[name] { attributes.set(name, value) }
        }
        return attributes
    }

    /// The permission bits of a stored mode. Tools disagree on the format: csspfs writes octal
    /// permissions with a leading zero (`0755`), rclone an octal `st_mode` (`100755`), s3fs a
    /// decimal one (`33261`; read as octal it would claim setgid). Without a leading zero, a
    /// number that is a whole `st_mode` (a real file type) in decimal is read as decimal; anything
    /// else as octal, and only bare permissions or a whole `st_mode` are taken.
    package static func permissions(_ text: String) -> UInt16? { modeParts(text)?.permissions }

    /// The file-type bits of a stored mode that is a whole `st_mode` (s3fs stores a symlink, a
    /// FIFO or a socket as an object whose mode says so); nil for bare permissions.
    package static func fileType(_ text: String) -> UInt32? { modeParts(text)?.fileType }

    /// A stored mode read as `permissions(_:)` says, with its file-type bits where it has them.
    private static func modeParts(_ text: String) -> (fileType: UInt32?, permissions: UInt16)? {
        let types: Set<UInt32> = [0o140000, 0o120000, 0o100000, 0o060000, 0o040000, 0o020000, 0o010000]
        func isMode(_ value: UInt32) -> Bool { value <= 0o177777 && types.contains(value & 0o170000) }
        func parts(_ value: UInt32) -> (UInt32?, UInt16) {
            (value > 0o7777 ? value & 0o170000 : nil, UInt16(value & 0o7777))
        }
        if !text.hasPrefix("0"), let value = UInt32(text, radix: 10), value > 0o7777, isMode(value) {
            return parts(value)
        }
        guard let value = UInt32(text, radix: 8), value <= 0o7777 || isMode(value) else { return nil }
        return parts(value)
    }

    /// Attributes of an object from its HEAD: metadata headers over content-type parameters.
    /// Another tool's object (no `cssp-mtime` parameter) with `foreign: .listing` has none: its
    /// attributes are what a listing shows of it (`ForeignAttributes`).
    public static func of(_ info: ObjectInfo, foreign: ForeignAttributes = .head) -> StoredAttributes {
        var attributes = parse(contentType: info.contentType).attributes
        if foreign == .listing && attributes.mtime == nil { return attributes }
        let headers = parse(metadata: info.metadata)
        attributes.mode = headers.mode ?? attributes.mode
        attributes.uid = headers.uid ?? attributes.uid
        attributes.gid = headers.gid ?? attributes.gid
        attributes.mtime = headers.mtime ?? attributes.mtime
        return attributes
    }

    private mutating func set(_ name: String, _ value: String) {
        switch name {
        case "mtime": mtime = Timestamp(parsing: value) ?? mtime
        case "mode": mode = Self.permissions(value) ?? mode
        case "uid": uid = UInt32(value) ?? uid
        case "gid": gid = UInt32(value) ?? gid
        default: break
        }
    }

    /// The content type to store: `base` plus these attributes as parameters.
    public func contentType(base: String) -> String {
        var text = base.isEmpty ? "application/octet-stream" : base
        if let mtime { text += ";cssp-mtime=\(mtime)" }
        if let mode { text += ";cssp-mode=0" + String(mode, radix: 8) }
        if let uid { text += ";cssp-uid=\(uid)" }
        if let gid { text += ";cssp-gid=\(gid)" }
        return text
    }

    /// `existing` metadata with these attributes written over it (other headers are kept:
    /// Swift replaces all metadata on every update).
    public func metadata(mergedInto existing: [String: String]) -> [String: String] {
        var result = existing
        if let mtime { result["mtime"] = mtime.description }
        if let mode { result["mode"] = "0" + String(mode, radix: 8) }
        if let uid { result["uid"] = String(uid) }
        if let gid { result["gid"] = String(gid) }
        return result
    }
}
