import CFuse3
import BlockCache
import Dispatch
import FileSystem
import FuseAdapter
import Logging
import Metrics
import MountCSSPConfig
import ObjectStore
import ObjectStoreHTTP

#if canImport(Glibc)
import Glibc
#endif

/// The composition root: parses, checks, mounts, serves. Every failure before the mount is one
/// line on stderr and a nonzero exit status; nothing is left mounted.
enum MountCommand {
    static let version = "0.1.0"

    enum ExitStatus {
        static let success: Int32 = 0
        static let usage: Int32 = 1
        static let mountFailure: Int32 = 32
        /// Unmounted, but uploads are still owed after drain_timeout (journaled for the next
        /// mount): sysexits' EX_TEMPFAIL.
        static let owed: Int32 = 75
    }

    /// The names umount(8) runs mount.cssp by (links to it): `umount.cssp` for the `helper=cssp`
    /// of the mount's utab line, `umount.fuse.cssp` for its type (see `Utab`).
    static let unmountHelperNames: Set<String> = ["umount.cssp", "umount.fuse.cssp"]

    static func run(arguments: [String], programName: String = "mount.cssp") -> Int32 {
        // Only the main thread may receive termination signals (libfuse's handler wakes it);
        // threads started from now on inherit the block. SIGPIPE must never kill the daemon.
        _ = cssp_block_termination_signals(1)
        _ = cssp_block_usr1()
        signal(SIGPIPE, SIG_IGN)
        // Transfer buffers (1–8 MiB) must go back to the system when freed. glibc raises its mmap
        // threshold after the first such free and then keeps them in per-thread heaps: the
        // daemon's memory grew to 230 MiB under 4 random readers. A fixed threshold stops that.
        _ = cssp_fixed_mmap_threshold(256 << 10)
        // Descriptors: open files' spools, curl connections and SQLite share the process's; the
        // soft limit (often 1024) is raised to the hard one, as servers do.
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }

        let command: Command
        do throws(ConfigurationError) {
            if let name = programName.split(separator: "/").last.map(String.init), unmountHelperNames.contains(name) {
                // umount(8): `umount.cssp MOUNTPOINT [-flags] [-t fuse.cssp] [-N namespace]`.
                var mountpoints: [String] = []
                var flags = ""
                var index = 0
                while index < arguments.count {
                    let argument = arguments[index]
                    index += 1
                    if argument == "-t" || argument == "-N" {
                        index += 1
                    } else if argument.hasPrefix("-") {
                        flags += argument
                    } else {
                        mountpoints.append(argument)
                    }
                }
                guard mountpoints.count == 1 else { throw ConfigurationError("usage: \(name) MOUNTPOINT") }
                return unmountHelper(mountpoints[0], lazy: flags.contains("l"))
            }
            command = try Arguments.parse(arguments, calledByMount: parentIsMount())
        } catch {
            return fail(error.message, ExitStatus.usage)
        }
        switch command {
        case .help:
            print(Arguments.usage)
            return ExitStatus.success
        case .version:
            print("mount.cssp \(version)")
            return ExitStatus.success
        case .mount(let options):
            return mount(options)
        case .ask(.drain, let mountpoint):
            return unmountHelper(mountpoint, lazy: false)
        case .ask(.restart, let mountpoint):
            var defaults = MountOptions(endpoint: try! Endpoint(parsing: "http://localhost/c"), mountpoint: mountpoint)
            defaults.cacheDirectory = nil
            return restart(mountpoint, cacheDirectory: cacheDirectory(defaults, environment()))
        case .ask(let question, let mountpoint):
            var defaults = MountOptions(endpoint: try! Endpoint(parsing: "http://localhost/c"), mountpoint: mountpoint)
            defaults.cacheDirectory = nil
            let ownCache = cacheDirectory(defaults, environment())
            switch ControlClient.ask(question.rawValue, mountpoint: mountpoint, callerCacheDirectory: ownCache) {
            case .success(let answer):
                print(answer, terminator: "")
                return ExitStatus.success
            case .failure(let error):
                return fail(error.description, ExitStatus.mountFailure)
            }
        }
    }

    /// Whether mount(8) runs us: then `-f` means *fake* (see `Arguments.parse`). mount(8) forks
    /// and executes the helper itself, so it is the parent process.
    static func parentIsMount() -> Bool {
        let fd = open("/proc/\(getppid())/comm", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 32)
        let n = read(fd, &buffer, buffer.count)
        return n > 0 && buffer[0..<n] == Array("mount\n".utf8)[...]
    }

    static func fail(_ message: String, _ status: Int32) -> Int32 {
        LogSink.stderr("mount.cssp: \(message)\n")
        return status
    }

    static func environment() -> [String: String] {
        var result: [String: String] = [:]
        var pointer = environ
        while let entry = pointer.pointee {
            let text = String(cString: entry)
            if let equals = text.firstIndex(of: "=") {
                result[String(text[..<equals])] = String(text[text.index(after: equals)...])
            }
            pointer += 1
        }
        return result
    }

    /// How to reach and sign for the store `endpoint` names (its dialect).
    static func storeConfiguration(_ endpoint: Endpoint, _ credentials: Credentials) -> HTTPStoreConfiguration {
        let signer: any RequestSigning
        let dialect: HTTPDialect
        switch endpoint.dialect {
        case .cssp:
            (signer, dialect) = (RequestSigner(accessKey: credentials.accessKey, secret: credentials.secret), .cssp)
        case .s3:
            let sigV4 = SigV4Signer(
                accessKey: credentials.accessKey, secret: credentials.secret, region: endpoint.region,
                sessionToken: credentials.sessionToken)
            (signer, dialect) = (sigV4, .s3)
        case .cos:
            let cos = COSSigner(accessKey: credentials.accessKey, secret: credentials.secret, sessionToken: credentials.sessionToken)
            (signer, dialect) = (cos, .cos)
        }
        var configuration = HTTPStoreConfiguration(baseURL: endpoint.baseURL, container: endpoint.container, signer: signer)
        configuration.dialect = dialect
        configuration.bucketInHost = endpoint.dialect != .cssp && !endpoint.pathStyle
        return configuration
    }

    /// In the background: the multipart uploads below `prefix` begun more than a day ago are
    /// aborted (a mount that ended in the middle of one left it; S3 keeps its parts until then).
    static func abortStaleUploads(_ store: S3ObjectStore, prefix: String, logger: Logger) {
        DispatchQueue.global(qos: .utility).async {
            do throws(ObjectStoreError) {
                let aborted = try store.abortStaleUploads(prefix: prefix, olderThan: 86_400, now: Double(time(nil)))
                if aborted > 0 {
                    logger.notice("aborted \(aborted) multipart uploads below '\(prefix)' begun more than a day ago (left by a mount that ended)")
                }
            } catch {
                logger.warning("cannot list the multipart uploads left below '\(prefix)': \(error.message)")
            }
        }
    }

    /// The store of `endpoint`'s dialect over `configuration`.
    static func makeStore(
        _ configuration: HTTPStoreConfiguration, _ endpoint: Endpoint, logger: Logger, maxIdleConnections: Int,
        metrics: MountMetrics = MountMetrics()
    ) -> any ObjectStore {
        switch endpoint.dialect {
        case .cssp:
            return HTTPObjectStore(configuration: configuration, logger: logger, maxIdleConnections: maxIdleConnections, metrics: metrics)
        case .s3, .cos:
            // COS names a copy's source by the bucket's host; behind endpoint= (path-style) the
            // bucket is the first segment of the source's path.
            let host = String(endpoint.baseURL.drop { $0 != "/" }.drop { $0 == "/" })
            let copySource = endpoint.dialect != .cos ? nil
                : endpoint.pathStyle ? host + "/" + endpoint.container : host
            return S3ObjectStore(
                configuration: configuration, logger: logger, maxIdleConnections: maxIdleConnections, metrics: metrics,
                copySourceHost: copySource)
        }
    }

    static func mount(_ options: MountOptions) -> Int32 {
        let levels: [String: Logger.Level] = ["error": .error, "warn": .warning, "notice": .notice, "info": .info, "debug": .debug]
        LogSink.shared.level = options.debug ? .debug : options.logLevel.flatMap { levels[$0] } ?? (options.verbose ? .info : .notice)
        LoggingSystem.bootstrap { _ in SinkLogHandler() }
        let logger = Logger(label: "mount.cssp")
        // A worker the supervisor started from the installed binary (`--restart`, issue 40): the
        // mount is there, held by the supervisor; this process checks its options and serves it.
        let worker = FuseSession.attachToSupervisor()
        if worker == .failed {
            return fail(
                "cannot serve as a worker of this mount's supervisor (it is of another csspfs version): the running worker's binary serves on",
                ExitStatus.mountFailure)
        }
        let startedByExec = worker == .attached
        if startedByExec && FuseSession.supervisorUsesSyslog { LogSink.shared.switchToSyslog() }
        if !startedByExec, let problem = mountpointProblem(options, logger: logger) { return problem }

        let env = environment()
        let credentials: Credentials
        do {
            credentials = try CredentialLoader.load(
                endpoint: options.endpoint, passwdFileOption: options.passwdFile, environment: env, profile: options.profile)
        } catch {
            return fail(error.message, ExitStatus.usage)
        }

        Curl.globalInit()
        var storeConfiguration = Self.storeConfiguration(options.endpoint, credentials)
        storeConfiguration.userAgent = "csspfs/\(Self.version)"
        storeConfiguration.connectTimeout = options.connectTimeout
        storeConfiguration.stallTimeout = options.stallTimeout
        storeConfiguration.lowSpeedLimit = options.lowSpeedLimit
        storeConfiguration.requestTimeout = options.requestTimeout
        storeConfiguration.copyTimeout = options.copyTimeout
        for (option, path, isDirectory) in [("cafile", options.caFile, false), ("capath", options.caPath, true)] {
            guard let path else { continue }
            var st = stat()
            guard stat(path, &st) == 0, ((st.st_mode & S_IFMT) == S_IFDIR) == isDirectory, access(path, R_OK) == 0 else {
                return fail(
                    "\(option)=\(path): not a readable \(isDirectory ? "directory" : "file"); give the CA certificate "
                        + (isDirectory ? "directory (openssl rehash DIR)" : "file (PEM)"), ExitStatus.usage)
            }
        }
        storeConfiguration.caFile = options.caFile
        storeConfiguration.caPath = options.caPath
        storeConfiguration.insecure = options.insecure
        if options.insecure && options.endpoint.baseURL.hasPrefix("https://") {
            logger.warning(
                "-o insecure: the server's certificate is not verified; anyone on the network path can read and change what this mount sends and receives")
        }
        storeConfiguration.maxAttempts = options.retries + 1
        storeConfiguration.credentialSource = credentials.source
        // Test hook: simulates a skewed clock (see docs/testing.md). Never needed in production.
        storeConfiguration.clockOffsetSeconds = Int(env["CSSP_TEST_CLOCK_OFFSET_SECONDS"] ?? "") ?? 0

        if options.fake {
            // mount -f: everything above checked, nothing mounted (not even the server asked).
            logger.info("mount -f (fake): \(options.endpoint.url) on \(options.mountpoint) not mounted")
            return ExitStatus.success
        }

        // Check endpoint and credentials before mounting: one quick attempt and one retry.
        var checkConfiguration = storeConfiguration
        checkConfiguration.maxAttempts = min(2, storeConfiguration.maxAttempts)
        checkConfiguration.connectTimeout = min(5, storeConfiguration.connectTimeout)
        do {
            _ = try Self.makeStore(checkConfiguration, options.endpoint, logger: logger, maxIdleConnections: 1).headContainer()
        } catch {
            switch error.code {
            case .notFound:
                let what = options.endpoint.dialect == .cssp ? "container" : "bucket"
                return fail(
                    "\(what) '\(options.endpoint.container)' does not exist at \(options.endpoint.baseURL): "
                        + "check the URL", ExitStatus.mountFailure)
            default:
                return fail(error.message, ExitStatus.mountFailure)
            }
        }

        var fsConfiguration = FilesystemConfiguration()
        fsConfiguration.rootPrefix = options.endpoint.prefix
        fsConfiguration.uid = options.uid ?? getuid()
        fsConfiguration.gid = options.gid ?? getgid()
        fsConfiguration.forcedUID = options.uid
        fsConfiguration.forcedGID = options.gid
        fsConfiguration.umask = options.umask
        fsConfiguration.readOnly = options.readOnly
        fsConfiguration.directoryCacheSeconds = options.directoryTimeout
        fsConfiguration.attributeCacheSeconds = options.attributeTimeout
        fsConfiguration.attributeWriteDelay = options.attributeWriteDelay
        fsConfiguration.writeBack = options.writeBack
        fsConfiguration.writeBackDelay = options.writeBackDelay
        fsConfiguration.directoryTime = Timestamp.now()
        fsConfiguration.readAheadWindow = options.readAheadMiB << 20
        fsConfiguration.memoryBudget = MemoryBudget(limit: Int64(options.memoryMiB) << 20)
        fsConfiguration.metadataPrefetchLimit = options.metadataPrefetch
        fsConfiguration.foreignAttributes = options.foreignAttributesFromHead ? .head : .listing
        fsConfiguration.listAhead = options.listAhead
        fsConfiguration.maximumEntries = options.metaMaxEntries
        fsConfiguration.serverExclusiveCreates = options.serverExclusiveCreates
        fsConfiguration.pollSeconds = options.pollSeconds
        // Test hook: the first retry of an owed upload waits this long, so that a test sees what
        // only the unmount's drain stores (README, Tests). Never needed in production.
        if let seconds = Double(env["CSSP_TEST_PENDING_RETRY_SECONDS"] ?? "") { fsConfiguration.pendingRetrySeconds = seconds }
        let cacheDirectory = cacheDirectory(options, env)
        if let problem = unsafeSharedDirectory(cacheDirectory, options, env) { return fail(problem, ExitStatus.usage) }
        fsConfiguration.writeBackMaxBytes = options.writeBackMaxMiB.map { Int64($0) << 20 }
            ?? max(256 << 20, Self.freeSpace(cacheDirectory) / 4)
        // Credentials are not part of it: blocks are also checked by ETag, which is the content's MD5.
        fsConfiguration.cacheIdentity = options.endpoint.baseURL + "/" + options.endpoint.container
        fsConfiguration.multipartThreshold = Int64(options.multipartThresholdMiB) << 20
        fsConfiguration.partSize = Int64(options.partSizeMiB) << 20
        fsConfiguration.uploadConcurrency = options.uploadParallelism
        fsConfiguration.spoolDirectory = cacheDirectory + "/spool/" + spoolName(for: options.endpoint)
        // Checked now, taken by each worker (a worker's filesystem starts from what is on disk
        // then: what a dead worker journaled included).
        do {
            try Filesystem.checkSpool(fsConfiguration)
        } catch {
            return fail(error.message, ExitStatus.usage)
        }

        var kernelOptions = ["fsname=" + mountTableName(options.fsname ?? options.endpoint.url), "subtype=cssp"]
        if options.allowOther { kernelOptions.append("allow_other") }
        if options.allowRoot { kernelOptions.append("allow_root") }
        if options.defaultPermissions { kernelOptions.append("default_permissions") }
        if options.readOnly { kernelOptions.append("ro") }
        kernelOptions += options.kernelFlags

        // As /proc/self/mountinfo will show it; resolved now, since the mountpoint cannot be
        // looked at once mounted until the session serves.
        let target = MountTable.canonical(options.mountpoint, resolvingLast: !startedByExec) ?? options.mountpoint
        if startedByExec {
            let holder: FuseSession
            do {
                holder = try FuseSession(inheritedMountpoint: options.mountpoint, options: kernelOptions)
            } catch {
                return fail(error.description, ExitStatus.mountFailure)
            }
            return serve(
                options, holder: holder, kernelOptions: kernelOptions, target: target, storeConfiguration: storeConfiguration,
                fsConfiguration: fsConfiguration, cacheDirectory: cacheDirectory, logger: logger)
        }
        Utab.forgetStale(target: target, logger: logger)
        Utab.forgetStaleLines(logger: logger)
        let holder: FuseSession
        do {
            holder = try FuseSession(mountpoint: options.mountpoint, options: kernelOptions, debug: false)
            try holder.mount()
        } catch {
            return fail(error.description, ExitStatus.mountFailure)
        }
        // Before the parent returns (daemonize): mount(8) then finds the line and adds none.
        if let utabOptions = options.utabOptions {
            Utab.record(
                source: options.fsname ?? options.endpoint.url, target: target, options: utabOptions, logger: logger)
        }
        logger.info("mounted \(options.endpoint.url) on \(options.mountpoint) as \(credentials)")
        if !options.foreground {
            // The parent returns only once the mount answers (see FuseSession.daemonize).
            holder.daemonize()
            LogSink.shared.switchToSyslog()
        }
        // This process holds the mount from here on; what follows runs in its worker, and again
        // in each worker that replaces a dead one.
        holder.superviseWorkers(useSyslog: !options.foreground)
        return serve(
            options, holder: holder, kernelOptions: kernelOptions, target: target, storeConfiguration: storeConfiguration,
            fsConfiguration: fsConfiguration, cacheDirectory: cacheDirectory, logger: logger)
    }

    /// A worker (issue 40): opens the caches and the spool, makes the filesystem from what is on
    /// disk now, serves until the mount ends, drains, and returns the exit status.
    static func serve(
        _ options: MountOptions, holder: FuseSession, kernelOptions: [String], target: String,
        storeConfiguration: HTTPStoreConfiguration, fsConfiguration: FilesystemConfiguration, cacheDirectory: String,
        logger: Logger
    ) -> Int32 {
        let incarnation = holder.incarnation
        if incarnation > 0 {
            logger.notice("worker \(getpid()) serves \(options.mountpoint) in place of the worker before it (restart \(incarnation))")
        }
        let metrics = MountMetrics()
        let store = Self.makeStore(
            storeConfiguration, options.endpoint, logger: logger, maxIdleConnections: options.maxThreads + 8, metrics: metrics)
        if incarnation == 0, !options.readOnly, let s3 = store as? S3ObjectStore {
            Self.abortStaleUploads(s3, prefix: options.endpoint.prefix, logger: logger)
        }
        var fsConfiguration = fsConfiguration
        fsConfiguration.metrics = metrics
        let blockCache = BlockCache.open(
            path: cacheDirectory + "/blocks.db", capacity: options.cacheSize ?? defaultCacheSize(cacheDirectory),
            blockSize: options.cacheBlockKiB << 10, logger: logger)
        fsConfiguration.blockCache = blockCache
        metrics.registry.gauge("cssp_cache_bytes", help: "Bytes the block cache holds (stored blocks).") {
            Double(blockCache?.storedBytes() ?? 0)
        }
        metrics.registry.gauge("cssp_cache_limit_bytes", help: "The block cache's size cap (cache_size).") {
            Double(blockCache?.capacity ?? 0)
        }
        let budget = fsConfiguration.memoryBudget
        metrics.registry.gauge("cssp_memory_fetched_bytes", help: "Fetched data readers hold in memory now.") {
            Double(budget.inUse)
        }
        metrics.registry.gauge("cssp_memory_limit_bytes", help: "The budget for fetched data (memory_mb).") {
            Double(budget.limit)
        }
        if options.foreignAttributesFromHead {
            fsConfiguration.metadataIndex = MetadataIndex.open(
                path: cacheDirectory + "/meta.db", identity: fsConfiguration.cacheIdentity, logger: logger)
        }
        // The numbers the kernel holds are logged for a successor; a successor takes over those
        // its dead predecessor logged.
        // (A log the supervisor could not map is none: it said so.)
        if SupervisorNodeLog.isAvailable { fsConfiguration.nodeLog = SupervisorNodeLog() }
        if SupervisorHandleLog.isAvailable { fsConfiguration.handleLog = SupervisorHandleLog() }
        if incarnation > 0 {
            fsConfiguration.adoptedNodes = SupervisorNodeLog.recorded()
            fsConfiguration.adoptedHandles = SupervisorHandleLog.recorded()
            logger.notice(
                "worker \(getpid()) takes over \(fsConfiguration.adoptedNodes.count) node numbers and \(fsConfiguration.adoptedHandles.count) open files that the kernel holds")
        }
        let filesystem: Filesystem
        do {
            filesystem = try Filesystem(store: store, configuration: fsConfiguration, logger: logger)
        } catch {
            logger.error("worker \(getpid()) cannot serve: \(error.message)")
            return ExitStatus.mountFailure
        }
        // New numbers (nodes, handles) never repeat one a dead worker gave: each worker numbers
        // from its own range.
        if incarnation > 0 { filesystem.numberFrom(incarnation << 40) }

        var fuseConfiguration = FuseConfiguration()
        fuseConfiguration.entryTimeout = options.entryTimeout
        fuseConfiguration.attributeTimeout = options.attributeTimeout
        fuseConfiguration.negativeTimeout = options.negativeTimeout
        fuseConfiguration.maxThreads = options.maxThreads
        fuseConfiguration.traceOperations = options.debug
        // A fault point for the tests of resent requests (issue 40): worker number N (0: the
        // first) dies before answering the Nth operation the list names. Not an option.
        if let raw = getenv("CSSP_TEST_WORKER_DIES_BEFORE_ANSWERING") {
            let plan = String(cString: raw)
            let operations = plan.split(separator: ",").map(String.init)
            if incarnation < operations.count { fuseConfiguration.dieBeforeAnswering = operations[Int(incarnation)] }
        }
        let adapter = FuseAdapter(filesystem: filesystem, configuration: fuseConfiguration, logger: logger, metrics: metrics)
        let session: FuseSession
        do {
            session = try FuseSession(serving: adapter, for: holder, options: kernelOptions, debug: false)
        } catch {
            logger.error("worker \(getpid()) cannot serve: \(error.description)")
            return ExitStatus.mountFailure
        }
        session.installKernelCache(on: filesystem)
        Thread.detached {
            while cssp_wait_usr1() == 0 {
                let level = LogSink.shared.toggleDebug()
                LogSink.stderrOrSyslog(.notice, "SIGUSR1: log level \(level) now")
            }
        }
        metrics.registry.gauge("cssp_worker_restarts", help: "Workers started in place of another (after a death or a --restart).") {
            Double(incarnation)
        }
        metrics.registry.gauge(
            "cssp_resent_requests", help: "Requests this worker served that the kernel sent again after a worker's death.")
        {
            Double(FuseSession.resentRequests)
        }
        let processes = Self.processLines(holder: holder.holderPID, incarnation: incarnation, since: Timestamp.now())
        let control = startControlServer(
            options, cacheDirectory: cacheDirectory, metrics: metrics, filesystem: filesystem, holder: holder.holderPID,
            processes: processes, logger: logger)
        defer { control?.stop() }
        if !options.readOnly {
            Thread.detached { filesystem.recoverPendingUploads() }
            // What /info says (bulk delete, whether If-None-Match is honoured) is logged at the
            // mount, not at the first upload.
            Thread.detached { _ = store.honoursIfNoneMatch }
        }
        filesystem.startPolling()
        HeapTrim.start(logger: logger)
        if options.readAheadMiB > 0 { raiseKernelReadAhead(target, logger: logger) }
        let rc = session.run()
        if FuseSession.restartRequested {
            // The mount goes on (`--restart`): what is owed stays journaled for the next worker,
            // which also takes over the open files.
            logger.notice("worker \(getpid()) stops for a restart; the supervisor starts the installed binary")
            if !filesystem.shutdown(deadline: 10) { logger.warning("background work still running 10 s into the restart: abandoned") }
            return ExitStatus.success
        }
        Utab.forgetStale(target: target, logger: logger)
        logger.info(
            "unmounted \(options.mountpoint); fetched data held at most \(budget.peak >> 20) MiB at once (memory_mb=\(budget.limit >> 20))")
        let owed = filesystem.drain(timeout: Double(options.drainTimeout)) { logger.warning("unmounting: \($0)") }
        if !filesystem.shutdown(deadline: 30) {
            logger.warning("background work still running 30 s after the unmount: abandoned")
        }
        if !owed.isEmpty {
            let keys = owed.map { "'\($0)'" }.joined(separator: ", ")
            logger.error(
                "\(owed.count) upload(s) still owed after drain_timeout=\(options.drainTimeout) s: \(keys); they stay journaled in \(fsConfiguration.spoolDirectory) and the next mount of this URL stores them")
            return ExitStatus.owed
        }
        return rc >= 0 ? ExitStatus.success : ExitStatus.mountFailure
    }

    /// The first lines of `--status` (issue 40): who holds the mount, who serves it, since when.
    static func processLines(holder: pid_t, incarnation: UInt64, since: Timestamp) -> String {
        "supervisor: \(holder)\nworker: \(getpid())\nworker binary: \(ownBinary())\nworker started: \(since.utc())\n"
            + "worker restarts: \(incarnation)\n"
            + "kernel resends a dead worker's requests: \(FuseSession.kernelResends ? "yes" : "no")\n"
    }

    /// `mount.cssp --unmount MOUNTPOINT`, and umount(8)'s helper: asks the daemon to store what
    /// is owed (up to its drain_timeout), unmounts, and waits for the daemon to exit, so that
    /// `umount` returns once the bytes are stored (or journaled for the next mount).
    /// The file this process runs (" (deleted)" once an upgrade replaced it).
    static func ownBinary() -> String {
        var buffer = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        return n > 0 ? String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "unknown"
    }

    /// `--restart MOUNTPOINT`: the worker makes way for the installed binary; returns once
    /// another worker serves, and says which.
    static func restart(_ mountpoint: String, cacheDirectory: String) -> Int32 {
        func worker() -> String? {
            guard case .success(let status) = ControlClient.ask("status", mountpoint: mountpoint, callerCacheDirectory: cacheDirectory)
            else { return nil }
            return status.split(separator: "\n").first { $0.hasPrefix("worker: ") }.map { String($0.dropFirst(8)) }
        }
        guard let before = worker() else {
            if case .failure(let error) = ControlClient.ask("status", mountpoint: mountpoint, callerCacheDirectory: cacheDirectory) {
                return fail(error.description, ExitStatus.mountFailure)
            }
            return fail("\(mountpoint): the mount's daemon names no worker: it is older than --restart", ExitStatus.mountFailure)
        }
        // (The worker may be gone before its answer is: the next one's answer is what counts.)
        _ = ControlClient.ask("restart", mountpoint: mountpoint, callerCacheDirectory: cacheDirectory)
        // The next worker answers the control socket once it serves.
        let deadline = Transfers.monotonic() + 120
        while Transfers.monotonic() < deadline {
            if let after = worker(), after != before {
                guard case .success(let status) = ControlClient.ask("status", mountpoint: mountpoint, callerCacheDirectory: cacheDirectory)
                else { continue }
                let binary = status.split(separator: "\n").first { $0.hasPrefix("worker binary: ") }.map { $0.dropFirst(15) } ?? "?"
                print("\(mountpoint): worker \(after) (\(binary)) serves in place of worker \(before)")
                return ExitStatus.success
            }
            usleep(50_000)  // polling another process's answer, not a synchronisation of ours
        }
        return fail("\(mountpoint): no new worker serves 120 s after the restart; see the mount's log", ExitStatus.mountFailure)
    }

    /// What is wrong with the mountpoint, as an exit status (after its line), or nil: it must
    /// be a directory and no live csspfs mount. A dead csspfs mount there (its daemon killed)
    /// is detached first.
    static func mountpointProblem(_ options: MountOptions, logger: Logger) -> Int32? {
        var st = stat()
        var fsStats = statvfs()
        if statvfs(options.mountpoint, &fsStats) != 0 && errno == ENOTCONN {
            // A daemon that died (kill -9, the OOM killer) leaves its mount behind, dead. A dead
            // csspfs mount is detached and mounted again, as an operator would; its owed uploads
            // are in the spool, and this mount stores them. (statvfs, not stat: the kernel answers
            // a stat of the dead mount's root from its cache for attr_timeout after the death.)
            guard isCSSPMount(options.mountpoint, resolvingLast: false) else {
                return fail(
                    "\(options.mountpoint) is a dead mount of another filesystem: unmount it first (fusermount3 -uz \(options.mountpoint))",
                    ExitStatus.usage)
            }
            guard detachDeadMount(options.mountpoint) else {
                return fail(
                    "\(options.mountpoint) is a dead csspfs mount that cannot be detached: run fusermount3 -uz \(options.mountpoint)",
                    ExitStatus.mountFailure)
            }
            logger.notice("\(options.mountpoint) was a dead csspfs mount (its daemon is gone): detached, mounting again")
        }
        guard stat(options.mountpoint, &st) == 0 else {
            return fail(
                "mountpoint \(options.mountpoint) does not exist: create it with mkdir -p \(options.mountpoint)",
                ExitStatus.usage)
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else {
            return fail("mountpoint \(options.mountpoint) is not a directory", ExitStatus.usage)
        }
        if isCSSPMount(options.mountpoint) {
            return fail(
                "\(options.mountpoint) is already a csspfs mount: unmount it first (fusermount3 -u \(options.mountpoint))",
                ExitStatus.usage)
        }
        return nil
    }

    static func unmountHelper(_ mountpoint: String, lazy: Bool) -> Int32 {
        var defaults = MountOptions(endpoint: try! Endpoint(parsing: "http://localhost/c"), mountpoint: mountpoint)
        defaults.cacheDirectory = nil
        let ownCache = cacheDirectory(defaults, environment())
        guard let target = ControlClient.mount(mountpoint) else {
            return fail("\(mountpoint) is not a csspfs mount (see /proc/mounts)", ExitStatus.usage)
        }
        var daemon: pid_t = 0
        var owed: [String] = []
        switch ControlClient.ask(ControlQuestion.drain.rawValue, mountpoint: mountpoint, callerCacheDirectory: ownCache) {
        case .success(let answer):
            for line in answer.split(separator: "\n") {
                if line.hasPrefix("pid ") { daemon = pid_t(line.dropFirst(4)) ?? 0 }
                if line.hasPrefix("owed ") { owed.append(String(line.dropFirst(5))) }
            }
        case .failure(let error):
            // An older daemon, or one that does not answer: unmount anyway (it drains after).
            LogSink.stderr("mount.cssp: warning: \(error.description); unmounting without waiting for uploads\n")
        }
        if getuid() == 0 {
            guard umount2(target.path, lazy ? Int32(MNT_DETACH) : 0) == 0 else {
                return fail("cannot unmount \(target.path): \(String(cString: strerror(errno)))", ExitStatus.mountFailure)
            }
        } else {
            let status = spawnAndWait(["fusermount3", "-u"] + (lazy ? ["-z"] : []) + [target.path])
            guard status == 0 else { return fail("fusermount3 -u \(target.path) failed", ExitStatus.mountFailure) }
        }
        // The daemon ends its background work (at most 30 s) and exits.
        var waited = 0
        while daemon > 0 && isRunning(daemon) && waited < 3500 {
            usleep(10_000)
            waited += 1
        }
        // The daemon removes the mount's utab line once unmounted; a killed one cannot.
        Utab.forgetStale(target: target.path, logger: Logger(label: "mount.cssp") { _ in SinkLogHandler() })
        if !owed.isEmpty {
            return fail(
                "unmounted \(target.path), but \(owed.count) upload(s) are still owed: "
                    + owed.map { "'\($0)'" }.joined(separator: ", ") + "; the next mount of this URL stores them",
                ExitStatus.owed)
        }
        return ExitStatus.success
    }

    /// Whether process `pid` exists and has not exited (a zombie waiting for its parent has).
    static func isRunning(_ pid: pid_t) -> Bool {
        let fd = open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 512)
        let n = read(fd, &buffer, buffer.count)
        guard n > 0 else { return false }
        // "PID (COMM) STATE ...": the state follows the last ')'.
        let text = buffer[0..<n]
        guard let close = text.lastIndex(of: UInt8(ascii: ")")), close + 2 < n else { return false }
        return text[close + 2] != UInt8(ascii: "Z")
    }

    /// Runs `argv` (found on PATH) and returns its exit status (-1 if it could not run).
    static func spawnAndWait(_ argv: [String]) -> Int32 {
        var pid = pid_t()
        let cArgs = argv.map { strdup($0) } + [nil]
        defer { for arg in cArgs { free(arg) } }
        guard posix_spawnp(&pid, argv[0], nil, nil, cArgs, environ) == 0 else { return -1 }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        return (status & 0x7f) == 0 ? (status >> 8) & 0xff : -1
    }

    /// 4 GiB, or a quarter of the free space where the cache lives if that is less (at least 64 MiB).
    static func defaultCacheSize(_ directory: String) -> Int64 {
        max(64 << 20, min(4 << 30, freeSpace(directory) / 4))
    }

    /// The bytes free for users where `directory` is (or would be), 16 GiB when unknown.
    static func freeSpace(_ directory: String) -> Int64 {
        var path = directory
        var fs = statvfs()
        while statvfs(path, &fs) != 0 {
            guard let slash = path.lastIndex(of: "/"), slash != path.startIndex else {
                path = "/"
                break
            }
            path = String(path[..<slash])
        }
        guard statvfs(path, &fs) == 0 else { return 16 << 30 }
        return Int64(fs.f_bavail) * Int64(fs.f_frsize)
    }

    /// Lets the kernel send 1 MiB sequential reads instead of 128 KiB ones (a per-mount setting;
    /// FUSE's own max_readahead does not raise it). Needs root; without it, reads stay smaller.
    /// `target`: the mountpoint as mountinfo writes it. The device comes from mountinfo, not a
    /// stat of the mount: a worker never sends its own mount a request.
    static func raiseKernelReadAhead(_ target: String, logger: Logger) {
        guard let number = Utab.device(of: target) else { return }
        let device = UInt64(number)
        let major = ((device >> 8) & 0xfff) | ((device >> 32) & ~0xfff)
        let minor = (device & 0xff) | ((device >> 12) & ~0xff)
        let path = "/sys/class/bdi/\(major):\(minor)/read_ahead_kb"
        let fd = open(path, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else {
            logger.debug("kernel read-ahead left as it is: \(path) is not writable")
            return
        }
        defer { close(fd) }
        let value = Array("1024\n".utf8)
        _ = value.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    }

    /// Detaches a dead mount (`umount -l` as root, `fusermount3 -uz` otherwise).
    static func detachDeadMount(_ path: String) -> Bool {
        if getuid() == 0 { return umount2(path, Int32(MNT_DETACH)) == 0 }
        var pid: pid_t = 0
        let argv = ["fusermount3", "-u", "-z", path]
        var cArgv: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        defer { for p in cArgv { free(p) } }
        guard posix_spawnp(&pid, "fusermount3", nil, nil, &cArgv, environ) == 0 else { return false }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        return status == 0
    }

    /// Whether /proc/mounts lists a csspfs mount on `path` (stacking a second one hides the first).
    /// `resolvingLast` false: only the parent is resolved (a dead mount cannot be looked at).
    static func isCSSPMount(_ path: String, resolvingLast: Bool = true) -> Bool {
        guard let target = MountTable.canonical(path, resolvingLast: resolvingLast) else { return false }
        return MountTable.csspfsMounts().contains { $0.path == target }
    }

    /// The control socket of `--stats` and `--status`; a mount without one still works (logged).
    static func startControlServer(
        _ options: MountOptions, cacheDirectory: String, metrics: MountMetrics, filesystem: Filesystem, holder: pid_t,
        processes: String, logger: Logger
    ) -> ControlServer? {
        guard let directory = ControlSocket.directory(uid: getuid(), cacheDirectory: cacheDirectory) else { return nil }
        let mountpoint = MountTable.canonical(options.mountpoint, resolvingLast: false) ?? options.mountpoint
        let path = directory + "/" + ControlSocket.name(mountpoint: mountpoint)
        do {
            let server = try ControlServer(path: path) { question in
                switch ControlQuestion(rawValue: question) {
                case .stats: return metrics.registry.render()
                case .status: return processes + filesystem.statusReport()
                case .restart:
                    guard FuseSession.requestRestart() else { return "this process is no worker: it cannot restart\n" }
                    logger.notice("asked to restart: worker \(getpid()) stops once its requests are answered")
                    return "worker \(getpid()) stops; the supervisor starts the installed binary in its place\n"
                case .drain:
                    logger.notice("asked to store what is owed before an unmount")
                    let owed = filesystem.drain(timeout: Double(options.drainTimeout)) { logger.warning("unmount: \($0)") }
                    // The process `--unmount` waits for: the one that holds the mount.
                    return "pid \(holder)\n" + owed.map { "owed \($0)\n" }.joined()
                case nil: return "unknown question '\(question)': ask stats or status\n"
                }
            }
            server.start()
            return server
        } catch {
            logger.warning("no --stats or --status for this mount: \(error)")
            return nil
        }
    }

    /// `-o cache_dir`, else /var/cache/csspfs for root, else $XDG_CACHE_HOME/csspfs or ~/.cache/csspfs.
    static func cacheDirectory(_ options: MountOptions, _ env: [String: String]) -> String {
        if let directory = options.cacheDirectory { return directory }
        if getuid() == 0 { return "/var/cache/csspfs" }
        if let xdg = env["XDG_CACHE_HOME"], !xdg.isEmpty { return xdg + "/csspfs" }
        if let home = env["HOME"], !home.isEmpty { return home + "/.cache/csspfs" }
        return "/tmp/csspfs-\(getuid())"
    }

    /// The last resort cache directory, `/tmp/csspfs-UID`, is a name anyone can make first: it is
    /// used only when it is ours, not a link, and closed to others (it is made so when missing).
    static func unsafeSharedDirectory(_ directory: String, _ options: MountOptions, _ env: [String: String]) -> String? {
        guard options.cacheDirectory == nil, directory.hasPrefix("/tmp/") else { return nil }
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            return "cannot make \(directory): \(String(cString: strerror(errno))); set HOME or -o cache_dir=DIR"
        }
        var st = stat()
        guard lstat(directory, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR, st.st_uid == getuid(), st.st_mode & 0o077 == 0
        else {
            return "\(directory) is not a private directory of this user (another user may have made it): "
                + "set HOME or XDG_CACHE_HOME, or use -o cache_dir=DIR"
        }
        return nil
    }

    /// One spool per mounted URL, so two mounts never share a spool (a readable, stable name).
    static func spoolName(for endpoint: Endpoint) -> String {
        let safe = endpoint.container.map { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" ? $0 : "_" }
        return String(safe.prefix(40)) + "-" + String(stableHash(endpoint.url), radix: 16)
    }

    /// libfuse splits options at commas, so escape them in the name shown in the mount table.
    static func mountTableName(_ name: String) -> String {
        name.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: ",", with: "\\,")
    }
}

extension String {
    fileprivate func replacingOccurrences(of target: String, with replacement: String) -> String {
        split(separator: target, omittingEmptySubsequences: false).joined(separator: replacement)
    }
}

/// A plain pthread for one background job (not a Swift task: it blocks on the network).
enum Thread {
    static func detached(_ body: @escaping @Sendable () -> Void) {
        final class Box: @unchecked Sendable {  // Handed to exactly one thread.
            let body: @Sendable () -> Void
            init(_ body: @escaping @Sendable () -> Void) { self.body = body }
        }
        var thread = pthread_t()
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        let rc = pthread_create(&thread, nil, { raw in
            let box = Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue()
            box.body()
            return nil
        }, box)
        if rc == 0 { pthread_detach(thread) } else { Unmanaged<Box>.fromOpaque(box).release() }
    }
}
