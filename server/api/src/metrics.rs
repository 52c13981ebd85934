//! Prometheus metrics, served on their own listener.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Every metric the API tier exports.
pub struct Metrics {
    pub registry: Registry,
    /// RPC calls by method and result code (`ok` or the error's code).
    pub rpc_requests: IntCounterVec,
    /// RPC latency by method.
    pub rpc_duration: HistogramVec,
    /// Open WebSockets by kind (`client`, `worker`).
    pub connections: IntGaugeVec,
    /// Events appended through this replica.
    pub events_appended: IntCounter,
    /// Turns settled, by state.
    pub turns: IntCounterVec,
    /// Automatic titles claimed, by outcome: `named`, `failed`, or `taken` (the claim found
    /// the session titled or its attempt made meanwhile: a transaction for nothing), or
    /// `refused` (not claimed: the tenant's model-call limits were reached).
    pub auto_titles: IntCounterVec,
    /// Turns handed to this replica's worker connections, by how: `admission` (the turn was
    /// admitted here and handed out in the same transaction), `claim`, or `recovery` (found
    /// handed out without its `turn.run`, the database's answer lost after the `COMMIT`).
    pub turns_handed: IntCounterVec,
    /// How long turns ran on this replica's workers, from hand-out to settling.
    pub turn_duration: prometheus::Histogram,
    /// From an event's commit to its delivery to a live watcher.
    pub fanout_lag: prometheus::Histogram,
    /// Events sent to watchers, by where they came from: `append` (this replica's own
    /// append, as written) or `read` (the database).
    pub watch_events: IntCounterVec,
    /// Model tokens by provider, model and kind (`input`, `output`).
    pub model_tokens: IntCounterVec,
    /// Time to the first byte of a provider's response, by provider and model.
    pub model_latency: HistogramVec,
    /// Worker connections held by this replica.
    pub workers_connected: IntGauge,
    /// Database pool size and idle connections.
    pub db_pool_size: IntGauge,
    pub db_pool_available: IntGauge,
    /// Authentication failures by reason.
    pub auth_failures: IntCounterVec,
    /// Bytes moved to and from object storage, by op (`put`, `get`).
    pub object_store_bytes: IntCounterVec,
    /// Times the LISTEN connection was lost (closed, failed, or silent past its probe).
    pub listen_reconnects: IntCounter,
    /// 1 while the LISTEN connection is set up and listening on every channel.
    pub listen_up: IntGauge,
    /// Notifications the LISTEN connection delivered, by channel (each one woke this
    /// replica).
    pub notices: IntCounterVec,
    /// `berth_build_info{version}`, always 1: which release each replica runs.
    pub build_info: IntGaugeVec,
    /// `process_*`: this process's CPU time, memory, file descriptors and start time.
    pub process: ProcessCollector,
}

