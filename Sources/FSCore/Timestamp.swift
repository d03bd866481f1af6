#if canImport(Glibc)
import Glibc
#endif

/// A time with nanosecond precision, as `stat` and `utimensat` carry it. A Double cannot hold
/// today's times to the nanosecond, and rsync compares them exactly.
public struct Timestamp: Sendable, Equatable, Comparable, CustomStringConvertible {
    public var seconds: Int64
    public var nanoseconds: Int32

    public init(seconds: Int64, nanoseconds: Int32) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }

    /// Seconds since the epoch; a value no Int64 holds (not finite, beyond ±2^62) is the epoch.
    public init(_ value: Double) {
        guard value.isFinite, abs(value) < 4.6e18 else {
            self = .zero
            return
        }
        let whole = value.rounded(.down)
        seconds = Int64(whole)
        nanoseconds = Int32(min(999_999_999, max(0, ((value - whole) * 1e9).rounded())))
    }

    public static let zero = Timestamp(seconds: 0, nanoseconds: 0)

    /// The second in UTC, ISO 8601: `2026-11-29T06:58:41Z`, or `20261129T065841Z` `compact`.
    package func utc(compact: Bool = false) -> String {
        var whole = time_t(seconds)
        var parts = tm()
        gmtime_r(&whole, &parts)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        let (dash, colon) = compact ? ("", "") : ("-", ":")
        return "\(parts.tm_year + 1900)\(dash)\(two(parts.tm_mon + 1))\(dash)\(two(parts.tm_mday))T"
            + "\(two(parts.tm_hour))\(colon)\(two(parts.tm_min))\(colon)\(two(parts.tm_sec))Z"
    }

    public static func now() -> Timestamp {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Timestamp(seconds: Int64(ts.tv_sec), nanoseconds: Int32(ts.tv_nsec))
    }

    /// Parses `1700000000`, `1700000000.5` or `1700000000.123456789` (the X-Object-Meta-Mtime
    /// format of rclone and svfs) exactly, without going through a Double.
    public init?(parsing text: some StringProtocol) {
        // On the bytes: this runs for every HEAD answer of other tools' objects (issue 38).
        var seconds: Int64 = 0
        var negative = false
        var nanos: Int32 = 0
        var fractionDigits = 0
        var sawDigit = false
        var inFraction = false
        for (i, byte) in text.utf8.enumerated() {
            if inFraction {
                guard fractionDigits < 9 else { break }  // beyond nanoseconds: ignored
                guard byte >= 0x30 && byte <= 0x39 else { return nil }
                nanos = nanos * 10 + Int32(byte - 0x30)
                fractionDigits += 1
            } else if byte == UInt8(ascii: "."), sawDigit {
                inFraction = true
            } else if i == 0 && (byte == UInt8(ascii: "-") || byte == UInt8(ascii: "+")) {
                negative = byte == UInt8(ascii: "-")
            } else if byte >= 0x30 && byte <= 0x39 {
                let (times, overflow) = seconds.multipliedReportingOverflow(by: 10)
                let (sum, overflow2) = times.addingReportingOverflow(Int64(byte - 0x30))
                guard !overflow && !overflow2 else { return nil }
                seconds = sum
                sawDigit = true
            } else {
                return nil
            }
        }
        guard sawDigit, !inFraction || fractionDigits > 0 else { return nil }
        for _ in fractionDigits..<9 { nanos *= 10 }
        self.init(seconds: negative ? -seconds : seconds, nanoseconds: nanos)
    }

    /// `seconds.nnnnnnnnn`.
    public var description: String {
        let fraction = String(nanoseconds)
        return "\(seconds)." + String(repeating: "0", count: 9 - fraction.count) + fraction
    }

    /// The time to the second, rounded up (how a HEAD's Last-Modified reports a listed time).
    package var roundedUpToSecond: Timestamp {
        nanoseconds > 0 ? Timestamp(seconds: seconds + 1, nanoseconds: 0) : self
    }

    /// Whether two reports of one object's time agree: equal, or one is the whole-second form of
    /// the other (a HEAD's Last-Modified is the listing's time rounded up to the second).
    package func agrees(with other: Timestamp) -> Bool {
        func roundedUp(_ t: Timestamp) -> Int64 { t.seconds + (t.nanoseconds > 0 ? 1 : 0) }
        if self == other { return true }
        if nanoseconds == 0 { return seconds == roundedUp(other) }
        return other.nanoseconds == 0 && other.seconds == roundedUp(self)
    }

    public static func < (a: Timestamp, b: Timestamp) -> Bool {
        (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds)
    }
}
