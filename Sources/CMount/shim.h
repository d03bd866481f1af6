// util-linux's libmount, for /run/mount/utab: its update API takes the file's lock and replaces
// the file whole (a new file renamed over it), as mount(8) and umount(8) do. No wrappers needed.
// And glibc's mallopt, which Swift's Glibc module leaves out.
#ifndef CSSP_MOUNT_SHIM_H
#define CSSP_MOUNT_SHIM_H
#include <libmount/libmount.h>
#include <malloc.h>

/// At most `count` malloc arenas (glibc's default is eight per core; every thread that
/// allocates may take one, and each keeps its freed memory).
static inline int cssp_limit_malloc_arenas(int count) { return mallopt(M_ARENA_MAX, count); }
#endif
