import Testing

@testable import ObjectStoreHTTP

/// What the client reads of Swift's `/info` and of a bulk delete's answer.
struct BulkDeleteTests {
    @Test func theLimitComesFromTheBulkDeleteSectionOfInfo() {
        let info = #"{"swift": {"version": "2.30.0"}, "bulk_upload": {"max_containers_per_extraction": 10000}, "#
            + #""bulk_delete": {"max_failed_deletes": 1000, "max_deletes_per_request": 10000}, "slo": {}}"#
        #expect(HTTPObjectStore.bulkDeleteLimit(info: Array(info.utf8)) == 10000)
    }

    @Test func infoWithoutBulkDeleteOrWithNonsenseHasNoLimit() {
        for info in [
            #"{"swift": {"version": "2.30.0"}, "max_deletes_per_request": 5}"#,
            #"{"bulk_delete": {"max_failed_deletes": 1000}, "x": {"max_deletes_per_request": 5}}"#,
            #"{"bulk_delete": {"max_deletes_per_request": 0}}"#,
            "<html>not found</html>", "",
        ] {
            #expect(HTTPObjectStore.bulkDeleteLimit(info: Array(info.utf8)) == nil, "\(info)")
        }
    }

    @Test func theCountsOfABulkAnswerAreRead() {
        let answer = Array(
            #"  {"Number Not Found": 2, "Response Status": "200 OK", "Errors": [], "Number Deleted":  38}"#.utf8)
        #expect(HTTPObjectStore.jsonNumber("Number Deleted", in: answer[...]) == 38)
        #expect(HTTPObjectStore.jsonNumber("Number Not Found", in: answer[...]) == 2)
        #expect(HTTPObjectStore.jsonNumber("Number Missing", in: answer[...]) == nil)
    }
}
