import Locking

/// A lock whose only job is to serialise a sequence of operations (held across network I/O on
/// purpose; it guards no data, so it cannot be the kind of lock STYLE forbids holding there).
package final class SerialLock: Sendable {
    /// Guards an Int, not Void: a zero-sized value has the address of the field after it (the
    /// mutex pointer), so ThreadSanitizer saw the next locker's read of that pointer race with
    /// the holder's access to the value.
    private let mutex = Locked<Int>(0)

    package func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        try mutex.withLock { (_: inout Int) throws(E) -> T in try body() }
    }

    package init() {}
}
