//! `rollcall run`: one rollout of an unmodified harness through the proxy.
//!
//! The harness gets a private home (its config files are written there), an
//! environment that points it at `PROXY/rollouts/<id>/v1`, and a working
//! directory. Its output streams through as it comes. When it exits, the
//! rollout is finished on the proxy with the exit status and duration.

use super::install::path_with;
use super::{Adapter, HarnessError, Vars};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// What to run.
pub struct RunSpec {
    pub adapter: Adapter,
    /// Where harnesses are installed.
    pub root: PathBuf,
    pub rollout: String,
    /// The proxy's base URL, `http://HOST:PORT`.
    pub proxy: String,
    pub model: String,
    /// The key the harness presents to the proxy.
    pub api_key: String,
    pub workdir: PathBuf,
    /// The private home; a fresh one under the cache directory when `None`.
    pub home: Option<PathBuf>,
    pub keep_home: bool,
    pub timeout: Duration,
    pub task: String,
    /// Extra metadata recorded in the finish row.
    pub metadata: Option<serde_json::Value>,
    /// Arguments appended to the adapter's command line.
    pub extra_args: Vec<String>,
    /// A shell command run in the workdir after the harness ends; exit 0
    /// gives the rollout reward 1, anything else reward 0.
    pub check: Option<String>,
    /// The rollout's budget, set on the proxy before the harness starts.
    pub budget: Option<crate::config::Budget>,
}

/// Give `rollout` its own budget on the proxy at `proxy` (`PUT
/// /v1/rollouts/<id>/budget`, presenting `key`).
pub async fn set_budget(
    client: &reqwest::Client,
    proxy: &str,
    key: &str,
    rollout: &str,
    budget: &crate::config::Budget,
) -> Result<(), String> {
    let body = serde_json::to_vec(budget).map_err(|e| e.to_string())?;
    client
        .put(format!("{proxy}/v1/rollouts/{rollout}/budget"))
        .bearer_auth(key)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// What the `--check` command said about the harness's work.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub exit_code: Option<i32>,
    /// The last few KiB of its stdout and stderr.
    pub output: String,
    pub reward: f64,
}

/// Longest a check may run.
const CHECK_TIMEOUT: Duration = Duration::from_secs(300);
/// Output of a check kept in the finish row.
const CHECK_OUTPUT_BYTES: usize = 4096;

/// Run `check` with `sh -c` in `workdir`, with the harness's environment
/// minus the proxy's key.
async fn run_check(check: &str, workdir: &Path) -> Check {
    let out = tokio::time::timeout(
        CHECK_TIMEOUT,
        tokio::process::Command::new("sh")
            .arg("-c")
            .arg(check)
            .current_dir(workdir)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await;
    match out {
        Ok(Ok(o)) => {
            let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&o.stderr));
            let mut cut = text.len().saturating_sub(CHECK_OUTPUT_BYTES);
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            Check {
                exit_code: o.status.code(),
                output: text[cut..].to_owned(),
                reward: if o.status.success() { 1.0 } else { 0.0 },
            }
        }
        Ok(Err(e)) => Check {
            exit_code: None,
            output: format!("could not run the check: {e}"),
            reward: 0.0,
        },
        Err(_) => Check {
            exit_code: None,
            output: format!("the check ran past {} s", CHECK_TIMEOUT.as_secs()),
            reward: 0.0,
        },
    }
}

/// How the harness ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
    /// It ran past the timeout and was killed.
    TimedOut,
    /// rollcall run was interrupted, and stopped it.
    Cancelled,
}

impl Outcome {
    /// The status recorded in the rollout's finish row.
    pub fn status(self) -> &'static str {
        match self {
            Outcome::Exited(0) => "completed",
            Outcome::Exited(_) | Outcome::Signaled(_) => "failed",
            Outcome::TimedOut => "timeout",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// The exit code `rollcall run` itself returns.
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Exited(c) => c,
            Outcome::Signaled(s) => 128 + s,
            Outcome::TimedOut => 124,
            Outcome::Cancelled => 130,
        }
    }
}

fn default_home(harness: &str, rollout: &str) -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache
        .join("rollcall")
        .join("homes")
        .join(format!("{harness}-{rollout}"))
}

