import CCurl
import Logging
import Metrics
import ObjectStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// State of one transfer, reached from libcurl's callbacks through the user-data pointer.
final class TransferContext {
    enum Upload {
        case bytes([UInt8], position: Int)
        case file(fd: Int32, offset: Int64, remaining: Int64)
    }

    var status = 0
    var headers: [String: String] = [:]
    var body: [UInt8] = []
    var sink: ((UnsafeRawBufferPointer) -> Void)?
    /// Where the bytes of a ranged GET must start: a 2xx answer other than a 206 for that range
    /// (a server or proxy that ignored the Range header) is refused, never served as the range.
    var rangeStart: Int64?
    /// Why the answer's body was refused (the transfer is aborted).
    var refused: String?
    /// The most bytes of a body kept in memory: a successful answer larger than this is refused;
    /// an error answer is cut (only its beginning says anything).
    static let bodyLimit = 32 << 20
    static let errorBodyLimit = 64 << 10
    var delivered: Int64 = 0
    var upload: Upload?
    var uploadError = false
    /// Body bytes sent by this attempt, and the upload's progress they also count in.
    var sent: Int64 = 0
    var progress: TransferProgress?
    /// Fed with every byte sent, when the request hashes its body.
    var md5: MD5?

    var uploadLength: Int64 {
        switch upload {
        case .bytes(let b, _): return Int64(b.count)
        case .file(_, _, let remaining): return remaining
        case nil: return 0
        }
    }

    /// Why a successful answer to a GET of the range starting at `start` is not that range.
    func rangeProblem(_ start: Int64) -> String? {
        guard status == 206 else { return "a \(status) answer to a ranged GET (the Range header was ignored)" }
        // Content-Range: bytes START-END/TOTAL
        guard let range = headers["content-range"], range.hasPrefix("bytes "),
            let dash = range.firstIndex(of: "-"),
            let first = Int64(range[range.index(range.startIndex, offsetBy: 6)..<dash]), first == start
        else { return "a ranged answer for other bytes than asked (Content-Range '\(headers["content-range"] ?? "")', asked from \(start))" }
        return nil
    }

    func closeUpload() {
        if case .file(let fd, _, _) = upload { close(fd) }
        upload = nil
    }
}

let curlHeader: cssp_curl_data_cb = { ptr, size, count, user in
    let n = size * count
    guard let ptr, let user else { return n }
    let context = Unmanaged<TransferContext>.fromOpaque(user).takeUnretainedValue()
    let raw = UnsafeRawBufferPointer(start: ptr, count: n)
    var line = String(decoding: raw, as: UTF8.self)
    while line.hasSuffix("\r\n") || line.hasSuffix("\n") { line.removeLast() }
    if line.hasPrefix("HTTP/") {
        // A new status line (after 100 Continue or a redirect) starts a new header block.
        let parts = line.split(separator: " ", maxSplits: 2)
        context.status = parts.count > 1 ? Int(parts[1]) ?? 0 : 0
        context.headers = [:]
    } else if let colon = line.firstIndex(of: ":") {
        let name = line[..<colon].lowercased()
        var value = line[line.index(after: colon)...]
        while value.first == " " { value = value.dropFirst() }
        context.headers[name] = String(value)
    }
    return n
}

let curlWrite: cssp_curl_data_cb = { ptr, size, count, user in
    let n = size * count
    guard let ptr, let user else { return n }
    let context = Unmanaged<TransferContext>.fromOpaque(user).takeUnretainedValue()
    let raw = UnsafeRawBufferPointer(start: ptr, count: n)
    let success = (200..<300).contains(context.status)
    if let sink = context.sink, success {
        if context.delivered == 0, let start = context.rangeStart, let problem = context.rangeProblem(start) {
            context.refused = problem
            return 0
        }
        sink(raw)
        context.delivered += Int64(n)
    } else if success {
        guard context.body.count + n <= TransferContext.bodyLimit else {
            context.refused = "an answer larger than \(TransferContext.bodyLimit >> 20) MiB"
            return 0
        }
        context.body.append(contentsOf: raw)
    } else {
        context.body.append(contentsOf: raw.prefix(max(0, TransferContext.errorBodyLimit - context.body.count)))
    }
    return n
}

let curlRead: cssp_curl_data_cb = { ptr, size, count, user in
    guard let ptr, let user else { return 0 }
    let context = Unmanaged<TransferContext>.fromOpaque(user).takeUnretainedValue()
    let capacity = size * count
    switch context.upload {
    case .bytes(let bytes, let position):
        let n = min(capacity, bytes.count - position)
        if n > 0 {
            bytes.withUnsafeBytes { src in
                UnsafeMutableRawPointer(ptr).copyMemory(from: src.baseAddress! + position, byteCount: n)
            }
        }
        context.upload = .bytes(bytes, position: position + n)
        if n > 0 { context.md5?.update(UnsafeRawBufferPointer(start: ptr, count: n)) }
        context.sent += Int64(n)
        return n
    case .file(let fd, let offset, let remaining):
        let want = min(capacity, Int(remaining))
        if want == 0 { return 0 }
        var n: Int
        repeat { n = pread(fd, ptr, want, off_t(offset)) } while n < 0 && errno == EINTR
        if n <= 0 {
            context.uploadError = true
            return Int(CURL_READFUNC_ABORT)
        }
        context.upload = .file(fd: fd, offset: offset + Int64(n), remaining: remaining - Int64(n))
        context.md5?.update(UnsafeRawBufferPointer(start: ptr, count: n))
        context.sent += Int64(n)
        context.progress?.add(Int64(n))
        return n
    case nil:
        return 0
    }
}

/// RFC 1123 dates as HTTP uses them (`Sat, 21 Nov 2026 22:40:21 GMT`).
enum HTTPDate {
    static func parse(_ text: String) -> Double? {
        let parts = text.split(separator: " ")
        guard parts.count >= 5, let day = Int(parts[1]), let year = Int(parts[3]) else { return nil }
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard let monthIndex = months.firstIndex(of: String(parts[2])) else { return nil }
        let clock = parts[4].split(separator: ":")
        guard clock.count == 3, let h = Int(clock[0]), let m = Int(clock[1]), let s = Int(clock[2]) else { return nil }
        // Years and fields outside these ranges are no time (and would overflow the arithmetic).
        guard (1970...9999).contains(year), (1...31).contains(day), (0...23).contains(h), (0...59).contains(m),
            (0...60).contains(s)
        else { return nil }
        let days = ListingParser.daysFromCivil(year: year, month: monthIndex + 1, day: day)
        return Double(days * 86_400 + h * 3600 + m * 60 + s)
    }
}
