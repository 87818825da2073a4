//! Prometheus metrics, served at `/metrics`.

use crate::record::{FailureClass, RecorderStats};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub wire_api: &'static str,
    pub status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabel {
    pub wire_api: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

fn latency_histogram() -> Histogram {
    // 100 µs … ~100 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 21))
}

pub struct Metrics {
    registry: Registry,
    pub calls: Family<CallLabels, Counter>,
    pub errors: Family<ClassLabel, Counter>,
    pub duration: Family<ApiLabel, Histogram, fn() -> Histogram>,
    pub ttfb: Family<ApiLabel, Histogram, fn() -> Histogram>,
    pub in_flight: Gauge,
    /// Calls refused before they were proxied, by reason (the error code).
    pub rejected: Family<ReasonLabel, Counter>,
    /// Calls whose end the write-ahead log could not take.
    pub unrecorded: Counter,
    shard_lag: Gauge,
    wal_write_failures: Gauge,
    rows_salvaged: Gauge,
    rows_published: Gauge,
    shards_published: Gauge,
    wal_bytes: Gauge,
    wal_segments: Gauge,
    stats: Arc<RecorderStats>,
}

impl Metrics {
    pub fn new(stats: Arc<RecorderStats>) -> Self {
        let mut registry = Registry::with_prefix("rollcall");
        let calls = Family::<CallLabels, Counter>::default();
        let errors = Family::<ClassLabel, Counter>::default();
        let duration = Family::<ApiLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let ttfb = Family::<ApiLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let m = Self {
            calls,
            errors,
            duration,
            ttfb,
            in_flight: Gauge::default(),
            rejected: Family::default(),
            unrecorded: Counter::default(),
            shard_lag: Gauge::default(),
            wal_write_failures: Gauge::default(),
            rows_salvaged: Gauge::default(),
            rows_published: Gauge::default(),
            shards_published: Gauge::default(),
            wal_bytes: Gauge::default(),
            wal_segments: Gauge::default(),
            stats,
            registry: Registry::default(),
        };
        registry.register(
            "calls",
            "Calls handled, by wire API and status",
            m.calls.clone(),
        );
        registry.register(
            "call_failures",
            "Failed calls by failure class",
            m.errors.clone(),
        );
        for class in FailureClass::ALL {
            let _ = m.errors.get_or_create(&ClassLabel {
                class: class.as_str(),
            });
        }
        registry.register(
            "call_duration_seconds",
            "Time from request to the end of the response",
            m.duration.clone(),
        );
        registry.register(
            "time_to_first_byte_seconds",
            "Time from request to the upstream's first byte",
            m.ttfb.clone(),
        );
        registry.register(
            "calls_in_flight",
            "Calls being handled now",
            m.in_flight.clone(),
        );
        registry.register(
            "rejected_calls",
            "Calls refused before they were proxied, by reason",
            m.rejected.clone(),
        );
        registry.register(
            "unrecorded_calls",
            "Calls whose end the write-ahead log could not take (answered 503 under on_wal_error = fail)",
            m.unrecorded.clone(),
        );
        registry.register(
            "wal_write_failures",
            "Write-ahead log batches whose write failed",
            m.wal_write_failures.clone(),
        );
        registry.register(
            "rows_salvaged",
            "Calls whose row assembly failed, recorded with their raw bytes",
            m.rows_salvaged.clone(),
        );
        registry.register(
            "shard_lag_rows",
            "Rows in the write-ahead log not yet in a published shard",
            m.shard_lag.clone(),
        );
        registry.register(
            "shard_rows_published",
            "Rows published to shards since start",
            m.rows_published.clone(),
        );
        registry.register(
            "shards_published",
            "Shard files published since start",
            m.shards_published.clone(),
        );
        registry.register(
            "wal_bytes_written",
            "Bytes written to the write-ahead log since start",
            m.wal_bytes.clone(),
        );
        registry.register(
            "wal_segments",
            "Write-ahead log segments on disk",
            m.wal_segments.clone(),
        );
        Self { registry, ..m }
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let s = &self.stats;
        self.shard_lag
            .set(s.unpublished_rows.load(Ordering::Relaxed));
        self.rows_published
            .set(s.rows_published.load(Ordering::Relaxed) as i64);
        self.shards_published
            .set(s.shards_published.load(Ordering::Relaxed) as i64);
        self.wal_bytes
            .set(s.wal_bytes_written.load(Ordering::Relaxed) as i64);
        self.wal_segments
            .set(s.wal_segments.load(Ordering::Relaxed));
        self.wal_write_failures
            .set(s.wal_write_failures.load(Ordering::Relaxed) as i64);
        self.rows_salvaged
            .set(s.rows_salvaged.load(Ordering::Relaxed) as i64);
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
