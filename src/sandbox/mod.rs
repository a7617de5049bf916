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
pub mod peers;

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
    /// Paths commands may read beneath, besides the system directories, the home
    /// directory and the roots.
    pub readable: Vec<String>,
    /// Whether commands may read (and execute from) the daemon user's home directory,
    /// its secrets ([`HOME_SECRETS`], `deny_read`) cut out.
    pub read_home: bool,
    /// Paths no command may read or write, whatever else is granted, besides the
    /// built-in list of secret locations ([`HOME_SECRETS`], [`SYSTEM_SECRETS`]).
    pub deny_read: Vec<String>,
    /// The package managers' caches commands may write beneath (those that exist when
    /// a call starts), so that builds with cached dependencies work.
    pub caches: Vec<String>,
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
            read_home: true,
            deny_read: Vec::new(),
            caches: DEFAULT_CACHES.iter().map(|cache| (*cache).to_owned()).collect(),
            network: true,
            max_processes: 0,
            max_memory_mb: 0,
        }
    }
}

/// The system directories a command may read (and execute from). Of `/dev`, only the
/// devices of [`DEVICE_READABLE`].
pub const SYSTEM_READABLE: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix",
    "/proc", "/sys", "/run",
];

/// The device files a command may read: no block device, no other device node.
pub const DEVICE_READABLE: &[&str] = &["/dev/random", "/dev/urandom"];

/// Device files a command may write (and read). `/dev/tty` is the command's own
/// terminal only: a command without one starts a session of its own, with no
/// controlling terminal. No other terminal is granted but the call's own (a
/// `tty: true` call's, added to its profile).
pub const DEVICE_WRITABLE: &[&str] =
    &["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx"];

/// Where developers' credentials, keys and private data live beneath their home
/// directory: never readable (nor writable) by a command, whatever else is granted.
pub const HOME_SECRETS: &[&str] = &[
    // Keys and agents.
    ".ssh",
    ".gnupg",
    ".password-store",
    ".local/share/keyrings",
    ".gnome2/keyrings",
    ".local/share/kwalletd",
    ".config/op",
    ".vault-token",
    // Clouds and clusters.
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".oci",
    ".config/doctl",
    ".config/rclone",
    ".s3cfg",
    ".boto",
    ".terraform.d/credentials.tfrc.json",
    // Registries, forges and package managers' tokens.
    ".docker/config.json",
    ".config/containers/auth.json",
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    // Databases.
    ".pgpass",
    ".my.cnf",
    // Browser and mail profiles (cookies, saved passwords).
    ".mozilla",
    ".thunderbird",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".config/vivaldi",
    // What was typed at prompts.
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
    ".local/share/fish/fish_history",
];

/// Secrets outside any home: a container's mounted secrets, and for a daemon running
/// as root (whose privileges reach further than any user's) the system's own.
pub const SYSTEM_SECRETS: &[&str] = &["/run/secrets"];

/// The system's secrets cut out for a root daemon; besides them, the SSH host keys
/// (`/etc/ssh/ssh_host_*_key`).
pub const ROOT_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/krb5.keytab",
    "/etc/credstore",
    "/etc/credstore.encrypted",
];

/// The caches builds write to, writable by default: rustup's cargo registry and git
/// checkouts, the XDG cache (pip, uv, go-build, ...), npm's, Go's modules, Maven's and
/// Gradle's.
pub const DEFAULT_CACHES: &[&str] = &[
    "~/.cache",
    "~/.cargo/registry",
    "~/.cargo/git",
    "~/.npm",
    "~/go/pkg/mod",
    "~/.m2/repository",
    "~/.gradle/caches",
];

/// The soft limit on open files commands start with, when the daemon raised its own.
static COMMANDS_DESCRIPTOR_LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Notes the soft limit on open files the daemon was started with, before it raised
/// its own for its connections: its commands get that one (a program that walks every
/// possible descriptor, or sizes a table by the limit, meets what it would have met in
/// the user's shell).
pub fn keep_commands_descriptor_limit(limit: u64) {
    let _ = COMMANDS_DESCRIPTOR_LIMIT.set(limit);
}

/// The soft limit on open files commands start with; `None`: the daemon's own.
pub fn commands_descriptor_limit() -> Option<u64> {
    COMMANDS_DESCRIPTOR_LIMIT.get().copied()
}

