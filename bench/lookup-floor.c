/* The least a FUSE lookup costs on this machine (bench/lookup-floor.sh): a low-level libfuse
 * daemon that answers every lookup with a new directory (a name starting with 'd') or a new
 * one-byte file (any other name) and does nothing else, served by libfuse's multi-threaded
 * loop with the thread settings mount.cssp uses (16 workers, all kept idle). A directory's
 * inode number is odd. */
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void describe(struct stat *st, fuse_ino_t ino) {
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    int directory = ino == FUSE_ROOT_ID || ino % 2 == 1;
    st->st_mode = directory ? (S_IFDIR | 0755) : (S_IFREG | 0644);
    st->st_nlink = 1;
    st->st_size = directory ? 0 : 1;
}

static void lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    static fuse_ino_t next = FUSE_ROOT_ID + 1;
    struct fuse_entry_param entry;
    (void)parent;
    memset(&entry, 0, sizeof entry);
    entry.ino = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) * 2 + (name[0] == 'd');
    entry.attr_timeout = 1;
    entry.entry_timeout = 1;
    describe(&entry.attr, entry.ino);
    fuse_reply_entry(req, &entry);
}

static void getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct stat st;
    (void)fi;
    describe(&st, ino);
    fuse_reply_attr(req, &st, 1);
}

static void opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    fuse_reply_open(req, fi);
}

static const struct fuse_lowlevel_ops operations = {.lookup = lookup, .getattr = getattr, .opendir = opendir};

int main(int argc, char *argv[]) {
    if (argc != 2) return 2;
    struct fuse_args args = FUSE_ARGS_INIT(1, argv);
    struct fuse_session *session = fuse_session_new(&args, &operations, sizeof operations, NULL);
    if (session == NULL || fuse_session_mount(session, argv[1]) != 0) return 1;
    fuse_daemonize(0);
    struct fuse_loop_config *config = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(config, 0);
    fuse_loop_cfg_set_max_threads(config, 16);
    fuse_loop_cfg_set_idle_threads(config, 16);
    int rc = fuse_session_loop_mt(session, config);
    fuse_loop_cfg_destroy(config);
    fuse_session_unmount(session);
    fuse_session_destroy(session);
    return rc == 0 ? 0 : 1;
}
