import ObjectStore
import Testing

@testable import ObjectStoreHTTP

struct ListingParserTests {
    func parse(_ xml: String) throws -> [ListEntry] { try ListingParser.parse(Array(xml.utf8)) }

    @Test func objectsAndSubdirs() throws {
        let entries = try parse(
            """
            <?xml version="1.0" encoding="UTF-8"?>
            <container name="photos"><object><name>a/b.jpg</name><hash>0123ABCD</hash><bytes>1234</bytes>\
            <content_type>image/jpeg</content_type><last_modified>2026-11-21T22:40:21.123456</last_modified>\
            <future_field>ignored</future_field></object>
            <subdir name="a/c/"><name>a/c/</name></subdir></container>
            """)
        #expect(entries.count == 2)
        guard case .object(let o) = entries[0] else { Issue.record("first entry is not an object"); return }
        #expect(o.key == "a/b.jpg")
        #expect(o.size == 1234)
        #expect(o.etag == "0123abcd")
        #expect(o.contentType == "image/jpeg")
        #expect(abs(o.lastModified - 1_795_300_821.123456) < 1e-6)
        #expect(entries[1] == .commonPrefix("a/c/"))
    }

    @Test func escapes() throws {
        let entries = try parse(
            """
            <container name="c"><subdir name="x"><name>a &amp; b &lt;c&gt; &quot;d&quot; &apos;e&apos; &#233; &#x1F600;/</name></subdir></container>
            """)
        #expect(entries == [.commonPrefix("a & b <c> \"d\" 'e' é 😀/")])
    }

    @Test func emptyListing() throws {
        #expect(try parse("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<container name=\"c\" />") == [])
        #expect(try parse("<container name=\"c\"></container>") == [])
    }

    @Test func malformedListingsThrow() {
        #expect(throws: ObjectStoreError.self) { try parse("<html>oops</html>") }
        #expect(throws: ObjectStoreError.self) { try parse("<container><object><name>x</name></object></container>") }
        #expect(throws: ObjectStoreError.self) { try parse("<container><subdir><name>a &bogus; b</name></subdir></container>") }
        #expect(throws: ObjectStoreError.self) { try parse("<container><object") }
    }

    @Test func errorBodies() {
        let body = Array(
            "<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>no &amp; no</Message></Error>"
                .utf8)
        let parsed = ListingParser.parseError(body)
        #expect(parsed?.code == "SignatureDoesNotMatch")
        #expect(parsed?.message == "no & no")
        #expect(ListingParser.parseError([]) == nil)
    }

    @Test func listingTimes() {
        #expect(ListingParser.parseListingTime("1970-01-01T00:00:00") == 0)
        #expect(ListingParser.parseListingTime("2000-03-01T00:00:00.5") == 951_868_800.5)
        #expect(ListingParser.parseListingTime("garbage") == nil)
    }
}
