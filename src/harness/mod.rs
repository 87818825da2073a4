//! Harness adapters: how each agent harness installs, and how it runs
//! unchanged against rollcall.
//!
//! Each adapter is a file `harness-adapters/<name>/adapter.toml`, compiled
//! into the binary. It names the pinned version, the installer (`npm`, `pip`
//! or `cargo`), the version check, and the run recipe: the command line, the
//! environment and the config files to write into a private home. Values in
//! the recipe are templates; see [`Vars`] for the placeholders.
//!
//! `rollcall harness install` ([`install`]) and `rollcall run` ([`run`]) put
//! the adapters to work. The harness itself is never modified or patched.

pub mod install;
pub mod run;

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Errors from harness installation and runs.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// unknown harness {0:?}; known: {1}
    #[error("unknown harness {0:?}; known: {1}")]
    Unknown(String, String),
    /// adapter {name}: {message}
    #[error("adapter {name}: {message}")]
    Adapter { name: String, message: String },
    /// harness {0} is not installed; run `rollcall harness install {0}`
    #[error("harness {0} is not installed (looked in {1}); run `rollcall harness install {0}`")]
    NotInstalled(String, PathBuf),
    /// installing {name} failed: {message}
    #[error("installing {name} failed: {message}")]
    Install { name: String, message: String },
    /// {name} reports the wrong version
    #[error(
        "{name} reports the wrong version: expected output containing {expected:?}, got {got:?}"
    )]
    WrongVersion {
        name: String,
        expected: String,
        got: String,
    },
    /// the proxy at {url} is not reachable
    #[error("the rollcall proxy at {url} is not reachable ({message}); start it with `rollcall serve` or pass --proxy")]
    Proxy { url: String, message: String },
    /// I/O error on {path}
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// a command could not be started
    #[error("could not start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
}

impl HarnessError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HarnessError + '_ {
        move |source| HarnessError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// How a harness is installed.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Installer {
    /// `npm install --prefix DIR package@version`.
    Npm,
    /// A virtual environment in DIR, then `pip install package==version`.
    Pip,
    /// `cargo install package --version version --locked --root DIR`.
    Cargo,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Install {
    pub kind: Installer,
    /// Package name in its registry.
    pub package: String,
    /// Executable name, found in the install's `bin` directory.
    pub bin: String,
    /// Major version of a Node.js runtime to install from npm
    /// (`node-linux-<arch>@N`) and put first on PATH, for harnesses that
    /// need a newer Node than the machine's.
    pub node: Option<String>,
    /// Extra arguments for the installer.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment for the installer.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// Arguments that make the harness print its version.
    pub args: Vec<String>,
    /// Text the output must contain.
    pub expect: String,
}

/// A config file written before the run, relative to the private home.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    pub path: String,
    pub content: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    /// The non-interactive command line, `{{bin}}` first.
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub files: Vec<File>,
    /// Directories to create in the private home before the run.
    #[serde(default)]
    pub dirs: Vec<String>,
}

/// One harness adapter, as read from its `adapter.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adapter {
    pub name: String,
    pub description: String,
    /// The pinned version.
    pub version: String,
    /// The wire API the harness speaks: chat (chat_completions), responses
    /// or messages.
    pub wire_api: crate::dialect::WireApi,
    pub install: Install,
    pub check: Check,
    pub run: Run,
    /// How `rollcall batch` runs it against a task container; `None` for a
    /// harness that has no recipe for that yet.
    pub container: Option<Container>,
    /// What this harness's calls outside the agent's trajectory look like
    /// (marked `side_call` on their rows).
    #[serde(default)]
    pub side_calls: Vec<crate::dialect::side_call::Rule>,
}

/// Where a harness runs when its rollout has a container of its own.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Inside the container, from the harness install mounted read-only
    /// (`/rollcall/harnesses`), reaching the proxy through the bridge on
    /// loopback.
    Inside,
    /// On the host, running its commands in the container itself (as
    /// mini-swe-agent does in its SWE-bench runner).
    Host,
}

/// The container recipe of an adapter: the [`Run`] recipe still applies,
/// with these additions.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Container {
    pub placement: Placement,
    /// The task the harness gets, a template over `{{problem_statement}}`,
    /// `{{instance_id}}`, `{{repo}}` and `{{container_workdir}}`.
    pub prompt: String,
    /// Inside: the executable, relative to the harness's install directory,
    /// when it is not the install's `bin` (e.g. a static binary that needs
    /// no Node runtime).
    pub bin: Option<String>,
    /// Arguments appended to the run recipe's command line.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment added to the run recipe's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Files added to the run recipe's, relative to the private home.
    #[serde(default)]
    pub files: Vec<File>,
}

/// The adapters compiled into this binary.
const SOURCES: &[(&str, &str)] = &[
    (
        "codex",
        include_str!("../../harness-adapters/codex/adapter.toml"),
    ),
    (
        "openclaw",
        include_str!("../../harness-adapters/openclaw/adapter.toml"),
    ),
    (
        "zeroclaw",
        include_str!("../../harness-adapters/zeroclaw/adapter.toml"),
    ),
    (
        "mini-swe-agent",
        include_str!("../../harness-adapters/mini-swe-agent/adapter.toml"),
    ),
    (
        "opencode",
        include_str!("../../harness-adapters/opencode/adapter.toml"),
    ),
    (
        "claude-code",
        include_str!("../../harness-adapters/claude-code/adapter.toml"),
    ),
];

/// Every adapter's side-call rules.
pub fn side_call_rules() -> Vec<crate::dialect::side_call::Rule> {
    names()
        .into_iter()
        .filter_map(|n| Adapter::get(n).ok())
        .flat_map(|a| a.side_calls)
        .collect()
}

