import Dispatch
import Logging
import MountCSSPConfig
import ObjectStore
import ObjectStoreHTTP
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// `cssp-tool URL COMMAND …` with credentials found as mount.cssp finds them.
enum Tool {
    static let usage = """
        usage: cssp-tool URL COMMAND [ARGS]
          head                                  HEAD the container
          ls [PREFIX] [DELIMITER]               list keys
          put KEY FILE [CONTENT_TYPE]           PUT a file (ETag-verified)
          put-bytes KEY TEXT [CONTENT_TYPE]     PUT a literal string
          get KEY FILE                          GET an object into FILE
          stat KEY                              HEAD an object
          rm KEY                                DELETE an object
          rm-prefix PREFIX                      DELETE every key starting with PREFIX
          put-dlo KEY FILE PART_MIB             upload FILE SDK-style: parts KEY/<id>/<n>, manifest KEY
          put-many PREFIX COUNT [SIZE] [JOBS]   PUT COUNT objects PREFIX<n> of SIZE bytes, JOBS in parallel
          head-many PREFIX [COUNT] [JOBS]       HEAD the first COUNT keys below PREFIX (listed first),
                                                JOBS in parallel (default 16); prints HEADs per second
        """

    static func run(_ arguments: [String]) -> Int32 {
        guard arguments.count >= 2 else {
            print(usage)
            return 1
        }
        do {
            let endpoint = try Endpoint(parsing: arguments[0])
            var env: [String: String] = [:]
            for name in ["CSSP_PASSWD_FILE", "HOME", "CSSP_ACCESS_KEY_ID", "CSSP_SECRET_ACCESS_KEY"] {
                if let value = getenv(name) { env[name] = String(cString: value) }
            }
            let credentials = try CredentialLoader.load(endpoint: endpoint, passwdFileOption: nil, environment: env)
            Curl.globalInit()
            var configuration = HTTPStoreConfiguration(
                baseURL: endpoint.baseURL, container: endpoint.container,
                signer: RequestSigner(accessKey: credentials.accessKey, secret: credentials.secret))
            configuration.credentialSource = credentials.source
            configuration.userAgent = "cssp-tool"
            let store = HTTPObjectStore(configuration: configuration, logger: Logger(label: "cssp-tool"))
            try perform(store, prefix: endpoint.prefix, command: arguments[1], args: Array(arguments.dropFirst(2)))
            return 0
        } catch let error as ConfigurationError {
            print("cssp-tool: \(error.message)")
        } catch let error as ObjectStoreError {
            print("cssp-tool: \(error)")
        } catch {
            print("cssp-tool: \(error)")
        }
        return 1
    }

