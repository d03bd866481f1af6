/// The metrics of one mount, by the names `mount.cssp --stats` prints (man page, STATISTICS).
/// Each component gets this object and counts what it does; the owners of values that are
/// states rather than counts (cache size, uploads owed) register gauges that read them.
public final class MountMetrics: Sendable {
    public let registry = MetricsRegistry()

    /// Requests sent to the store, one per attempt: `method`, `status` (the HTTP status, or
    /// `none` when no answer came: connection refused, reset, timeout).
    public let requests: CounterFamily
    /// Seconds from sending a request to its last byte, per `method`.
    public let requestSeconds: HistogramFamily
    /// Listing pages asked for (GETs of the container, counted in `requests` too).
    public let listings: Counter
    public let bytesSent: Counter
    public let bytesReceived: Counter
    /// Attempts sent again: `reason` is the status that caused it, or `network`.
    public let retries: CounterFamily
    /// Block-cache lookups of a read that found, or did not find, their block.
    public let cacheHits: Counter
    public let cacheMisses: Counter
    /// Operations the kernel asked for, by `op`.
    public let fuseOperations: CounterFamily
    /// Operations answered with an error, by `op` and `errno` (its symbolic name).
    public let errors: CounterFamily
    /// Names the kernel was asked to forget to keep the mount's metadata under `meta_max_entries`.
    public let entriesForgotten: Counter
    /// Uploads stored as a conflict copy: the object at their name changed since this mount read
    /// or wrote it (another client's version stays; the log names both keys).
    public let conflicts: Counter
    /// Requests the kernel sent again after a worker's death that the dead worker had done
    /// already (a mkdir whose directory is there, an unlink whose name is gone): answered as done.
    public let resentDone: Counter

    public init() {
        requests = registry.counters(
            "cssp_requests_total", help: "Requests sent to the store (each attempt), by method and HTTP status.",
            labels: ["method", "status"])
        requestSeconds = registry.histograms(
            "cssp_request_seconds", help: "Time from sending a request to its last byte, by method.",
            labels: ["method"], bounds: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60])
        listings = registry.counter(
            "cssp_listings_total", help: "Listing pages asked of the store (GETs of the container, also in cssp_requests_total).")
        bytesSent = registry.counter("cssp_bytes_sent_total", help: "Request body bytes sent to the store.")
        bytesReceived = registry.counter("cssp_bytes_received_total", help: "Response body bytes received from the store.")
        retries = registry.counters(
            "cssp_retries_total", help: "Requests sent again, by the status that caused it (or network).",
            labels: ["reason"])
        cacheHits = registry.counter("cssp_cache_hits_total", help: "Blocks a read found in the block cache.")
        cacheMisses = registry.counter("cssp_cache_misses_total", help: "Blocks a read did not find in the block cache.")
        fuseOperations = registry.counters(
            "cssp_fuse_ops_total", help: "Operations the kernel asked for, by operation.", labels: ["op"])
        errors = registry.counters(
            "cssp_errors_total", help: "Operations answered with an error, by operation and errno.",
            labels: ["op", "errno"])
        entriesForgotten = registry.counter(
            "cssp_entries_forgotten_total", help: "Names the kernel was asked to forget, to stay under meta_max_entries.")
        conflicts = registry.counter(
            "cssp_conflicts_total",
            help: "Uploads stored as a conflict copy: another client changed the object since this mount read or wrote it.")
        resentDone = registry.counter(
            "cssp_resent_done_total",
            help: "Requests sent again after a worker's death that the dead worker had done: answered as done, not done twice.")
    }
}
