@testable import FileSystem

extension Filesystem {
    /// Opens `inode` read-only and reads it to the end in `chunk`-sized reads, as a program would.
    func readWhole(_ inode: InodeNumber, chunk: Int) throws -> [UInt8] {
        let opened = try open(inode, writable: false, truncate: false)
        defer { release(handle: opened.handle) }
        var bytes: [UInt8] = []
        while true {
            var got = 0
            try read(handle: opened.handle, offset: Int64(bytes.count), length: chunk) { piece in
                got = piece.count
                bytes.append(contentsOf: piece)
            }
            if got == 0 { return bytes }
        }
    }
}