/// The reasons `berth_auth_failures_total` counts, each exported from the start (at zero),
/// so a panel or an alert has a series before the first failure.
pub const AUTH_FAILURE_REASONS: &[&str] = &[
    "attachments",
    "cluster",
    "invalid",
    "login",
    "login-busy",
    "login-rate-limited",
    "missing",
    "model-proxy",
    "not-a-worker",
    "origin",
    "unauthenticated-limit",
];

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let m = Metrics {
            rpc_requests: IntCounterVec::new(Opts::new("berth_rpc_requests_total", "RPC calls"), &["method", "code"])
                .expect("metric"),
            rpc_duration: HistogramVec::new(
                HistogramOpts::new("berth_rpc_duration_seconds", "RPC latency"),
                &["method"],
            )
            .expect("metric"),
            connections: IntGaugeVec::new(Opts::new("berth_connections", "open WebSockets"), &["kind"])
                .expect("metric"),
            events_appended: IntCounter::new("berth_events_appended_total", "events appended").expect("metric"),
            turns: IntCounterVec::new(Opts::new("berth_turns_total", "turns settled"), &["state"]).expect("metric"),
            auto_titles: IntCounterVec::new(
                Opts::new(
                    "berth_auto_titles_total",
                    "automatic titles claimed, by outcome (refused: not claimed, at the tenant's model-call limits)",
                ),
                &["outcome"],
            )
            .expect("metric"),
            turns_handed: IntCounterVec::new(
                Opts::new("berth_turns_handed_total", "turns handed to worker connections, by how"),
                &["via"],
            )
            .expect("metric"),
            turn_duration: prometheus::Histogram::with_opts(
                HistogramOpts::new("berth_turn_duration_seconds", "turn duration")
                    .buckets(vec![0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0]),
            )
            .expect("metric"),
            fanout_lag: prometheus::Histogram::with_opts(
                HistogramOpts::new("berth_fanout_lag_seconds", "commit to live delivery")
                    .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            )
            .expect("metric"),
            watch_events: IntCounterVec::new(
                Opts::new("berth_watch_events_total", "events sent to watchers"),
                &["source"],
            )
            .expect("metric"),
            model_tokens: IntCounterVec::new(
                Opts::new("berth_model_tokens_total", "model tokens"),
                &["provider", "model", "kind"],
            )
            .expect("metric"),
            model_latency: HistogramVec::new(
                HistogramOpts::new("berth_model_latency_seconds", "provider time to first byte"),
                &["provider", "model"],
            )
            .expect("metric"),
            workers_connected: IntGauge::new("berth_workers_connected", "worker connections").expect("metric"),
            db_pool_size: IntGauge::new("berth_db_pool_size", "database pool size").expect("metric"),
            db_pool_available: IntGauge::new("berth_db_pool_available", "idle database connections").expect("metric"),
            auth_failures: IntCounterVec::new(
                Opts::new("berth_auth_failures_total", "authentication failures"),
                &["reason"],
            )
            .expect("metric"),
            object_store_bytes: crate::blobs::bytes_counter(),
            listen_reconnects: IntCounter::new("berth_db_listen_reconnects_total", "LISTEN connections lost")
                .expect("metric"),
            listen_up: IntGauge::new("berth_db_listen_up", "1 while the LISTEN connection listens").expect("metric"),
            notices: IntCounterVec::new(
                Opts::new("berth_db_notices_total", "notifications received, by channel"),
                &["channel"],
            )
            .expect("metric"),
            build_info: IntGaugeVec::new(
                Opts::new("berth_build_info", "the release this replica runs (always 1)"),
                &["version"],
            )
            .expect("metric"),
            process: ProcessCollector::new(),
            registry,
        };
        for c in m.collectors() {
            m.registry.register(c).expect("metrics registered once");
        }
        // Series that exist from the start, at zero.
        for reason in AUTH_FAILURE_REASONS {
            m.auth_failures.with_label_values(&[reason]);
        }
        for op in ["put", "get"] {
            m.object_store_bytes.with_label_values(&[op]);
        }
        m.build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        m
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.rpc_requests.clone()),
            Box::new(self.rpc_duration.clone()),
            Box::new(self.connections.clone()),
            Box::new(self.events_appended.clone()),
            Box::new(self.turns.clone()),
            Box::new(self.auto_titles.clone()),
            Box::new(self.turns_handed.clone()),
            Box::new(self.turn_duration.clone()),
            Box::new(self.fanout_lag.clone()),
            Box::new(self.watch_events.clone()),
            Box::new(self.model_tokens.clone()),
            Box::new(self.model_latency.clone()),
            Box::new(self.workers_connected.clone()),
            Box::new(self.db_pool_size.clone()),
            Box::new(self.db_pool_available.clone()),
            Box::new(self.auth_failures.clone()),
            Box::new(self.object_store_bytes.clone()),
            Box::new(self.listen_reconnects.clone()),
            Box::new(self.listen_up.clone()),
            Box::new(self.notices.clone()),
            Box::new(self.build_info.clone()),
            Box::new(self.process.clone()),
        ]
    }

    /// The name of every exported metric family, including those with no sample yet.
    pub fn names(&self) -> Vec<String> {
        self.collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()))
            .collect()
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encode metrics");
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// The standard `process_*` metrics of this process, read from `/proc/self` when scraped
/// (Linux; elsewhere none): `process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
/// `process_start_time_seconds`.
#[derive(Clone)]
pub struct ProcessCollector {
    descs: Vec<prometheus::core::Desc>,
}