/// What the daemon configured: the settings, the paths no command may touch, the
/// workspace roots (what upstream servers may write besides their own paths), and the
/// fixed part of every command's grant, resolved once.
#[derive(Clone, Debug)]
struct Configured {
    config: SandboxConfig,
    protected: Vec<PathBuf>,
    roots: Vec<PathBuf>,
    grant: Grant,
}

/// The part of a command's sandbox that is the same for every call: what it may read
/// (the system directories, the readable devices, the home directory) and write (the
/// writable devices, the caches), the base of its ruleset; then the configured
/// `readable` and `writable`.
#[derive(Clone, Debug, Default)]
struct Grant {
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
    readable: Vec<PathBuf>,
    writable: Vec<PathBuf>,
    /// The home directory read, if it is.
    home: Option<PathBuf>,
    /// The caches among `write`.
    caches: Vec<PathBuf>,
    /// The secret locations, cut out of everything.
    secrets: Vec<PathBuf>,
}

impl Grant {
    fn new(config: &SandboxConfig, home: Option<&Path>, root: bool) -> Grant {
        let mut read: Vec<PathBuf> =
            SYSTEM_READABLE.iter().chain(DEVICE_READABLE).map(PathBuf::from).collect();
        // Never `/` as a whole: a home of `/` (some service users) reads nothing more.
        let read_home = home
            .filter(|home| config.read_home && home.is_absolute() && *home != Path::new("/"))
            .map(|home| std::fs::canonicalize(home).unwrap_or_else(|_| home.to_owned()));
        read.extend(read_home.clone());
        let caches: Vec<PathBuf> = config.caches.iter().filter_map(|raw| expand(raw)).collect();
        let mut write: Vec<PathBuf> = DEVICE_WRITABLE.iter().map(PathBuf::from).collect();
        write.extend(caches.iter().cloned());
        Grant {
            read,
            write,
            readable: config.readable.iter().filter_map(|raw| expand(raw)).collect(),
            writable: config.writable.iter().filter_map(|raw| expand(raw)).collect(),
            home: read_home,
            caches,
            secrets: secrets(config, home, root),
        }
    }

    /// The read and write paths of a command with these `roots`, the base first, and
    /// how many of each the base is.
    fn paths(&self, roots: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>, (usize, usize)) {
        let mut read = Vec::with_capacity(self.read.len() + self.readable.len());
        read.extend(self.read.iter().chain(&self.readable).cloned());
        let mut write =
            Vec::with_capacity(self.write.len() + self.writable.len() + roots.len() + 1);
        write.extend(self.write.iter().chain(&self.writable).chain(roots).cloned());
        (read, write, (self.read.len(), self.write.len()))
    }
}

/// Every secret location: [`HOME_SECRETS`] beneath the home directory (as named and as
/// the home resolves), [`SYSTEM_SECRETS`], for a root daemon [`ROOT_SECRETS`] and the
/// SSH host keys, and `[sandbox] deny_read`.
fn secrets(config: &SandboxConfig, home: Option<&Path>, root: bool) -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = home.map(Path::to_path_buf).into_iter().collect();
    if let Some(resolved) = homes.first().and_then(|home| std::fs::canonicalize(home).ok())
        && !homes.contains(&resolved)
    {
        homes.push(resolved);
    }
    let mut secrets: Vec<PathBuf> = homes
        .iter()
        .filter(|home| home.is_absolute() && home.as_path() != Path::new("/"))
        .flat_map(|home| HOME_SECRETS.iter().map(move |secret| home.join(secret)))
        .collect();
    secrets.extend(SYSTEM_SECRETS.iter().map(PathBuf::from));
    if root {
        secrets.extend(ROOT_SECRETS.iter().map(PathBuf::from));
        if let Ok(entries) = std::fs::read_dir("/etc/ssh") {
            secrets.extend(entries.flatten().map(|entry| entry.path()).filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("ssh_host_") && name.ends_with("_key"))
            }));
        }
    }
    secrets.extend(config.deny_read.iter().filter_map(|raw| expand(raw)));
    secrets.sort();
    secrets.dedup();
    secrets
}

static CONFIGURED: RwLock<Option<Configured>> = RwLock::new(None);

