import ObjectStore
import ObjectStoreTesting
import Testing

@testable import FSCore
@testable import FSFiles
@testable import FSJournal
@testable import FSNamespace
@testable import FileSystem

/// The compact listing storage (issue 21): every entry reads back exactly as it was appended,
/// whatever did or did not pack, and a typical listing takes a fraction of its entries' size.
struct PackedEntriesTests {
    /// Random entries of every shape the listings produce, and odd ones they might.
    static func randomEntry(_ random: inout SeededGenerator, prefix: String) -> DirectoryEntry {
        func pick<T>(_ values: [T]) -> T { values[Int.random(in: 0..<values.count, using: &random)] }
        let name = pick(["a", "f00012345", "café", "cafe\u{301}", "a longer name than fifteen bytes", "x~object", " ", "日本語のファイル名"])
            + String(Int.random(in: 0..<1000, using: &random))
        let kind = pick([NodeKind.file, .file, .file, .directory, .symlink, .fifo, .socket])
        let standard = kind == .directory ? prefix + name + "/" : prefix + name
        let key = pick([standard, standard, standard, prefix + "other", prefix + name + "/", "elsewhere/" + name])
        let md5 = String((0..<32).map { _ in pick(Array("0123456789abcdef")) })
        let etag = pick([md5, md5, md5, "", md5.uppercased(), "\"" + md5 + "\"", String(md5.prefix(31)), md5 + "0", "d41d8cd98f00b204e9800998ecf8427e-3"])
        let time = Timestamp(
            seconds: pick([0, 1_700_000_000, -1, -5_000_000_000, Int64.max / 2, 9_223_372_036]),
            nanoseconds: pick([0, 1, 999_999_999, 123_456_789]))
        var attributes = StoredAttributes()
        if Bool.random(using: &random) { attributes.mode = pick([0o644, 0o755, 0o4777, 0]) }
        if Bool.random(using: &random) { attributes.uid = pick([0, 1000, UInt32.max]) }
        if Bool.random(using: &random) { attributes.gid = pick([0, 1000, UInt32.max, 0x8000_0000]) }
        if Bool.random(using: &random) { attributes.mtime = pick([time, Timestamp(seconds: Int64.max, nanoseconds: 5)]) }
        let base = pick(["application/octet-stream", "text/plain", "", "application/directory", "text/plain;charset=utf-8", "application/link"])
        let contentType = pick([
            attributes.contentType(base: base), attributes.contentType(base: base), base,
            base + ";cssp-mode=644", base + ";cssp-unknown=1", "text/plain; cssp-uid=7", base + ";cssp-mtime=1.5;cssp-mtime=2",
        ])
        return DirectoryEntry(
            name: name, kind: kind, key: key, size: pick([0, 1, 4096, Int64.max, -1]), etag: etag, lastModified: time,
            contentType: contentType)
    }

    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func everyEntryReadsBackAsAppended(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        let prefix = ["", "dir/", "a/b c/"][Int(seed % 3)]
        let entries = (0..<2_000).map { _ in Self.randomEntry(&random, prefix: prefix) }
        let packed = PackedEntries(prefix: prefix, entries)
        #expect(packed.count == entries.count)
        for (index, entry) in entries.enumerated() where packed[index] != entry {
            Issue.record("entry \(index): appended \(entry), read back \(packed[index])")
            return
        }
        let kept = packed.filter { $0.kind == .directory }
        #expect(Array(kept) == entries.filter { $0.kind == .directory })
        for index in packed.indices {
            let entry = packed[index]
            let (base, attributes) = StoredAttributes.parse(contentType: entry.contentType)
            guard entry.parsedContentType.base == base && entry.parsedContentType.attributes == attributes else {
                Issue.record("entry \(index): known parse \(entry.parsedContentType) of \(entry.contentType)")
                return
            }
        }
        let needing = packed.indices.filter(packed.needsMetadata)
        #expect(needing == entries.indices.filter { BackgroundHeads.needsMetadata(entries[$0]) })
        #expect(!needing.isEmpty && needing.count < entries.count)
    }

    /// The columns that start narrow or absent: entries without attributes, then one with
    /// attributes that are all zero (present, not absent), small sizes, then one past 4 GiB;
    /// every entry reads back as appended, before and after.
    @Test func columnsThatGrowLaterReadBackTheEntriesBefore() {
        func entry(_ name: String, size: Int64, attributes: StoredAttributes) -> DirectoryEntry {
            DirectoryEntry(
                name: name, kind: .file, key: name, size: size, etag: "", lastModified: .zero,
                contentType: attributes.contentType(base: "text/plain"))
        }
        let entries = [
            entry("a", size: 1, attributes: StoredAttributes()), entry("b", size: 0, attributes: StoredAttributes()),
            entry("c", size: 7, attributes: StoredAttributes(mode: 0, uid: 0, gid: 0)),
            entry("d", size: 1 << 33, attributes: StoredAttributes()),
            entry("e", size: 5, attributes: StoredAttributes(mtime: Timestamp(seconds: 0, nanoseconds: 0))),
            entry("f", size: Int64(UInt32.max), attributes: StoredAttributes()),
        ]
        var packed = PackedEntries(prefix: "")
        for (count, next) in entries.enumerated() {
            packed.append(next)
            #expect(Array(packed) == Array(entries[...count]), "after \(next.name)")
        }
        #expect(packed.map(\.parsedContentType.attributes) == entries.map(\.parsedContentType.attributes))
    }

