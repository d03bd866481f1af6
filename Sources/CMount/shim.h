// util-linux's libmount, for /run/mount/utab: its update API takes the file's lock and replaces
// the file whole (a new file renamed over it), as mount(8) and umount(8) do. No wrappers needed.
// And glibc's mallopt, mallinfo2 and malloc_trim, which Swift's Glibc module leaves out.
#ifndef CSSP_MOUNT_SHIM_H
#define CSSP_MOUNT_SHIM_H
#include <libmount/libmount.h>
#include <malloc.h>

/// At most `count` malloc arenas (glibc's default is eight per core; every thread that
/// allocates may take one, and each keeps its freed memory).
static inline int cssp_limit_malloc_arenas(int count) { return mallopt(M_ARENA_MAX, count); }

/// Bytes in the free chunks malloc keeps (whether or not their pages went back to the system).
static inline size_t cssp_malloc_free_bytes(void) { return mallinfo2().fordblks; }

/// Gives the pages of free chunks back to the system (madvise), in every arena.
static inline int cssp_malloc_trim(void) { return malloc_trim(0); }
#endif
