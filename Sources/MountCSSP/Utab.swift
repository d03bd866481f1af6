import CMount
import Logging
import MountCSSPConfig

#if canImport(Glibc)
import Glibc
#endif

/// A mount's line in util-linux's /run/mount/utab: what makes a plain `umount MOUNTPOINT` run
/// the umount helper, which stores what is owed before it unmounts. Written and removed through
/// libmount, which takes the file's lock and replaces it whole, as mount(8) and umount(8) do.
///
/// 1. umount(8) (util-linux 2.38) runs `/sbin/umount.TYPE` only when it knows the mount's type
///    with its subtype. Without a utab line for the mountpoint it asks statfs(2), which says
///    `fuse`; there is no /sbin/umount.fuse, so it calls umount(2) itself and returns at once.
///    With a line it reads /proc/self/mountinfo (type `fuse.cssp`) and adds the line's options
///    to that entry: `helper=cssp` makes it run /sbin/umount.cssp; a line whose source is not
///    the kernel's is not added, and the type finds /sbin/umount.fuse.cssp. Both are links to
///    mount.cssp.
/// 2. mount(8) records only options it knows (`helper=cssp` had to be given), so the daemon
///    records its own line. mount(8), finding a line of the same source and mountpoint when its
///    helper returns, adds none.
/// 3. The file is root's: a user's mount records nothing. umount(8) run by a user reads
///    mountinfo anyway and should find /sbin/umount.fuse.cssp by the type (not tested here:
///    the tests mount as root; users have `mount.cssp --unmount`).
/// 4. umount(8) removes the line after its helper. Any other end of the mount (fusermount3 -u,
///    SIGTERM, anyone's umount(2)) leaves that to the daemon, once the kernel let go of the mount.
///    The line of a daemon killed with SIGKILL stays, as its dead mount does, until the next
///    mount on the mountpoint (or a umount of the dead mount); once the dead mount is detached
///    by other means, the next csspfs mount anywhere removes it (`forgetStaleLines`).
/// 5. A line is stale once nothing is mounted on its mountpoint: then every line for it goes,
///    whoever wrote it. While anything is mounted there (a dead mount too), none is touched.
enum Utab {
    /// Records that `source` (as the kernel's mount table shows it) is mounted on `target` (a
    /// canonical path) with `options`. Not root: nothing to do (the file is root's).
    static func record(source: String, target: String, options: String, logger: Logger) {
        guard let entry = mnt_new_fs() else { return }
        defer { mnt_unref_fs(entry) }
        guard mnt_fs_set_source(entry, source) == 0, mnt_fs_set_target(entry, target) == 0,
            mnt_fs_set_fstype(entry, "fuse.cssp") == 0, mnt_fs_set_options(entry, options) == 0,
            let update = mnt_new_update()
        else { return }
        defer { mnt_free_update(update) }
        let prepared = mnt_update_set_fs(update, 0, nil, entry)
        if prepared == -EACCES {
            logger.debug("no line in /run/mount/utab: it is root's")
            return
        }
        let rc = prepared == 0 ? mnt_update_table(update, nil) : prepared
        if rc != 0 {
            logger.warning(
                "cannot record the mount in /run/mount/utab (\(String(cString: strerror(-rc)))): umount will not wait for uploads; use mount.cssp --unmount \(target)")
        }
    }

    /// Removes the lines for `target` if nothing is mounted there (see 5 above).
    static func forgetStale(target: String, logger: Logger) {
        // libmount removes the last line for a mountpoint per update: one pass per line.
        for _ in 0..<8 {
            guard !isMountpoint(target), let update = mnt_new_update() else { return }
            defer { mnt_free_update(update) }
            guard mnt_update_set_fs(update, 0, target, nil) == 0, let file = mnt_update_get_filename(update),
                utabHasLine(String(cString: file), for: target)
            else { return }
            let rc = mnt_update_table(update, nil)
            guard rc == 0 else {
                logger.warning("cannot remove the line of \(target) from /run/mount/utab: \(String(cString: strerror(-rc)))")
                return
            }
        }
    }

    /// Removes the lines of csspfs mounts (`helper=cssp`) whose mountpoint has nothing mounted
    /// any more, wherever they are: a daemon killed with SIGKILL whose dead mount was then
    /// detached by hand (`fusermount3 -u`) leaves its line with nobody to remove it. Each mount
    /// sweeps them.
    static func forgetStaleLines(logger: Logger) {
        guard let text = WholeFile.text("/run/mount/utab") else { return }
        var targets: Set<String> = []
        for line in text.split(separator: "\n") where line.contains("helper=cssp") {
            guard let field = line.split(separator: " ").first(where: { $0.hasPrefix("TARGET=") }) else { continue }
            targets.insert(unescapedFromTable(String(field.dropFirst("TARGET=".count))))
        }
        for target in targets.sorted() { forgetStale(target: target, logger: logger) }
    }

    /// Undoes `escapedForTable`: `\ooo` octal escapes.
    static func unescapedFromTable(_ text: String) -> String {
        var bytes: [UInt8] = []
        var rest = Substring(text).utf8[...]
        while let byte = rest.first {
            let digits = rest.dropFirst().prefix(3)
            if byte == UInt8(ascii: "\\"), digits.count == 3, let value = UInt8(String(decoding: digits, as: UTF8.self), radix: 8) {
                bytes.append(value)
                rest = rest.dropFirst(4)
            } else {
                bytes.append(byte)
                rest = rest.dropFirst()
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Whether /proc/self/mountinfo lists a mount on `target`, compared as written (a dead mount
    /// cannot be resolved). Unreadable: as if it did, so that no line is removed.
    static func isMountpoint(_ target: String) -> Bool {
        guard let table = mnt_new_table_from_file("/proc/self/mountinfo") else { return true }
        defer { mnt_unref_table(table) }
        return mnt_table_find_target(table, target, Int32(MNT_ITER_BACKWARD)) != nil
    }

    /// The device number of the mount on `target` (as mountinfo writes it), from
    /// /proc/self/mountinfo: no request to the mount, which a worker must never send itself (a
    /// thread of it waiting on its own mount keeps the process from exiting).
    static func device(of target: String) -> dev_t? {
        guard let table = mnt_new_table_from_file("/proc/self/mountinfo") else { return nil }
        defer { mnt_unref_table(table) }
        guard let fs = mnt_table_find_target(table, target, Int32(MNT_ITER_BACKWARD)) else { return nil }
        return mnt_fs_get_devno(fs)
    }

    /// Whether utab (`file`) has a line for `target`, compared as written, with the file's
    /// escapes. (libmount 2.38 reads utab's lines when asked for a table of it, but finds no
    /// target among them.)
    static func utabHasLine(_ file: String, for target: String) -> Bool {
        guard let text = WholeFile.text(file) else { return false }
        let escaped = " TARGET=" + escapedForTable(target) + " "
        return text.split(separator: "\n").contains { $0.contains(escaped) }
    }

    /// `path` as mount tables write it: space, tab, newline and backslash in octal.
    static func escapedForTable(_ path: String) -> String {
        var out = ""
        for scalar in path.unicodeScalars {
            switch scalar {
            case " ", "\t", "\n", "\\":
                let octal = String(scalar.value, radix: 8)
                out += "\\" + String(repeating: "0", count: max(0, 3 - octal.count)) + octal
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}
