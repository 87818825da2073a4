//! The `rollcall` command line.

use crate::config::Config;
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
    },
    /// Run the scripted model server used by tests, benchmarks and the demo
    /// (a stand-in for a real model server; see `upstream::scripted`).
    ScriptedUpstream {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
}

fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ROLLCALL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(&cli.log_format);
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
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cmd: Command) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        Command::Serve {
            config,
            listen,
            upstream,
            shards,
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
            let server = crate::server::Server::bind(cfg).await?;
            println!("rollcall listening on http://{}", server.addr);
            tracing::info!(addr = %server.addr, shards = %server.state.config.shards.dir.display(), "serving");
            server.run(shutdown_signal()).await;
            Ok(())
        }
        Command::ScriptedUpstream { listen } => {
            let (addr, serve) = crate::upstream::scripted::bind(listen).await?;
            println!("scripted upstream listening on http://{addr}");
            tokio::select! {
                _ = serve => {},
                _ = shutdown_signal() => {},
            }
            Ok(())
        }
    }
}
