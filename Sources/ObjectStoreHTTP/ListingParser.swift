import ObjectStore

/// Parses Swift's `format=xml` container listings and `<Error>` bodies.
///
/// The documents are small and machine-written, so this is a minimal scanner, not a general XML
/// parser: elements, text, the five predefined entities and numeric character references.
/// Unknown elements are skipped, so new fields in the listing do not break us.
public enum ListingParser {
    /// Parses a listing body into entries, in document order.
    public static func parse(_ body: [UInt8]) throws(ObjectStoreError) -> [ListEntry] {
        var scanner = XMLScanner(body)
        var entries: [ListEntry] = []
        var fields: [String: String] = [:]
        var inEntry: String? = nil  // "object" or "subdir"
        var currentField: String? = nil
        var text = ""
        var sawContainer = false
        while let token = try scanner.next() {
            switch token {
            case .open(let name, let selfClosing):
                if name == "container" { sawContainer = true; continue }
                if name == "object" || name == "subdir" {
                    inEntry = name
                    fields = [:]
                    if selfClosing { inEntry = nil }
                } else if inEntry != nil && !selfClosing {
                    currentField = name
                    text = ""
                }
            case .text(let value):
                if currentField != nil { text += value }
            case .close(let name):
                if name == "object" || name == "subdir" {
                    entries.append(try entry(kind: name, fields: fields))
                    inEntry = nil
                } else if name == currentField {
                    fields[name] = text
                    currentField = nil
                }
            }
        }
        guard sawContainer else {
            throw ObjectStoreError(.invalidResponse, "the listing is not a Swift XML container listing")
        }
        return entries
    }

    private static func entry(kind: String, fields: [String: String]) throws(ObjectStoreError) -> ListEntry {
        guard let name = fields["name"] else {
            throw ObjectStoreError(.invalidResponse, "a listing entry has no name")
        }
        if kind == "subdir" { return .commonPrefix(name) }
        guard let bytes = fields["bytes"].flatMap({ Int64($0) }), bytes >= 0, bytes <= HTTPObjectStore.largestSize else {
            throw ObjectStoreError(.invalidResponse, "listing entry '\(name)' has no valid size")
        }
        return .object(
            ObjectSummary(
                key: name, size: bytes, etag: (fields["hash"] ?? "").lowercased(),
                contentType: fields["content_type"] ?? "",
                lastModified: parseListingTime(fields["last_modified"] ?? "") ?? 0))
    }

