//! `rollcall harness`: install and list the agent harnesses.

use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum HarnessCommand {
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

pub fn run(cmd: HarnessCommand) -> Result<(), Box<dyn std::error::Error>> {
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
                    a.name,
                    a.version,
                    a.wire_api.as_str(),
                    via
                );
            }
            Ok(())
        }
    }
}
