//! The hot path side by side in one run: the same small non-streaming Chat
//! Completions call sent by wrk straight to the scripted upstream, and
//! through nginx, a bare hyper forwarder, rollcall (recording every call)
//! and LiteLLM in front of it.
//!
//! Run with `make bench`, which installs wrk and nginx from Debian and
//! LiteLLM into `.venv-litellm`. The load generator is wrk (C, a few µs of
//! CPU per call) rather than a Rust client, so that the load generator does
//! not eat the CPU the proxies need: on a 2-core machine wrk, the upstream
//! and the proxy share the cores, and only figures measured side by side,
//! interleaved, in one run mean anything.
//!
//! Every measurement (64 connections, 256 connections, 1 connection for
//! latency) runs each target back to back; the whole round repeats R times
//! (3; 1 with `BENCH_QUICK=1`) and the table shows the median per target.
//! LiteLLM is two orders of magnitude slower: it runs only at 64 connections
//! and 1 connection, for a shorter time.
//!
//! Each process's CPU per call is also split into user space and kernel,
//! and rollcall's by kind of thread (its serving threads, where the WAL is
//! written inline, against the shard writer and the WAL's helpers), so
//! that a gap can be traced to the side that makes it.
//!
//! Environment: `BENCH_QUICK=1` shortens every phase; `LITELLM_VENV` points
//! at a virtualenv with `litellm[proxy]` (default `.venv-litellm`);
//! `WRK` and `NGINX` name the binaries (default: found on `PATH`).

#[path = "../tests/common/mod.rs"]
mod common;

use common::{scripted_upstream, spawn, Proc};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The call every run sends: small, non-streaming.
const BODY: &str = r#"{"model":"bench","stream":false,"messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"List the files in the repository."}]}"#;

fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1")
}

fn main() {
    // The bare hyper forwarder is this same binary run again with
    // `--forwarder LISTEN UPSTREAM`: a process of its own, like every other
    // target, so that /proc gives its CPU alone and it never shares this
    // process's threads; and one file that `cargo bench --bench compare`
    // builds, with no example to build or find beside it.
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--forwarder") {
        forwarder::run(&args[i + 1], &args[i + 2]);
        return;
    }
    bench();
}

// ---------------------------------------------------------------------------
// The targets.

struct Target {
    name: &'static str,
    /// The URL wrk calls (path included).
    url: String,
    /// Extra request headers (LiteLLM's key).
    headers: Vec<(String, String)>,
    /// The proxy's root process, whose tree's CPU is charged to it.
    pid: Option<u32>,
    /// LiteLLM: 64 connections and 1 connection only, shorter runs.
    slow: bool,
    /// rollcall: its CPU is also counted by kind of thread.
    by_thread: bool,
}

/// nginx with `proxy_pass` to the upstream over kept-alive connections,
/// 2 worker processes, no access log: the fastest proxy a user could pick.
struct Nginx {
    child: Child,
    url: String,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM the master, which stops its workers; SIGKILL would orphan
        // them, still listening.
        stop_gently(&mut self.child);
    }
}

fn stop_gently(child: &mut Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} is not listening on 127.0.0.1:{port}");
}

