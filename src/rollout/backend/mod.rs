//! Where rollouts run: one fresh sandbox (a container) per rollout and per
//! grading, behind one trait, so that the engine does not know whether the
//! sandboxes are Docker containers (today, [`docker`]) or Kubernetes pods
//! (later).
//!
//! A backend labels everything it makes with the batch that made it
//! ([`LABEL_BATCH`]), so that a batch can remove all of its sandboxes on the
//! way out and a later start can remove what a killed batch left.

pub mod docker;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// Label naming the batch a sandbox belongs to.
pub const LABEL_BATCH: &str = "rollcall.batch";
/// Label naming the rollout a sandbox serves.
pub const LABEL_ROLLOUT: &str = "rollcall.rollout";
/// Label saying what a sandbox is for: `rollout` or `grade`.
pub const LABEL_ROLE: &str = "rollcall.role";

/// Errors from a backend. Every one is an infrastructure fault: it never
/// becomes a reward.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// the container daemon is not reachable
    #[error("the container daemon is not reachable ({0}); start it (`.ci/docker-up` installs and starts dockerd) or set DOCKER_HOST")]
    Unreachable(String),
    /// image {0} is missing
    #[error("image {0} is missing (no registry is consulted; build or load it first)")]
    ImageMissing(String),
    /// the daemon refused or failed a request
    #[error("container daemon error during {op}: {message}")]
    Daemon { op: &'static str, message: String },
    /// a command in the sandbox ran past its deadline
    #[error("{0:?} ran past {1:?} in the sandbox")]
    Timeout(String, Duration),
}

/// Resource limits of one sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// CPUs (fractional allowed).
    pub cpus: f64,
    /// Memory in bytes (swap included: no extra swap).
    pub memory: i64,
    /// Most processes at once.
    pub pids: i64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            cpus: 1.0,
            memory: 2 << 30,
            pids: 512,
        }
    }
}

/// A read-only (or writable) host directory mounted into the sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub host: std::path::PathBuf,
    pub sandbox: String,
    pub read_only: bool,
}

/// What to create.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub image: String,
    pub workdir: String,
    pub limits: Limits,
    pub mounts: Vec<Mount>,
    /// Labels besides the batch label (the rollout, the role).
    pub labels: BTreeMap<String, String>,
}

/// A command to run in a sandbox.
#[derive(Debug, Clone, Default)]
pub struct Exec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    /// Longest it may run; past it the sandbox's processes are killed and
    /// [`BackendError::Timeout`] returned.
    pub timeout: Option<Duration>,
    /// Most output bytes kept (the tail beyond is dropped; `truncated`
    /// says so).
    pub max_output: usize,
}

/// What a command printed (stdout and stderr interleaved, as they came) and
/// how it ended.
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    pub output: Vec<u8>,
    pub truncated: bool,
    /// `None` when the daemon did not report one.
    pub exit_code: Option<i64>,
}

impl ExecOutput {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }
}

/// What the backend knows of a sandbox after the fact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SandboxState {
    pub running: bool,
    /// The kernel's OOM killer ended a process of it.
    pub oom_killed: bool,
}

/// A file to place in a sandbox.
#[derive(Debug, Clone)]
pub struct FileIn {
    /// Absolute path inside the sandbox.
    pub path: String,
    pub content: Vec<u8>,
    pub mode: u32,
}

/// A place that runs sandboxes. Implemented by [`docker::Docker`].
pub trait Backend: Send + Sync + 'static {
    /// Create and start a sandbox; returns its id.
    fn create(
        &self,
        spec: &SandboxSpec,
    ) -> impl Future<Output = Result<String, BackendError>> + Send;
    /// Run a command to its end (or its timeout).
    fn exec(
        &self,
        id: &str,
        exec: Exec,
    ) -> impl Future<Output = Result<ExecOutput, BackendError>> + Send;
    /// Start a command in the background and return at once.
    fn spawn(&self, id: &str, exec: Exec) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// Write files into a running sandbox.
    fn put_files(
        &self,
        id: &str,
        files: &[FileIn],
    ) -> impl Future<Output = Result<(), BackendError>> + Send;
    fn state(&self, id: &str) -> impl Future<Output = Result<SandboxState, BackendError>> + Send;
    /// Remove a sandbox and what it holds (gone already is fine).
    fn remove(&self, id: &str) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// Is the image there?
    fn has_image(&self, image: &str) -> impl Future<Output = Result<bool, BackendError>> + Send;
    /// Every batch that has sandboxes, with how many.
    fn batches(&self)
        -> impl Future<Output = Result<BTreeMap<String, usize>, BackendError>> + Send;
    /// Remove every sandbox of `batch`; returns how many.
    fn remove_batch(&self, batch: &str)
        -> impl Future<Output = Result<usize, BackendError>> + Send;
}
