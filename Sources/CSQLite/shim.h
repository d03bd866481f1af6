// SQLite for the block cache. SQLITE_TRANSIENT is a cast macro Swift cannot import.
#ifndef CSSP_SQLITE_SHIM_H
#define CSSP_SQLITE_SHIM_H
#include <sqlite3.h>
static inline int cssp_sqlite3_bind_text_transient(sqlite3_stmt *s, int i, const char *p, int n) {
    return sqlite3_bind_text(s, i, p, n, SQLITE_TRANSIENT);
}
#endif