/// Names of all known harnesses.
pub fn names() -> Vec<&'static str> {
    SOURCES.iter().map(|(n, _)| *n).collect()
}

impl Adapter {
    /// The adapter called `name`.
    pub fn get(name: &str) -> Result<Adapter, HarnessError> {
        let Some((_, src)) = SOURCES.iter().find(|(n, _)| *n == name) else {
            return Err(HarnessError::Unknown(name.to_owned(), names().join(", ")));
        };
        let a: Adapter = toml::from_str(src).map_err(|e| HarnessError::Adapter {
            name: name.to_owned(),
            message: e.to_string(),
        })?;
        if a.name != name {
            return Err(HarnessError::Adapter {
                name: name.to_owned(),
                message: format!("adapter.toml names itself {:?}", a.name),
            });
        }
        Ok(a)
    }

    /// Where this harness lives under the harness root.
    pub fn dir(&self, root: &Path) -> PathBuf {
        root.join(&self.name)
    }

    /// The harness executable inside its install.
    pub fn bin(&self, root: &Path) -> PathBuf {
        let dir = self.dir(root);
        match self.install.kind {
            Installer::Npm => dir.join("node_modules").join(".bin"),
            Installer::Pip | Installer::Cargo => dir.join("bin"),
        }
        .join(&self.install.bin)
    }

    /// The `bin` directory of this harness's Node runtime, if it needs one.
    pub fn node_bin(&self, root: &Path) -> Option<PathBuf> {
        self.install
            .node
            .as_ref()
            .map(|major| install::node_dir(root, major).join("bin"))
    }
}

/// The default harness root: `$ROLLCALL_HARNESS_DIR`, else
/// `$XDG_DATA_HOME/rollcall/harnesses`, else `~/.local/share/rollcall/harnesses`.
pub fn default_root() -> PathBuf {
    if let Some(d) = std::env::var_os("ROLLCALL_HARNESS_DIR") {
        return PathBuf::from(d);
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data.join("rollcall").join("harnesses")
}

/// The values a recipe may use, as `{{name}}` or `{{name|json}}` (the value
/// as a JSON string literal, quotes included; also a valid TOML string).
pub struct Vars(pub BTreeMap<&'static str, String>);

impl Vars {
    /// Fill the placeholders of `template`. A literal `{` right before a
    /// placeholder is kept (`{{{model|json}}: 1}` gives `{"m": 1}`).
    pub fn render(&self, template: &str) -> Result<String, String> {
        let mut out = String::with_capacity(template.len());
        let mut rest = template;
        while let Some(i) = rest.find("{{") {
            out.push_str(&rest[..i]);
            rest = &rest[i..];
            while rest.starts_with("{{{") {
                out.push('{');
                rest = &rest[1..];
            }
            let Some(end) = rest.find("}}") else {
                return Err(format!("unclosed placeholder in {template:?}"));
            };
            let spec = rest[2..end].trim();
            let (name, filter) = match spec.split_once('|') {
                Some((n, f)) => (n.trim(), Some(f.trim())),
                None => (spec, None),
            };
            let value = self
                .0
                .get(name)
                .ok_or_else(|| format!("unknown placeholder {{{{{name}}}}}"))?;
            match filter {
                None => out.push_str(value),
                Some("json") => out.push_str(&serde_json::Value::from(value.as_str()).to_string()),
                Some(f) => return Err(format!("unknown filter {f:?} in {{{{{spec}}}}}")),
            }
            rest = &rest[end + 2..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars {
        Vars(BTreeMap::from([
            ("model", "m\"1".to_owned()),
            ("home", "/h".to_owned()),
        ]))
    }

    #[test]
    fn every_adapter_parses_and_renders() {
        let mut v = vars();
        for k in [
            "bin",
            "base_url",
            "proxy",
            "rollout",
            "api_key",
            "task",
            "workdir",
            "container",
            "container_workdir",
            "image",
            "problem_statement",
            "instance_id",
            "repo",
        ] {
            v.0.insert(k, format!("<{k}>"));
        }
        for name in names() {
            let a = Adapter::get(name).unwrap();
            assert!(!a.version.is_empty());
            for t in a.run.argv.iter().chain(a.run.env.values()) {
                v.render(t).unwrap();
            }
            let container = a.container.iter();
            for t in container
                .clone()
                .flat_map(|c| c.args.iter().chain(c.env.values()))
            {
                v.render(t).unwrap();
            }
            for c in container.clone() {
                v.render(&c.prompt).unwrap();
            }
            for f in a
                .run
                .files
                .iter()
                .chain(container.flat_map(|c| c.files.iter()))
            {
                let text = v.render(&f.content).unwrap();
                if f.path.ends_with(".json") {
                    serde_json::from_str::<serde_json::Value>(&text)
                        .unwrap_or_else(|e| panic!("{name} {}: {e}\n{text}", f.path));
                }
                if f.path.ends_with(".toml") {
                    toml::from_str::<toml::Table>(&text)
                        .unwrap_or_else(|e| panic!("{name} {}: {e}\n{text}", f.path));
                }
            }
        }
    }

    #[test]
    fn render_escapes_and_rejects() {
        let v = vars();
        assert_eq!(v.render("{{home}}/x").unwrap(), "/h/x");
        assert_eq!(v.render("{{model|json}}").unwrap(), "\"m\\\"1\"");
        assert_eq!(v.render("{{{model|json}}: 1}").unwrap(), "{\"m\\\"1\": 1}");
        assert!(v.render("{{nope}}").is_err());
        assert!(v.render("{{home|yaml}}").is_err());
        assert!(v.render("{{home").is_err());
        assert!(Adapter::get("nope").is_err());
    }
}