const PROCESS_METRICS: &[(&str, &str)] = &[
    (
        "process_cpu_seconds_total",
        "user and system CPU time spent, in seconds",
    ),
    ("process_resident_memory_bytes", "resident memory size, in bytes"),
    ("process_virtual_memory_bytes", "virtual memory size, in bytes"),
    ("process_open_fds", "open file descriptors"),
    ("process_max_fds", "the most file descriptors the process may open"),
    (
        "process_start_time_seconds",
        "start time since the Unix epoch, in seconds",
    ),
];

impl ProcessCollector {
    fn new() -> ProcessCollector {
        let descs = PROCESS_METRICS
            .iter()
            .map(|(name, help)| {
                prometheus::core::Desc::new(name.to_string(), help.to_string(), Vec::new(), Default::default())
                    .expect("metric")
            })
            .collect();
        ProcessCollector { descs }
    }

    /// The values, in [`PROCESS_METRICS`]' order (None where `/proc` cannot say).
    fn values() -> Option<[f64; 6]> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // After the command name (which may hold spaces): state ppid … (fields from 3 on).
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let num = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<f64>().ok());
        let ticks = 100.0; // USER_HZ on Linux
        let page = 4096.0;
        let cpu = (num(14)? + num(15)?) / ticks;
        let start_ticks = num(22)?;
        let vsize = num(23)?;
        let rss = num(24)? * page;
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
        let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        let max = std::fs::read_to_string("/proc/self/limits")
            .ok()?
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3)?.parse::<f64>().ok())
            .unwrap_or(0.0);
        Some([cpu, rss, vsize, open, max, boot + start_ticks / ticks])
    }
}

impl prometheus::core::Collector for ProcessCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let Some(values) = Self::values() else {
            return Vec::new();
        };
        PROCESS_METRICS
            .iter()
            .zip(values)
            .map(|((name, help), v)| {
                let mut m = prometheus::proto::Metric::default();
                let mut f = prometheus::proto::MetricFamily::default();
                f.set_name(name.to_string());
                f.set_help(help.to_string());
                if name.ends_with("_total") {
                    let mut c = prometheus::proto::Counter::default();
                    c.set_value(v);
                    m.set_counter(c);
                    f.set_field_type(prometheus::proto::MetricType::COUNTER);
                } else {
                    let mut g = prometheus::proto::Gauge::default();
                    g.set_value(v);
                    m.set_gauge(g);
                    f.set_field_type(prometheus::proto::MetricType::GAUGE);
                }
                f.mut_metric().push(m);
                f
            })
            .collect()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 50: panels and alerts have a series before anything happens (each failure
    /// reason and object-store op at zero), and the process and build metrics are there.
    #[test]
    fn counters_start_at_zero_and_process_and_build_metrics_are_exported() {
        let text = Metrics::new().render();
        for reason in AUTH_FAILURE_REASONS {
            let line = format!("berth_auth_failures_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&line), "{line} missing");
        }
        for op in ["put", "get"] {
            assert!(text.contains(&format!("berth_object_store_bytes_total{{op=\"{op}\"}} 0")));
        }
        assert!(text.contains(&format!(
            "berth_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
        for (name, _) in PROCESS_METRICS {
            let sample = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
            let v: f64 = sample.rsplit(' ').next().unwrap().parse().unwrap();
            assert!(v >= 0.0, "{sample}");
        }
        assert!(text.contains("# TYPE process_cpu_seconds_total counter"));
        let rss = text
            .lines()
            .find(|l| l.starts_with("process_resident_memory_bytes "))
            .unwrap();
        assert!(rss.rsplit(' ').next().unwrap().parse::<f64>().unwrap() > 1e6, "{rss}");
    }
}