/// Sets the sandbox for every command from now on (at start-up and on reload).
/// `protected` are toolgate's own files and directories (configuration, tokens,
/// audit log, state), never readable or writable by a command, as the secret
/// locations are ([`HOME_SECRETS`], [`SYSTEM_SECRETS`], `deny_read`); `roots` the configured
/// workspace roots, which upstream servers may write. Until this is called (library
/// users, tests) commands run without a sandbox.
pub fn configure(config: SandboxConfig, protected: Vec<PathBuf>, roots: Vec<PathBuf>) {
    if config.enabled && confine::landlock_abi() == 0 {
        tracing::warn!(
            "this kernel has no Landlock: commands run without the sandbox{}",
            if config.required { " (it is required: commands are refused)" } else { "" }
        );
    }
    for missing in unenforceable(&config) {
        tracing::warn!("{missing}: the limit is not enforced");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let grant = Grant::new(&config, home.as_deref(), rustix::process::geteuid().is_root());
    let mut protected = protected;
    protected.extend(grant.secrets.iter().cloned());
    protected.sort();
    protected.dedup();
    {
        let mut slot = CONFIGURED.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(Configured { config, protected, roots, grant });
    }
    tracing::info!("{}", describe());
}

/// The configured limits this machine cannot enforce, each as one line naming the
/// limit and why: `max_processes` without a `pids` controller for calls,
/// `max_memory_mb` without a `memory` one (cgroup v2, or v1 on a hybrid hierarchy).
pub fn unenforceable(config: &SandboxConfig) -> Vec<String> {
    let cgroups = CallCgroups::get();
    let why = |controller: &str| match cgroups {
        Err(reason) => Some(format!("no per-call cgroups ({reason})")),
        Ok(cgroups) if !cgroups.has_controller(controller) => {
            Some(format!("no {controller} controller for the calls' cgroups"))
        }
        Ok(_) => None,
    };
    let mut missing = Vec::new();
    if config.max_processes > 0
        && let Some(why) = why("pids")
    {
        missing.push(format!("[sandbox] max_processes = {}: {why}", config.max_processes));
    }
    if config.max_memory_mb > 0
        && let Some(why) = why("memory")
    {
        missing.push(format!("[sandbox] max_memory_mb = {}: {why}", config.max_memory_mb));
    }
    missing
}

/// Why the daemon must not start with this sandbox: it is required (`required =
/// true`) and a configured limit cannot be enforced, or enabled and required on a
/// kernel without Landlock. `None` when it may start.
pub fn refusal(config: &SandboxConfig) -> Option<String> {
    if !config.enabled || !config.required {
        return None;
    }
    if confine::landlock_abi() == 0 {
        return Some(
            "the sandbox is required ([sandbox] required = true) but this kernel has no \
             Landlock"
                .to_owned(),
        );
    }
    let missing = unenforceable(config);
    (!missing.is_empty()).then(|| {
        format!("the sandbox is required ([sandbox] required = true) but {}", missing.join("; "))
    })
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
        "unenforced_limits": config.as_ref().map(unenforceable).unwrap_or_default(),
        "grants": grants(),
        "summary": describe(),
    })
}

/// The sandbox layer's sentence in `tools/explain` for a command: what it may read
/// and write and what never; `None` when commands run without a sandbox.
pub fn explain() -> Option<String> {
    let slot = CONFIGURED.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let configured = slot.as_ref().filter(|configured| configured.config.enabled)?;
    let abi = confine::landlock_abi();
    if abi == 0 {
        return Some(if configured.config.required {
            "the sandbox is required but this kernel has no Landlock: the command is refused"
                .to_owned()
        } else {
            "this kernel has no Landlock: the command runs without the sandbox".to_owned()
        });
    }
    let grant = &configured.grant;
    let joined = |paths: &[PathBuf]| -> String {
        paths.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(", ")
    };
    let mut read = "the system directories".to_owned();
    if let Some(home) = &grant.home {
        read.push_str(&format!(", the home directory {}", home.display()));
    }
    if !grant.readable.is_empty() {
        read.push_str(&format!(", {}", joined(&grant.readable)));
    }
    let caches: Vec<PathBuf> =
        grant.caches.iter().filter(|cache| cache.exists()).cloned().collect();
    let mut write = "the session's roots, its private $TMPDIR".to_owned();
    if !caches.is_empty() {
        write.push_str(&format!(", the caches {}", joined(&caches)));
    }
    if !grant.writable.is_empty() {
        write.push_str(&format!(", {}", joined(&grant.writable)));
    }
    let secrets = grant.secrets.iter().filter(|secret| secret.symlink_metadata().is_ok()).count();
    Some(format!(
        "the command runs in the kernel sandbox (landlock v{abi}{}): it may read {read}; write \
         {write}; never the secret locations ({secrets} here, `toolgate status` lists them) \
         or toolgate's own files",
        if configured.config.network { "" } else { ", network off" },
    ))
}

