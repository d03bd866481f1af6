/// At most `burst` lines of one kind per `window` seconds; the next line after a quiet spell
/// says how many were dropped. An outage makes every open file and every retry log the same
/// error: the first few say it, a count says the rest.
public struct RateLimiter {
    public var burst = 5
    public var window: Double = 60

    public init() {}

    private struct Kind {
        var start: Double
        var count: Int
        var suppressed: Int
    }

    private var kinds: [String: Kind] = [:]

    /// nil: drop the line. Otherwise the number of lines of this kind dropped before it.
    public mutating func admit(_ kind: String, now: Double) -> Int? {
        if kinds.count > 10_000 { kinds.removeAll() }
        var entry = kinds[kind] ?? Kind(start: now, count: 0, suppressed: 0)
        if now - entry.start >= window {
            entry.start = now
            entry.count = 0
        }
        entry.count += 1
        if entry.count > burst {
            entry.suppressed += 1
            kinds[kind] = entry
            return nil
        }
        let dropped = entry.suppressed
        entry.suppressed = 0
        kinds[kind] = entry
        return dropped
    }
}
