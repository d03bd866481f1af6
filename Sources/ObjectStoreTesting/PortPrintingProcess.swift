import Foundation

/// Starts a helper server for tests (a Python script) that prints the port it listens on as its
/// first line, and returns it with that port. The caller ends it (SIGKILL) when done.
public func launchPrintingPort(_ executable: String, _ arguments: [String]) throws -> (process: Process, port: Int) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let output = Pipe()
    process.standardOutput = output
    try process.run()
    var line: [UInt8] = []
    while true {
        let byte = output.fileHandleForReading.readData(ofLength: 1)
        guard let first = byte.first, first != 10 else { break }
        line.append(first)
    }
    guard let port = Int(String(decoding: line, as: UTF8.self)) else {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        throw CocoaError(.executableLoad, userInfo: [NSLocalizedDescriptionKey: "\(executable) \(arguments.first ?? "") printed no port"])
    }
    return (process, port)
}
