//! Containment and confinement of everything toolgate runs.
//!
//! - [`cgroup`]: one cgroup v2 per call where the daemon can create one, so that
//!   nothing a call started survives it, whatever happens to its supervisor; with
//!   the `pids` and `memory` controllers, its limits.
//! - [`harden`]: the daemon's own protection (not dumpable, secrets wiped from its
//!   environment block) and the capabilities a root daemon's commands lose.
//! - [`confine`]: the kernel sandbox a command enters before `exec` (Landlock and
//!   seccomp), described by a [`Profile`] built here from the `[sandbox]`
//!   configuration and the session's roots.

pub mod cgroup;
pub mod confine;
pub mod denied;
pub mod exec;
pub mod harden;

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use serde::{Deserialize, Serialize};

pub use cgroup::{CallCgroup, CallCgroups};
pub use harden::{daemon_environment, harden_daemon};

/// How a call's process tree is held, as reported in results and `toolgate status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Containment {
    /// A cgroup v2 per call: nothing inside can leave it, `cgroup.kill` ends it.
    Cgroup,
    /// The per-call supervisor alone (a subreaper walking the process tree). A
    /// supervisor killed from outside can leave its orphans running.
    Supervisor,
}

impl Containment {
    pub fn as_str(self) -> &'static str {
        match self {
            Containment::Cgroup => "cgroup",
            Containment::Supervisor => "supervisor",
        }
    }

    /// What calls get on this machine, and why when it is not a cgroup.
    pub fn available() -> (Containment, Option<&'static str>) {
        match CallCgroups::get() {
            Ok(_) => (Containment::Cgroup, None),
            Err(reason) => (Containment::Supervisor, Some(reason)),
        }
    }
}

/// `[sandbox]`: the kernel sandbox around commands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// Run commands in the sandbox (where the kernel has Landlock).
    pub enabled: bool,
    /// Refuse to run commands when the sandbox cannot be put in force.
    pub required: bool,
    /// Paths commands may write beneath, besides the roots and a per-call temporary
    /// directory (`~` is the daemon's home).
    pub writable: Vec<String>,
    /// Paths commands may read beneath, besides the system directories and the roots.
    pub readable: Vec<String>,
    /// Whether commands may open TCP and UDP connections.
    pub network: bool,
    /// Processes (and threads) one call may have at once; 0: no limit.
    pub max_processes: u64,
    /// Memory one call may use, in MiB; 0: no limit.
    pub max_memory_mb: u64,
}

impl Default for SandboxConfig {
    fn default() -> SandboxConfig {
        SandboxConfig {
            enabled: true,
            required: false,
            writable: Vec::new(),
            readable: Vec::new(),
            network: true,
            max_processes: 0,
            max_memory_mb: 0,
        }
    }
}

/// The system directories a command may read (and execute from).
pub const SYSTEM_READABLE: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix",
    "/proc", "/sys", "/dev", "/run",
];

/// Device files a command may write.
pub const DEVICE_WRITABLE: &[&str] =
    &["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts"];

/// What the daemon configured: the settings, the paths no command may touch and the
/// workspace roots (what upstream servers may write besides their own paths).
#[derive(Clone, Debug)]
struct Configured {
    config: SandboxConfig,
    protected: Vec<PathBuf>,
    roots: Vec<PathBuf>,
}

static CONFIGURED: RwLock<Option<Configured>> = RwLock::new(None);

/// Sets the sandbox for every command from now on (at start-up and on reload).
/// `protected` are toolgate's own files and directories (configuration, tokens,
/// audit log, state), never readable or writable by a command; `roots` the configured
/// workspace roots, which upstream servers may write. Until this is called (library
/// users, tests) commands run without a sandbox.
pub fn configure(config: SandboxConfig, protected: Vec<PathBuf>, roots: Vec<PathBuf>) {
    if config.enabled && confine::landlock_abi() == 0 {
        tracing::warn!(
            "this kernel has no Landlock: commands run without the sandbox{}",
            if config.required { " (it is required: commands are refused)" } else { "" }
        );
    }
    {
        let mut slot = CONFIGURED.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(Configured { config, protected, roots });
    }
    tracing::info!("{}", describe());
}