/// What every command is granted, each part with its reason, for `toolgate status`
/// and `explain`: what it may read and write beyond its call's roots and temporary
/// directory, and the secrets cut out of all of it. `Null` without a sandbox.
pub fn grants() -> serde_json::Value {
    let slot = CONFIGURED.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(configured) = slot.as_ref().filter(|configured| configured.config.enabled) else {
        return serde_json::Value::Null;
    };
    let grant = &configured.grant;
    let config = &configured.config;
    let listed = |paths: &[PathBuf]| -> Vec<String> {
        paths.iter().map(|path| path.display().to_string()).collect()
    };
    let existing = |paths: &[PathBuf]| -> Vec<String> {
        paths
            .iter()
            .filter(|path| path.symlink_metadata().is_ok())
            .map(|path| path.display().to_string())
            .collect()
    };
    let configured_paths = |raw: &[String]| -> Vec<String> {
        raw.iter().filter_map(|raw| expand(raw)).map(|path| path.display().to_string()).collect()
    };
    let system: Vec<&str> = SYSTEM_READABLE.iter().chain(DEVICE_READABLE).copied().collect();
    serde_json::json!({
        "read": [
            {"paths": system, "why": "the system's programs, libraries and settings, and the \
              random devices"},
            {"paths": listed(grant.home.as_slice()), "why": "the home directory, where \
              developers' toolchains and settings live (rustup, pyenv, nvm, ~/.local/bin, \
              ~/.gitconfig): read and execute only, the secrets cut out. Its entries are \
              listed when a call's sandbox is built; one created later is readable from \
              the next call on"},
            {"paths": configured_paths(&config.readable), "why": "[sandbox] readable"},
        ],
        "write": [
            {"paths": ["the session's roots", "the call's private temporary directory \
              ($TMPDIR)"], "why": "the workspace and scratch space"},
            {"paths": DEVICE_WRITABLE, "why": "the null devices and terminals"},
            {"paths": existing(&grant.caches), "why": "the package managers' caches that \
              exist, so that builds with cached dependencies work ([sandbox] caches; what a \
              command writes there, later builds read)"},
            {"paths": configured_paths(&config.writable), "why": "[sandbox] writable"},
        ],
        "never": {
            "secrets": existing(&grant.secrets),
            "own_files": "toolgate's configuration, tokens, audit log, state and socket",
            "why": "credentials, keys and private data: unreadable and unwritable whatever \
              else is granted, a widening included ([sandbox] deny_read adds to them)",
        },
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
    /// How many of `read` and of `write` (the first ones) are the part every command
    /// shares (the system directories, devices, home and caches): the base of the
    /// ruleset, made ahead of a call and not repeated in results.
    #[serde(default)]
    pub base: (usize, usize),
}

impl Profile {
    /// What the profile grants beyond the fixed system parts, for results and the
    /// audit log: `in_force` (what the kernel put in force), the paths writable and
    /// readable besides the system directories and devices, and the network.
    pub fn summary(&self, in_force: &str) -> serde_json::Value {
        let (read_base, write_base) = self.base;
        let write = self.write.get(write_base..).unwrap_or_default();
        let read: Vec<&PathBuf> =
            self.read.get(read_base..).unwrap_or_default().iter().chain(&self.own_read).collect();
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
    let (read, write, base) = configured.grant.paths(roots);
    Ok(Some((
        Profile {
            read,
            write,
            protect: configured.protected.clone(),
            network: config.network,
            own_read: Vec::new(),
            landlock_abi: Some(confine::landlock_abi()),
            base,
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
    let (mut read, mut write, base) = configured.grant.paths(&configured.roots);
    read.extend(server.readable.iter().filter_map(|raw| expand(raw)));
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
    write.extend(cwd.map(Path::to_path_buf));
    write.extend(server.writable.iter().filter_map(|raw| expand(raw)));
    Ok(Some(Profile {
        read,
        write,
        protect: configured.protected.clone(),
        network: server.network.unwrap_or(config.network),
        own_read: Vec::new(),
        landlock_abi: Some(confine::landlock_abi()),
        base,
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
