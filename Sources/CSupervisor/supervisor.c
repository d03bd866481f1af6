// The supervisor and the start of a worker: see include/cssp_supervisor.h and
// docs/restart-design.md. Plain C on purpose: the supervisor must stay small and must not depend
// on anything a worker's death can leave in a bad state.
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include "cssp_supervisor.h"

#include <fuse3/fuse_lowlevel.h>
#include <linux/fuse.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

// Debian 12's linux/fuse.h (7.38) names neither: the kernel has both since 6.9 (7.40).
#define CSSP_FUSE_NOTIFY_RESEND 7
#define CSSP_FUSE_HAS_RESEND (1ULL << 39)

// A worker that dies this many times within this many seconds is not started again: the mount
// answers EIO until it is unmounted.
#define DEATHS_ALLOWED 5
#define DEATH_WINDOW_SECONDS 30

/// What the supervisor and its workers share: a memfd the supervisor maps before the first
/// worker, which a worker started from the installed binary (`--restart`) maps again by its
/// inherited descriptor. Its layout is checked by number: a binary of another layout cannot
/// be such a worker.
#define CSSP_SHARED_LAYOUT 1
struct shared {
    uint32_t layout;
    /// The first INIT reply that reached the kernel; later workers' replies are compared with it
    /// and dropped (the kernel takes one).
    int init_answered;
    size_t init_reply_size;
    unsigned char init_reply[512];
    /// The INIT request as the kernel sent it, and what the supervisor learned from it.
    uint64_t init_unique;
    size_t init_request_size;
    unsigned char init_request[8192];
    int kernel_resends;
    /// The worker's number (0: the first), the supervisor, whether to log to syslog.
    uint64_t incarnation;
    pid_t supervisor;
    int use_syslog;
    /// The worker that asked to be replaced by the installed binary (`--restart`), and the one
    /// that serves now (set once its session took the INIT).
    pid_t restart_requested;
    pid_t serving;
};
/// The descriptors of the memfds behind the shared page, the logs and the table of requests in
/// flight (-1: none), which a worker started by exec inherits.
static int shared_fd = -1, node_log_fd = -1, handle_log_fd = -1, inflight_fd = -1;

/// A memfd of `size` bytes mapped shared (pages taken as they are written); NULL on failure.
static void *map_memfd(const char *name, size_t size, int *fd_out) {
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return NULL;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return NULL;
    }
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (memory == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_out = fd;
    return memory;
}

/// The same, by an inherited descriptor (a worker started by exec); NULL when there is none.
static void *map_inherited(int fd, size_t size) {
    if (fd < 0) return NULL;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    return memory == MAP_FAILED ? NULL : memory;
}

/// The logs a worker keeps for its successor: what the kernel's node numbers name
/// (`cssp_node_log_*`, the namespace room's) and the file handles it holds (`cssp_handle_log_*`,
/// the files room's). Anonymous shared memory the supervisor maps before the first fork; pages
/// are taken as they are written.
///
/// Two halves: a successor reads the `active` one. A worker appends to the half it `writes`:
/// the active one, or, while it writes the log again whole (`restart` ... `commit`), the other,
/// which becomes active at the commit. A worker killed in the middle of a rewrite leaves the
/// whole old log active, and the supervisor points the next worker's appends at it again.
struct shared_log {
    uint64_t active;
    uint64_t writes;
    uint64_t used[2];
    unsigned char bytes[];
};
#define LOG_HALF(capacity) (((capacity) - sizeof(struct shared_log)) / 2)
/// The requests a worker has read and not answered, one slot per serving thread (its unique id,
/// 0: none): on a kernel that cannot send them again, the worker that replaces a dead one
/// answers these with EIO, so that none hangs. A slot may still hold a request answered from
/// another thread: the kernel refuses an answer to a request it no longer waits for (ENOENT).
#define INFLIGHT_SLOTS 1024
struct inflight_table {
    uint64_t unique[INFLIGHT_SLOTS];
};
static struct inflight_table *inflight;
static __thread int inflight_slot = -1;
static int inflight_slots_taken;
#define NODE_LOG_CAPACITY ((size_t)1 << 30)
#define HANDLE_LOG_CAPACITY ((size_t)1 << 28)
static struct shared_log *node_log;
static struct shared_log *handle_log;

