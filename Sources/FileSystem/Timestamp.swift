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

    public static func now() -> Timestamp {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Timestamp(seconds: Int64(ts.tv_sec), nanoseconds: Int32(ts.tv_nsec))
    }

    /// Parses `1700000000`, `1700000000.5` or `1700000000.123456789` (the X-Object-Meta-Mtime
    /// format of rclone and svfs) exactly, without going through a Double.
    public init?(parsing text: some StringProtocol) {
        let parts = text.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        guard let first = parts.first, !first.isEmpty, let s = Int64(first) else { return nil }
        var nanos: Int32 = 0
        if parts.count == 2 {
            let digits = parts[1].prefix(9)
            guard !digits.isEmpty, digits.allSatisfy(\.isASCII), let value = Int32(digits) else { return nil }
            nanos = value
            for _ in digits.count..<9 { nanos *= 10 }
        }
        self.init(seconds: s, nanoseconds: nanos)
    }

    /// `seconds.nnnnnnnnn`.
    public var description: String {
        let fraction = String(nanoseconds)
        return "\(seconds)." + String(repeating: "0", count: 9 - fraction.count) + fraction
    }

    /// Whether two reports of one object's time agree: equal, or one is the whole-second form of
    /// the other (a HEAD's Last-Modified is the listing's time rounded up to the second).
    func agrees(with other: Timestamp) -> Bool {
        func roundedUp(_ t: Timestamp) -> Int64 { t.seconds + (t.nanoseconds > 0 ? 1 : 0) }
        if self == other { return true }
        if nanoseconds == 0 { return seconds == roundedUp(other) }
        return other.nanoseconds == 0 && other.seconds == roundedUp(self)
    }

    public static func < (a: Timestamp, b: Timestamp) -> Bool {
        (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds)
    }
}
