import Locking
import Synchronization

/// Counters, gauges and histograms of one mount, rendered in the Prometheus text exposition
/// format (version 0.0.4) by `MetricsRegistry.render()`.
///
/// Subtleties:
/// 1. Hot paths (a FUSE read, a cache hit) touch one atomic: a labelled family hands out its
///    `Counter` once per label set, and callers on hot paths keep it.
/// 2. Gauges are closures read at render time, so the owner of a value (the block cache, the
///    spool) stays its only keeper.
/// 3. Nothing here knows a path, a key or a credential: labels are methods, statuses, operation
///    and errno names, reasons.

/// A monotonically increasing count.
public final class Counter: Sendable {
    private let count = Atomic<Int64>(0)

    public init() {}

    public func add(_ amount: Int64 = 1) {
        count.add(amount, ordering: .relaxed)
    }

    public var value: Int64 { count.load(ordering: .relaxed) }
}

/// Counters of one name with label values (`cssp_requests_total{method="GET",status="200"}`).
public final class CounterFamily: Sendable {
    public let labelNames: [String]
    private let counters = Locked<[[String]: Counter]>([:])

    init(labelNames: [String]) { self.labelNames = labelNames }

    /// The counter of these label values (created at its first use).
    public func labels(_ values: String...) -> Counter {
        precondition(values.count == labelNames.count, "label values do not match \(labelNames)")
        return counters.withLock { c in
            if let counter = c[values] { return counter }
            let counter = Counter()
            c[values] = counter
            return counter
        }
    }

    /// The value for these label values, 0 if never counted.
    public func value(_ values: String...) -> Int64 {
        counters.withLock { $0[values]?.value ?? 0 }
    }

    var snapshot: [([String], Int64)] {
        counters.withLock { c in c.map { ($0.key, $0.value.value) } }.sorted { $0.0.lexicographicallyPrecedes($1.0) }
    }
}

/// Observations counted into cumulative buckets, with their sum, per label values.
public final class HistogramFamily: Sendable {
    public let labelNames: [String]
    public let bounds: [Double]

    struct Series {
        var buckets: [Int64]
        var sum: Double = 0
        var count: Int64 = 0
    }

    private let series = Locked<[[String]: Series]>([:])

    init(labelNames: [String], bounds: [Double]) {
        self.labelNames = labelNames
        self.bounds = bounds
    }

    public func observe(_ value: Double, _ labels: String...) {
        let index = bounds.firstIndex { value <= $0 } ?? bounds.count
        series.withLock { s in
            var entry = s[labels] ?? Series(buckets: Array(repeating: 0, count: bounds.count + 1))
            entry.buckets[index] += 1
            entry.sum += value
            entry.count += 1
            s[labels] = entry
        }
    }

    /// Observations of these label values.
    public func count(_ labels: String...) -> Int64 {
        series.withLock { $0[labels]?.count ?? 0 }
    }

    var snapshot: [([String], Series)] {
        series.withLock { s in s.map { ($0.key, $0.value) } }.sorted { $0.0.lexicographicallyPrecedes($1.0) }
    }
}

/// Every metric of a mount, in the order they are registered.
public final class MetricsRegistry: Sendable {
    enum Kind: Sendable {
        case counter(Counter)
        case counters(CounterFamily)
        case gauge(@Sendable () -> Double)
        case histograms(HistogramFamily)
    }

    struct Entry: Sendable {
        var name: String
        var help: String
        var kind: Kind
    }

    private let entries = Locked<[Entry]>([])

    public init() {}

    private func register(_ name: String, _ help: String, _ kind: Kind) {
        entries.withLock { e in
            precondition(!e.contains { $0.name == name }, "metric \(name) registered twice")
            e.append(Entry(name: name, help: help, kind: kind))
        }
    }

    public func counter(_ name: String, help: String) -> Counter {
        let counter = Counter()
        register(name, help, .counter(counter))
        return counter
    }

    public func counters(_ name: String, help: String, labels: [String]) -> CounterFamily {
        let family = CounterFamily(labelNames: labels)
        register(name, help, .counters(family))
        return family
    }

    public func histograms(_ name: String, help: String, labels: [String], bounds: [Double]) -> HistogramFamily {
        let family = HistogramFamily(labelNames: labels, bounds: bounds)
        register(name, help, .histograms(family))
        return family
    }

    /// A value read when the metrics are rendered. Registering a name again replaces its reader
    /// (a component built again, as the block cache after a failed open, takes over its gauge).
    public func gauge(_ name: String, help: String, _ read: @escaping @Sendable () -> Double) {
        entries.withLock { e in
            e.removeAll { $0.name == name }
            e.append(Entry(name: name, help: help, kind: .gauge(read)))
        }
    }

    /// All metrics in the Prometheus text exposition format.
    public func render() -> String {
        var out = ""
        for entry in entries.withLock({ $0 }) {
            let type: String
            switch entry.kind {
            case .counter, .counters: type = "counter"
            case .gauge: type = "gauge"
            case .histograms: type = "histogram"
            }
            out += "# HELP \(entry.name) \(Self.escapeHelp(entry.help))\n# TYPE \(entry.name) \(type)\n"
            switch entry.kind {
            case .counter(let counter):
                out += "\(entry.name) \(counter.value)\n"
            case .counters(let family):
                for (values, value) in family.snapshot {
                    out += "\(entry.name)\(Self.labels(family.labelNames, values)) \(value)\n"
                }
            case .gauge(let read):
                out += "\(entry.name) \(Self.number(read()))\n"
            case .histograms(let family):
                for (values, series) in family.snapshot {
                    var cumulative: Int64 = 0
                    for (index, bound) in family.bounds.enumerated() {
                        cumulative += series.buckets[index]
                        let labels = Self.labels(family.labelNames + ["le"], values + [Self.number(bound)])
                        out += "\(entry.name)_bucket\(labels) \(cumulative)\n"
                    }
                    let all = Self.labels(family.labelNames + ["le"], values + ["+Inf"])
                    out += "\(entry.name)_bucket\(all) \(series.count)\n"
                    let plain = Self.labels(family.labelNames, values)
                    out += "\(entry.name)_sum\(plain) \(Self.number(series.sum))\n"
                    out += "\(entry.name)_count\(plain) \(series.count)\n"
                }
            }
        }
        return out
    }

    static func labels(_ names: [String], _ values: [String]) -> String {
        guard !names.isEmpty else { return "" }
        return "{" + zip(names, values).map { "\($0)=\"\(escapeValue($1))\"" }.joined(separator: ",") + "}"
    }

    /// Integers without a fraction, others as Swift prints them (both parse as Go floats).
    static func number(_ value: Double) -> String {
        if value.isNaN { return "NaN" }
        if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return "\(value)"
    }

    static func escapeValue(_ text: String) -> String {
        text.replacingAll("\\", "\\\\").replacingAll("\"", "\\\"").replacingAll("\n", "\\n")
    }

    static func escapeHelp(_ text: String) -> String {
        text.replacingAll("\\", "\\\\").replacingAll("\n", "\\n")
    }
}

extension String {
    fileprivate func replacingAll(_ target: Character, _ replacement: String) -> String {
        guard contains(target) else { return self }
        var out = ""
        for character in self {
            if character == target { out += replacement } else { out.append(character) }
        }
        return out
    }
}