static unsigned char init_request[8192];
static size_t init_request_size;
static uint64_t init_unique;
static int kernel_resends;
static uint64_t incarnation;
static pid_t supervisor;
// The mount's /dev/fuse descriptor (the supervisor's; a worker's copy by the same number).
static int device_fd = -1;
static int log_to_syslog;
static struct shared *shared;
// Whether the next worker is the installed binary (since a `--restart`), not a fork of this one.
static int exec_next;
#define WORKER_EXEC_FAILED 127
// In a worker, while its session handles the replayed INIT.
static int replaying;
static int reply_differs;

static void take_over_dead_workers_requests(int fd);

static void say(int priority, const char *format, ...) {
    char message[512];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(message, sizeof message, format, arguments);
    va_end(arguments);
    if (log_to_syslog) {
        syslog(priority, "%s", message);
    } else {
        fprintf(stderr, "mount.cssp: %s\n", message);
    }
}

static double monotonic_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static void sleep_seconds(double seconds) {
    struct timespec wait = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&wait, &wait) != 0 && errno == EINTR) {}
}

/// Whether the kernel ended the connection (unmounted, or aborted through fusectl).
static int connection_gone(int fd) {
    if (fd < 0) return 1;
    struct pollfd probe = {.fd = fd, .events = 0};
    return poll(&probe, 1, 0) == 1 && (probe.revents & (POLLERR | POLLHUP | POLLNVAL));
}

/// After the worker gave up: one request read and answered EIO (a FORGET or INTERRUPT needs no
/// answer). -1 once the kernel ended the connection.
static int answer_eio(int fd, unsigned char *buffer, size_t size) {
    ssize_t n = read(fd, buffer, size);
    if (n < 0) return errno == ENODEV ? -1 : 0;
    if ((size_t)n < sizeof(struct fuse_in_header)) return 0;
    const struct fuse_in_header *in = (const void *)buffer;
    if (in->opcode == FUSE_FORGET || in->opcode == FUSE_BATCH_FORGET || in->opcode == FUSE_INTERRUPT) return 0;
    struct fuse_out_header out = {.len = sizeof out, .error = -EIO, .unique = in->unique};
    if (write(fd, &out, sizeof out) < 0 && errno == ENODEV) return -1;
    return 0;
}

static const char *describe(int status, char *text, size_t size) {
    if (WIFSIGNALED(status)) {
        snprintf(text, size, "killed by signal %d (%s)%s", WTERMSIG(status), strsignal(WTERMSIG(status)),
                 WCOREDUMP(status) ? ", core dumped" : "");
    } else {
        snprintf(text, size, "exited with status %d", WEXITSTATUS(status));
    }
    return text;
}

static int final_status(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static struct shared_log *map_log(size_t capacity, const char *name, const char *what, int *fd_out) {
    struct shared_log *log = map_memfd(name, capacity, fd_out);
    if (log == NULL) {
        say(LOG_WARNING, "no %s (%s): a worker that replaces a dead one knows none of its %s", name, strerror(errno), what);
    }
    return log;
}

/// Once the first worker runs, the supervisor lets go of what its start made resident and its
/// loop never uses again: the free heap, and its mappings of program and library code and
/// read-only data (private file mappings no page of which was copied on write, which the
/// kernel fills again from the page cache at the next touch; the worker's are its own). What
/// stays resident is what the loop touches: its RSS is then a few hundred KiB, not the 20 MiB
/// of a process that parsed options, asked the server and mapped curl and OpenSSL.
static void shed_startup_memory(void) {
    malloc_trim(0);
    FILE *maps = fopen("/proc/self/smaps", "re");
    if (maps == NULL) return;
    char line[512];
    unsigned long start = 0, end = 0, inode = 0;
    char perms[8] = "";
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long s, e, offset, node, kb;
        char p[8], device[16];
        if (sscanf(line, "%lx-%lx %7s %lx %15s %lu", &s, &e, p, &offset, device, &node) == 6) {
            start = s;
            end = e;
            inode = node;
            memcpy(perms, p, sizeof perms);
            continue;
        }
        if (sscanf(line, "Anonymous: %lu kB", &kb) == 1 && inode != 0 && kb == 0 && perms[1] != 'w' && perms[3] == 'p') {
            madvise((void *)start, end - start, MADV_DONTNEED);
        }
    }
    fclose(maps);
}

