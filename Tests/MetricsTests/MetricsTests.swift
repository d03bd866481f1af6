import Testing

@testable import Metrics

/// The Prometheus text exposition format (0.0.4) as `mount.cssp --stats` prints it.
struct MetricsTests {
    @Test func countersGaugesAndHistogramsRenderInTheTextFormat() {
        let registry = MetricsRegistry()
        let plain = registry.counter("t_plain_total", help: "A plain count.")
        let labelled = registry.counters("t_requests_total", help: "By method.", labels: ["method", "status"])
        registry.gauge("t_level", help: "A level.") { 2.5 }
        let times = registry.histograms("t_seconds", help: "Times.", labels: ["method"], bounds: [0.1, 1])
        plain.add(3)
        labelled.labels("PUT", "201").add()
        labelled.labels("GET", "200").add(2)
        times.observe(0.05, "GET")
        times.observe(0.5, "GET")
        times.observe(7, "GET")
        #expect(
            registry.render() == """
                # HELP t_plain_total A plain count.
                # TYPE t_plain_total counter
                t_plain_total 3
                # HELP t_requests_total By method.
                # TYPE t_requests_total counter
                t_requests_total{method="GET",status="200"} 2
                t_requests_total{method="PUT",status="201"} 1
                # HELP t_level A level.
                # TYPE t_level gauge
                t_level 2.5
                # HELP t_seconds Times.
                # TYPE t_seconds histogram
                t_seconds_bucket{method="GET",le="0.1"} 1
                t_seconds_bucket{method="GET",le="1"} 2
                t_seconds_bucket{method="GET",le="+Inf"} 3
                t_seconds_sum{method="GET"} 7.55
                t_seconds_count{method="GET"} 3

                """)
    }

    @Test func labelValuesAreEscaped() {
        let registry = MetricsRegistry()
        registry.counters("t_total", help: "Back\\slash\nnewline.", labels: ["op"]).labels("a\"b\\c\nd").add()
        let text = registry.render()
        #expect(text.contains(#"# HELP t_total Back\\slash\nnewline."#))
        #expect(text.contains(#"t_total{op="a\"b\\c\nd"} 1"#))
    }

    @Test func aGaugeRegisteredAgainReplacesTheFirst() {
        let registry = MetricsRegistry()
        registry.gauge("t_g", help: "G.") { 1 }
        registry.gauge("t_g", help: "G.") { 2 }
        #expect(registry.render() == "# HELP t_g G.\n# TYPE t_g gauge\nt_g 2\n")
    }

    /// Every name the man page's STATISTICS section promises is registered by a mount.
    @Test func aMountRegistersTheDocumentedNames() {
        let text = MountMetrics().registry.render()
        for name in [
            "cssp_requests_total", "cssp_request_seconds", "cssp_bytes_sent_total", "cssp_bytes_received_total",
            "cssp_retries_total", "cssp_cache_hits_total", "cssp_cache_misses_total", "cssp_fuse_ops_total",
            "cssp_errors_total",
        ] {
            #expect(text.contains("# TYPE \(name) "), "\(name)")
        }
    }
}
