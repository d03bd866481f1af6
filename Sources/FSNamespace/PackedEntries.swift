import FSCore
import ObjectStore

/// Directory entries of one directory, stored in a few flat arrays instead of one
/// `DirectoryEntry` each (issue 21: a `DirectoryEntry` with its four strings took about 350
/// bytes; a packed one about 60). What makes an entry small:
/// 1. The names are the bytes of one array; the key is not stored when it is the directory's
///    prefix and the name (a file) or the name and "/" (a directory), as almost every key is.
/// 2. An ETag of 32 lower-case hex digits (an MD5) is 16 bytes.
/// 3. A content type is split as `StoredAttributes.parse` splits it: its base, mode and owners
///    are a style, one of a few (a table per collection, two bytes an entry, none while all
///    entries have the first), its mtime a number. Only when the content type made back from
///    them is byte for byte the one listed; else it is kept whole.
/// 4. Times are nanoseconds since the epoch in an Int64 (years 1678 to 2262; others kept whole).
/// 5. Sizes are 4 bytes until one needs 8, and the attribute columns take no room until an entry
///    has attributes (a listing of other tools' objects has none).
/// Whatever does not pack (another key, ETag, content type or time) is kept as it came, in a
/// table of exceptions: an entry reads back exactly as it was appended.
package struct PackedEntries: Sendable, RandomAccessCollection {
    /// The key prefix of the directory the entries are in ("" or ending in "/").
    package let prefix: String

    private var names: [UInt8] = []
    /// Where each name ends in `names`.
    private var ends: [UInt32] = []
    /// The kind (low 3 bits) and the `Flag`s.
    private var flags: [UInt8] = []
    /// Sizes while every one fits 32 bits; then `wideSizes` (and this is empty).
    private var sizes: [UInt32] = []
    private var wideSizes: [Int64]? = nil
    private var modified: [Int64] = []
    /// Two words an MD5.
    private var digests: [UInt64] = []
    /// Each entry's style number (base content type, mode, owners); empty while every entry has
    /// style 0.
    private var styleNumbers: [UInt16] = []
    private var styles = NumberedStyles(limit: Int(UInt16.max) + 1)
    /// The `cssp-mtime` parameter in ns (with `Flag.hasMtime`); empty until an entry has one.
    private var mtimes: [Int64] = []
    /// Entries with something that did not pack, by position.
    private var exceptions: [Int32: Exception] = [:]

    private struct Exception: Sendable {
        package var key: String?
        package var etag: String?
        package var contentType: String?
        package var lastModified: Timestamp?
    }

    private enum Flag {
        package static let kind: UInt8 = 0x07
        package static let exception: UInt8 = 0x08
        package static let noEtag: UInt8 = 0x10
        package static let hasMtime: UInt8 = 0x20
    }

    package init(prefix: String) { self.prefix = prefix }

    package init(prefix: String, _ entries: some Sequence<DirectoryEntry>) {
        self.prefix = prefix
        append(contentsOf: entries)
    }

    package var startIndex: Int { 0 }
    package var endIndex: Int { ends.count }

    /// Bytes held (the arrays' contents, not their spare capacity), for tests and --stats.
    package var bytes: Int {
        names.count + ends.count * 4 + flags.count + sizes.count * 4 + (wideSizes?.count ?? 0) * 8 + modified.count * 8
            + digests.count * 8 + styleNumbers.count * 2 + mtimes.count * 8 + exceptions.count * 64
    }

    package subscript(position: Int) -> DirectoryEntry {
        let start = position == 0 ? 0 : Int(ends[position - 1])
        let name = names.withUnsafeBufferPointer { String(decoding: $0[start..<Int(ends[position])], as: UTF8.self) }
        let flag = flags[position]
        let kind = Self.kinds[Int(flag & Flag.kind)]
        let exception = flag & Flag.exception != 0 ? exceptions[Int32(position)] : nil
        let key = exception?.key ?? (kind == .directory ? prefix + name + "/" : prefix + name)
        let etag =
            exception?.etag ?? (flag & Flag.noEtag != 0 ? "" : Self.hex(digests[2 * position], digests[2 * position + 1]))
        let lastModified = exception?.lastModified ?? Self.timestamp(modified[position])
        var contentType = exception?.contentType
        var parsed: (base: String, attributes: StoredAttributes)? = nil
        if contentType == nil {
            let style = styles[UInt32(styleNumbers.isEmpty ? 0 : styleNumbers[position])]
            let base = style.baseContentType.string
            let attributes = StoredAttributes(
                mode: style.mode, uid: style.uid, gid: style.gid,
                mtime: flag & Flag.hasMtime != 0 ? Self.timestamp(mtimes[position]) : nil)
            contentType = attributes == StoredAttributes() ? base : attributes.contentType(base: base)
            parsed = (base, attributes)
        }
        return DirectoryEntry(
            name: name, kind: kind, key: key, size: size(position), etag: etag, lastModified: lastModified,
            contentType: contentType!, knownParse: parsed)
    }

    /// Gives back the spare capacity appending left (up to half of each array: a third of a
    /// 200 000-entry listing's memory), for a listing that is complete and only read from now on.
    package mutating func compact() {
        func exact<T>(_ array: inout [T]) {
            if array.capacity > array.count + array.count / 8 { array = array.withUnsafeBufferPointer { Array($0) } }
        }
        exact(&names)
        exact(&ends)
        exact(&flags)
        exact(&sizes)
        if var wide = wideSizes {
            wideSizes = nil
            exact(&wide)
            wideSizes = wide
        }
        exact(&modified)
        exact(&digests)
        exact(&styleNumbers)
        exact(&mtimes)
        styles.forgetNumbers()
    }

    package mutating func append(contentsOf entries: some Sequence<DirectoryEntry>) {
        for entry in entries { append(entry) }
    }

    package mutating func append(_ entry: DirectoryEntry) {
        let position = Int32(ends.count)
        var exception = Exception()
        names.append(contentsOf: entry.name.utf8)
        ends.append(UInt32(names.count))
        var flag = entry.kind.code
        if !isStandardKey(entry) { exception.key = entry.key }
        if entry.etag.isEmpty {
            flag |= Flag.noEtag
            digests.append(0)
            digests.append(0)
        } else if let (high, low) = Self.digest(entry.etag) {
            digests.append(high)
            digests.append(low)
        } else {
            exception.etag = entry.etag
            digests.append(0)
            digests.append(0)
        }
        appendSize(entry.size)
        if let nanoseconds = Self.nanoseconds(entry.lastModified) {
            modified.append(nanoseconds)
        } else {
            exception.lastModified = entry.lastModified
            modified.append(0)
        }
        // The content type as base and parameters, if it reads back the same.
        let (base, attributes) = entry.parsedContentType
        let plain = attributes == StoredAttributes()
        let mtime = attributes.mtime.flatMap(Self.nanoseconds)
        let rebuilt = plain ? base : attributes.contentType(base: base)
        if rebuilt.utf8.elementsEqual(entry.contentType.utf8) && (attributes.mtime == nil || mtime != nil),
            let number = styles.number(
                NodeStyle(baseContentType: base.exact, mode: attributes.mode, uid: attributes.uid, gid: attributes.gid))
        {
            appendStyle(UInt16(number))
            if mtime != nil { flag |= Flag.hasMtime }
            appendMtime(mtime)
        } else {
            exception.contentType = entry.contentType
            appendStyle(0)
            appendMtime(nil)
        }
        if exception.key != nil || exception.etag != nil || exception.contentType != nil || exception.lastModified != nil {
            flag |= Flag.exception
            exceptions[position] = exception
        }
        flags.append(flag)
    }

    private mutating func appendSize(_ size: Int64) {
        if wideSizes != nil {
            wideSizes!.append(size)
        } else if let narrow = UInt32(exactly: size) {
            sizes.append(narrow)
        } else {
            wideSizes = sizes.map { Int64($0) } + [size]
            sizes = []
        }
    }

    private func size(_ position: Int) -> Int64 { wideSizes?[position] ?? Int64(sizes[position]) }

    /// One entry's style number (none while every entry so far and this one have style 0).
    private mutating func appendStyle(_ number: UInt16) {
        if styleNumbers.isEmpty {
            if number == 0 { return }
            styleNumbers = Array(repeating: 0, count: ends.count - 1)
        }
        styleNumbers.append(number)
    }

    /// One entry's mtime (none while every entry so far and this one have none).
    private mutating func appendMtime(_ mtime: Int64?) {
        if mtimes.isEmpty {
            guard mtime != nil else { return }
            mtimes = Array(repeating: 0, count: ends.count - 1)
        }
        mtimes.append(mtime ?? 0)
    }

    /// Whether the entry's key is the prefix and its name (and "/" for a directory), compared
    /// in place: this runs for every entry of every listing.
    private func isStandardKey(_ entry: DirectoryEntry) -> Bool {
        var key = entry.key.utf8[...]
        guard key.starts(with: prefix.utf8) else { return false }
        key = key.dropFirst(prefix.utf8.count)
        guard key.starts(with: entry.name.utf8) else { return false }
        key = key.dropFirst(entry.name.utf8.count)
        return entry.kind == .directory ? key.elementsEqual("/".utf8) : key.isEmpty
    }

    /// The entries for which `keep` is true, in order.
    package func filter(_ keep: (DirectoryEntry) -> Bool) -> PackedEntries {
        var result = PackedEntries(prefix: prefix)
        for entry in self where keep(entry) { result.append(entry) }
        return result
    }

    /// `BackgroundHeads.needsMetadata` of the entry at `position`, without making a `DirectoryEntry`
    /// (this runs for every entry of every listing: making each one took a sixth of the daemon's
    /// time in a walk).
    package func needsMetadata(_ position: Int) -> Bool {
        switch Self.kinds[Int(flags[position] & Flag.kind)] {
        case .directory: return true
        case .symlink, .fifo, .socket: return false
        case .file: return size(position) == 0
        }
    }

    /// Whether the entry at `position` is a directory (without making a `DirectoryEntry`).
    package func isDirectory(_ position: Int) -> Bool { Self.kinds[Int(flags[position] & Flag.kind)] == .directory }

    /// The position of the entry named `name` in entries in a listing's order: by the bytes of
    /// their names, a directory's with its "/" (`a.txt` before `a/`), if there is one.
    package func sortedPosition(of name: String) -> Int? {
        var text = name
        return text.withUTF8 { wanted -> Int? in
            // A file of that name sorts as `name`, a directory as `name/`: look for either.
            for slash in [false, true] {
                var low = 0
                var high = count
                while low < high {
                    let middle = (low + high) / 2
                    if sortKey(middle, precedes: wanted, slash: slash) { low = middle + 1 } else { high = middle }
                }
                guard low < count else { continue }
                if withName(low, { $0.elementsEqual(wanted) }) && isDirectory(low) == slash { return low }
            }
            return nil
        }
    }

    /// Whether the entry at `position`, as a listing sorts it (its key: the name, and "/" for a
    /// directory), precedes `wanted` (and a "/" with `slash`).
    private func sortKey(_ position: Int, precedes wanted: UnsafeBufferPointer<UInt8>, slash: Bool) -> Bool {
        let directory = isDirectory(position)
        return withName(position) { name in
            func byte(_ bytes: UnsafeBufferPointer<UInt8>, _ withSlash: Bool, _ i: Int) -> UInt8? {
                i < bytes.count ? bytes[i] : (i == bytes.count && withSlash ? UInt8(ascii: "/") : nil)
            }
            var i = 0
            while true {
                switch (byte(name, directory, i), byte(wanted, slash, i)) {
                case (nil, nil): return false
                case (nil, _): return true
                case (_, nil): return false
                case (let a?, let b?): if a != b { return a < b }
                }
                i += 1
            }
        }
    }

    /// The name at `position` as bytes, without making a `DirectoryEntry`.
    package func withName<T>(_ position: Int, _ body: (UnsafeBufferPointer<UInt8>) -> T) -> T {
        let start = position == 0 ? 0 : Int(ends[position - 1])
        return names.withUnsafeBufferPointer { body(UnsafeBufferPointer(rebasing: $0[start..<Int(ends[position])])) }
    }


    private static let kinds: [NodeKind] = [.file, .directory, .symlink, .fifo, .socket, .file, .file, .file]


    package static func nanoseconds(_ time: Timestamp) -> Int64? {
        let (product, overflow) = time.seconds.multipliedReportingOverflow(by: 1_000_000_000)
        guard !overflow, time.nanoseconds >= 0, time.nanoseconds < 1_000_000_000 else { return nil }
        let (sum, overflowed) = product.addingReportingOverflow(Int64(time.nanoseconds))
        return overflowed ? nil : sum
    }

    package static func timestamp(_ nanoseconds: Int64) -> Timestamp {
        let (seconds, rest) = nanoseconds.quotientAndRemainder(dividingBy: 1_000_000_000)
        return rest < 0
            ? Timestamp(seconds: seconds - 1, nanoseconds: Int32(rest + 1_000_000_000))
            : Timestamp(seconds: seconds, nanoseconds: Int32(rest))
    }

    /// An ETag of exactly 32 lower-case hex digits, as two words.
    package static func digest(_ etag: String) -> (UInt64, UInt64)? {
        var words: (UInt64, UInt64) = (0, 0)
        var count = 0
        for byte in etag.utf8 {
            let value: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): value = byte - UInt8(ascii: "a") + 10
            default: return nil
            }
            guard count < 32 else { return nil }
            if count < 16 {
                words.0 = words.0 << 4 | UInt64(value)
            } else {
                words.1 = words.1 << 4 | UInt64(value)
            }
            count += 1
        }
        return count == 32 ? words : nil
    }

    package static func hex(_ high: UInt64, _ low: UInt64) -> String {
        let digits = Array("0123456789abcdef".utf8)
        return String(unsafeUninitializedCapacity: 32) { buffer in
            for i in 0..<16 {
                buffer[i] = digits[Int(high >> (60 - 4 * UInt64(i)) & 0xF)]
                buffer[16 + i] = digits[Int(low >> (60 - 4 * UInt64(i)) & 0xF)]
            }
            return 32
        }
    }
}