/// The installed binary and the supervisor's arguments, for a worker started by exec.
static char exe_path[4096];
static char **saved_argv;

static void remember_command(void) {
    ssize_t n = readlink("/proc/self/exe", exe_path, sizeof exe_path - 1);
    exe_path[n > 0 ? n : 0] = 0;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    static char line[65536];
    ssize_t size = read(fd, line, sizeof line - 1);
    close(fd);
    if (size <= 0) return;
    line[size] = 0;
    size_t count = 0;
    for (ssize_t i = 0; i < size; i++) count += line[i] == 0;
    saved_argv = calloc(count + 2, sizeof *saved_argv);
    if (saved_argv == NULL) return;
    size_t at = 0;
    for (char *p = line; p < line + size && at <= count; p += strlen(p) + 1) saved_argv[at++] = p;
}

/// In a new worker's process: becomes the installed binary, which serves as this worker
/// (`cssp_worker_attach`). Returns only if exec failed.
static void exec_worker(void) {
    int fds[] = {device_fd, shared_fd, node_log_fd, handle_log_fd, inflight_fd};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
        if (fds[i] >= 0) fcntl(fds[i], F_SETFD, 0);
    }
    char value[96];
    snprintf(value, sizeof value, "%d,%d,%d,%d,%d", fds[0], fds[1], fds[2], fds[3], fds[4]);
    setenv("CSSP_WORKER", value, 1);
    if (saved_argv != NULL && exe_path[0] != 0) execv(exe_path, saved_argv);
    say(LOG_ERR, "cannot start %s as the new worker: %s", exe_path, strerror(errno));
}

