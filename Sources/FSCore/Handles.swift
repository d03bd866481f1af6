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

    /// Numbers from `first` on (a worker that replaces a dead one, whose numbers the kernel
    /// may still hold); never lower than now.
    package mutating func numberFrom(_ first: UInt64) { next = max(next, first) }

    package subscript(_ number: UInt64) -> Value? { open[number] }

    /// Replaces an open handle's value; nothing once it is closed.
    package mutating func replace(_ number: UInt64, with value: Value) {
        if open[number] != nil { open[number] = value }
    }

    package mutating func close(_ number: UInt64) -> Value? { open.removeValue(forKey: number) }
}
