import BlockCache
import Dispatch
import FSCore

#if canImport(Glibc)
import Glibc
#endif

extension SpoolFile {
    /// Offers what was just stored to the block cache, in the background, so that reading it back
    /// (after the kernel dropped its pages, or from the next mount) needs no GET. Stops at the
    /// first sign of a newer change: blocks must hold exactly the bytes of `object`'s ETag.
    /// `seeding` is entered while the job is queued or running.
    package func seedCache(
        _ cache: BlockCache, as object: BlockCache.Object, generation: UInt64, size: Int64, pool: BackgroundPool,
        seeding: DispatchGroup
    ) {
        guard size > 0, size <= cache.capacity / 4 else { return }
        let fd = (try? usingDescriptor { dup($0) }) ?? -1
        guard fd >= 0 else { return }
        seeding.enter()
        let started = pool.submit { [self, seeding] in
            defer { seeding.leave() }
            defer { close(fd) }
            let blockSize = Int64(cache.blockSize)
            var index: Int64 = 0
            while index * blockSize < size {
                let count = Int(min(blockSize, size - index * blockSize))
                let buffer = ByteBuffer(capacity: count)
                let offset = index * blockSize
                while buffer.count < count {
                    var n = 0
                    buffer.fill { space in
                        n = pread(fd, space.baseAddress!, count - buffer.count, off_t(offset + Int64(buffer.count)))
                        return max(n, 0)
                    }
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { return }
                }
                guard self.isUnchanged(since: generation) else { return }
                cache.store(object, block: index, bytes: buffer, range: 0..<count, waitForRoom: true)
                index += 1
            }
        }
        if !started {
            close(fd)
            seeding.leave()
        }
    }
}
