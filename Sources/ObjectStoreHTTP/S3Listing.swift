import ObjectStore

/// S3's XML answers: a bucket listing (ListObjectsV2, or COS's GET Bucket: the same elements),
/// DeleteObjects' failures, and single fields (an upload's `UploadId`).
enum S3Listing {
    struct Page {
        var entries: [ListEntry]
        var isTruncated: Bool
    }

    /// Walks an answer whose root element is `root`: `entry(name, fields)` for each child of
    /// the root named in `entries` (its own children's texts by name), `top(name, text)` for
    /// every other child of the root. Throws when the root is another element.
    static func walk(
        _ body: [UInt8], root: String, entries: Set<String>, entry: (String, [String: String]) throws(ObjectStoreError) -> Void,
        top: (String, String) -> Void
    ) throws(ObjectStoreError) {
        var scanner = XMLScanner(body)
        var fields: [String: String] = [:]
        var path: [String] = []
        var text = ""
        var sawRoot = false
        while let token = try scanner.next() {
            switch token {
            case .open(let name, let selfClosing):
                if selfClosing { continue }
                if path.isEmpty && name == root { sawRoot = true }
                if path.count == 1 && entries.contains(name) { fields = [:] }
                path.append(name)
                text = ""
            case .text(let value):
                text += value
            case .close(let name):
                guard path.last == name else {
                    throw ObjectStoreError(.invalidResponse, "the server's \(root) is not well-formed XML ('\(name)')")
                }
                path.removeLast()
                if path.count == 2 && entries.contains(path[1]) { fields[name] = text }
                if path.count == 1 {
                    if entries.contains(name) { try entry(name, fields) } else { top(name, text) }
                }
                text = ""
            }
        }
        guard sawRoot else { throw ObjectStoreError(.invalidResponse, "the server's answer is not a \(root)") }
    }

    /// A listing asked with `encoding-type=url`: keys and prefixes come URL-encoded.
    static func parse(_ body: [UInt8]) throws(ObjectStoreError) -> Page {
        var entries: [ListEntry] = []
        var truncated = false
        try walk(body, root: "ListBucketResult", entries: ["Contents", "CommonPrefixes"]) { (kind, fields) throws(ObjectStoreError) in
            entries.append(try entry(kind: kind, fields: fields))
        } top: { name, text in
            if name == "IsTruncated" { truncated = text == "true" }
        }
        // Objects and prefixes come in two runs: merged into one, in the byte order of names.
        entries.sort { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
        return Page(entries: entries, isTruncated: truncated)
    }

    private static func entry(kind: String, fields: [String: String]) throws(ObjectStoreError) -> ListEntry {
        if kind == "CommonPrefixes" {
            guard let prefix = fields["Prefix"].flatMap(decode) else {
                throw ObjectStoreError(.invalidResponse, "a listed common prefix has no valid Prefix")
            }
            return .commonPrefix(prefix)
        }
        guard let key = fields["Key"].flatMap(decode) else {
            throw ObjectStoreError(.invalidResponse, "a listed object has no valid Key")
        }
        guard let size = fields["Size"].flatMap({ Int64($0) }), size >= 0, size <= HTTPObjectStore.largestSize else {
            throw ObjectStoreError(.invalidResponse, "listing entry '\(key)' has no valid size")
        }
        return .object(
            ObjectSummary(
                key: key, size: size, etag: HTTPObjectStore.unquote(fields["ETag"] ?? ""), contentType: "",
                lastModified: ListingParser.parseListingTime(fields["LastModified"] ?? "") ?? 0))
    }

    /// A URL-encoded name of a listing (`+` is a space, as AWS writes it).
    static func decode(_ text: String) -> String? {
        PercentEncoding.decode(text.replacing("+", with: " "))
    }

    /// The text of the first element `name` anywhere in `body`.
    static func field(_ name: String, in body: [UInt8]) -> String? {
        var scanner = XMLScanner(body)
        var inside = false
        var text = ""
        while let token = try? scanner.next() {
            switch token {
            case .open(let open, let selfClosing):
                if open == name {
                    if selfClosing { return "" }
                    inside = true
                    text = ""
                }
            case .text(let value): if inside { text += value }
            case .close(let close): if close == name && inside { return text }
            }
        }
        return nil
    }

    /// The keys DeleteObjects could not delete, with their error codes.
    static func deleteErrors(_ body: [UInt8]) throws(ObjectStoreError) -> [(key: String, code: String)] {
        var scanner = XMLScanner(body)
        var failed: [(key: String, code: String)] = []
        var inError = false
        var sawResult = false
        var fields: [String: String] = [:]
        var current: String? = nil
        var text = ""
        while let token = try scanner.next() {
            switch token {
            case .open(let name, let selfClosing):
                if name == "DeleteResult" { sawResult = true }
                if name == "Error" && !selfClosing {
                    inError = true
                    fields = [:]
                } else if inError && !selfClosing {
                    current = name
                    text = ""
                }
            case .text(let value): if current != nil { text += value }
            case .close(let name):
                if name == "Error" && inError {
                    failed.append((fields["Key"] ?? "", fields["Code"] ?? ""))
                    inError = false
                } else if name == current {
                    fields[name] = text
                    current = nil
                }
            }
        }
        guard sawResult else {
            let detail = ListingParser.parseError(body)
            throw ObjectStoreError(
                .invalidResponse, "the answer to a bulk delete is not a DeleteResult" + (detail.map { ": \($0.code) \($0.message)" } ?? ""))
        }
        return failed
    }

    struct Uploads {
        var uploads: [(session: UploadSession, initiated: Double)]
        var isTruncated: Bool
        var nextKeyMarker: String?
        var nextUploadIDMarker: String?
    }

    /// ListMultipartUploads' answer (keys as they are: it is asked without encoding-type).
    static func uploads(_ body: [UInt8]) throws(ObjectStoreError) -> Uploads {
        var result = Uploads(uploads: [], isTruncated: false, nextKeyMarker: nil, nextUploadIDMarker: nil)
        try walk(body, root: "ListMultipartUploadsResult", entries: ["Upload"]) { (_, fields) throws(ObjectStoreError) in
            guard let key = fields["Key"], let id = fields["UploadId"] else {
                throw ObjectStoreError(.invalidResponse, "a listed upload has no Key or UploadId")
            }
            let initiated = ListingParser.parseListingTime(fields["Initiated"] ?? "") ?? 0
            result.uploads.append((UploadSession(key: key, id: id), initiated))
        } top: { name, text in
            switch name {
            case "IsTruncated": result.isTruncated = text == "true"
            case "NextKeyMarker": result.nextKeyMarker = text.isEmpty ? nil : text
            case "NextUploadIdMarker": result.nextUploadIDMarker = text.isEmpty ? nil : text
            default: break
            }
        }
        return result
    }

    /// Whether XML 1.0 can carry `key` (no control characters but tab, newline, return).
    static func isXMLSafe(_ key: String) -> Bool {
        key.unicodeScalars.allSatisfy { $0.value >= 0x20 || $0 == "\t" || $0 == "\n" || $0 == "\r" }
            && !key.unicodeScalars.contains { $0.value == 0xFFFE || $0.value == 0xFFFF }
    }

    static func escape(_ text: String) -> String {
        var out = ""
        for c in text.unicodeScalars {
            switch c {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&apos;"
            case "\r": out += "&#13;"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }
}