fn start_nginx(dir: &Path, upstream: &str) -> Nginx {
    // Debian installs nginx in /usr/sbin, off most users' PATH.
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("nginx").is_file()));
    let nginx = std::env::var("NGINX")
        .unwrap_or_else(|_| if on_path { "nginx" } else { "/usr/sbin/nginx" }.into());
    let up = upstream.strip_prefix("http://").unwrap_or(upstream);
    let port = free_port();
    let d = dir.join("nginx");
    std::fs::create_dir_all(&d).unwrap();
    let p = |s: &str| d.join(s).display().to_string();
    // As root, nginx's workers would run as `nobody`; keep them as root,
    // the user running the bench. As anyone else `user` does not apply.
    // SAFETY: geteuid has no preconditions.
    let user = if unsafe { libc::geteuid() } == 0 {
        "user root;\n"
    } else {
        ""
    };
    let conf = format!(
        "{user}worker_processes 2;
pid {pid};
error_log {err} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {t}/client;
    proxy_temp_path {t}/proxy;
    fastcgi_temp_path {t}/fastcgi;
    uwsgi_temp_path {t}/uwsgi;
    scgi_temp_path {t}/scgi;
    keepalive_requests 1000000;
    upstream scripted {{
        server {up};
        keepalive 512;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://scripted;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
}}
",
        pid = p("nginx.pid"),
        err = p("error.log"),
        t = d.display(),
    );
    let cf = d.join("nginx.conf");
    std::fs::write(&cf, conf).unwrap();
    let child = Command::new(&nginx)
        .arg("-c")
        .arg(&cf)
        .arg("-p")
        .arg(&d)
        .arg("-e")
        .arg(p("error.log"))
        .args(["-g", "daemon off;"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {nginx}: {e} (make bench installs it from Debian)"));
    let mut n = Nginx {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(s)) = n.child.try_wait() {
            panic!(
                "nginx exited ({s}): {}",
                std::fs::read_to_string(d.join("error.log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "nginx did not start listening");
        std::thread::sleep(Duration::from_millis(20));
    }
    n
}

fn start_forwarder(upstream: &str) -> Proc {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .args(["--forwarder", "127.0.0.1:0", upstream])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the forwarder");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("forwarder ready line");
    let url = line
        .trim()
        .strip_prefix("forwarder listening on ")
        .unwrap_or_else(|| panic!("unexpected forwarder line {line:?}"))
        .to_owned();
    Proc { child, url }
}

/// The floor the crates themselves set: a hyper server and hyper-util's
/// legacy client with its keep-alive pool, forwarding method, path, headers
/// and body, and the answer back, with nothing else.
mod forwarder {
    use hyper::body::Incoming;
    use hyper::{header, Request, Uri};
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use std::sync::Arc;

    pub fn run(listen: &str, upstream: &str) {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            let client: Client<_, Incoming> = Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(1024)
                .build(connector);
            let upstream: Arc<str> = upstream.trim_end_matches('/').into();
            let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
            println!(
                "forwarder listening on http://{}",
                listener.local_addr().unwrap()
            );
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let (client, upstream) = (client.clone(), upstream.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                        let (client, upstream) = (client.clone(), upstream.clone());
                        async move {
                            let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
                            // A path the server accepted is a valid URI's tail.
                            *req.uri_mut() = format!("{upstream}{pq}").parse::<Uri>().unwrap();
                            // The client sets Host from the URI.
                            req.headers_mut().remove(header::HOST);
                            client.request(req).await
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
    }
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
        println!("LiteLLM: not installed at {venv}; run `make bench` to install it. Skipping its column.");
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
        if let Ok(r) = http(&format!("{base}/health/liveliness"), "GET", &[], "") {
            if r.starts_with("HTTP/1.1 200") {
                return Some(LiteLlm {
                    child,
                    base: format!("{base}/v1"),
                    key,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("LiteLLM: did not become ready within 180 s; skipping its column.");
    None
}

/// One HTTP/1.1 exchange through std, `Connection: close`: readiness polls
/// and the check that every target answers the bench's call.
fn http(
    url: &str,
    method: &str,
    headers: &[(String, String)],
    body: &str,
) -> std::io::Result<String> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = std::net::TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!(
        "{method} /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    Ok(buf)
}

// ---------------------------------------------------------------------------
// CPU accounting.

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64).max(1.0)
}

/// CPU seconds used so far: in user space, and in the kernel.
#[derive(Clone, Copy, Default)]
struct Cpu {
    user: f64,
    kernel: f64,
}

impl Cpu {
    fn total(self) -> f64 {
        self.user + self.kernel
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            user: self.user - before.user,
            kernel: self.kernel - before.kernel,
        }
    }
}

/// The fields of a `/proc/.../stat` line after the command name (which may
/// hold spaces), from the state on.
fn stat_fields(stat: &str) -> Vec<u64> {
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    rest.split_whitespace()
        .map(|v| v.parse::<u64>().unwrap_or(0))
        .collect()
}

/// A stat line's CPU (utime and stime, fields 14 and 15).
fn stat_cpu(f: &[u64]) -> Cpu {
    let tick = |i: usize| f.get(i).copied().unwrap_or(0) as f64 / clock_ticks();
    Cpu {
        user: tick(11),
        kernel: tick(12),
    }
}

/// CPU used so far by process `root` and all its descendants (nginx's
/// workers, LiteLLM's), every thread, from /proc.
fn tree_cpu(root: u32) -> Cpu {
    let mut parent = HashMap::new();
    let mut cpu = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let f = stat_fields(&s);
        parent.insert(pid, f.get(1).copied().unwrap_or(0) as u32);
        cpu.insert(pid, stat_cpu(&f));
    }
    let mut total = Cpu::default();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        let c = cpu.get(&p).copied().unwrap_or_default();
        total = Cpu {
            user: total.user + c.user,
            kernel: total.kernel + c.kernel,
        };
        todo.extend(parent.iter().filter(|(_, pp)| **pp == p).map(|(c, _)| *c));
    }
    total
}

/// CPU seconds used so far by each kind of thread of process `pid`: its
/// threads by name, with a trailing number dropped (`rollcall-serve-0` and
/// `rollcall-serve-1` are one kind; Linux keeps 15 bytes of a name).
fn threads_cpu(pid: u32) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
    for e in tasks.into_iter().flatten().flatten() {
        let dir = e.path();
        let (Ok(name), Ok(stat)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("stat")),
        ) else {
            continue;
        };
        let kind = name.trim().trim_end_matches(|c: char| c.is_ascii_digit());
        let kind = kind.trim_end_matches('-').to_string();
        *out.entry(kind).or_default() += stat_cpu(&stat_fields(&stat)).total();
    }
    out
}

/// CPU seconds used by this process's waited-for children: only wrk is
/// waited for while the servers run, so the change across one wrk run is
/// that run's CPU.
fn children_cpu() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// wrk.

/// A wrk Lua script: POST `body` as JSON with `headers`.
fn wrk_script(dir: &Path, name: &str, body: &str, headers: &[(String, String)]) -> PathBuf {
    let mut s = format!(
        "wrk.method = \"POST\"\nwrk.body = [[{body}]]\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
    );
    for (k, v) in headers {
        s.push_str(&format!("wrk.headers[\"{k}\"] = \"{v}\"\n"));
    }
    let p = dir.join(format!("{name}.lua"));
    std::fs::write(&p, s).unwrap();
    p
}

#[derive(Clone, Default)]
struct Run {
    calls_per_sec: f64,
    calls: u64,
    /// Seconds.
    p50: f64,
    p99: f64,
    /// CPU µs per completed call: the proxy's process tree (None: direct),
    /// the upstream's, wrk's.
    cpu_proxy: Option<f64>,
    cpu_upstream: f64,
    cpu_wrk: f64,
    /// The proxy's CPU µs per call in the kernel (the rest is user space).
    cpu_proxy_kernel: Option<f64>,
    /// A `by_thread` target's CPU µs per call, by kind of thread.
    cpu_threads: BTreeMap<String, f64>,
}

/// `12.34us`, `1.20ms`, `2.00s`, `1.00m` → seconds.
fn wrk_duration(s: &str) -> Option<f64> {
    let (n, unit) = if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        return None;
    };
    n.parse::<f64>().ok().map(|v| v * unit)
}

struct Wrk<'a> {
    bin: String,
    upstream_pid: u32,
    scripts: &'a HashMap<&'static str, PathBuf>,
}

impl Wrk<'_> {
    /// One wrk run; panics with wrk's output when any call failed.
    fn run(&self, t: &Target, script: &Path, conns: usize, secs: f64) -> Run {
        self.run_with(t, script, conns, secs, true, |_| {}).0
    }

    /// [`Wrk::run`], calling `during` every 100 ms while wrk runs; with
    /// `strict` false, errors are returned (in the text) instead of fatal.
    fn run_with(
        &self,
        t: &Target,
        script: &Path,
        conns: usize,
        secs: f64,
        strict: bool,
        mut during: impl FnMut(&Target),
    ) -> (Run, String) {
        let threads = if conns == 1 { 1 } else { 2 };
        let by_thread = |t: &Target| match t.pid {
            Some(pid) if t.by_thread => threads_cpu(pid),
            _ => BTreeMap::new(),
        };
        let cpu0 = (
            t.pid.map(tree_cpu),
            tree_cpu(self.upstream_pid),
            children_cpu(),
            by_thread(t),
        );
        let mut child = Command::new(&self.bin)
            .arg(format!("-t{threads}"))
            .arg(format!("-c{conns}"))
            // wrk takes whole seconds (2s, 2m, 2h).
            .arg(format!("-d{}s", secs.round().max(1.0) as u64))
            .args(["--timeout", "15s", "--latency", "-s"])
            .arg(script)
            .arg(&t.url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "start {}: {e} (make bench installs it from Debian)",
                    self.bin
                )
            });
        // wrk prints only at the end: its pipes never fill while it runs.
        while child.try_wait().expect("wait wrk").is_none() {
            during(t);
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = child.wait_with_output().expect("wrk output");
        let cpu1 = (
            t.pid.map(tree_cpu),
            tree_cpu(self.upstream_pid),
            children_cpu(),
            by_thread(t),
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let fail = |why: &str| -> ! {
            panic!(
                "wrk against {} ({} connections): {why}\n{text}{}",
                t.name,
                conns,
                String::from_utf8_lossy(&out.stderr)
            )
        };
        if !out.status.success() {
            fail("wrk failed");
        }
        let mut r = Run::default();
        let mut errors = String::new();
        let mut in_latency = false;
        for line in text.lines() {
            let l = line.trim();
            let w: Vec<&str> = l.split_whitespace().collect();
            if l.starts_with("Latency Distribution") {
                in_latency = true;
            } else if in_latency && w.len() == 2 && w[0].ends_with('%') {
                let v = wrk_duration(w[1]).unwrap_or_else(|| fail("bad percentile"));
                match w[0] {
                    "50%" => r.p50 = v,
                    "99%" => r.p99 = v,
                    _ => {}
                }
            } else if w.get(1) == Some(&"requests") && w.get(2) == Some(&"in") {
                in_latency = false;
                r.calls = w[0].parse().unwrap_or_else(|_| fail("bad request count"));
            } else if let Some(v) = l.strip_prefix("Requests/sec:") {
                r.calls_per_sec = v
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| fail("bad Requests/sec"));
            } else if l.starts_with("Socket errors:") || l.starts_with("Non-2xx or 3xx") {
                errors.push_str(l);
                errors.push('\n');
            }
        }
        if r.calls == 0 || r.calls_per_sec == 0.0 {
            fail("no call completed");
        }
        if strict && !errors.is_empty() {
            fail(&format!("calls failed: {}", errors.trim()));
        }
        let per = |a: f64, b: f64| (b - a) / r.calls as f64 * 1e6;
        let proxy = cpu0.0.zip(cpu1.0).map(|(a, b)| b.since(a));
        r.cpu_proxy = proxy.map(|c| per(0.0, c.total()));
        r.cpu_proxy_kernel = proxy.map(|c| per(0.0, c.kernel));
        r.cpu_upstream = per(cpu0.1.total(), cpu1.1.total());
        r.cpu_wrk = per(cpu0.2, cpu1.2);
        r.cpu_threads = cpu1
            .3
            .iter()
            .map(|(k, b)| (k.clone(), per(cpu0.3.get(k).copied().unwrap_or(0.0), *b)))
            .collect();
        (r, errors)
    }
}