/// The sandbox and containment in force, for `daemon/status`.
pub fn status() -> serde_json::Value {
    let (containment, why) = Containment::available();
    let config = configured();
    serde_json::json!({
        "landlock_abi": confine::landlock_abi(),
        "enabled": config.as_ref().is_some_and(|config| config.enabled),
        "required": config.as_ref().is_some_and(|config| config.required),
        "network": config.as_ref().is_none_or(|config| config.network),
        "containment": containment.as_str(),
        "containment_note": why,
        "limit_controllers": CallCgroups::get().map(CallCgroups::controllers).unwrap_or_default(),
        "summary": describe(),
    })
}

/// The configured sandbox settings, if the daemon configured one.
pub fn configured() -> Option<SandboxConfig> {
    let slot = CONFIGURED.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    slot.as_ref().map(|configured| configured.config.clone())
}

/// One command's sandbox: what it may read and write, what it may never touch, and
/// whether it has the network. A sandboxed upstream server's launcher gets it as JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub protect: Vec<PathBuf>,
    pub network: bool,
    /// Readable even inside a protected directory (a skill's own folder under
    /// toolgate's configuration directory); protected paths beneath them stay cut out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_read: Vec<PathBuf>,
    /// The Landlock ABI of the running kernel as the daemon probed it, so that a
    /// supervisor (a new process per call) does not probe it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landlock_abi: Option<i32>,
}

impl Profile {
    /// What the profile grants beyond the fixed system parts, for results and the
    /// audit log: `in_force` (what the kernel put in force), the paths writable and
    /// readable besides the system directories and devices, and the network.
    pub fn summary(&self, in_force: &str) -> serde_json::Value {
        let write: Vec<&PathBuf> = self
            .write
            .iter()
            .filter(|path| {
                !DEVICE_WRITABLE.iter().any(|device| path.as_path() == Path::new(device))
            })
            .collect();
        let read: Vec<&PathBuf> = self
            .read
            .iter()
            .filter(|path| {
                !SYSTEM_READABLE.iter().any(|system| path.as_path() == Path::new(system))
            })
            .chain(&self.own_read)
            .collect();
        serde_json::json!({
            "in_force": in_force,
            "write": write,
            "read": read,
            "network": self.network,
        })
    }

    /// Adds what a person (or a rule) granted one call.
    pub fn widen(&mut self, widening: &Widening) {
        for path in &widening.writable {
            if !self.write.contains(path) {
                self.write.push(path.clone());
            }
        }
        for path in &widening.readable {
            if !self.read.contains(path) {
                self.read.push(path.clone());
            }
        }
        self.network |= widening.network;
    }
}

/// What one call may get beyond the configured sandbox, asked for by the model and
/// granted by a person: more writable or readable paths, the network.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(inline)]
pub struct Widening {
    /// Absolute paths the command may also write beneath (created files included).
    #[serde(default)]
    pub writable: Vec<PathBuf>,
    /// Absolute paths the command may also read beneath.
    #[serde(default)]
    pub readable: Vec<PathBuf>,
    /// Whether the command may also open TCP and UDP connections.
    #[serde(default)]
    pub network: bool,
}

impl Widening {
    pub fn is_empty(&self) -> bool {
        self.writable.is_empty() && self.readable.is_empty() && !self.network
    }

    /// Every path must be absolute: the sandbox is built away from the call's cwd.
    pub fn check(&self) -> Result<(), String> {
        match self.writable.iter().chain(&self.readable).find(|path| !path.is_absolute()) {
            Some(path) => Err(format!("sandbox: {} is not an absolute path", path.display())),
            None => Ok(()),
        }
    }
}

/// Limits for one call's cgroup (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_processes: u64,
    pub max_memory_mb: u64,
}

