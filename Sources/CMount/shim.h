// util-linux's libmount, for /run/mount/utab: its update API takes the file's lock and replaces
// the file whole (a new file renamed over it), as mount(8) and umount(8) do. No wrappers needed.
#ifndef CSSP_MOUNT_SHIM_H
#define CSSP_MOUNT_SHIM_H
#include <libmount/libmount.h>
#endif
