//! Side-by-side comparison in one run, against the same fast scripted
//! upstream: direct, through rollcall, and through the LiteLLM proxy.
//!
//! Run with `make bench` (which installs LiteLLM into `.venv-litellm`).
//! Everything shares this machine's cores, so only the ratios and
//! differences measured here, side by side, are meaningful.
//!
//! Environment: `BENCH_QUICK=1` shortens every phase; `LITELLM_VENV` points
//! at a virtualenv with `litellm[proxy]` (default `.venv-litellm`).

#[path = "../tests/common/mod.rs"]
mod common;

use common::{scripted_upstream, spawn, Proc};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Target {
    name: &'static str,
    base: String,
    key: Option<String>,
}

fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1")
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

fn body(stream: bool, model: &str) -> String {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "List the files in the repository."}],
    })
    .to_string()
}

async fn call(c: &reqwest::Client, t: &Target, b: &str) -> (Duration, Duration, usize) {
    let start = Instant::now();
    let mut req = c
        .post(format!("{}/chat/completions", t.base))
        .header("content-type", "application/json")
        .body(b.to_owned());
    if let Some(k) = &t.key {
        req = req.bearer_auth(k);
    }
    let mut resp = req.send().await.expect("request");
    assert!(
        resp.status().is_success(),
        "{} answered {}",
        t.name,
        resp.status()
    );
    let mut first = None;
    let mut n = 0;
    while let Some(chunk) = resp.chunk().await.expect("body") {
        first.get_or_insert_with(|| start.elapsed());
        n += chunk.len();
    }
    (first.unwrap_or_else(|| start.elapsed()), start.elapsed(), n)
}

fn ms(d: f64) -> String {
    format!("{:.3} ms", d * 1e3)
}

/// CPU seconds (user + system) a process has used, from `/proc/PID/stat`.
fn cpu_secs(pid: &str) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at state.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

/// Pin every thread of process `pid` to the CPUs in `cpus` (`taskset`'s
/// list syntax); false when that is not possible here.
fn pin(pid: &str, cpus: &str) -> bool {
    Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, pid])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct LiteLlm {
    child: Child,
    base: String,
    key: String,
}