/// The sandbox for a command of a session with these roots: `Ok(None)` when the
/// sandbox is off (or not configured), an error when it is required and cannot be
/// put in force.
pub fn profile_for(roots: &[PathBuf]) -> Result<Option<(Profile, Limits)>, String> {
    let slot = CONFIGURED.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(configured) = slot.as_ref() else {
        return Ok(None);
    };
    let config = &configured.config;
    let limits =
        Limits { max_processes: config.max_processes, max_memory_mb: config.max_memory_mb };
    if !config.enabled {
        return Ok(None);
    }
    if confine::landlock_abi() == 0 && config.required {
        return Err("the sandbox is required ([sandbox] required = true) but this kernel has \
                    no Landlock"
            .to_owned());
    }
    let mut read: Vec<PathBuf> = SYSTEM_READABLE.iter().map(PathBuf::from).collect();
    read.extend(config.readable.iter().filter_map(|raw| expand(raw)));
    let mut write: Vec<PathBuf> = roots.to_vec();
    write.extend(DEVICE_WRITABLE.iter().map(PathBuf::from));
    write.extend(config.writable.iter().filter_map(|raw| expand(raw)));
    Ok(Some((
        Profile {
            read,
            write,
            protect: configured.protected.clone(),
            network: config.network,
            own_read: Vec::new(),
            landlock_abi: Some(confine::landlock_abi()),
        },
        limits,
    )))
}

/// The program a server runs, as `exec` finds it: a name with a slash as it is (when
/// absolute; a relative one gives `None`), else the first file of that name in
/// `search_path` (`PATH`).
fn find_program(program: &str, search_path: Option<&str>) -> Option<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return path.is_absolute().then_some(path);
    }
    std::env::split_paths(search_path?)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// What a program needs to read to run: its directory and, for one in a `bin`
/// directory, the installation prefix above it (`~/.pyenv/versions/3.12` for its
/// `bin/python3`: the interpreter's library), both for the path as named and as
/// resolved through symlinks. Never `/` or the home directory as a whole.
fn program_dirs(program: &Path) -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let too_wide = |dir: &Path| dir == Path::new("/") || home.as_deref() == Some(dir);
    let mut dirs = Vec::new();
    let named = program.to_path_buf();
    let resolved = std::fs::canonicalize(program).ok();
    for path in std::iter::once(named).chain(resolved) {
        let Some(dir) = path.parent() else { continue };
        let wanted = match dir.parent() {
            Some(prefix)
                if dir.file_name().is_some_and(|name| name == "bin") && !too_wide(prefix) =>
            {
                prefix
            }
            _ => dir,
        };
        if !too_wide(wanted) && !dirs.iter().any(|known: &PathBuf| known == wanted) {
            dirs.push(wanted.to_path_buf());
        }
    }
    dirs
}

/// An absolute path from a configured one (`~` is the daemon's home); `None` for a
/// relative one.
fn expand(raw: &str) -> Option<PathBuf> {
    let home = || std::env::var_os("HOME").map(PathBuf::from);
    let path = match raw.strip_prefix("~/") {
        Some(rest) => home()?.join(rest),
        None if raw == "~" => home()?,
        None => PathBuf::from(raw),
    };
    path.is_absolute().then_some(path)
}

/// How one upstream stdio server is sandboxed (its `[[mcp_servers]]` entry).
#[derive(Clone, Copy, Debug)]
pub struct ServerSandbox<'a> {
    /// `sandbox`: false runs the server unconfined.
    pub enabled: bool,
    pub writable: &'a [String],
    pub readable: &'a [String],
    /// `network`; `None`: as `[sandbox] network`.
    pub network: Option<bool>,
}