int cssp_supervise(struct fuse_session *se, int use_syslog) {
    log_to_syslog = use_syslog;
    supervisor = getpid();
    int fd = fuse_session_fd(se);
    device_fd = fd;
    shared = map_memfd("cssp-shared", sizeof *shared, &shared_fd);
    if (shared == NULL) {
        say(LOG_ERR, "cannot map the supervisor's shared page: %s", strerror(errno));
        fuse_session_unmount(se);
        _exit(32);
    }
    shared->layout = CSSP_SHARED_LAYOUT;
    shared->supervisor = supervisor;
    shared->use_syslog = use_syslog;
    inflight = map_memfd("cssp-inflight", sizeof *inflight, &inflight_fd);
    if (inflight == NULL) {
        say(LOG_WARNING, "cannot map the table of requests in flight (%s): on a kernel that cannot send a dead worker's requests again, they hang", strerror(errno));
    }
    node_log = map_log(NODE_LOG_CAPACITY, "cssp-node-log", "numbers", &node_log_fd);
    handle_log = map_log(HANDLE_LOG_CAPACITY, "cssp-handle-log", "open files", &handle_log_fd);
    remember_command();

    ssize_t n;
    do {
        n = read(fd, init_request, sizeof init_request);
    } while (n < 0 && errno == EINTR);
    const struct fuse_in_header *in = (const void *)init_request;
    if (n < (ssize_t)(sizeof *in + sizeof(struct fuse_init_in)) || in->opcode != FUSE_INIT) {
        say(LOG_ERR, "the kernel's first request was not INIT (%s): unmounting", n < 0 ? strerror(errno) : "short");
        fuse_session_unmount(se);
        _exit(32);
    }
    init_request_size = (size_t)n;
    init_unique = in->unique;
    const struct fuse_init_in *init = (const void *)(init_request + sizeof *in);
    uint64_t flags = init->flags;
    if (flags & FUSE_INIT_EXT) flags |= (uint64_t)init->flags2 << 32;
    kernel_resends = (flags & CSSP_FUSE_HAS_RESEND) != 0;
    // The tests of kernels before 6.9 (not an option): behave as if the kernel could not resend.
    const char *pretend = getenv("CSSP_TEST_KERNEL_WITHOUT_RESEND");
    if (pretend != NULL && strcmp(pretend, "1") == 0) kernel_resends = 0;
    shared->init_unique = init_unique;
    shared->init_request_size = init_request_size;
    memcpy(shared->init_request, init_request, init_request_size);
    shared->kernel_resends = kernel_resends;

    // The supervisor takes the termination signals (it unmounts) and SIGUSR1 (passed on), and
    // learns of a worker's end from SIGCHLD, all through one descriptor.
    sigset_t original, handled;
    sigemptyset(&handled);
    int signals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGCHLD};
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) sigaddset(&handled, signals[i]);
    sigprocmask(SIG_BLOCK, &handled, &original);
    int signal_fd = signalfd(-1, &handled, SFD_CLOEXEC);
    if (signal_fd < 0) {
        say(LOG_ERR, "cannot make a signalfd: %s; unmounting", strerror(errno));
        fuse_session_unmount(se);
        _exit(32);
    }

    double deaths[DEATHS_ALLOWED] = {0};
    size_t death_count = 0;
    // Deaths each within 2 s of the one before: a crash loop, met with a growing wait.
    unsigned fast_deaths = 0;
    double last_death = -1e9;
    int stopping = 0, given_up = 0, last_status = 0;
    unsigned char *eio_buffer = NULL;
    size_t eio_buffer_size = 0;
    pid_t worker = 0;
    double start_at = monotonic_seconds();  // when the next worker is due (0: none is)

    for (;;) {
        if (worker == 0 && start_at > 0 && !stopping && !given_up) {
            double wait = start_at - monotonic_seconds();
            if (wait > 0) sleep_seconds(wait);
            start_at = 0;
            cssp_logs_settle();
            shared->incarnation = incarnation;
            shared->serving = 0;
            pid_t pid = fork();
            if (pid == 0) {
                close(signal_fd);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != supervisor) _exit(1);
                // Termination signals wait until the worker serves (it leaves its loop at one).
                sigset_t mask = original;
                sigaddset(&mask, SIGTERM);
                sigaddset(&mask, SIGINT);
                sigaddset(&mask, SIGHUP);
                sigprocmask(SIG_SETMASK, &mask, NULL);
                if (exec_next) {
                    exec_worker();
                    _exit(WORKER_EXEC_FAILED);
                }
                return 0;
            }
            if (pid < 0) {
                say(LOG_ERR, "cannot start a worker: %s; trying again in 1 s", strerror(errno));
                start_at = monotonic_seconds() + 1;
                continue;
            }
            worker = pid;
            if (incarnation == 0) shed_startup_memory();
        }
        struct pollfd waits[2] = {{.fd = signal_fd, .events = POLLIN}, {.fd = given_up ? fd : -1, .events = POLLIN}};
        if (poll(waits, 2, -1) < 0) continue;
        if (waits[1].revents) {
            if (answer_eio(fd, eio_buffer, eio_buffer_size) < 0) _exit(last_status ? last_status : 1);
        }
        if (!(waits[0].revents & POLLIN)) continue;
        struct signalfd_siginfo info;
        if (read(signal_fd, &info, sizeof info) != sizeof info) continue;
        switch (info.ssi_signo) {
        case SIGUSR1:
            if (worker > 0) kill(worker, SIGUSR1);
            break;
        case SIGTERM:
        case SIGINT:
        case SIGHUP:
            if (!stopping) {
                say(LOG_NOTICE, "%s: unmounting", strsignal((int)info.ssi_signo));
                stopping = 1;
                fuse_session_unmount(se);
                fd = -1;
                if (worker == 0) _exit(given_up ? 1 : last_status);
                // The worker leaves its loop even while files stay open on the detached
                // mount (as one process did), drains and exits.
                kill(worker, SIGTERM);
            }
            break;
        case SIGCHLD: {
            int status;
            pid_t ended;
            while ((ended = waitpid(-1, &status, WNOHANG)) > 0) {
                if (ended != worker) continue;
                worker = 0;
                last_status = final_status(status);
                if (stopping || connection_gone(fd)) _exit(last_status);
                if (shared->restart_requested == ended && shared->serving == ended) {
                    // A planned restart (`--restart`): not a death; the installed binary serves next.
                    shared->restart_requested = 0;
                    exec_next = exe_path[0] != 0 && saved_argv != NULL;
                    incarnation++;
                    say(LOG_NOTICE, "worker %d stopped for a restart; starting worker %llu from %s", (int)ended,
                        (unsigned long long)incarnation, exec_next ? exe_path : "this binary (its path is unknown)");
                    start_at = monotonic_seconds();
                    continue;
                }
                if (exec_next && shared->serving != ended) {
                    // The installed binary did not come to serve (another layout, another INIT
                    // answer, a start that failed): the running binary serves, as before.
                    exec_next = 0;
                    say(LOG_ERR, "worker %d from %s ended before it served: the next worker is this binary again",
                        (int)ended, exe_path);
                }
                char text[160];
                describe(status, text, sizeof text);
                double now = monotonic_seconds();
                deaths[death_count % DEATHS_ALLOWED] = now;
                death_count++;
                size_t recent = 0;
                for (size_t i = 0; i < DEATHS_ALLOWED && i < death_count; i++) {
                    if (now - deaths[i] <= DEATH_WINDOW_SECONDS) recent++;
                }
                if (recent >= DEATHS_ALLOWED) {
                    say(LOG_ERR,
                        "worker %d %s, its %d death within %d s: no new worker; every request now fails with EIO "
                        "until the mount is unmounted (umount it, then mount again; the log above says why)",
                        (int)ended, text, DEATHS_ALLOWED, DEATH_WINDOW_SECONDS);
                    given_up = 1;
                    take_over_dead_workers_requests(fd);
                    eio_buffer_size = 4 << 20;  // more than the largest WRITE the kernel sends
                    eio_buffer = malloc(eio_buffer_size);
                    if (eio_buffer == NULL) _exit(1);
                    break;
                }
                // At once; after a death within 2 s of the one before, 0.1 s, then 0.2 s, 0.4 s...
                fast_deaths = now - last_death < 2 ? fast_deaths + 1 : 0;
                last_death = now;
                double backoff = fast_deaths == 0 ? 0 : 0.1 * (double)(1u << (fast_deaths - 1 < 5 ? fast_deaths - 1 : 5));
                incarnation++;
                say(LOG_ERR, "worker %d %s; starting worker %llu%s", (int)ended, text,
                    (unsigned long long)incarnation,
                    kernel_resends ? " (the kernel sends its requests again)"
                                   : " (this kernel cannot send again the requests it had read: they fail with EIO)");
                start_at = now + backoff;
            }
            break;
        }
        default:
            break;
        }
    }
}

