import Foundation
import MountCSSPConfig
import Testing

/// `WholeFile`: what replaced Foundation's `String(contentsOfFile:)` in the product (issue 39).
struct WholeFileTests {
    @Test func readsAFileLargerThanItsBufferWhole() throws {
        let path = NSTemporaryDirectory() + "cssp-wholefile-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: path) }
        let bytes = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        #expect(WholeFile.read(path) == bytes)
        #expect(WholeFile.read(path, limit: 70_000) == Array(bytes.prefix(70_000)))
        try Data("TARGET=/mnt/a\\040b OPTS=helper=cssp\n".utf8).write(to: URL(fileURLWithPath: path))
        #expect(WholeFile.text(path) == "TARGET=/mnt/a\\040b OPTS=helper=cssp\n")
    }

    @Test func aFileThatCannotBeOpenedIsNil() {
        #expect(WholeFile.read("/nonexistent/cssp-wholefile") == nil)
        #expect(WholeFile.text("/") == nil)
    }
}