/// The sandbox of an upstream stdio server started as `program args` in `cwd`:
/// `Ok(None)` when it runs unconfined (the sandbox is off for it or everywhere, or
/// not configured), an error when it is required and cannot be put in force.
///
/// A server may write beneath the workspace roots, its `cwd`, `[sandbox] writable`
/// and its own `writable`; read the system directories, those, `[sandbox] readable`,
/// its own `readable`, the program's directory and the directory of every argument
/// naming an existing file (the script it runs). toolgate's own files are cut out as
/// for commands.
pub fn server_profile(
    server: ServerSandbox<'_>,
    program: &str,
    args: &[String],
    cwd: Option<&Path>,
    search_path: Option<&str>,
) -> Result<Option<Profile>, String> {
    let slot = CONFIGURED.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(configured) = slot.as_ref() else {
        return Ok(None);
    };
    let config = &configured.config;
    if !config.enabled || !server.enabled {
        return Ok(None);
    }
    if confine::landlock_abi() == 0 {
        if config.required {
            return Err("the sandbox is required ([sandbox] required = true) but this kernel \
                        has no Landlock"
                .to_owned());
        }
        return Ok(None);
    }
    let mut read: Vec<PathBuf> = SYSTEM_READABLE.iter().map(PathBuf::from).collect();
    read.extend(config.readable.iter().chain(server.readable).filter_map(|raw| expand(raw)));
    if let Some(program) = find_program(program, search_path) {
        read.extend(program_dirs(&program));
    }
    for arg in args {
        let path = Path::new(arg);
        if path.is_absolute()
            && path.is_file()
            && let Some(dir) = path.parent()
            && dir != Path::new("/")
        {
            read.push(dir.to_owned());
        }
    }
    let mut write: Vec<PathBuf> = configured.roots.clone();
    write.extend(cwd.map(Path::to_path_buf));
    write.extend(DEVICE_WRITABLE.iter().map(PathBuf::from));
    write.extend(config.writable.iter().chain(server.writable).filter_map(|raw| expand(raw)));
    Ok(Some(Profile {
        read,
        write,
        protect: configured.protected.clone(),
        network: server.network.unwrap_or(config.network),
        own_read: Vec::new(),
        landlock_abi: Some(confine::landlock_abi()),
    }))
}

/// A one-line account of the sandbox for `toolgate status` and the start-up log.
pub fn describe() -> String {
    let abi = confine::landlock_abi();
    let (containment, why) = Containment::available();
    let sandbox = match configured() {
        None => "not configured".to_owned(),
        Some(config) if !config.enabled => "disabled ([sandbox] enabled = false)".to_owned(),
        Some(_) if abi == 0 => "unavailable (no Landlock in this kernel)".to_owned(),
        Some(config) => {
            format!("landlock v{abi}{}", if config.network { "" } else { ", network off" })
        }
    };
    let containment = match (why, CallCgroups::get()) {
        (None, Ok(cgroups)) if cgroups.controllers().is_empty() => {
            format!("{} (no pids or memory controller: limits off)", containment.as_str())
        }
        (None, Ok(cgroups)) => {
            format!("{} (limits: {})", containment.as_str(), cgroups.controllers().join(", "))
        }
        (None, Err(_)) => containment.as_str().to_owned(),
        (Some(why), _) => format!("{} ({why})", containment.as_str()),
    };
    format!("sandbox: {sandbox}; containment: {containment}")
}

/// toolgate's own files that commands may never read or write: every configuration
/// file read, the configuration directories, the state directory, the audit log,
/// token files and the socket's directory. Paths that do not exist are kept as they
/// are (they may appear later); existing ones are canonicalized.
pub fn own_paths(candidates: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = candidates
        .into_iter()
        .filter(|path| path.is_absolute() && path != Path::new("/"))
        .map(|path| std::fs::canonicalize(&path).unwrap_or(path))
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_in_a_bin_directory_brings_its_installation_prefix() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let prefix = dir.path().join("versions/3.12");
        std::fs::create_dir_all(prefix.join("bin")).unwrap_or_else(|err| panic!("{err}"));
        std::fs::write(prefix.join("bin/python3"), "").unwrap_or_else(|err| panic!("{err}"));
        let search = format!("/nonexistent:{}", prefix.join("bin").display());
        let found = find_program("python3", Some(&search));
        assert_eq!(found, Some(prefix.join("bin/python3")));
        let prefix = std::fs::canonicalize(&prefix).unwrap_or_else(|err| panic!("{err}"));
        assert!(program_dirs(&prefix.join("bin/python3")).contains(&prefix));
        assert!(!program_dirs(Path::new("/bin/true")).contains(&PathBuf::from("/")));
        assert_eq!(find_program("./relative", Some("/bin")), None);
    }
}