    static func perform(_ store: HTTPObjectStore, prefix: String, command: String, args: [String]) throws {
        func arg(_ i: Int) throws -> String {
            guard i < args.count else { throw ConfigurationError("missing argument for \(command)\n\(usage)") }
            return args[i]
        }
        switch command {
        case "head":
            let info = try store.headContainer()
            print("objects \(info.objectCount) bytes \(info.bytesUsed)")
        case "ls":
            let delimiter = args.count > 1 ? args[1] : nil
            for entry in try store.listAll(prefix: prefix + (args.first ?? ""), delimiter: delimiter) {
                switch entry {
                case .object(let o): print("\(o.size)\t\(o.etag)\t\(o.key)")
                case .commonPrefix(let p): print("-\t-\t\(p)")
                }
            }
        case "put":
            let path = try arg(1)
            let length = try fileSize(path)
            let etag = try store.put(
                key: prefix + arg(0), body: .file(path: path, offset: 0, length: length),
                contentType: args.count > 2 ? args[2] : nil, metadata: [:])
            print(etag)
        case "put-bytes":
            let etag = try store.put(
                key: prefix + arg(0), body: .bytes(Array(try arg(1).utf8)), contentType: args.count > 2 ? args[2] : nil,
                metadata: [:])
            print(etag)
        case "get":
            let path = try arg(1)
            let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            guard fd >= 0 else { throw ConfigurationError("cannot write \(path)") }
            defer { close(fd) }
            _ = try store.get(key: prefix + arg(0), range: nil) { bytes in
                _ = write(fd, bytes.baseAddress, bytes.count)
            }
        case "stat":
            let info = try store.head(key: prefix + arg(0))
            print("size \(info.size) etag \(info.etag) type \(info.contentType) manifest \(info.manifest ?? "-")")
            for (name, value) in info.metadata.sorted(by: { $0.key < $1.key }) { print("meta \(name): \(value)") }
        case "rm":
            try store.delete(key: prefix + arg(0))
        case "rm-prefix":
            let keys = try store.listAll(prefix: prefix + arg(0), delimiter: nil).map(\.name)
            try parallel(keys.count, jobs: 16) { i in try store.delete(key: keys[i]) }
            print("deleted \(keys.count)")
        case "put-dlo":
            let path = try arg(1)
            guard let partMiB = Int(try arg(2)), partMiB > 0 else { throw ConfigurationError("PART_MIB must be > 0") }
            let length = try fileSize(path)
            let uploadID = String(UInt64.random(in: 0...UInt64.max), radix: 16)
            let key = prefix + (try arg(0))
            let partSize = Int64(partMiB) << 20
            let parts = Int((length + partSize - 1) / partSize)
            try parallel(parts, jobs: 4) { i in
                let offset = Int64(i) * partSize
                let name = key + "/" + uploadID + "/" + zeroPadded(i + 1)
                try store.put(
                    key: name, body: .file(path: path, offset: offset, length: min(partSize, length - offset)),
                    contentType: nil, metadata: [:])
            }
            try store.putManifest(key: key, partPrefix: key + "/" + uploadID + "/", contentType: nil, metadata: [:])
            print("\(parts) parts under \(key)/\(uploadID)/")
        case "put-many":
            let base = prefix + (try arg(0))
            guard let count = Int(try arg(1)) else { throw ConfigurationError("COUNT must be a number") }
            let size = args.count > 2 ? Int(args[2]) ?? 0 : 0
            let jobs = args.count > 3 ? Int(args[3]) ?? 16 : 16
            let body = [UInt8](repeating: UInt8(ascii: "x"), count: size)
            try parallel(count, jobs: jobs) { i in
                try store.put(key: base + zeroPadded(i), body: .bytes(body), contentType: nil, metadata: [:])
            }
            print("put \(count) objects")
        case "head-many":
            let listed = try store.listAll(prefix: prefix + arg(0), delimiter: nil).map(\.name)
            let keys = args.count > 1 ? Array(listed.prefix(Int(args[1]) ?? listed.count)) : listed
            let jobs = args.count > 2 ? Int(args[2]) ?? 16 : 16
            let start = ContinuousClock.now
            try parallel(keys.count, jobs: jobs) { i in _ = try store.head(key: keys[i]) }
            let elapsed = ContinuousClock.now - start
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            print("headed \(keys.count) in \(seconds) s: \(Double(keys.count) / seconds) per second")
        default:
            throw ConfigurationError("unknown command '\(command)'\n\(usage)")
        }
    }

    static func fileSize(_ path: String) throws -> Int64 {
        var st = stat()
        guard stat(path, &st) == 0 else { throw ConfigurationError("cannot stat \(path)") }
        return Int64(st.st_size)
    }

    /// Runs `body(0..<count)` on `jobs` threads; rethrows the first error.
    static func parallel(_ count: Int, jobs: Int, _ body: @escaping @Sendable (Int) throws -> Void) throws {
        let next = Atomic<Int>(0)
        let firstError = Mutex<(any Error)?>(nil)
        DispatchQueue.concurrentPerform(iterations: max(1, min(jobs, count))) { _ in
            while true {
                let i = next.add(1, ordering: .relaxed).oldValue
                if i >= count || firstError.withLock({ $0 != nil }) { return }
                do { try body(i) } catch { firstError.withLock { if $0 == nil { $0 = error } } }
            }
        }
        if let error = firstError.withLock({ $0 }) { throw error }
    }
}

/// Zero-padded to 8 digits, so lexicographic order is numeric order.
func zeroPadded(_ value: Int) -> String {
    let digits = "\(value)"
    return String(repeating: "0", count: Swift.max(0, 8 - digits.utf8.count)) + digits
}