static uint64_t resent_requests;
/// Whether the request this thread read last was sent again (libfuse serves a request on the
/// thread that read it).
static __thread int reading_resent;

static ssize_t worker_read(int fd, void *buffer, size_t size, void *userdata) {
    (void)userdata;
    ssize_t n = read(fd, buffer, size);
    reading_resent = 0;
    if (n >= (ssize_t)sizeof(struct fuse_in_header)) {
        const struct fuse_in_header *in = buffer;
        if (inflight != NULL) {
            if (inflight_slot == -1) {
                int taken = __atomic_fetch_add(&inflight_slots_taken, 1, __ATOMIC_RELAXED);
                inflight_slot = taken < INFLIGHT_SLOTS ? taken : -2;
            }
            // FORGET and BATCH_FORGET take no answer.
            int answered = in->opcode != FUSE_FORGET && in->opcode != FUSE_BATCH_FORGET;
            if (inflight_slot >= 0) __atomic_store_n(&inflight->unique[inflight_slot], answered ? in->unique : 0, __ATOMIC_RELEASE);
        }
        if (in->unique & CSSP_FUSE_UNIQUE_RESEND) {
            __atomic_add_fetch(&resent_requests, 1, __ATOMIC_RELAXED);
            reading_resent = 1;
        }
    }
    return n;
}

uint64_t cssp_resent_requests(void) { return __atomic_load_n(&resent_requests, __ATOMIC_RELAXED); }

int cssp_request_is_resent(void) { return reading_resent; }

