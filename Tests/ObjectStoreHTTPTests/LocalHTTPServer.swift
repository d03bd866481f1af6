import Foundation
import Logging
import ObjectStore
import ObjectStoreTesting
import Testing

@testable import ObjectStoreHTTP

/// A small HTTP server (a Python script given to `/usr/bin/python3 -c`) on a free port of
/// 127.0.0.1, for answers the real server never gives. The script prints its port first.
final class LocalHTTPServer {
    let process: Process
    let port: Int

    init(script: String, arguments: [String] = []) throws {
        (process, port) = try launchPrintingPort("/usr/bin/python3", ["-c", script] + arguments)
    }

    deinit {
        // SIGKILL: a child may inherit a mask that blocks SIGTERM from the test runner's thread.
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// A store of container "c" on this server, retrying quickly.
    func store(configure: (inout HTTPStoreConfiguration) -> Void = { _ in }) -> HTTPObjectStore {
        Curl.globalInit()
        var configuration = HTTPStoreConfiguration(
            baseURL: "http://127.0.0.1:\(port)", container: "c", signer: RequestSigner(accessKey: "k", secret: "s"))
        configuration.backoffBase = 0.01
        configure(&configuration)
        return HTTPObjectStore(configuration: configuration, logger: Logger(label: "test"))
    }
}
