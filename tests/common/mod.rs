//! Test support: start real `rollcall` and `scripted-upstream` processes on
//! loopback, and read shards back with the `parquet` crate's Arrow reader.
#![allow(dead_code)]

use arrow::array::{Array, AsArray, RecordBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_rollcall");

/// A child process killed on drop.
pub struct Proc {
    pub child: Child,
    pub url: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// SIGTERM and wait: the proxy publishes every pending shard.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("rollcall did not exit after SIGTERM");
    }
}

pub fn spawn(args: &[&str], ready_prefix: &str) -> Proc {
    spawn_env(args, ready_prefix, &[])
}

/// [`spawn`] with extra environment variables.
pub fn spawn_env(args: &[&str], ready_prefix: &str, env: &[(&str, &str)]) -> Proc {
    spawn_bin(BIN, args, ready_prefix, env)
}

/// Start `bin` with `args` and wait for its ready line, `ready_prefix` then
/// the URL.
pub fn spawn_bin(bin: &str, args: &[&str], ready_prefix: &str, env: &[(&str, &str)]) -> Proc {
    let mut child = Command::new(bin)
        .args(args)
        .env("ROLLCALL_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {bin}: {e}"));
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("ready line");
    let url = line
        .trim()
        .strip_prefix(ready_prefix)
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Proc { child, url }
}

/// The scripted model server, its own binary (`src/bin/scripted-upstream`).
pub const SCRIPTED_UPSTREAM: &str = env!("CARGO_BIN_EXE_scripted-upstream");

pub fn scripted_upstream() -> Proc {
    spawn_bin(
        SCRIPTED_UPSTREAM,
        &["--listen", "127.0.0.1:0"],
        "scripted upstream listening on ",
        &[],
    )
}

/// Start the proxy with `extra_toml` (any tables) in front of `upstream`.
pub fn proxy(dir: &Path, upstream: &str, extra_toml: &str) -> Proc {
    proxy_env(dir, upstream, extra_toml, &[])
}

/// [`proxy`] with extra environment variables.
pub fn proxy_env(dir: &Path, upstream: &str, extra_toml: &str, env: &[(&str, &str)]) -> Proc {
    let cfg = dir.join("rollcall.toml");
    let toml = format!("[shards]\nmax_age_secs = 0.2\n{extra_toml}\n");
    std::fs::write(&cfg, toml).expect("write config");
    let shards = dir.join("shards");
    spawn_env(
        &[
            "serve",
            "--config",
            cfg.to_str().expect("utf-8 path"),
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
            "--shards",
            shards.to_str().expect("utf-8 path"),
        ],
        "rollcall listening on ",
        env,
    )
}

pub fn shards_dir(dir: &Path) -> PathBuf {
    dir.join("shards")
}

/// Every row of `DIR/<kind>/*.parquet`, one map of column → value per row
/// (strings, integers, booleans; other types as their debug text).
pub fn read_rows(
    shards: &Path,
    kind: &str,
) -> Vec<std::collections::BTreeMap<String, serde_json::Value>> {
    let mut out = Vec::new();
    let dir = shards.join(kind);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for f in files {
        assert_eq!(
            f.extension().and_then(|e| e.to_str()),
            Some("parquet"),
            "stray file {f:?}"
        );
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&f).unwrap())
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            out.extend(batch_rows(&batch.unwrap()));
        }
    }
    out
}

fn batch_rows(b: &RecordBatch) -> Vec<std::collections::BTreeMap<String, serde_json::Value>> {
    use arrow::datatypes::{DataType, Int32Type, Int64Type};
    use serde_json::Value;
    let schema = b.schema();
    (0..b.num_rows())
        .map(|i| {
            schema
                .fields()
                .iter()
                .enumerate()
                .map(|(c, f)| {
                    let col = b.column(c);
                    let v = if col.is_null(i) {
                        Value::Null
                    } else {
                        match f.data_type() {
                            DataType::Utf8 => {
                                Value::String(col.as_string::<i32>().value(i).to_owned())
                            }
                            DataType::Binary => Value::String(
                                String::from_utf8_lossy(col.as_binary::<i32>().value(i))
                                    .into_owned(),
                            ),
                            DataType::Int64 => {
                                Value::from(col.as_primitive::<Int64Type>().value(i))
                            }
                            DataType::Int32 => {
                                Value::from(col.as_primitive::<Int32Type>().value(i))
                            }
                            DataType::Boolean => Value::Bool(col.as_boolean().value(i)),
                            _ => Value::String(format!("{:?}", col.slice(i, 1))),
                        }
                    };
                    (f.name().clone(), v)
                })
                .collect()
        })
        .collect()
}

/// An HTTP client for tests (reqwest's TLS needs a crypto provider installed).
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The proxy's `/healthz` answer.
pub async fn health(client: &reqwest::Client, proxy: &str) -> serde_json::Value {
    let resp = client.get(format!("{proxy}/healthz")).send().await.unwrap();
    resp.json().await.unwrap()
}

/// Wait until the proxy reports no unpublished rows.
pub async fn wait_published(client: &reqwest::Client, proxy: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = health(client, proxy).await;
        if h["shard_lag_rows"] == 0 {
            // Published means renamed into place; nothing more to wait for.
            return;
        }
        assert!(Instant::now() < deadline, "shards not published: {h}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
