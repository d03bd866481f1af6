#if canImport(Glibc)
import Glibc
#endif

/// Everything `mount.cssp` was asked to do, parsed from its arguments.
public struct MountOptions: Sendable, Equatable {
    public var endpoint: Endpoint
    public var mountpoint: String
    public var foreground = false
    /// `mount -f` (fake): everything is checked, nothing is mounted.
    public var fake = false
    public var debug = false
    public var verbose = false
    public var passwdFile: String? = nil
    /// s3:// and cos://: the server (`endpoint=URL`), the region, path-style addressing forced,
    /// and the profile of `~/.aws/credentials` (s3://).
    public var storeEndpoint: String? = nil
    public var region: String? = nil
    public var pathStyle = false
    public var profile: String? = nil
    public var readOnly = false
    public var allowOther = false
    public var allowRoot = false
    public var defaultPermissions = false
    public var uid: UInt32? = nil
    public var gid: UInt32? = nil
    public var umask: UInt16 = 0o022
    public var attributeTimeout = 1.0
    /// Seconds a chmod, chown or utimes of a closed file waits for a rename or upload to carry
    /// it before it is stored on its own (0: at once).
    public var attributeWriteDelay = 1.0
    public var entryTimeout = 1.0
    public var negativeTimeout = 1.0
    public var directoryTimeout = 5.0
    public var maxThreads = 16
    public var retries = 6
    public var connectTimeout = 10
    public var stallTimeout = 30
    public var lowSpeedLimit = 1024
    public var requestTimeout = 60
    public var copyTimeout = 3600
    /// TLS: extra CA certificates (a PEM file, a hashed directory), or no verification at all.
    public var caFile: String? = nil
    public var caPath: String? = nil
    public var insecure = false
    public var readAheadMiB = 24
    /// MiB of fetched data all readers hold in memory together (read-ahead stops there).
    public var memoryMiB = 64
    /// Seconds an unmount waits for uploads in progress and retries owed ones before the daemon
    /// exits (what is still owed stays journaled for the next mount).
    public var drainTimeout = 120
    /// Write-back: a close journals the file locally and returns; a queue stores it.
    public var writeBack = false
    public var writeBackDelay = 1.0
    /// `writeback_max_mb` (nil: a quarter of the free space of cache_dir, at least 256 MiB).
    public var writeBackMaxMiB: Int? = nil
    /// `-o log_level`: error, warn, notice (the default), info or debug; nil when not given.
    public var logLevel: String? = nil
    /// Listed entries HEADed in the background per listing (0: none).
    public var metadataPrefetch = 10_000
    /// `foreign_attrs`: other tools' objects described by a HEAD (`head`, the default, true) or
    /// by the listing alone (`listing`, false).
    public var foreignAttributesFromHead = true
    /// Listings of subdirectories fetched at once ahead of a walk (`list_ahead`).
    public var listAhead = 8
    /// At most this many names' attributes and, apart, names in remembered listings (`meta_max_entries`; 0: no bound).
    public var metaMaxEntries = 250_000
    /// `O_CREAT|O_EXCL` checked by the server (`excl_create=server`: the empty file is stored
    /// with If-None-Match before the open returns) or by this mount only (`local`, the default).
    public var serverExclusiveCreates = false
    /// Seconds between the polls for other clients' changes (`poll_s`; 0: none).
    public var pollSeconds = 1.0
    /// Bytes the block cache may hold (0: no cache; nil: the default, see `MountCommand`).
    public var cacheSize: Int64? = nil
    public var cacheBlockKiB = 1024
    /// Spool files live below this directory (nil: the default for the user).
    public var cacheDirectory: String? = nil
    public var multipartThresholdMiB = 64
    public var partSizeMiB = 32
    public var uploadParallelism = 4
    /// Generic kernel mount flags passed through to libfuse (nosuid, nodev, noatime, …).
    public var kernelFlags: [String] = []
    public var fsname: String? = nil
    /// Options mount(8) records in /run/mount/utab and passes on (`_netdev`, `x-*` when run by
    /// hand), as given: the mount's own utab line keeps them.
    public var utabRecordedOptions: [String] = []
    /// `-n`, mount(8)'s "do not write /etc/mtab": no utab line either, as in libmount.
    public var noUtab = false

