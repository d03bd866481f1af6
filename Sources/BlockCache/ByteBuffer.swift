/// Bytes in one malloc'd block: filled by one thread, then only read, by any number of threads.
/// (A growing `[UInt8]` costs measurably more per byte; this is written once, in place.)
public final class ByteBuffer: @unchecked Sendable {  // No lock: `append` happens before publication.
    private let storage: UnsafeMutableRawBufferPointer
    public private(set) var count = 0

    /// Called once the buffer is freed (a memory budget gives its bytes back).
    private let onFree: (@Sendable () -> Void)?

    public init(capacity: Int, onFree: (@Sendable () -> Void)? = nil) {
        // Page-aligned when a page or more: the block cache writes such blocks with O_DIRECT.
        storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(capacity, 1), alignment: capacity >= 4096 ? 4096 : 16)
        self.onFree = onFree
    }

    deinit {
        storage.deallocate()
        onFree?()
    }

    public var capacity: Int { storage.count }

    /// Appends what fits; the rest is dropped (callers size the buffer from the range they asked for).
    public func append(_ bytes: UnsafeRawBufferPointer) {
        let n = min(bytes.count, storage.count - count)
        guard n > 0 else { return }
        (storage.baseAddress! + count).copyMemory(from: bytes.baseAddress!, byteCount: n)
        count += n
    }

    /// Fills the buffer to `count` bytes with `body`, which returns how many it wrote.
    public func fill(_ body: (UnsafeMutableRawBufferPointer) -> Int) {
        count += body(UnsafeMutableRawBufferPointer(rebasing: storage[count...]))
    }

    /// Calls `body` with the bytes in `range`, clipped to what was filled.
    public func withBytes<R, E: Error>(_ range: Range<Int>, _ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        let upper = min(range.upperBound, count)
        let lower = min(range.lowerBound, upper)
        return try body(UnsafeRawBufferPointer(rebasing: storage[lower..<upper]))
    }
}
