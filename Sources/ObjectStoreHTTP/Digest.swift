import CCrypto

/// HMAC-SHA1, HMAC-SHA256, SHA-1, SHA-256, MD5 and base64 on OpenSSL's libcrypto.
enum Digest {
    static func hmacSHA1(key: [UInt8], message: [UInt8]) -> [UInt8] {
        hmac(EVP_sha1(), key: key, message: message)
    }

    static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        hmac(EVP_sha256(), key: key, message: message)
    }

    static func sha1(_ message: [UInt8]) -> [UInt8] { digest(EVP_sha1(), message) }

    static func sha256(_ message: [UInt8]) -> [UInt8] { digest(EVP_sha256(), message) }

    private static func hmac(_ md: OpaquePointer?, key: [UInt8], message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let ok = key.withUnsafeBufferPointer { k in
            message.withUnsafeBufferPointer { m in
                HMAC(md, k.baseAddress, Int32(k.count), m.baseAddress, m.count, &out, &length)
            }
        }
        precondition(ok != nil, "HMAC failed")
        return Array(out.prefix(Int(length)))
    }

    private static func digest(_ md: OpaquePointer?, _ message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let ok = message.withUnsafeBufferPointer { m in EVP_Digest(m.baseAddress, m.count, &out, &length, md, nil) }
        precondition(ok == 1, "digest failed")
        return Array(out.prefix(Int(length)))
    }

    static func base64(_ bytes: [UInt8]) -> String {
        var out = [UInt8](repeating: 0, count: 4 * ((bytes.count + 2) / 3) + 1)
        let n = bytes.withUnsafeBufferPointer { EVP_EncodeBlock(&out, $0.baseAddress, Int32($0.count)) }
        return String(decoding: out.prefix(Int(n)), as: UTF8.self)
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(bytes.count * 2)
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// Incremental MD5 (the ETag of a Swift object).
public final class MD5 {
    private let context: OpaquePointer

    public init() {
        context = EVP_MD_CTX_new()
        precondition(EVP_DigestInit_ex(context, EVP_md5(), nil) == 1, "MD5 init failed")
    }

    deinit { EVP_MD_CTX_free(context) }

    public func update(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        _ = EVP_DigestUpdate(context, bytes.baseAddress, bytes.count)
    }

    public func update(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { update($0) }
    }

    /// The digest as lower-case hex.
    public func finalize() -> String {
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        _ = EVP_DigestFinal_ex(context, &out, &length)
        return Digest.hex(Array(out.prefix(Int(length))))
    }

    public static func hex(of bytes: [UInt8]) -> String {
        let md5 = MD5()
        md5.update(bytes)
        return md5.finalize()
    }
}