    /// The options of the mount's line in /run/mount/utab, or nil for no line. `helper=cssp`
    /// makes umount(8) run /sbin/umount.cssp (MountCommand's `Utab` has the details).
    public var utabOptions: String? {
        noUtab ? nil : (utabRecordedOptions + ["helper=cssp"]).joined(separator: ",")
    }

    public init(endpoint: Endpoint, mountpoint: String) {
        self.endpoint = endpoint
        self.mountpoint = mountpoint
    }
}

/// What the command line asks for.
public enum Command: Sendable, Equatable {
    case mount(MountOptions)
    case help
    case version
    /// `--stats MOUNTPOINT`, `--status MOUNTPOINT`: ask the running mount's daemon.
    case ask(ControlQuestion, mountpoint: String)
}

public enum ControlQuestion: String, Sendable, Equatable {
    case stats, status
    /// The worker makes way for the installed binary (issue 40): `--restart`.
    case restart
    /// The unmount helper's question: store what is owed now (answered when done).
    case drain
}

/// Parses `mount.cssp URL MOUNTPOINT [-o opt[,opt…]] [-f] [-d] [-s] [-n] [-v]`, the mount(8)
/// helper convention. Flags and -o may come before, between or after the two positionals.
public enum Arguments {
    /// Options mount(8), fstab or systemd use that mean nothing to the filesystem itself.
    static let mountOnlyOptions: Set<String> = [
        "_netdev", "nofail", "noauto", "auto", "user", "users", "nouser", "owner", "group", "defaults",
    ]
    /// Generic flags the kernel applies to any mount; passed through.
    static let kernelFlags: Set<String> = [
        "nosuid", "suid", "nodev", "dev", "noexec", "exec", "noatime", "atime", "relatime", "norelatime",
        "strictatime", "nodiratime", "diratime", "lazytime", "nolazytime", "sync", "async", "dirsync",
    ]

