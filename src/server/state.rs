//! What every request handler shares.

use super::metrics::Metrics;
use super::sequencer::Sequencer;
use crate::config::{OnWalError, RolloutConfig, ServerConfig};
use crate::record::Recorder;
use crate::upstream::RouteTable;
use std::collections::HashSet;
use tokio_util::task::TaskTracker;

pub struct State {
    pub server: ServerConfig,
    pub rollouts: RolloutConfig,
    /// `shards.on_wal_error`: what a call gets when its record fails.
    pub on_wal_error: OnWalError,
    pub routes: RouteTable,
    pub recorder: Recorder,
    pub sequencer: Sequencer,
    pub metrics: Metrics,
    /// Accepted client keys, when keys are required.
    pub client_keys: Option<HashSet<String>>,
    /// Accepted admin keys (`/v1/admin/*`); `None`: admin is refused.
    pub admin_keys: Option<HashSet<String>>,
    /// Each rollout's last call, to tell retries from turns.
    pub attempts: super::attempts::Attempts,
    /// Each rollout's budget and spending.
    pub budgets: super::budget::Budgets,
    /// Each route's weight-sync gate.
    pub gates: super::pause::Gates,
    /// Tasks that outlive their request (stream pumps, the records of
    /// dropped calls): shutdown waits for them.
    pub tasks: TaskTracker,
    /// The job API (`/v1/jobs`), mounted by `app` once the server is bound
    /// (it needs the server's address); unset: `/v1/jobs` answers 404.
    pub jobs: std::sync::OnceLock<crate::http::Handler>,
    /// Cancelled when the server stops: long-lived answers (a followed
    /// feed) end.
    pub stopping: tokio_util::sync::CancellationToken,
}
