//! `rollcall run`: one rollout of an unmodified agent harness through a
//! running proxy (over HTTP only), finished with its exit status.

use clap::Args;
use std::path::PathBuf;

/// Run one rollout of an unmodified agent harness through the proxy, then
/// finish the rollout with its exit status and duration.
#[derive(Args)]
pub struct Run {
    /// Harness name (see `rollcall harness list`).
    #[arg(long)]
    pub harness: String,
    /// Rollout id the harness's calls are recorded under.
    #[arg(long)]
    pub rollout: String,
    /// Model name the harness asks for.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Working directory of the harness (created if missing).
    #[arg(long, default_value = ".")]
    pub workdir: PathBuf,
    /// Base URL of a running `rollcall serve`.
    #[arg(long, env = "ROLLCALL_URL", default_value = "http://127.0.0.1:8700")]
    pub proxy: String,
    /// Key the harness presents to the proxy (never recorded).
    #[arg(
        long,
        env = "ROLLCALL_CLIENT_KEY",
        default_value = "rollcall",
        hide_env_values = true
    )]
    pub api_key: String,
    /// Where harnesses are installed.
    #[arg(long, env = "ROLLCALL_HARNESS_DIR")]
    pub prefix: Option<PathBuf>,
    /// Private home for the harness's config and state (default: a fresh
    /// directory under ~/.cache/rollcall/homes, removed afterwards).
    #[arg(long)]
    pub home: Option<PathBuf>,
    /// Keep the private home after the run.
    #[arg(long)]
    pub keep_home: bool,
    /// Stop the harness after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Extra JSON metadata for the rollout's finish row.
    #[arg(long)]
    pub metadata: Option<String>,
    /// A shell command run in the workdir after the harness ends (a
    /// test of its work): exit 0 finishes the rollout with reward 1,
    /// anything else with reward 0.
    #[arg(long)]
    pub check: Option<String>,
    #[command(flatten)]
    pub budget: super::BudgetArgs,
    /// An argument appended to the harness's command line (repeat for
    /// more), e.g. `--harness-arg=-c --harness-arg=agent.step_limit=5`.
    #[arg(long = "harness-arg", allow_hyphen_values = true)]
    pub harness_args: Vec<String>,
    /// The task, as one or more words.
    #[arg(last = true, required = true)]
    pub task: Vec<String>,
}

impl Run {
    pub async fn run(self) -> Result<i32, Box<dyn std::error::Error>> {
        let Run {
            harness,
            rollout,
            model,
            workdir,
            proxy,
            api_key,
            prefix,
            home,
            keep_home,
            timeout,
            metadata,
            check,
            harness_args,
            task,
            budget,
        } = self;
        let metadata = match metadata {
            Some(m) => Some(
                serde_json::from_str(&m).map_err(|e| format!("--metadata must be JSON: {e}"))?,
            ),
            None => None,
        };
        let spec = crate::harness::run::RunSpec {
            adapter: crate::harness::Adapter::get(&harness)?,
            root: prefix.unwrap_or_else(crate::harness::default_root),
            rollout,
            proxy,
            model,
            api_key,
            workdir,
            home,
            keep_home,
            timeout: std::time::Duration::from_secs(timeout),
            task: task.join(" "),
            metadata,
            extra_args: harness_args,
            check,
            budget: budget.budget(),
        };
        Ok(crate::harness::run::run(spec).await?.exit_code())
    }
}