impl Drop for LiteLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_litellm(upstream: &str) -> Option<LiteLlm> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = std::env::var("LITELLM_VENV")
        .unwrap_or_else(|_| root.join(".venv-litellm").display().to_string());
    if !std::path::Path::new(&venv).join("bin/litellm").exists() {
        println!("LiteLLM: not installed at {venv}; run `make bench` to install it. Skipping its columns.");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let mut child = Command::new("bash")
        .arg(root.join("benches/litellm/serve.sh"))
        .arg(format!("{upstream}/v1"))
        .arg(port.to_string())
        .arg(&venv)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // Read the key, then keep draining stdout: LiteLLM dies of EPIPE if its
    // banner has nowhere to go.
    let out = BufReader::new(child.stdout.take()?);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if let Some(k) = line.strip_prefix("LITELLM_MASTER_KEY=") {
                let _ = tx.send(k.to_owned());
            }
        }
    });
    let key = rx.recv_timeout(Duration::from_secs(30)).ok()?;
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(180);
    while Instant::now() < deadline {
        if let Ok(r) = reqwest::blocking_get_ok(&format!("{base}/health/liveliness")) {
            if r {
                return Some(LiteLlm {
                    child,
                    base: format!("{base}/v1"),
                    key,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("LiteLLM: did not become ready within 180 s; skipping its columns.");
    None
}

mod reqwest {
    pub use ::reqwest::*;
    /// A tiny blocking GET through std, to poll readiness without a runtime.
    pub fn blocking_get_ok(url: &str) -> std::io::Result<bool> {
        use std::io::{Read, Write};
        let rest = url.strip_prefix("http://").unwrap_or(url);
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut s = std::net::TcpStream::connect(host)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
        write!(
            s,
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )?;
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        Ok(buf.starts_with("HTTP/1.1 200"))
    }
}

async fn latency(
    c: &reqwest::Client,
    targets: &[Target],
    n: usize,
    stream: bool,
    model: &str,
) -> Vec<(Vec<f64>, Vec<f64>)> {
    let b = body(stream, model);
    let mut out: Vec<(Vec<f64>, Vec<f64>)> = targets.iter().map(|_| (vec![], vec![])).collect();
    for t in targets {
        for _ in 0..20 {
            call(c, t, &b).await;
        }
    }
    for i in 0..n {
        for (j, t) in targets.iter().enumerate() {
            // LiteLLM is ~100x slower; sample it every 10th round.
            if t.name == "litellm" && i % 10 != 0 {
                continue;
            }
            let (first, total, _) = call(c, t, &b).await;
            out[j].0.push(first.as_secs_f64());
            out[j].1.push(total.as_secs_f64());
        }
    }
    out
}

async fn throughput(t: &Target, conns: usize, secs: f64) -> f64 {
    let c = reqwest::Client::builder()
        .pool_max_idle_per_host(conns)
        .build()
        .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let b = Arc::new(body(false, "bench"));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let t = Arc::new(Target {
        name: t.name,
        base: t.base.clone(),
        key: t.key.clone(),
    });
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (c, done, b, t) = (c.clone(), done.clone(), b.clone(), t.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                call(&c, &t, &b).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let start = Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let q = quick();
    let up = scripted_upstream();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bench.toml");
    std::fs::write(
        &cfg,
        "[server]\nmax_concurrent_calls = 8192\n[shards]\nmax_age_secs = 5\n",
    )
    .unwrap();
    let shards = dir.path().join("shards");
    let px: Proc = spawn(
        &[
            "serve",
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &format!("{}/v1", up.url),
            "--shards",
            shards.to_str().unwrap(),
        ],
        "rollcall listening on ",
    );
    let lite = start_litellm(&up.url);
    let mut targets = vec![
        Target {
            name: "direct",
            base: format!("{}/v1", up.url),
            key: None,
        },
        Target {
            name: "rollcall",
            base: format!("{}/rollouts/bench/v1", px.url),
            key: None,
        },
    ];
    if let Some(l) = &lite {
        targets.push(Target {
            name: "litellm",
            base: l.base.clone(),
            key: Some(l.key.clone()),
        });
    }
    println!("# rollcall side-by-side benchmark (same scripted upstream; 2 shared cores, so read the ratios)");
    rt.block_on(async {
        let c = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        // 1. Added latency per call, non-streaming, sequential.
        let n = if q { 300 } else { 2000 };
        let lat = latency(&c, &targets, n, false, "bench").await;
        println!("\n## Latency per call (non-streaming, sequential, {n} calls)");
        println!(
            "{:<10} {:>12} {:>12} {:>14} {:>14}",
            "target", "p50", "p99", "added p50", "added p99"
        );
        let (mut d50, mut d99) = (0.0, 0.0);
        let mut added = Vec::new();
        for (t, (_, total)) in targets.iter().zip(lat) {
            let mut v = total;
            let (p50, p99) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
            if t.name == "direct" {
                (d50, d99) = (p50, p99);
            }
            added.push((t.name, p50 - d50, p99 - d99));
            println!(
                "{:<10} {:>12} {:>12} {:>14} {:>14}",
                t.name,
                ms(p50),
                ms(p99),
                ms(p50 - d50),
                ms(p99 - d99)
            );
        }
        // 2. Streaming: time to first byte, and per-event overhead.
        let n = if q { 100 } else { 500 };
        let lat = latency(&c, &targets, n, true, "bench@events=8").await;
        println!("\n## Streaming time to first byte ({n} calls, 8 events each)");
        let mut ttfb_direct = 0.0;
        for (t, (first, _)) in targets.iter().zip(lat) {
            let mut v = first;
            let p50 = pct(&mut v, 0.5);
            if t.name == "direct" {
                ttfb_direct = p50;
            }
            println!(
                "{:<10} p50 {:>12} (added {:>12})  p99 {:>12}",
                t.name,
                ms(p50),
                ms(p50 - ttfb_direct),
                ms(pct(&mut v, 0.99))
            );
        }
        let events = 2000;
        let n = if q { 10 } else { 40 };
        let lat = latency(&c, &targets, n, true, &format!("bench@events={events}")).await;
        println!("\n## Per stream event ({n} streams of {events} events)");
        let mut per_event = Vec::new();
        let mut direct_total = 0.0;
        for (t, (_, total)) in targets.iter().zip(lat) {
            let mut v = total;
            let p50 = pct(&mut v, 0.5);
            if t.name == "direct" {
                direct_total = p50;
            }
            let per = (p50 - direct_total) / events as f64;
            per_event.push((t.name, per));
            println!(
                "{:<10} stream p50 {:>12}  overhead per event {:>8.2} µs",
                t.name,
                ms(p50),
                per * 1e6
            );
        }
        // 3. Throughput: every process on every core, as the machine is;
        // then again with rollcall on a core of its own and the client and
        // upstream sharing the other, as when the model server runs
        // elsewhere.
        let secs: f64 = if q { 1.5 } else { 4.0 };
        let (up_pid, px_pid) = (up.child.id().to_string(), px.child.id().to_string());
        let lite_pid = lite.as_ref().map(|l| l.child.id().to_string());
        let me = std::process::id().to_string();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut tput = std::collections::BTreeMap::new();
        for pinned in [false, true] {
            if pinned {
                let (mine, theirs) = ("0", format!("1-{}", cores - 1));
                let ok = cores >= 2
                    && pin(&me, mine)
                    && pin(&up_pid, mine)
                    && pin(&px_pid, &theirs)
                    && lite_pid.as_ref().is_none_or(|p| pin(p, &theirs));
                if !ok {
                    println!("\n(no second core or no taskset: skipping the pinned throughput)");
                    break;
                }
                println!("\n## Throughput, rollcall and LiteLLM on CPUs {theirs}, client and upstream on CPU {mine}");
            } else {
                println!("\n## Throughput (non-streaming calls/s, {secs} s each; CPU µs per call by process)");
            }
            for conns in [64, 256] {
                for t in &targets {
                    let cpu0 = [cpu_secs("self"), cpu_secs(&up_pid), cpu_secs(&px_pid)];
                    let r = throughput(
                        t,
                        conns,
                        if t.name == "litellm" {
                            secs.min(3.0)
                        } else {
                            secs
                        },
                    )
                    .await;
                    tput.insert((pinned, conns, t.name), r);
                    let cpu1 = [cpu_secs("self"), cpu_secs(&up_pid), cpu_secs(&px_pid)];
                    let calls = r * secs;
                    let per = |i: usize| (cpu1[i] - cpu0[i]) / calls.max(1.0) * 1e6;
                    let proxy = if t.name == "rollcall" {
                        format!("  rollcall {:>5.1}", per(2))
                    } else {
                        String::new()
                    };
                    println!(
                        "{:<10} {:>4} connections {:>10.0} calls/s   CPU/call: client {:>5.1}  upstream {:>5.1}{proxy}",
                        t.name, conns, r, per(0), per(1)
                    );
                }
            }
        }
        let all = format!("0-{}", cores - 1);
        for p in [&me, &up_pid, &px_pid] {
            pin(p, &all);
        }
        // 4. RSS at 1,000 concurrent streams.
        let streams = 1000;
        let before = rss_kb(px.child.id());
        let c2 = reqwest::Client::builder()
            .pool_max_idle_per_host(streams)
            .build()
            .unwrap();
        let started = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        let b = Arc::new(body(true, "bench@events=30@delay_ms=100"));
        let proxy_base = Arc::new(targets[1].base.clone());
        for _ in 0..streams {
            let (c2, started, b, base) =
                (c2.clone(), started.clone(), b.clone(), proxy_base.clone());
            tasks.push(tokio::spawn(async move {
                let mut r = c2
                    .post(format!("{base}/chat/completions"))
                    .body((*b).clone())
                    .send()
                    .await
                    .unwrap();
                let mut first = true;
                while let Some(_c) = r.chunk().await.unwrap() {
                    if first {
                        started.fetch_add(1, Ordering::Relaxed);
                        first = false;
                    }
                }
            }));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while started.load(Ordering::Relaxed) < streams as u64 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let open = started.load(Ordering::Relaxed);
        let mut peak = 0;
        for _ in 0..10 {
            peak = peak.max(rss_kb(px.child.id()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        println!("\n## Memory");
        println!(
            "rollcall RSS idle {:.1} MB; with {open} concurrent streams open: {:.1} MB",
            before as f64 / 1024.0,
            peak as f64 / 1024.0
        );

        println!("\n## Targets");
        let rc = added.iter().find(|a| a.0 == "rollcall").unwrap();
        let check = |ok: bool| if ok { "PASS" } else { "MISS" };
        println!(
            "{} added latency p50 {} (target ≤ 0.5 ms)",
            check(rc.1 <= 0.0005),
            ms(rc.1)
        );
        println!(
            "{} added latency p99 {} (target ≤ 1 ms)",
            check(rc.2 <= 0.001),
            ms(rc.2)
        );
        let pe = per_event.iter().find(|a| a.0 == "rollcall").unwrap().1;
        println!(
            "{} per stream event {:.2} µs (target ≤ 20 µs)",
            check(pe <= 20e-6),
            pe * 1e6
        );
        for ((pinned, conns, name), r) in &tput {
            if *name != "rollcall" {
                continue;
            }
            let how = if *pinned { ", own core" } else { "" };
            let d = tput[&(*pinned, *conns, "direct")];
            println!(
                "{} throughput at {conns}{how}: {:.0}% of direct (target ≥ 50%)",
                check(*r >= 0.5 * d),
                100.0 * r / d
            );
            if let Some(l) = tput.get(&(*pinned, *conns, "litellm")) {
                println!(
                    "{} throughput at {conns}{how}: {:.0}x LiteLLM (target ≥ 50x)",
                    check(*r >= 50.0 * l),
                    r / l
                );
            }
        }
        if let Some(l) = added.iter().find(|a| a.0 == "litellm") {
            println!(
                "info LiteLLM adds p50 {} / p99 {} per call",
                ms(l.1),
                ms(l.2)
            );
        }
        println!(
            "{} RSS {:.1} MB at {open} streams (target ≤ 100 MB)",
            check(peak < 100 * 1024),
            peak as f64 / 1024.0
        );
    });
    drop(lite);
    px.stop();
}