    /// Parses `2026-11-21T22:40:21.123456` (UTC) into seconds since the epoch.
    public static func parseListingTime(_ text: String) -> Double? {
        let bytes = Array(text.utf8)
        guard bytes.count >= 19 else { return nil }
        func number(_ from: Int, _ count: Int) -> Int? {
            var v = 0
            for i in from..<(from + count) {
                let d = Int(bytes[i]) - 48
                guard d >= 0 && d <= 9 else { return nil }
                v = v * 10 + d
            }
            return v
        }
        guard let year = number(0, 4), let month = number(5, 2), let day = number(8, 2),
            let hour = number(11, 2), let minute = number(14, 2), let second = number(17, 2),
            (1...12).contains(month)
        else { return nil }
        var fraction = 0.0
        if bytes.count > 20 && bytes[19] == UInt8(ascii: ".") {
            var scale = 0.1
            for b in bytes[20...] {
                let d = Int(b) - 48
                guard d >= 0 && d <= 9 else { break }
                fraction += Double(d) * scale
                scale /= 10
            }
        }
        let days = daysFromCivil(year: year, month: month, day: day)
        return Double(days * 86_400 + hour * 3600 + minute * 60 + second) + fraction
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    static func daysFromCivil(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    /// The `<Code>` and `<Message>` of an `<Error>` body, if it is one.
    public static func parseError(_ body: [UInt8]) -> (code: String, message: String)? {
        var scanner = XMLScanner(body)
        var fields: [String: String] = [:]
        var current: String? = nil
        var text = ""
        while let token = try? scanner.next() {
            switch token {
            case .open(let name, let selfClosing):
                if !selfClosing { current = name; text = "" }
            case .text(let value): text += value
            case .close(let name):
                if name == current { fields[name] = text }
                current = nil
            }
        }
        guard let code = fields["Code"] else { return nil }
        return (code, fields["Message"] ?? "")
    }
}

/// A forward-only tokenizer over a UTF-8 XML document.
struct XMLScanner {
    enum Token: Equatable {
        case open(String, selfClosing: Bool)
        case close(String)
        case text(String)
    }

    private let bytes: [UInt8]
    private var index = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    mutating func next() throws(ObjectStoreError) -> Token? {
        while index < bytes.count {
            if bytes[index] != UInt8(ascii: "<") {
                let start = index
                while index < bytes.count && bytes[index] != UInt8(ascii: "<") { index += 1 }
                let raw = bytes[start..<index]
                if raw.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) { continue }
                return .text(try Self.unescape(raw))
            }
            // Markup.
            guard let end = bytes[index...].firstIndex(of: UInt8(ascii: ">")) else {
                throw ObjectStoreError(.invalidResponse, "the XML document is truncated")
            }
            let inner = bytes[(index + 1)..<end]
            index = end + 1
            guard let first = inner.first else { continue }
            if first == UInt8(ascii: "?") || first == UInt8(ascii: "!") { continue }
            if first == UInt8(ascii: "/") {
                return .close(Self.name(inner.dropFirst()))
            }
            let selfClosing = inner.last == UInt8(ascii: "/")
            return .open(Self.name(inner), selfClosing: selfClosing)
        }
        return nil
    }

    private static func name(_ tag: ArraySlice<UInt8>) -> String {
        let end =
            tag.firstIndex(where: { $0 == 0x20 || $0 == 0x0A || $0 == 0x09 || $0 == UInt8(ascii: "/") }) ?? tag.endIndex
        return String(decoding: tag[tag.startIndex..<end], as: UTF8.self)
    }

    static func unescape(_ raw: ArraySlice<UInt8>) throws(ObjectStoreError) -> String {
        guard raw.contains(UInt8(ascii: "&")) else { return String(decoding: raw, as: UTF8.self) }
        var out = [UInt8]()
        out.reserveCapacity(raw.count)
        var i = raw.startIndex
        while i < raw.endIndex {
            let b = raw[i]
            guard b == UInt8(ascii: "&") else {
                out.append(b)
                i += 1
                continue
            }
            guard let semi = raw[i...].firstIndex(of: UInt8(ascii: ";")) else {
                throw ObjectStoreError(.invalidResponse, "unterminated XML entity")
            }
            let entity = String(decoding: raw[(i + 1)..<semi], as: UTF8.self)
            switch entity {
            case "amp": out.append(UInt8(ascii: "&"))
            case "lt": out.append(UInt8(ascii: "<"))
            case "gt": out.append(UInt8(ascii: ">"))
            case "quot": out.append(UInt8(ascii: "\""))
            case "apos": out.append(UInt8(ascii: "'"))
            default:
                var scalarValue: UInt32? = nil
                if entity.hasPrefix("#x") || entity.hasPrefix("#X") {
                    scalarValue = UInt32(entity.dropFirst(2), radix: 16)
                } else if entity.hasPrefix("#") {
                    scalarValue = UInt32(entity.dropFirst(1))
                }
                guard let value = scalarValue, let scalar = Unicode.Scalar(value) else {
                    throw ObjectStoreError(.invalidResponse, "unknown XML entity &\(entity);")
                }
                out.append(contentsOf: Array(String(Character(scalar)).utf8))
            }
            i = semi + 1
        }
        return String(decoding: out, as: UTF8.self)
    }
}
