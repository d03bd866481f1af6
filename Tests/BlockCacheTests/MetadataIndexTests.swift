import Foundation
import Logging
import ObjectStore
import ObjectStoreTesting
import Testing

@testable import BlockCache

/// The metadata index on its own (issue 38): answers kept across opens, per store, forgotten by
/// key and by prefix, keys compared byte for byte, a damaged file made again.
struct MetadataIndexTests {
    let directory = TestScratch.directory + "cssp-meta-index-" + UUID().uuidString

    init() throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    func record(_ key: String) -> MetadataIndex.Record {
        let info = ObjectInfo(
            key: key, size: 64, etag: "etag-" + key, contentType: "application/octet-stream", lastModified: 1_700_000_001,
            metadata: ["mtime": "1500000000.25", "mode": "100600", "note": "a=b;c"],
            manifest: key.hasSuffix("dlo") ? "c/parts/" : nil)
        return MetadataIndex.Record(info, listed: 1_700_000_000_123_456_000)
    }

    func open(_ identity: String = "store", logger: Logger = Logger(label: "test")) throws -> MetadataIndex {
        try #require(MetadataIndex.open(path: directory + "/meta.db", identity: identity, logger: logger))
    }

    @Test func answersAreKeptAcrossOpensPerStore() throws {
        let first = try open()
        first.record(record("a/f"))
        first.record(record("a/dlo"))
        // Seen before the flush, and after it.
        #expect(first.lookup(["a/f", "a/g"]) == [record("a/f"), nil])
        first.flush()
        #expect(first.lookup(["a/dlo"]) == [record("a/dlo")])
        let again = try open()
        #expect(again.lookup(["a/f", "a/dlo", "a/g"]) == [record("a/f"), record("a/dlo"), nil])
        #expect(try open("another store").lookup(["a/f"]) == [nil])
    }

    @Test func forgottenKeysAndPrefixesAreGoneBeforeAndAfterTheFlush() throws {
        let index = try open()
        for key in ["a/1", "a/2", "ab/3", "b/4"] { index.record(record(key)) }
        index.flush()
        index.forget(keys: ["b/4"], prefixes: ["a/"])
        #expect(index.lookup(["a/1", "a/2", "ab/3", "b/4"]) == [nil, nil, record("ab/3"), nil])
        index.flush()
        #expect(try open().lookup(["a/1", "a/2", "ab/3", "b/4"]) == [nil, nil, record("ab/3"), nil])
    }

    @Test func keysAreComparedByTheirBytes() throws {
        let index = try open()
        index.record(record("caf\u{E9}"))
        index.flush()
        #expect(index.lookup(["caf\u{E9}", "cafe\u{301}"]) == [record("caf\u{E9}"), nil])
    }

    @Test func aDamagedFileIsMadeAgain() throws {
        try Data("not a database, not at all".utf8).write(to: URL(fileURLWithPath: directory + "/meta.db"))
        let index = try open()
        index.record(record("k"))
        index.flush()
        #expect(try open().lookup(["k"]) == [record("k")])
        let mode = try FileManager.default.attributesOfItem(atPath: directory + "/meta.db")[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }
}
