//! `rollcall view`: the local web viewer (see `src/view`).

use crate::view::index::Index;
use crate::view::server::{bind, Viewer};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Serve a local web page of the shards' rollouts: filtered, sorted and
/// paged on the server, every asset in the binary.
#[derive(Args)]
pub struct View {
    /// The shard directory.
    #[arg(long)]
    pub shards: PathBuf,
    #[arg(long, default_value = "127.0.0.1:8300")]
    pub listen: SocketAddr,
}

impl View {
    pub async fn run(self) -> Result<i32, Box<dyn std::error::Error>> {
        let shards = self.shards.clone();
        let index = tokio::task::spawn_blocking(move || Index::build(&shards)).await??;
        let n = index.rollouts.len();
        let (addr, serve) = bind(
            Viewer::new(index, self.shards.display().to_string()),
            self.listen,
        )
        .await?;
        println!("rollcall view listening on http://{addr}");
        eprintln!(
            "{n} rollouts of {} at http://{addr}/",
            self.shards.display()
        );
        tokio::select! {
            _ = serve => {},
            _ = crate::http::shutdown_signal() => {},
        }
        Ok(0)
    }
}