// ---------------------------------------------------------------------------
// Report.

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn calls(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// Seconds → `93 µs` or `21.6 ms`.
fn us(s: f64) -> String {
    let u = s * 1e6;
    if u.abs() >= 1000.0 {
        format!("{:.1} ms", u / 1000.0)
    } else {
        format!("{u:.0} µs")
    }
}

fn signed(s: f64) -> String {
    if s >= 0.0 {
        format!("+{}", us(s))
    } else {
        format!("−{}", us(-s))
    }
}

fn check(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// Call rows in the shards under `dir` (Parquet footers only).
fn shard_rows(dir: &Path) -> i64 {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    std::fs::read_dir(dir.join("calls"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .filter_map(|p| SerializedFileReader::new(std::fs::File::open(p).ok()?).ok())
        .map(|r| r.metadata().file_metadata().num_rows())
        .sum()
}

fn bench() {
    let q = quick();
    let rounds = if q { 1 } else { 3 };
    let secs = if q { 2.0 } else { 5.0 };
    let slow_secs = if q { 2.0 } else { 3.0 };
    let wrk_bin = std::env::var("WRK").unwrap_or_else(|_| "wrk".into());

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
    let nginx = start_nginx(dir.path(), &up.url);
    let fwd = start_forwarder(&up.url);
    let lite = start_litellm(&up.url);
    for u in [&up.url, &px.url, &nginx.url, &fwd.url] {
        let port = u.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap();
        wait_listening(port, u);
    }

    let path = "/v1/chat/completions";
    let mut targets = vec![
        Target {
            name: "direct",
            url: format!("{}{path}", up.url),
            headers: vec![],
            pid: None,
            slow: false,
            by_thread: false,
        },
        Target {
            name: "nginx",
            url: format!("{}{path}", nginx.url),
            headers: vec![],
            pid: Some(nginx.child.id()),
            slow: false,
            by_thread: false,
        },
        Target {
            name: "hyper",
            url: format!("{}{path}", fwd.url),
            headers: vec![],
            pid: Some(fwd.child.id()),
            slow: false,
            by_thread: false,
        },
        Target {
            name: "rollcall",
            url: format!("{}/rollouts/bench{path}", px.url),
            headers: vec![],
            pid: Some(px.child.id()),
            slow: false,
            by_thread: true,
        },
    ];
    if let Some(l) = &lite {
        targets.push(Target {
            name: "litellm",
            url: format!("{}/chat/completions", l.base),
            headers: vec![("Authorization".into(), format!("Bearer {}", l.key))],
            pid: Some(l.child.id()),
            slow: true,
            by_thread: false,
        });
    }

    // Every target answers the bench's call before anything is measured.
    for t in &targets {
        let r = http(&t.url, "POST", &t.headers, BODY).expect("sanity call");
        assert!(
            r.starts_with("HTTP/1.1 200") && r.contains("\"choices\""),
            "{} does not answer the bench's call: {r}",
            t.name
        );
    }

    let scripts: HashMap<&'static str, PathBuf> = targets
        .iter()
        .map(|t| (t.name, wrk_script(dir.path(), t.name, BODY, &t.headers)))
        .collect();
    let wrk = Wrk {
        bin: wrk_bin,
        upstream_pid: up.child.id(),
        scripts: &scripts,
    };

    println!("# rollcall's hot path side by side (wrk, same scripted upstream, 2 shared cores)");
    println!(
        "{rounds} round(s); each round runs every target back to back at 64, 256 and 1 connection; \
         {secs} s per run (LiteLLM {slow_secs} s, not at 256); medians shown"
    );
    // Warm-up: pools filled, allocators and caches warm.
    for t in &targets {
        wrk.run(t, &wrk.scripts[t.name], 64, 1.0);
    }

    let measurements = [64usize, 256, 1];
    let mut runs: HashMap<(usize, &'static str), Vec<Run>> = HashMap::new();
    for round in 0..rounds {
        for &conns in &measurements {
            for t in &targets {
                if t.slow && conns == 256 {
                    continue;
                }
                let s = if t.slow { slow_secs } else { secs };
                let r = wrk.run(t, &wrk.scripts[t.name], conns, s);
                runs.entry((conns, t.name)).or_default().push(r);
            }
        }
        // Every round's figures, to show the spread behind the medians.
        let mut line = vec![];
        for &conns in &measurements {
            let each: Vec<String> = targets
                .iter()
                .filter_map(|t| {
                    let r = runs.get(&(conns, t.name))?.get(round)?;
                    Some(if conns == 1 {
                        format!("{} {}/{}", t.name, us(r.p50), us(r.p99))
                    } else {
                        format!("{} {}", t.name, calls(r.calls_per_sec))
                    })
                })
                .collect();
            line.push(format!("{conns} conn: {}", each.join(", ")));
        }
        println!("round {}: {}", round + 1, line.join("; "));
    }

    // Medians per target and measurement.
    let med = |conns: usize, name: &str, f: &dyn Fn(&Run) -> f64| -> Option<f64> {
        runs.get(&(conns, name))
            .map(|v| median(v.iter().map(f).collect()))
    };
    let tput = |c: usize, n: &str| med(c, n, &|r| r.calls_per_sec);
    let p50 = |n: &str| med(1, n, &|r| r.p50);
    let p99 = |n: &str| med(1, n, &|r| r.p99);
    let (d50, d99) = (p50("direct").unwrap(), p99("direct").unwrap());

    let header = |t: &Target| match t.name {
        "direct" => "direct".to_string(),
        "nginx" => "nginx (`proxy_pass`, 2 workers, keepalive, records nothing)".into(),
        "hyper" => {
            "bare hyper forwarder (hyper server + hyper-util pooled client, records nothing)".into()
        }
        "rollcall" => "rollcall (records every call)".into(),
        _ => "LiteLLM (1 worker, records nothing)".into(),
    };
    println!();
    let cols: Vec<String> = targets.iter().map(header).collect();
    println!("| | {} |", cols.join(" | "));
    println!("|---|{}", "---|".repeat(targets.len()));
    let row = |label: &str, cell: &dyn Fn(&Target) -> String| {
        let cells: Vec<String> = targets.iter().map(cell).collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    let not_run = || "not run".to_string();
    for c in [64, 256] {
        row(&format!("calls/s at {c} connections"), &|t| {
            tput(c, t.name).map_or_else(not_run, calls)
        });
    }
    row("latency at 1 connection, p50 / p99", &|t| {
        format!(
            "{} / {}",
            us(p50(t.name).unwrap()),
            us(p99(t.name).unwrap())
        )
    });
    row(
        "latency added over direct at 1 connection, p50 / p99",
        &|t| {
            if t.name == "direct" {
                "—".into()
            } else {
                format!(
                    "{} / {}",
                    signed(p50(t.name).unwrap() - d50),
                    signed(p99(t.name).unwrap() - d99)
                )
            }
        },
    );
    for c in [64, 256] {
        row(
            &format!("CPU µs per call at {c} connections: proxy / upstream / wrk"),
            &|t| {
                if !runs.contains_key(&(c, t.name)) {
                    return not_run();
                }
                let proxy = match t.pid {
                    None => "—".into(),
                    Some(_) => format!(
                        "{:.0}",
                        med(c, t.name, &|r| r.cpu_proxy.unwrap_or_default()).unwrap()
                    ),
                };
                format!(
                    "{proxy} / {:.0} / {:.0}",
                    med(c, t.name, &|r| r.cpu_upstream).unwrap(),
                    med(c, t.name, &|r| r.cpu_wrk).unwrap()
                )
            },
        );
    }
    for c in [64, 256] {
        row(
            &format!("proxy CPU µs per call at {c} connections: user space / kernel"),
            &|t| {
                if !runs.contains_key(&(c, t.name)) {
                    return not_run();
                }
                if t.pid.is_none() {
                    return "—".into();
                }
                let kernel = |r: &Run| r.cpu_proxy_kernel.unwrap_or_default();
                let user = med(c, t.name, &|r| r.cpu_proxy.unwrap_or_default() - kernel(r));
                let kernel = med(c, t.name, &kernel);
                format!("{:.0} / {:.0}", user.unwrap(), kernel.unwrap())
            },
        );
    }
    // Where rollcall's CPU goes: its serving threads (the proxy path, the
    // WAL written inline) and its recording stages.
    for c in [64, 256] {
        let Some(rs) = runs.get(&(c, "rollcall")) else {
            continue;
        };
        let kinds: BTreeMap<&str, ()> = rs
            .iter()
            .flat_map(|r| r.cpu_threads.keys().map(|k| (k.as_str(), ())))
            .collect();
        let each: Vec<String> = kinds
            .keys()
            .map(|k| {
                let v = median(
                    rs.iter()
                        .map(|r| r.cpu_threads.get(*k).copied().unwrap_or(0.0))
                        .collect(),
                );
                (k, v)
            })
            .filter(|(_, v)| *v >= 0.05)
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect();
        println!(
            "\nrollcall CPU µs per call at {c} connections, by thread: {}",
            each.join(", ")
        );
    }

    println!("\n## Targets (informational; a MISS does not fail the bench)");
    for c in [64, 256] {
        let (r, n) = (tput(c, "rollcall").unwrap(), tput(c, "nginx").unwrap());
        println!(
            "{} rollcall / nginx throughput at {c} connections: {:.0} % (target ≥ 75 %)",
            check(r >= 0.75 * n),
            100.0 * r / n
        );
    }
    let (a50, a99) = (
        p50("rollcall").unwrap() - d50,
        p99("rollcall").unwrap() - d99,
    );
    println!(
        "{} rollcall added latency p50: {} (target ≤ 60 µs)",
        check(a50 <= 60e-6),
        signed(a50)
    );
    println!(
        "{} rollcall added latency p99: {} (target ≤ 250 µs)",
        check(a99 <= 250e-6),
        signed(a99)
    );
    for c in [64, 256] {
        let (n, h, r) = (
            tput(c, "nginx").unwrap(),
            tput(c, "hyper").unwrap(),
            tput(c, "rollcall").unwrap(),
        );
        println!(
            "info at {c} connections: hyper forwarder / nginx {:.0} %, rollcall / hyper forwarder {:.0} %, nginx / direct {:.0} %",
            100.0 * h / n,
            100.0 * r / h,
            100.0 * n / tput(c, "direct").unwrap()
        );
    }
    if let Some(l) = tput(64, "litellm") {
        println!(
            "info rollcall / LiteLLM throughput at 64 connections: {:.0}x",
            tput(64, "rollcall").unwrap() / l
        );
    }

    // Streaming: the cost per event of a long stream (1 connection), and
    // rollcall's memory with 1,000 streams open at once.
    println!("\n## Streaming");
    let events = 2000;
    // The scripted upstream splits its answer, `Reply to: <user text>`, into
    // at most one event per character: a user text of 1,990 characters makes
    // the answer 2,000 characters long, one per event.
    let sbody = format!(
        r#"{{"model":"bench@events={events}","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(events - "Reply to: ".len())
    );
    let deltas = http(&targets[0].url, "POST", &[], &sbody)
        .expect("stream call")
        .matches("\"delta\"")
        .count();
    assert!(
        deltas > events,
        "the scripted upstream streamed {deltas} deltas, not {events} + 1"
    );
    let sscript = wrk_script(dir.path(), "stream", &sbody, &[]);
    let mut direct_stream = 0.0;
    for t in targets.iter().filter(|t| !t.slow) {
        let r = wrk.run(t, &sscript, 1, if q { 2.0 } else { 3.0 });
        if t.name == "direct" {
            direct_stream = r.p50;
            println!(
                "direct: a stream of {events} events takes {} (p50)",
                us(r.p50)
            );
        } else {
            let per = (r.p50 - direct_stream) / events as f64;
            println!(
                "{}: {} (p50), overhead per stream event {:.2} µs{}",
                t.name,
                us(r.p50),
                per * 1e6,
                if t.name == "rollcall" {
                    format!(" ({} target ≤ 20 µs)", check(per <= 20e-6))
                } else {
                    String::new()
                }
            );
        }
    }
    let rc = targets.iter().find(|t| t.name == "rollcall").unwrap();
    let idle = rss_kb(px.child.id());
    let mbody = r#"{"model":"bench@events=30@delay_ms=100","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mscript = wrk_script(dir.path(), "memory", mbody, &[]);
    let mut peak = 0;
    let (_, errs) = wrk.run_with(rc, &mscript, 1000, 5.0, false, |_| {
        peak = peak.max(rss_kb(px.child.id()));
    });
    println!(
        "{} rollcall RSS {:.1} MB before; with 1,000 connections streaming (30 events 100 ms apart): {:.1} MB (target ≤ 100 MB){}",
        check(peak < 100 * 1024),
        idle as f64 / 1024.0,
        peak as f64 / 1024.0,
        if errs.is_empty() {
            String::new()
        } else {
            format!("; wrk: {}", errs.trim().replace('\n', "; "))
        }
    );

    drop(lite);
    drop(nginx);
    drop(fwd);
    let sent: u64 = runs
        .iter()
        .filter(|((_, n), _)| *n == "rollcall")
        .flat_map(|(_, v)| v.iter().map(|r| r.calls))
        .sum();
    px.stop();
    let rows = shard_rows(&shards);
    println!(
        "\nrollcall recorded {rows} call rows in its shards (the measured runs alone completed {sent} calls through it; warm-up and streaming runs add more)"
    );
    assert!(
        rows >= sent as i64,
        "rollcall recorded fewer rows ({rows}) than calls it completed ({sent})"
    );
}