    /// `calledByMount`: mount(8) runs us (it passes `-f` meaning *fake*, not foreground).
    /// `directory`: what relative paths are resolved against (the current directory; the
    /// daemon's becomes `/` once it detaches).
    public static func parse(_ arguments: [String], calledByMount: Bool = false, directory: String = currentDirectory())
        throws(ConfigurationError) -> Command
    {
        var positionals: [String] = []
        var optionLists: [String] = []
        var foreground = false
        var fake = false
        var debug = false
        var verbose = false
        var noUtab = false
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            switch argument {
            case "-h", "--help": return .help
            case "-V", "--version": return .version
            case "--stats", "--status", "--unmount", "--restart":
                let questions: [String: ControlQuestion] = [
                    "--stats": .stats, "--status": .status, "--unmount": .drain, "--restart": .restart,
                ]
                let question = questions[argument]!
                let rest = positionals + arguments[index...].filter { !$0.hasPrefix("-") }
                guard rest.count == 1 else {
                    throw ConfigurationError("usage: mount.cssp \(argument) MOUNTPOINT")
                }
                return .ask(question, mountpoint: rest[rest.startIndex])
            case "-f": if calledByMount { fake = true } else { foreground = true }
            case "-d": debug = true; foreground = true
            case "-s": break  // mount(8): sloppy; nothing to do.
            case "-n": noUtab = true  // mount(8): no mtab.
            case "-v": verbose = true
            case "-o", "-t", "-N":
                guard index < arguments.count else { throw ConfigurationError("\(argument) needs a value") }
                if argument == "-o" { optionLists.append(arguments[index]) }
                index += 1
            default:
                if argument.hasPrefix("-o") && argument.count > 2 {
                    optionLists.append(String(argument.dropFirst(2)))
                } else if argument.hasPrefix("-") && argument != "-" {
                    throw ConfigurationError("unknown flag '\(argument)': see mount.cssp --help")
                } else {
                    positionals.append(argument)
                }
            }
        }
        guard positionals.count == 2 else {
            throw ConfigurationError(
                positionals.count < 2
                    ? "usage: mount.cssp URL MOUNTPOINT [-o options]: see mount.cssp --help"
                    : "too many arguments ('\(positionals[2])'): usage: mount.cssp URL MOUNTPOINT [-o options]")
        }
        var options = MountOptions(endpoint: try Endpoint(parsing: positionals[0]), mountpoint: positionals[1])
        options.foreground = foreground
        options.fake = fake
        options.debug = debug
        options.verbose = verbose
        options.noUtab = noUtab
        for list in optionLists {
            for option in splitOptions(list) where !option.isEmpty {
                try apply(option, to: &options)
            }
        }
        try options.endpoint.resolve(endpoint: options.storeEndpoint, region: options.region, pathStyle: options.pathStyle)
        if options.profile != nil && options.endpoint.dialect != .s3 {
            throw ConfigurationError("option 'profile' names a profile of ~/.aws/credentials: it is for s3:// URLs")
        }
        func resolved(_ path: String) -> String { path.hasPrefix("/") ? path : directory + "/" + path }
        options.mountpoint = resolved(options.mountpoint)
        options.cacheDirectory = options.cacheDirectory.map(resolved)
        options.passwdFile = options.passwdFile.map(resolved)
        options.caFile = options.caFile.map(resolved)
        options.caPath = options.caPath.map(resolved)
        return .mount(options)
    }

    /// The process's current directory.
    public static func currentDirectory() -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        guard getcwd(&buffer, buffer.count) != nil else { return "/" }
        return String(cString: buffer)
    }

    /// Splits an option list at commas; `\,` is a comma inside a value (a path), `\\` a backslash.
    static func splitOptions(_ list: String) -> [String] {
        var options: [String] = []
        var current = ""
        var escaped = false
        for character in list {
            if escaped {
                current.append(character)
                escaped = false
            } else if character == "\\" {
                escaped = true
            } else if character == "," {
                options.append(current)
                current = ""
            } else {
                current.append(character)
            }
        }
        if escaped { current.append("\\") }
        options.append(current)
        return options
    }

    static func apply(_ option: String, to options: inout MountOptions) throws(ConfigurationError) {
        let parts = option.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
        let name = String(parts[0])
        let value = parts.count > 1 ? String(parts[1]) : nil
        guard !name.isEmpty else {
            throw ConfigurationError("option '\(option)' has no name: write NAME=VALUE (see mount.cssp --help)")
        }
        func needValue() throws(ConfigurationError) -> String {
            guard let value, !value.isEmpty else { throw ConfigurationError("option '\(name)' needs a value: \(name)=…") }
            return value
        }
        func seconds() throws(ConfigurationError) -> Double {
            let text = try needValue()
            guard let v = Double(text), v >= 0, v.isFinite else {
                throw ConfigurationError("option '\(name)' needs a number of seconds ≥ 0, not '\(text)'")
            }
            return v
        }
        func integer(_ range: ClosedRange<Int>) throws(ConfigurationError) -> Int {
            let text = try needValue()
            guard let v = Int(text), range.contains(v) else {
                throw ConfigurationError("option '\(name)' needs an integer in \(range.lowerBound)…\(range.upperBound), not '\(text)'")
            }
            return v
        }
        func byteCount() throws(ConfigurationError) -> Int64 {
            let text = try needValue()
            let units: [Character: Int64] = ["K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40]
            var digits = Substring(text)
            var unit: Int64 = 1 << 20
            if let last = digits.last?.uppercased().first, let scale = units[last] {
                unit = scale
                digits = digits.dropLast()
            }
            guard let v = Int64(digits), v >= 0, v <= (Int64.max >> 41) else {
                throw ConfigurationError("option '\(name)' needs a size such as 500M, 2G or 0, not '\(text)'")
            }
            return v * unit
        }
        if kernelFlags.contains(name) && value == nil {
            options.kernelFlags.append(name)
            return
        }
        // A value with a comma would need quoting in utab's option string: not recorded.
        if (name == "_netdev" || name.hasPrefix("x-")) && !option.contains(",") {
            options.utabRecordedOptions.append(option)
        }
        // helper=cssp: every mount's utab line has it anyway (see `utabOptions`).
        if mountOnlyOptions.contains(name) || name.hasPrefix("x-") || name == "comment" || name == "helper" { return }
        switch name {
        case "ro": options.readOnly = true
        case "rw": options.readOnly = false  // the last of ro/rw wins, as in mount(8)
        case "passwd_file": options.passwdFile = try needValue()
        case "endpoint": options.storeEndpoint = try needValue()
        case "region": options.region = try needValue()
        case "path_style": options.pathStyle = true
        case "profile": options.profile = try needValue()
        case "allow_other": options.allowOther = true
        case "allow_root": options.allowRoot = true
        case "default_permissions": options.defaultPermissions = true
        case "uid": options.uid = UInt32(try integer(0...Int(UInt32.max - 1)))
        case "gid": options.gid = UInt32(try integer(0...Int(UInt32.max - 1)))
        case "umask":
            let text = try needValue()
            guard let v = UInt16(text, radix: 8), v <= 0o777 else {
                throw ConfigurationError("option 'umask' needs an octal mask such as 022, not '\(text)'")
            }
            options.umask = v
        case "attr_timeout": options.attributeTimeout = try seconds()
        case "attr_write_delay": options.attributeWriteDelay = try seconds()
        case "entry_timeout": options.entryTimeout = try seconds()
        case "negative_timeout": options.negativeTimeout = try seconds()
        case "dir_timeout": options.directoryTimeout = try seconds()
        case "max_threads": options.maxThreads = try integer(1...256)
        case "retries": options.retries = try integer(0...20)
        case "connect_timeout": options.connectTimeout = try integer(1...600)
        case "stall_timeout": options.stallTimeout = try integer(1...3600)
        case "low_speed_limit": options.lowSpeedLimit = try integer(1...(1 << 30))
        case "request_timeout": options.requestTimeout = try integer(1...86_400)
        case "copy_timeout": options.copyTimeout = try integer(1...86_400)
        case "cafile": options.caFile = try needValue()
        case "capath": options.caPath = try needValue()
        case "insecure": options.insecure = true
        case "readahead_mb": options.readAheadMiB = try integer(0...1024)
        case "memory_mb": options.memoryMiB = try integer(8...65_536)
        case "drain_timeout": options.drainTimeout = try integer(0...86_400)
        case "writeback": options.writeBack = true
        case "writeback_delay": options.writeBackDelay = try seconds()
        case "writeback_max_mb": options.writeBackMaxMiB = try integer(1...(1 << 24))
        case "log_level":
            let level = try needValue()
            guard ["error", "warn", "notice", "info", "debug"].contains(level) else {
                throw ConfigurationError("option 'log_level' needs error, warn, notice, info or debug, not '\(level)'")
            }
            options.logLevel = level
        case "meta_prefetch": options.metadataPrefetch = try integer(0...1_000_000)
        case "foreign_attrs":
            let value = try needValue()
            guard value == "head" || value == "listing" else {
                throw ConfigurationError("option 'foreign_attrs' needs head or listing, not '\(value)'")
            }
            options.foreignAttributesFromHead = value == "head"
        case "list_ahead": options.listAhead = try integer(0...64)
        case "meta_max_entries": options.metaMaxEntries = try integer(0...1_000_000_000)
        case "poll_s":
            let value = try seconds()
            guard value == 0 || value >= 0.1 else {
                throw ConfigurationError("option 'poll_s' needs 0 (no polling) or at least 0.1 seconds, not '\(value)'")
            }
            options.pollSeconds = value
        case "excl_create":
            let value = try needValue()
            guard value == "server" || value == "local" else {
                throw ConfigurationError("option 'excl_create' needs server or local, not '\(value)'")
            }
            options.serverExclusiveCreates = value == "server"
        case "cache_size": options.cacheSize = try byteCount()
        case "cache_block_kb":
            let kib = try integer(64...16384)
            guard kib & (kib - 1) == 0 else {
                throw ConfigurationError("option 'cache_block_kb' needs a power of two (64, 128, … 16384), not '\(kib)'")
            }
            options.cacheBlockKiB = kib
        case "cache_dir": options.cacheDirectory = try needValue()
        case "multipart_threshold_mb": options.multipartThresholdMiB = try integer(1...5120)
        case "part_size_mb": options.partSizeMiB = try integer(1...5120)
        case "upload_parallel": options.uploadParallelism = try integer(1...64)
        case "fsname": options.fsname = try needValue()
        case "debug": options.debug = true; options.foreground = true
        case "foreground": options.foreground = true
        default:
            throw ConfigurationError("unknown option '\(option)': see mount.cssp --help for the options")
        }
    }

    public static let usage = """
        usage: mount.cssp URL MOUNTPOINT [-o option[,option...]] [-f] [-d]
               mount.cssp --stats MOUNTPOINT | --status MOUNTPOINT | --unmount MOUNTPOINT
               mount.cssp --restart MOUNTPOINT

        Mounts the container or bucket at URL on MOUNTPOINT. URL is one of
          http(s)://HOST[:PORT]/CONTAINER[/PREFIX]   a CSSP container (the Swift API)
          s3://BUCKET[/PREFIX]                       a bucket of an S3-compatible store
          cos://BUCKET-APPID[/PREFIX]                a bucket of Tencent COS

        flags:
          -f                     stay in the foreground (log to stderr); when mount(8) runs
                                 mount.cssp, its "fake": check everything, mount nothing
          -d                     log every FUSE operation; implies -f
          -s                     accepted for mount(8), ignored
          -n                     mount(8)'s "no mtab": no line in /run/mount/utab, so umount
                                 does not wait for uploads
          -v                     log mounts and unmounts (info level)
          -h, --help             this text;  -V, --version  the version
          --stats MOUNTPOINT     the running mount's statistics (Prometheus text format)
          --status MOUNTPOINT    its processes, uploads in progress and owed, for people
          --unmount MOUNTPOINT   store what is owed (up to drain_timeout), then unmount; also
                                 what umount(8) runs (as /sbin/umount.cssp)
          --restart MOUNTPOINT   the mount's worker makes way for the installed mount.cssp
                                 (after an upgrade): no unmount, open files stay open

        options (-o; a comma inside a value is written \\,):
          passwd_file=PATH       credentials file (ACCESS_KEY:SECRET or URL:ACCESS_KEY:SECRET), mode 600
          endpoint=URL           s3://, cos://: the server, http(s)://HOST[:PORT], addressed path-style
                                 (default: AWS's regional endpoint, or COS's for the region)
          region=REGION          s3://, cos://: the bucket's region (s3 default us-east-1; cos://
                                 needs it unless endpoint= is given)
          path_style             s3://, cos://: the bucket in the path, not in the host name
          profile=NAME           s3://: the profile of ~/.aws/credentials (default $AWS_PROFILE or default)
          ro, rw                 read-only mount (writes fail with EROFS), or not (the default);
                                 the last one given wins
          foreground             as -f, also when mount(8) runs mount.cssp
          debug                  as -d
          allow_other            let other users access the mount (needs user_allow_other for non-root)
          allow_root             let root access the mount
          default_permissions    let the kernel check permissions against the modes shown
          uid=N, gid=N           owner of every file (default: the mounting user)
          umask=OCTAL            bits cleared from modes 0777/0666 (default 022)
          attr_timeout=S         seconds the kernel caches attributes (default 1)
          entry_timeout=S        seconds the kernel caches names (default 1)
          negative_timeout=S     seconds the kernel caches "no such file" (default 1)
          dir_timeout=S          seconds a complete listing answers lookups (default 5)
          readahead_mb=N         largest sequential read-ahead window in MiB, 0 = off (default 24)
          memory_mb=N            fetched data all readers hold at once; read-ahead waits, demand reads
                                 add at most max_threads blocks (default 64)
          meta_prefetch=N        after a listing, HEAD up to N directories and empty files in the
                                 background (their attributes are on a marker, or a DLO's); and HEAD
                                 other tools' files ahead of the lookups of ls -l, du or rsync; 8 at
                                 a time; 0 = off (default 10000)
          foreign_attrs=head     other tools' files (mtime only in X-Object-Meta-Mtime) show the
                                 mtime, mode and owner their metadata headers say, from a HEAD before
                                 the first stat (kept in cache_dir: once per object); listing: the
                                 listing's size and time, no HEAD (default head)
          list_ahead=N           after readdir lists a directory, list up to N of its subdirectories
                                 at once ahead of find, du or rsync; 0 = off (default 8)
          meta_max_entries=N     keep the attributes of at most N names (files of the directories used
                                 longest ago are handed back to the kernel to forget) and at most N
                                 names in remembered listings; about 250 bytes each; 0 = no bound
                                 (default 250000)
          poll_s=S               every S seconds, one listing of the directories in use (or a HEAD of
                                 the container) shows other clients' changes at once; 0 = off (default 1)
          excl_create=server     O_CREAT|O_EXCL (lock files) is checked by the server: the empty file
                                 is stored before the open returns, so that of several hosts one
                                 wins; costs two requests per new file (cp and rsync use O_EXCL).
                                 excl_create=local (the default) checks this mount only
          cache_size=SIZE        block cache size, e.g. 500M or 4G; plain numbers are MiB; 0 = no
                                 cache (default 4G, or a quarter of the free space if less)
          cache_block_kb=N       block cache block size in KiB, a power of two (default 1024)
          cache_dir=PATH         block cache and spool of files being written (default /var/cache/csspfs for
                                 root, else $XDG_CACHE_HOME/csspfs or ~/.cache/csspfs)
          multipart_threshold_mb=N  files larger than this are uploaded in parts (default 64)
          part_size_mb=N         size of one part (default 32)
          upload_parallel=N      parts uploaded at once (default 4)
          attr_write_delay=S     a chmod, chown or touch of a closed file waits this long for a rename
                                 or write to carry it before it is stored alone; journaled meanwhile
                                 (default 1; 0 = at once)
          drain_timeout=S        at unmount, wait this long for uploads in progress and owed
                                 (default 120); what is left stays journaled for the next mount
          writeback              close, unlink and rmdir return once journaled on the local disk;
                                 a queue stores them (off by default; fsync and unmount wait)
          writeback_delay=S      seconds a closed file waits in that queue, so that a rename
                                 right after the close costs no request (default 1)
          writeback_max_mb=N     closes wait while the files not yet stored hold more than this
                                 (default a quarter of the free space of cache_dir, at least 256)
          max_threads=N          FUSE worker threads (default 16)
          retries=N              retries of a failed idempotent request (default 6)
          connect_timeout=S      seconds to connect (default 10)
          stall_timeout=S        seconds below low_speed_limit before a transfer fails (default 30)
          low_speed_limit=B      bytes per second a transfer must keep up (default 1024)
          request_timeout=S      deadline of a request, plus its size at low_speed_limit (default 60)
          copy_timeout=S         deadline of a server-side copy (default 3600)
          cafile=PATH            PEM file of CA certificates that sign the server's (private CA)
          capath=DIR             directory of hashed CA certificates (openssl rehash)
          insecure               no certificate verification (warned at every mount)
          fsname=NAME            name in the mount table (default: the URL)
          helper=cssp            accepted, no longer needed: every mount made as root records it
                                 in /run/mount/utab, so umount runs /sbin/umount.cssp
          log_level=LEVEL        error, warn, notice (default; info with -v), info or debug;
                                 SIGUSR1 turns debug on and off at run time
          nosuid,nodev,noexec,noatime,...  passed to the kernel
          _netdev,nofail,noauto,auto,user,users,nouser,owner,group,defaults,x-*,comment=
                                 ignored (mount(8), fstab, systemd)

        credentials, first found:
          http(s)://  -o passwd_file, $CSSP_PASSWD_FILE, ~/.passwd-cssp, /etc/passwd-cssp,
                      $CSSP_ACCESS_KEY_ID with $CSSP_SECRET_ACCESS_KEY
          s3://       -o passwd_file, $AWS_ACCESS_KEY_ID with $AWS_SECRET_ACCESS_KEY (and
                      $AWS_SESSION_TOKEN), ~/.aws/credentials ($AWS_SHARED_CREDENTIALS_FILE) [profile]
          cos://      -o passwd_file, $TENCENTCLOUD_SECRET_ID with $TENCENTCLOUD_SECRET_KEY (and
                      $TENCENTCLOUD_SESSION_TOKEN)

        exit status: 0 mounted (with -f: unmounted cleanly), 1 bad arguments or configuration,
        32 the store or the mount failed, 75 unmounted with uploads still owed (journaled).
        umount(8) runs /sbin/umount.cssp (a link to mount.cssp; the mount records helper=cssp in
        /run/mount/utab): it stores what is owed, then unmounts. fusermount3 -u returns at once.
        """
}
