// Bridge to libfuse3's low-level API. FUSE_USE_VERSION must be defined here: a module map cannot
// define macros and a cSettings define is not seen by Swift's importer. At 312 Debian's libfuse
// 3.14 exposes fuse_session_loop_mt as a real function with a configurable thread count.
// The entry points are wrapped so that libfuse 3.17+, where some become macros, still builds.
#ifndef CSSP_FUSE_SHIM_H
#define CSSP_FUSE_SHIM_H
#define FUSE_USE_VERSION 312
#include <stddef.h>
#include <pthread.h>
#include <fuse_lowlevel.h>
#include <syslog.h>
#include <signal.h>
#include <malloc.h>

static inline struct fuse_session *cssp_fuse_session_new(struct fuse_args *args,
        const struct fuse_lowlevel_ops *ops, void *userdata) {
    return fuse_session_new(args, ops, sizeof(*ops), userdata);
}

static inline int cssp_fuse_session_loop_mt(struct fuse_session *se, unsigned int max_threads) {
    struct fuse_loop_config *config = fuse_loop_cfg_create();
    if (config == NULL) return -1;
    fuse_loop_cfg_set_clone_fd(config, 0);
    fuse_loop_cfg_set_max_threads(config, max_threads);
    /* Keep idle workers: creating threads per burst costs more than their stacks. */
    fuse_loop_cfg_set_idle_threads(config, max_threads);
    int rc = fuse_session_loop_mt(se, config);
    fuse_loop_cfg_destroy(config);
    return rc;
}

/* syslog is variadic, which Swift cannot call. */
static inline void cssp_syslog(int priority, const char *message) {
    syslog(priority, "%s", message);
}

/* Signal-mask helpers: the daemon blocks termination signals until the FUSE loop runs, so that
 * only the main thread (which libfuse's signal handler wakes) ever receives them. */
static inline int cssp_block_termination_signals(int block) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    return pthread_sigmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}

/* SIGUSR1 toggles debug logging: blocked in every thread (call before any is started), and
 * taken by one thread with sigwait. */
static inline int cssp_block_usr1(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    return pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static inline int cssp_wait_usr1(void) {
    sigset_t set;
    int signal_number = 0;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    return sigwait(&set, &signal_number);
}

/* Puts bytes of an inode into the kernel's page cache (FUSE_NOTIFY_STORE), so that reads of
 * them never reach the daemon. FUSE_BUFVEC_INIT is a macro Swift cannot use. */
static inline int cssp_notify_store(struct fuse_session *se, fuse_ino_t ino, off_t offset,
                                    const void *bytes, size_t size) {
    struct fuse_bufvec bufv = FUSE_BUFVEC_INIT(size);
    bufv.buf[0].mem = (void *)bytes;
    return fuse_lowlevel_notify_store(se, ino, offset, &bufv, 0);
}

/* Daemon process setup: a fixed mmap threshold, so that large transfer buffers are returned to
 * the system when freed (glibc's dynamic threshold would keep them in per-thread heaps).
 * mallopt lives in malloc.h, which Swift's Glibc module does not export. */
static inline int cssp_fixed_mmap_threshold(int bytes) {
    return mallopt(M_MMAP_THRESHOLD, bytes);
}
#endif