static ssize_t worker_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    if (replaying && count > 0 && iov[0].iov_len >= sizeof(struct fuse_out_header)) {
        const struct fuse_out_header *out = iov[0].iov_base;
        if (out->unique == init_unique) {
            unsigned char reply[sizeof shared->init_reply];
            size_t total = 0;
            for (int i = 0; i < count; i++) {
                size_t part = iov[i].iov_len;
                if (total + part <= sizeof reply) memcpy(reply + total, iov[i].iov_base, part);
                total += part;
            }
            if (total > sizeof reply) total = sizeof reply;
            if (shared->init_answered) {
                // The kernel has its answer: this one only sets up the session, and must be the same.
                reply_differs = total != shared->init_reply_size || memcmp(reply, shared->init_reply, total) != 0;
                return (ssize_t)total;
            }
            ssize_t written = writev(fd, iov, count);
            if (written >= 0) {
                memcpy(shared->init_reply, reply, total);
                shared->init_reply_size = total;
                shared->init_answered = 1;
            }
            return written;
        }
    }
    ssize_t written = writev(fd, iov, count);
    if (inflight != NULL && inflight_slot >= 0 && count > 0 && iov[0].iov_len >= sizeof(struct fuse_out_header)) {
        const struct fuse_out_header *out = iov[0].iov_base;
        if (out->unique != 0 && out->unique == inflight->unique[inflight_slot]) {
            __atomic_store_n(&inflight->unique[inflight_slot], 0, __ATOMIC_RELEASE);
        }
    }
    return written;
}

/// What a dead worker had read and not answered: the kernel sends it again where it can
/// (FUSE_NOTIFY_RESEND, before this process reads), else it is answered with EIO here (it would
/// hang). By the worker that replaces the dead one, or by a supervisor that gave up.
static void take_over_dead_workers_requests(int fd) {
    int answered = 0;
    for (int slot = 0; inflight != NULL && slot < INFLIGHT_SLOTS; slot++) {
        uint64_t unique = __atomic_exchange_n(&inflight->unique[slot], 0, __ATOMIC_ACQ_REL);
        if (unique == 0 || kernel_resends) continue;
        struct fuse_out_header eio = {.len = sizeof eio, .error = -EIO, .unique = unique};
        if (write(fd, &eio, sizeof eio) == (ssize_t)sizeof eio) answered++;
    }
    if (answered > 0) {
        say(LOG_WARNING, "%d request(s) the dead worker had read answered with EIO: this kernel cannot send them again",
            answered);
    }
    if (!kernel_resends) return;
    struct fuse_out_header resend = {.len = sizeof resend, .error = CSSP_FUSE_NOTIFY_RESEND, .unique = 0};
    if (write(fd, &resend, sizeof resend) < 0) {
        say(LOG_WARNING, "the kernel refused FUSE_NOTIFY_RESEND: %s", strerror(errno));
    }
}

int cssp_worker_start(struct fuse_session *se) {
    static const struct fuse_custom_io io = {.read = worker_read, .writev = worker_writev};
    int fd = device_fd;
    if (fd < 0) return -1;
    if (fuse_session_custom_io(se, &io, fd) != 0) return -1;
    struct fuse_buf buffer = {.mem = init_request, .size = init_request_size};
    replaying = 1;
    fuse_session_process_buf(se, &buffer);
    replaying = 0;
    if (reply_differs) {
        say(LOG_ERR, "worker %d negotiated another INIT answer than the first worker: it cannot serve this mount",
            (int)getpid());
        return -1;
    }
    if (incarnation > 0) take_over_dead_workers_requests(fd);
    __atomic_store_n(&shared->serving, getpid(), __ATOMIC_RELEASE);
    return 0;
}

int cssp_worker_attach(void) {
    const char *value = getenv("CSSP_WORKER");
    if (value == NULL) return 1;
    int fds[5];
    if (sscanf(value, "%d,%d,%d,%d,%d", &fds[0], &fds[1], &fds[2], &fds[3], &fds[4]) != 5) return -1;
    unsetenv("CSSP_WORKER");
    shared = map_inherited(fds[1], sizeof *shared);
    if (shared == NULL || shared->layout != CSSP_SHARED_LAYOUT || fds[0] < 0) return -1;
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    device_fd = fds[0];
    shared_fd = fds[1];
    node_log_fd = fds[2];
    handle_log_fd = fds[3];
    inflight_fd = fds[4];
    node_log = map_inherited(fds[2], NODE_LOG_CAPACITY);
    handle_log = map_inherited(fds[3], HANDLE_LOG_CAPACITY);
    inflight = map_inherited(fds[4], sizeof(struct inflight_table));
    incarnation = shared->incarnation;
    supervisor = shared->supervisor;
    kernel_resends = shared->kernel_resends;
    log_to_syslog = shared->use_syslog;
    init_unique = shared->init_unique;
    init_request_size = shared->init_request_size < sizeof init_request ? shared->init_request_size : sizeof init_request;
    memcpy(init_request, shared->init_request, init_request_size);
    // The supervisor's death ends this worker too (kept across exec; set again all the same).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != supervisor) _exit(1);
    return 0;
}