fn absolute(p: &Path) -> Result<PathBuf, HarnessError> {
    std::path::absolute(p).map_err(HarnessError::io(p))
}

/// Kill the harness's whole process group: SIGTERM, then SIGKILL after a grace.
pub async fn stop_group(child: &mut tokio::process::Child) {
    let Some(pid) = child.id() else { return };
    let pgid = pid as libc::pid_t;
    // SAFETY: kill(2) with a negative pid signals the process group we
    // created for the child; it has no memory-safety preconditions.
    unsafe { libc::kill(-pgid, libc::SIGTERM) };
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        // SAFETY: as above.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = child.wait().await;
    }
}

/// Run the harness once; returns how it ended.
pub async fn run(mut spec: RunSpec) -> Result<Outcome, HarnessError> {
    spec.root = absolute(&spec.root)?;
    let a = &spec.adapter;
    crate::record::check_rollout_id(&spec.rollout).map_err(|e| HarnessError::Adapter {
        name: a.name.clone(),
        message: e.to_string(),
    })?;
    let bin = a.bin(&spec.root);
    if !bin.exists() {
        return Err(HarnessError::NotInstalled(
            a.name.clone(),
            a.dir(&spec.root),
        ));
    }
    let proxy = spec.proxy.trim_end_matches('/').to_owned();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| HarnessError::Proxy {
            url: proxy.clone(),
            message: e.to_string(),
        })?;
    let health = client.get(format!("{proxy}/healthz")).send().await;
    if let Err(e) = health.and_then(|r| r.error_for_status()) {
        return Err(HarnessError::Proxy {
            url: proxy,
            message: e.to_string(),
        });
    }

    if let Some(b) = &spec.budget {
        set_budget(&client, &proxy, &spec.api_key, &spec.rollout, b)
            .await
            .map_err(|e| HarnessError::Proxy {
                url: proxy.clone(),
                message: format!("could not set the budget of rollout {}: {e}", spec.rollout),
            })?;
    }
    let workdir = absolute(&spec.workdir)?;
    std::fs::create_dir_all(&workdir).map_err(HarnessError::io(&workdir))?;
    let home = absolute(
        &spec
            .home
            .clone()
            .unwrap_or_else(|| default_home(&a.name, &spec.rollout)),
    )?;
    if home.exists() && spec.home.is_none() {
        std::fs::remove_dir_all(&home).map_err(HarnessError::io(&home))?;
    }
    std::fs::create_dir_all(&home).map_err(HarnessError::io(&home))?;

    let base_url = format!("{proxy}/rollouts/{}/v1", spec.rollout);
    let vars = Vars(BTreeMap::from([
        ("bin", bin.display().to_string()),
        ("base_url", base_url.clone()),
        ("proxy", proxy.clone()),
        ("rollout", spec.rollout.clone()),
        ("model", spec.model.clone()),
        ("api_key", spec.api_key.clone()),
        ("task", spec.task.clone()),
        ("workdir", workdir.display().to_string()),
        ("home", home.display().to_string()),
    ]));
    let render = |t: &str| {
        vars.render(t).map_err(|message| HarnessError::Adapter {
            name: a.name.clone(),
            message,
        })
    };
    for d in &a.run.dirs {
        let path = home.join(render(d)?);
        std::fs::create_dir_all(&path).map_err(HarnessError::io(&path))?;
    }
    for f in &a.run.files {
        let path = home.join(render(&f.path)?);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(HarnessError::io(parent))?;
        }
        std::fs::write(&path, render(&f.content)?).map_err(HarnessError::io(&path))?;
    }
    let argv = a
        .run
        .argv
        .iter()
        .map(|t| render(t))
        .collect::<Result<Vec<_>, _>>()?;
    let mut env = BTreeMap::new();
    for (k, v) in &a.run.env {
        env.insert(k.clone(), render(v)?);
    }
    for d in ["config", "data", "cache", "state"] {
        std::fs::create_dir_all(home.join(format!(".{d}"))).map_err(HarnessError::io(&home))?;
    }

    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .args(&spec.extra_args)
        .current_dir(&workdir)
        // Some harnesses (opencode) take their directory from PWD.
        .env("PWD", &workdir)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".data"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_STATE_HOME", home.join(".state"))
        .env("OPENAI_BASE_URL", &base_url)
        .env("OPENAI_API_KEY", &spec.api_key)
        .env("ROLLCALL_ROLLOUT_ID", &spec.rollout)
        .env("PATH", path_with(a.node_bin(&spec.root).as_deref()))
        .envs(&env)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true);
    eprintln!(
        "==> rollcall run: {} {} rollout {} -> {base_url} (workdir {}, home {})",
        a.name,
        a.version,
        spec.rollout,
        workdir.display(),
        home.display()
    );
    let started = Instant::now();
    let started_at = crate::now_micros();
    let mut child = cmd.spawn().map_err(|source| HarnessError::Spawn {
        program: argv[0].clone(),
        source,
    })?;
    let outcome = tokio::select! {
        status = child.wait() => match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                match (s.code(), s.signal()) {
                    (Some(c), _) => Outcome::Exited(c),
                    (None, Some(sig)) => Outcome::Signaled(sig),
                    (None, None) => Outcome::Exited(1),
                }
            }
            Err(e) => return Err(HarnessError::Io { path: bin.clone(), source: e }),
        },
        _ = tokio::time::sleep(spec.timeout) => {
            stop_group(&mut child).await;
            Outcome::TimedOut
        }
        _ = crate::http::shutdown_signal() => {
            stop_group(&mut child).await;
            Outcome::Cancelled
        }
    };
    let duration = started.elapsed().as_secs_f64();
    let mut metadata = json!({
        "harness": a.name,
        "harness_version": a.version,
        "wire_api": a.wire_api,
        "model": spec.model,
        "exit_code": match outcome { Outcome::Exited(c) => json!(c), _ => json!(null) },
        "signal": match outcome { Outcome::Signaled(s) => json!(s), _ => json!(null) },
        "outcome": outcome.status(),
        "duration_s": duration,
        "started_at": started_at,
        "task": spec.task,
    });
    if let Some(extra) = &spec.metadata {
        metadata["extra"] = extra.clone();
    }
    let mut finish_body = json!({"status": outcome.status(), "metadata": metadata});
    if let Some(check) = spec
        .check
        .as_deref()
        .filter(|_| outcome != Outcome::Cancelled)
    {
        let c = run_check(check, &workdir).await;
        eprintln!(
            "==> rollcall run: check `{check}` exit {} -> reward {}",
            c.exit_code.map_or("none".into(), |c| c.to_string()),
            c.reward
        );
        finish_body["reward"] = json!(c.reward);
        finish_body["metadata"]["check"] =
            json!({"command": check, "exit_code": c.exit_code, "output": c.output});
    }
    let finish = client
        .post(format!("{proxy}/v1/rollouts/{}/finish", spec.rollout))
        .bearer_auth(&spec.api_key)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(finish_body.to_string())
        .send()
        .await
        .and_then(|r| r.error_for_status());
    if let Err(e) = finish {
        return Err(HarnessError::Proxy {
            url: proxy,
            message: format!("could not finish rollout {}: {e}", spec.rollout),
        });
    }
    eprintln!(
        "==> rollcall run: {} rollout {} {} (exit {}) in {duration:.1} s",
        a.name,
        spec.rollout,
        outcome.status(),
        outcome.exit_code()
    );
    if !spec.keep_home && spec.home.is_none() {
        let _ = std::fs::remove_dir_all(&home);
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn check_sets_the_reward_from_its_exit_status() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("out.txt"), "42\n").unwrap();
        let pass = run_check("grep -q 42 out.txt && echo ok", dir.path()).await;
        assert_eq!(
            (pass.exit_code, pass.reward, pass.output.as_str()),
            (Some(0), 1.0, "ok\n")
        );
        let fail = run_check("echo nope >&2; exit 3", dir.path()).await;
        assert_eq!(
            (fail.exit_code, fail.reward, fail.output.as_str()),
            (Some(3), 0.0, "nope\n")
        );
        let long = run_check("head -c 10000 /dev/zero | tr '\\0' x", dir.path()).await;
        assert_eq!(long.output.len(), CHECK_OUTPUT_BYTES);
    }
}
