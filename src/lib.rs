//! rollcall: an OpenAI-compatible recording proxy for agent harnesses.
//!
//! A call flows `server` (routes, limits, rollout tags) → `upstream` (route
//! selection, forwarding) → back to the harness, while `record` writes it to a
//! write-ahead log and then to Parquet shards. `dialect` knows the wire APIs:
//! how to parse, assemble streams, normalize and format errors.
//! See `docs/architecture.md`.

pub mod app;
pub mod cli;
pub mod config;
pub mod dialect;
pub mod export;
pub mod grade;
pub mod harness;
pub mod http;
pub mod jobs;
pub mod model;
pub mod recipe;
pub mod record;
pub mod redact;
pub mod rollout;
pub mod server;
pub mod upstream;
pub mod view;

/// Microseconds since the Unix epoch, the unit of every timestamp we record.
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}