int cssp_worker_uses_syslog(void) { return log_to_syslog; }

int cssp_worker_request_restart(void) {
    if (shared == NULL || supervisor == 0 || getpid() == supervisor) return -1;
    __atomic_store_n(&shared->restart_requested, getpid(), __ATOMIC_RELEASE);
    return 0;
}

static int log_append(struct shared_log *log, size_t capacity, const void *record, size_t size) {
    if (log == NULL) return -1;
    uint64_t half = log->writes;
    uint64_t used = log->used[half];
    if (used + size > LOG_HALF(capacity)) return -1;
    memcpy(log->bytes + half * LOG_HALF(capacity) + used, record, size);
    // A worker killed in the middle leaves the record uncounted.
    __atomic_store_n(&log->used[half], used + size, __ATOMIC_RELEASE);
    return 0;
}

static void log_restart(struct shared_log *log) {
    if (log == NULL) return;
    uint64_t other = 1 - log->active;
    __atomic_store_n(&log->used[other], 0, __ATOMIC_RELEASE);
    log->writes = other;
}

static void log_commit(struct shared_log *log, int complete) {
    if (log == NULL) return;
    if (complete) {
        __atomic_store_n(&log->active, log->writes, __ATOMIC_RELEASE);
    } else {
        log->writes = log->active;
    }
}

/// Before a worker starts: appends go to the active half (its predecessor may have died in the
/// middle of a rewrite).
static void log_settle(struct shared_log *log) {
    if (log != NULL) log->writes = log->active;
}

static size_t log_read(struct shared_log *log, size_t capacity, const unsigned char **bytes) {
    if (log == NULL) return 0;
    uint64_t half = __atomic_load_n(&log->active, __ATOMIC_ACQUIRE);
    *bytes = log->bytes + half * LOG_HALF(capacity);
    return __atomic_load_n(&log->used[half], __ATOMIC_ACQUIRE);
}

int cssp_node_log_append(const void *record, size_t size) { return log_append(node_log, NODE_LOG_CAPACITY, record, size); }
void cssp_node_log_restart(void) { log_restart(node_log); }
void cssp_node_log_commit(int complete) { log_commit(node_log, complete); }
size_t cssp_node_log_read(const unsigned char **bytes) { return log_read(node_log, NODE_LOG_CAPACITY, bytes); }

int cssp_handle_log_append(const void *record, size_t size) {
    return log_append(handle_log, HANDLE_LOG_CAPACITY, record, size);
}
void cssp_handle_log_restart(void) { log_restart(handle_log); }
void cssp_handle_log_commit(int complete) { log_commit(handle_log, complete); }
size_t cssp_handle_log_read(const unsigned char **bytes) { return log_read(handle_log, HANDLE_LOG_CAPACITY, bytes); }

void cssp_logs_settle(void) {
    log_settle(node_log);
    log_settle(handle_log);
}

int cssp_logs_map_for_testing(void) {
    if (node_log == NULL) node_log = map_log(NODE_LOG_CAPACITY, "cssp-node-log", "numbers", &node_log_fd);
    if (handle_log == NULL) handle_log = map_log(HANDLE_LOG_CAPACITY, "cssp-handle-log", "open files", &handle_log_fd);
    return node_log != NULL && handle_log != NULL ? 0 : -1;
}

uint64_t cssp_worker_incarnation(void) { return incarnation; }

int cssp_supervisor_pid(void) { return (int)supervisor; }

int cssp_kernel_resends(void) { return kernel_resends; }