    /// A listing of other tools' objects (MD5 ETags, one content type) and one of csspfs's own
    /// (attributes in the content type, one mode and owner): neither needs a style column (all
    /// entries have the first), only csspfs's an mtime column, both 4-byte sizes (42 and 50
    /// bytes an entry with names of 9 bytes; 44 and 62 with the content type, mode and owners
    /// in columns of their own).
    @Test func aTypicalListingPacksSmall() {
        var plain = PackedEntries(prefix: "seed/huge-flat/")
        var own = PackedEntries(prefix: "backup/")
        for i in 0..<10_000 {
            let name = "f" + String(i + 10_000_000)
            let etag = String(repeating: "0123456789abcdef", count: 2)
            plain.append(
                DirectoryEntry(
                    name: name, kind: .file, key: "seed/huge-flat/" + name, size: 1, etag: etag,
                    lastModified: Timestamp(seconds: 1_700_000_000, nanoseconds: 123_456_000),
                    contentType: "application/octet-stream"))
            let attributes = StoredAttributes(
                mode: 0o644, uid: 1000, gid: 1000, mtime: Timestamp(seconds: 1_700_000_000 + Int64(i), nanoseconds: 5))
            own.append(
                DirectoryEntry(
                    name: name, kind: .file, key: "backup/" + name, size: 4096, etag: etag,
                    lastModified: Timestamp(seconds: 1_700_000_000, nanoseconds: 0),
                    contentType: attributes.contentType(base: "application/octet-stream")))
        }
        #expect(plain.bytes / plain.count <= 42, "\(plain.bytes / plain.count) bytes an entry")
        #expect(own.bytes / own.count <= 50, "\(own.bytes / own.count) bytes an entry")
        #expect(own[77].contentType.contains(";cssp-mode=0644"))
    }
}

/// The remembered listing over packed entries answers as a dictionary of its entries would: by
/// name, the last entry of a name wins, changes made here override, `sorted` is in the order of
/// the names' bytes (a listing is in key order, where "b-1" comes before the directory "b/").
struct EntryTableTests {
    @Test(arguments: [1, 2, 3, 4, 5, 6] as [UInt64])
    func answersAsADictionaryOfItsEntries(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        let prefix = "p/"
        let pool = ["b", "b-1", "b.txt", "a", "c", "café", "cafe\u{301}", "Z", "b0", "zz"]
        func pick(_ values: [String]) -> String { values[Int.random(in: 0..<values.count, using: &random)] }
        func entry(_ name: String, size: Int64) -> DirectoryEntry {
            let directory = Bool.random(using: &random)
            return DirectoryEntry(
                name: name, kind: directory ? .directory : .file, key: prefix + name + (directory ? "/" : ""), size: size,
                etag: "", lastModified: .zero, contentType: "")
        }
        // In key order (directories as "name/"), sometimes in name order, with duplicates.
        var listed = (0..<Int.random(in: 0...12, using: &random)).map { i in entry(pick(pool), size: Int64(i)) }
        if Bool.random(using: &random) {
            listed.sort { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
        } else {
            listed.sort { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
        }
        var table = EntryTable(PackedEntries(prefix: prefix, listed))
        var expected: [ExactString: DirectoryEntry] = [:]
        for entry in listed { expected[entry.name.exact] = entry }
        let listedNames = Set(expected.keys)
        var changed: Set<ExactString> = []
        for _ in 0..<Int.random(in: 0...5, using: &random) {
            let name = pick(pool).exact
            let change: DirectoryEntry? = Bool.random(using: &random) ? entry(name.string, size: 99) : nil
            table[name] = change
            expected[name] = change
            changed.insert(name)
        }
        for name in pool.map(\.exact) {
            #expect(table[name] == expected[name], "\(name) in \(listed.map(\.key))")
            #expect(table.listed(name) == listedNames.contains(name))
        }
        let sortedExpected = expected.values.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
        #expect(Array(table.sorted) == sortedExpected, "listed \(listed.map(\.key))")
        let added = changed.filter { !listedNames.contains($0) }.compactMap { expected[$0] }
            .sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
        #expect(table.addedHere == added)
    }
}

/// The byte-wise parse of ASCII content types gives what the character-wise one gives.
struct ContentTypeParseTests {
    @Test(arguments: [1, 2, 3] as [UInt64])
    func bytesAndCharactersAgree(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        let pieces = [";", " ", "=", "cssp-", "mode", "mtime", "uid", "gid", "0644", "1.5", "12", "text/plain",
                      "charset=utf-8", "x", "application/octet-stream", "4294967296", "-", ";cssp-mode=0755", ";;"]
        for _ in 0..<3_000 {
            let text = (0..<Int.random(in: 0...9, using: &random)).map { _ in
                pieces[Int.random(in: 0..<pieces.count, using: &random)]
            }.joined()
            let bytes = StoredAttributes.parseASCII(text)
            let characters = StoredAttributes.parseCharacters(text)
            #expect(bytes?.base == characters.base && bytes?.attributes == characters.attributes, "\(text)")
            if bytes?.base != characters.base || bytes?.attributes != characters.attributes { return }
        }
        #expect(StoredAttributes.parseASCII("text/plain;charset=é") == nil)
    }
}
