// The supervisor of a mount (issue 40, docs/restart-design.md): the process that mounted holds
// /dev/fuse for the mount's whole life and serves nothing; workers it forks serve. A worker that
// dies is replaced, and the kernel's requests wait in its queue meanwhile: no ENOTCONN.
#ifndef CSSP_SUPERVISOR_H
#define CSSP_SUPERVISOR_H
#include <stddef.h>
#include <stdint.h>

struct fuse_session;

/// Called once mounted (after detaching, when not in the foreground), before any thread is
/// started. Reads the kernel's INIT request, then forks workers until the mount ends.
/// Returns only in a worker, with 0. In the supervisor it never returns: once the mount ends (or
/// a SIGTERM, SIGINT or SIGHUP unmounted it and the worker finished) it exits with the last
/// worker's status. `use_syslog`: where the supervisor logs (else stderr).
int cssp_supervise(struct fuse_session *se, int use_syslog);

/// In a worker: makes `se` (a session of the worker's own, never mounted) read and write
/// through the inherited descriptor, replays the INIT
/// the supervisor read (its reply reaches the kernel from the first worker only) and, in a
/// worker that replaces a dead one, asks the kernel to send again the requests that one had
/// read (FUSE_NOTIFY_RESEND), where the kernel can. 0, or -1 when the session refused.
int cssp_worker_start(struct fuse_session *se);

/// Which worker this is: 0 for the first, n for the one started after n deaths.
uint64_t cssp_worker_incarnation(void);

/// The supervisor's pid (in a worker: its parent), 0 before `cssp_supervise`.
int cssp_supervisor_pid(void);

/// In a process the supervisor started from the installed binary (`--restart`; the variable
/// CSSP_WORKER names its inherited descriptors): takes the supervisor's shared memory and
/// /dev/fuse over, so that `cssp_worker_start` serves as a forked worker would. 0 when it did,
/// 1 when this process is no such worker, -1 when it cannot be one (another layout).
int cssp_worker_attach(void);

/// Whether the supervisor logs to syslog (a worker started by exec logs as it does).
int cssp_worker_uses_syslog(void);

/// A worker asks to be replaced by the installed binary once it exits (`--restart`): its end
/// is then no death. 0, or -1 outside a worker.
int cssp_worker_request_restart(void);

/// Whether the kernel offered FUSE_HAS_RESEND (known once `cssp_supervise` read the INIT).
int cssp_kernel_resends(void);

/// Requests this worker read that the kernel sent again (a dead worker had read them).
uint64_t cssp_resent_requests(void);

/// Whether the request the calling thread is serving was sent again: a dead worker had read
/// it, and may have done it before it died. Valid in a request's callback, on its thread.
int cssp_request_is_resent(void);

/// The node log, shared by the supervisor and its workers (one writer at a time: the worker,
/// under its own lock). Appends `size` bytes of `record`: 0, or -1 when there is no room (or no
/// log). `restart` begins writing it again whole, which counts from `commit(1)` on (a worker
/// that dies before leaves the old log whole; `commit(0)` gives up and keeps it); `read` gives
/// its bytes and their count.
int cssp_node_log_append(const void *record, size_t size);
void cssp_node_log_restart(void);
void cssp_node_log_commit(int complete);
size_t cssp_node_log_read(const unsigned char **bytes);

/// The handle log: the file handles the kernel holds, in the same way (the files room's).
int cssp_handle_log_append(const void *record, size_t size);
void cssp_handle_log_restart(void);
void cssp_handle_log_commit(int complete);
size_t cssp_handle_log_read(const unsigned char **bytes);

/// Points both logs' appends at what a successor reads (the supervisor, before each worker).
void cssp_logs_settle(void);

/// Maps both logs in this process, as the supervisor does (unit tests of the logs); 0 or -1.
int cssp_logs_map_for_testing(void);

/// Requests sent again at the kernel's RESEND are marked by this bit of their unique id.
#define CSSP_FUSE_UNIQUE_RESEND (1ULL << 63)
#endif
