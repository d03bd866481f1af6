import CCurl
import Synchronization

/// A libcurl easy handle. Used by one thread at a time: `CurlHandlePool` hands each out exclusively.
final class CurlHandle: @unchecked Sendable {
    let raw: UnsafeMutableRawPointer

    init() {
        guard let handle = curl_easy_init() else { fatalError("curl_easy_init failed: out of memory") }
        raw = handle
    }

    deinit { curl_easy_cleanup(raw) }
}

/// Reuses easy handles, and with them their open connections, across requests and threads.
final class CurlHandlePool: Sendable {
    /// Protects the idle handles.
    private let idle = Mutex<[CurlHandle]>([])
    private let maxIdle: Int

    init(maxIdle: Int) { self.maxIdle = maxIdle }

    func withHandle<T, E: Error>(_ body: (CurlHandle) throws(E) -> T) throws(E) -> T {
        let handle = idle.withLock { $0.popLast() } ?? CurlHandle()
        defer {
            idle.withLock { handles in
                if handles.count < maxIdle { handles.append(handle) }
            }
        }
        return try body(handle)
    }
}

/// Process-wide libcurl setup; must run before any thread uses curl.
public enum Curl {
    public static func globalInit() {
        let rc = curl_global_init(Int(CURL_GLOBAL_DEFAULT))
        precondition(rc == CURLE_OK, "curl_global_init failed")
    }
}
