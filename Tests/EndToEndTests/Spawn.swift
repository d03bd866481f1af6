import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Child processes without Foundation's Process, whose waitUntilExit was seen to hang forever on a
/// child that forks a daemon and exits. Pipes are close-on-exec, so concurrently spawned children
/// never inherit another child's pipe (which would delay its EOF).
struct Child {
    let pid: pid_t

    /// Starts `argv` with stdin from /dev/null and stdout/stderr on the given descriptors.
    static func spawn(_ argv: [String], environment: [String: String]?, stdout: Int32, stderr: Int32) throws -> Child {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, stdout, 1)
        posix_spawn_file_actions_adddup2(&actions, stderr, 2)
        let env = (environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" }
        var cArgv = argv.map { strdup($0) } + [nil]
        var cEnv = env.map { strdup($0) } + [nil]
        defer {
            cArgv.forEach { free($0) }
            cEnv.forEach { free($0) }
        }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, argv[0], &actions, nil, &cArgv, &cEnv)
        guard rc == 0 else { throw HarnessError("cannot start \(argv[0]): \(String(cString: strerror(rc)))") }
        return Child(pid: pid)
    }

    /// Waits for the child; returns its exit status (128 + signal if killed).
    func wait() -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        return Child.decode(status)
    }

    /// The exit status if the child has exited (reaping it), else nil.
    func poll() -> Int32? {
        var status: Int32 = 0
        let rc = waitpid(pid, &status, WNOHANG)
        return rc == pid ? Child.decode(status) : nil
    }

    static func decode(_ status: Int32) -> Int32 {
        let signal = status & 0x7f
        return signal == 0 ? (status >> 8) & 0xff : 128 + signal
    }
}

/// Runs `command` with bash, collects stdout and stderr, waits for it.
@discardableResult
func shell(_ command: String, environment: [String: String]? = nil) throws -> Output {
    var out: [Int32] = [0, 0]
    var err: [Int32] = [0, 0]
    // pipe2(O_CLOEXEC) is not visible to Swift without _GNU_SOURCE; set the flag right after.
    guard pipe(&out) == 0, pipe(&err) == 0 else { throw HarnessError("pipe failed") }
    for fd in out + err { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    let child: Child
    do {
        child = try Child.spawn(["/bin/bash", "-c", command], environment: environment, stdout: out[1], stderr: err[1])
    } catch {
        [out[0], out[1], err[0], err[1]].forEach { close($0) }
        throw error
    }
    close(out[1])
    close(err[1])
    var collected: [[UInt8]] = [[], []]
    var fds = [pollfd(fd: out[0], events: Int16(POLLIN), revents: 0), pollfd(fd: err[0], events: Int16(POLLIN), revents: 0)]
    var open = 2
    var buffer = [UInt8](repeating: 0, count: 65536)
    while open > 0 {
        if poll(&fds, 2, -1) < 0 {
            if errno == EINTR { continue }
            break
        }
        for i in 0..<2 where fds[i].fd >= 0 && fds[i].revents != 0 {
            let n = read(fds[i].fd, &buffer, buffer.count)
            if n > 0 {
                collected[i] += buffer[0..<n]
            } else if n == 0 || errno != EINTR {
                close(fds[i].fd)
                fds[i].fd = -1
                open -= 1
            }
        }
    }
    let status = child.wait()
    return Output(
        status: status, stdout: String(decoding: collected[0], as: UTF8.self),
        stderr: String(decoding: collected[1], as: UTF8.self))
}
