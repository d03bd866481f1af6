/// A string compared and hashed by its UTF-8 bytes.
///
/// Swift's `String` equality is canonical equivalence: "é" precomposed (NFC) equals "e" followed
/// by a combining accent (NFD). Object keys and file names are byte strings, and two keys that
/// differ only in normalisation are two objects: tables of names and keys use this type, so that
/// `rm`, a write or a rename of one spelling never acts on the other.
public struct ExactString: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let string: String

    public init(_ string: String) { self.string = string }

    public static func == (a: ExactString, b: ExactString) -> Bool { a.string.utf8.elementsEqual(b.string.utf8) }

    /// Byte order, as listings sort keys.
    public static func < (a: ExactString, b: ExactString) -> Bool {
        a.string.utf8.lexicographicallyPrecedes(b.string.utf8)
    }

    public func hash(into hasher: inout Hasher) {
        var string = self.string
        string.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
    }

    public var description: String { string }
}

extension String {
    /// This string compared by its bytes (see `ExactString`).
    public var exact: ExactString { ExactString(self) }

    /// Whether both strings have the same bytes (not only the same characters).
    public func isSameKey(as other: String) -> Bool { utf8.elementsEqual(other.utf8) }
}

extension ExactString: ExpressibleByStringLiteral {
    public init(stringLiteral value: String) { self.init(value) }
}
