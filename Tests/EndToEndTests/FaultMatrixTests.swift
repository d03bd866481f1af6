import Foundation
import ObjectStoreTesting
import ObjectStore
import ObjectStoreHTTP
import Testing

/// What a real network does, through the real binary (hostile-network issue): each case writes a
/// rule to the test server's fault file (see `server/cssp_auth.py`, parse_faults), runs a read
/// or a write through the mount, and checks the outcome. Prints the matrix it ran.
@Suite(.serialized)
struct FaultMatrixTests {
    enum Outcome: String {
        /// The operation succeeds with the right bytes.
        case survived
        /// The operation fails with EIO; nothing wrong is read or stored.
        case reportedEIO = "EIO"
    }

    struct Case {
        var fault: String
        var write: Bool
        var expected: Outcome
    }

    static let cases: [Case] = [
        Case(fault: "status=503,times=2", write: false, expected: .survived),
        Case(fault: "status=429,retry-after=1,times=1", write: false, expected: .survived),
        Case(fault: "reset-after=100000,times=1", write: false, expected: .survived),
        Case(fault: "stall=4,times=1", write: false, expected: .survived),
        Case(fault: "stall=4,stall-after=65536,times=1", write: false, expected: .survived),
        Case(fault: "drip=0.5,times=1", write: false, expected: .survived),
        Case(fault: "status=503", write: false, expected: .reportedEIO),
        Case(fault: "status=503,times=2", write: true, expected: .survived),
        Case(fault: "status=429,retry-after=1,times=1", write: true, expected: .survived),
        Case(fault: "stall=4,times=1", write: true, expected: .survived),
        Case(fault: "status=503", write: true, expected: .reportedEIO),
    ]

    @Test func everyFaultIsSurvivedOrReported() throws {
        let environment = try Environment.load()
        let faultFile = try environment.faultFile()
        let (container, store, cache) = try environment.newContainer("faults")
        defer { try? FileManager.default.removeItem(atPath: cache) }
        let local = TestScratch.directory + "cssp-e2e-faults-" + container
        try FileManager.default.createDirectory(atPath: local, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: local) }
        // 3 MiB per object: several ranged GETs, and more than one part's worth of resume.
        var contents: [[UInt8]] = []
        for index in Self.cases.indices {
            var generator = SystemRandomNumberGenerator()
            let bytes = (0..<(3 << 20)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            contents.append(bytes)
            if !Self.cases[index].write {
                try store.put(key: "r\(index).bin", body: .bytes(bytes), contentType: nil, metadata: [:])
            }
            try Data(bytes).write(to: URL(fileURLWithPath: local + "/w\(index).bin"))
        }
        let mount = try Mount(
            environment, container: container,
            options: ["cache_dir=" + cache, "retries=3", "stall_timeout=2", "request_timeout=5"])
        defer { try? FileManager.default.removeItem(atPath: faultFile) }
        var matrix: [String] = []
        for (index, fault) in Self.cases.enumerated() {
            let method = fault.write ? "PUT" : "GET"
            let key = (fault.write ? "w" : "r") + "\(index).bin"
            try "\(method) \(fault.fault) /\(container)/\(key)\n".writeReplacing(file: faultFile)
            let started = Date()
            let run =
                fault.write
                ? try shell("cp \(quoted(local + "/" + key)) \(quoted(mount.path(key)))")
                : try shell("cat \(quoted(mount.path(key))) > \(quoted(local + "/read-" + key))")
            let seconds = Date().timeIntervalSince(started)
            try FileManager.default.removeItem(atPath: faultFile)
            let outcome: String
            if run.status == 0 {
                let bytes =
                    fault.write
                    ? try store.getBytes(key: key, range: nil)
                    : [UInt8](try Data(contentsOf: URL(fileURLWithPath: local + "/read-" + key)))
                outcome = bytes == contents[index] ? Outcome.survived.rawValue : "WRONG BYTES"
            } else {
                outcome = run.stderr.contains("Input/output error") ? Outcome.reportedEIO.rawValue : "failed: \(run.stderr)"
            }
            #expect(outcome == fault.expected.rawValue, "\(method) \(fault.fault): \(outcome)")
            matrix.append(
                "\(method.padding(toLength: 4, withPad: " ", startingAt: 0)) \(fault.fault.padding(toLength: 40, withPad: " ", startingAt: 0)) \(outcome) in \(String(format: "%.1f", seconds)) s")
        }
        #expect(try mount.unmount() == 0)
        print("fault matrix (fault, outcome, time):\n  " + matrix.joined(separator: "\n  "))
    }
}
