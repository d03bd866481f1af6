// SQLite for the block cache and the metadata index. SQLITE_TRANSIENT is a cast macro Swift
// cannot import; O_DIRECT (for the cache's data file) is a GNU extension Glibc's Swift module
// does not export.
#ifndef CSSP_SQLITE_SHIM_H
#define CSSP_SQLITE_SHIM_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <sqlite3.h>
static inline int cssp_o_direct(void) { return O_DIRECT; }
static inline int cssp_sqlite3_bind_text_transient(sqlite3_stmt *s, int i, const char *p, int n) {
    return sqlite3_bind_text(s, i, p, n, SQLITE_TRANSIENT);
}
static inline int cssp_sqlite3_bind_blob_transient(sqlite3_stmt *s, int i, const void *p, int n) {
    return sqlite3_bind_blob(s, i, p, n, SQLITE_TRANSIENT);
}
#endif