/// What many entries and nodes share: the base content type and csspfs's mode and owners
/// parameters (each maybe absent). A listing or a mount sees a few.
package struct NodeStyle: Hashable, Sendable {
    package var baseContentType: ExactString
    package var mode: UInt16?
    package var uid: UInt32?
    package var gid: UInt32?
}

/// Styles numbered in the order they first come, each kept once; past `limit` of them there is
/// no number for a new one (its entry or node is kept whole).
package struct NumberedStyles: Sendable {
    package let limit: Int
    private var styles: [NodeStyle] = []
    /// Made again when needed after `forgetNumbers`.
    private var numbers: [NodeStyle: UInt32] = [:]

    package init(limit: Int) { self.limit = limit }

    package mutating func number(_ style: NodeStyle) -> UInt32? {
        if numbers.isEmpty && !styles.isEmpty {
            for (number, known) in styles.enumerated() { numbers[known] = UInt32(number) }
        }
        if let number = numbers[style] { return number }
        guard styles.count < limit else { return nil }
        let number = UInt32(styles.count)
        styles.append(style)
        numbers[style] = number
        return number
    }

    /// Drops the table from styles to numbers (a complete listing only reads).
    package mutating func forgetNumbers() { numbers = [:] }

    package subscript(number: UInt32) -> NodeStyle { styles[Int(number)] }
}
