/// Open handles numbered as FUSE hands them to the kernel (a room's file or directory handles).
/// Numbers are never reused, so a late call with a closed handle finds nothing instead of
/// another file.
package struct Handles<Value> {
    package private(set) var open: [UInt64: Value] = [:]
    private var next: UInt64 = 1

    package init() {}

    package mutating func open(_ value: Value) -> UInt64 {
        defer { next += 1 }
        open[next] = value
        return next
    }

    /// Numbers below this one (0: none) may be a dead worker's that the kernel still holds.
    package private(set) var firstOwn: UInt64 = 0

    /// Numbers from `first` on (a worker that replaces a dead one, whose numbers the kernel
    /// may still hold); never lower than now.
    package mutating func numberFrom(_ first: UInt64) {
        next = max(next, first)
        firstOwn = max(firstOwn, first)
    }

    /// Takes over handle `number`, which a dead worker gave and the kernel holds.
    package mutating func adopt(_ number: UInt64, _ value: Value) { open[number] = value }

    /// The handle `number`, taking it over with `value` if this worker does not know it and it
    /// is below its own numbers: a dead worker's, which the kernel holds (it sends no handle it
    /// released).
    package mutating func inherit(_ number: UInt64, _ value: @autoclosure () -> Value) -> Value? {
        if let known = open[number] { return known }
        guard number < firstOwn else { return nil }
        let value = value()
        open[number] = value
        return value
    }

    package subscript(_ number: UInt64) -> Value? { open[number] }

    /// Replaces an open handle's value; nothing once it is closed.
    package mutating func replace(_ number: UInt64, with value: Value) {
        if open[number] != nil { open[number] = value }
    }

    package mutating func close(_ number: UInt64) -> Value? { open.removeValue(forKey: number) }
}
