import CMount
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Gives freed heap back to the system once the daemon's work settles. glibc keeps what the
/// daemon frees for its next allocations: a listing read and parsed page by page, a walk's pages
/// held ahead, a reader's copies, all freed once the listing is remembered, left the daemon's
/// resident memory near its peak for the mount's life (issue 21: after `ls -l` of 200 000 names
/// about 190 bytes an entry resident, 160 once trimmed; docs/decisions/0103-heap-trim.md, its
/// figures in 0102-eighty-byte-nodes.md).
/// Twice a second the bytes in malloc's free chunks are sampled; when they moved by more than
/// `quiet` since the last sample, work is under way; at the first sample after work at which
/// they did not, the free chunks' pages go back (malloc_trim: a walk of the free chunks and a
/// madvise each). An idle mount (a poll a second) moves far less: it trims nothing.
enum HeapTrim {
    static let quiet = 256 << 10
    static let period = timespec(tv_sec: 0, tv_nsec: 500_000_000)

    static func start(logger: Logger) {
        Thread.detached {
            var last = cssp_malloc_free_bytes()
            var working = false
            while true {
                var pause = period
                nanosleep(&pause, nil)
                let free = cssp_malloc_free_bytes()
                if free.distance(to: last).magnitude > quiet {
                    working = true
                } else if working {
                    working = false
                    _ = cssp_malloc_trim()
                    logger.debug("heap: \(free >> 20) MiB in free chunks, their pages given back")
                }
                last = free
            }
        }
    }
}
