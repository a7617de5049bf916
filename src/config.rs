//! The daemon's configuration: one TOML format read from layered sources.
//!
//! The layers are, in order: the embedded defaults (`config/default.toml`, compiled in
//! so that `toolgate serve` needs no file at all), `/etc/toolgate/config.toml`,
//! `$XDG_CONFIG_HOME/toolgate/config.toml` and an explicit `--config FILE`. Missing
//! optional files are skipped; a missing explicit file is an error. Layers are merged
//! as TOML tables: tables merge key by key, every other value (arrays included)
//! replaces the earlier one.
//!
//! A configuration mistake must be fixable without guessing, so every error names the
//! file, the line and column, and the key. Each file is parsed on its own first (syntax
//! errors carry the file's own positions) and the position of every key is remembered.
//! The merged table is then encoded once more and deserialized; the span of a
//! deserialization error leads back to a key path, and the key path to the last layer
//! that set it. Semantic checks (ranges, regexes, transports) report through the same
//! key-path lookup.
//!
//! [`Config::load`] is pure apart from reading the files and canonicalizing the roots:
//! every directory and environment-derived value comes in through [`LoadOptions`], so
//! tests point it at temporary directories and never read the real `/etc` or `~`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

use crate::hooks::HookConfig;
use crate::tools::{Env, EnvPolicy};

/// The embedded defaults: the first layer, and the documentation of every key.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// The permission modes `[permissions] mode` accepts.
pub const PERMISSION_MODES: [&str; 5] = ["default", "accept_edits", "plan", "bypass", "dont_ask"];

/// The system-wide configuration directory.
pub const SYSTEM_CONFIG_DIR: &str = "/etc/toolgate";

/// The file name looked up in the system and user configuration directories.
pub const CONFIG_FILE_NAME: &str = "config.toml";

/// How errors name the embedded layer.
const DEFAULTS_NAME: &str = "(built-in defaults)";

/// Variables of the service manager's protocol. They describe this process (its
/// notification socket, its inherited descriptors, its watchdog) and would mislead a
/// child that also speaks the protocol, so they are never inherited by commands.
const SERVICE_MANAGER_VARS: [&str; 6] = [
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
];

/// Placeholder written instead of secret-looking values in a configuration dump.
const REDACTED: &str = "[redacted]";

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file that had to be read could not be (an explicit `--config` that does not
    /// exist, or an optional file that exists but is unreadable).
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid TOML.
    #[error("{file}:{line}:{column}: {message}")]
    Syntax { file: String, line: usize, column: usize, message: String },
    /// A key has a wrong type or value, or is unknown.
    #[error("{}", render_invalid(file, *position, key, message))]
    Invalid {
        /// The file that set the key (or the embedded defaults).
        file: String,
        /// 1-based line and column of the key in `file`, when known.
        position: Option<(usize, usize)>,
        /// The key, as `[section] key` or `[[array]] #n key`.
        key: String,
        message: String,
    },
    #[error("cannot determine the current directory: {0}")]
    CurrentDir(#[source] std::io::Error),
    /// The merged configuration could not be encoded for validation or for a dump.
    #[error("cannot encode the configuration as TOML: {0}")]
    Encode(String),
    /// A file toolgate would take instructions from (configuration, skill, hook) could
    /// be changed by someone other than root or the daemon's user.
    #[error("{}: {problem}; {fix}", path.display())]
    Untrusted {
        /// The file, or the directory on its path, that is at fault.
        path: PathBuf,
        problem: String,
        /// The command that makes it safe.
        fix: String,
    },
}

fn render_invalid(
    file: &str,
    position: Option<(usize, usize)>,
    key: &str,
    message: &str,
) -> String {
    let mut out = String::from(file);
    if let Some((line, column)) = position {
        let _ = write!(out, ":{line}:{column}");
    }
    out.push_str(": ");
    if !key.is_empty() {
        out.push_str(key);
        out.push_str(": ");
    }
    out.push_str(message);
    out
}

/// A deserializer's complaint about a value in plain terms: `invalid type: string "10",
/// expected u64` becomes `must be a whole number, not the text "10"`. Anything it does
/// not recognise is kept as it is.
fn plain_message(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown variant ")
        && let Some((got, wanted)) = rest.split_once(", expected ")
    {
        let wanted = wanted.replace('`', "\"");
        return format!("must be {wanted}, not {}", got.replace('`', "\""));
    }
    let (value, rest) = if let Some(rest) = message.strip_prefix("invalid type: ") {
        (false, rest)
    } else if let Some(rest) = message.strip_prefix("invalid value: ") {
        (true, rest)
    } else {
        return message.to_owned();
    };
    let Some((got, wanted)) = rest.rsplit_once(", expected ") else {
        return message.to_owned();
    };
    format!("must be {}, not {}", plain_expected(wanted, value), plain_got(got))
}

/// What a deserializer expected, in plain terms. `value`: the type was right but the
/// value out of range.
fn plain_expected(wanted: &str, value: bool) -> String {
    let range = |max: &str| {
        if value { format!("a whole number from 0 to {max}") } else { "a whole number".to_owned() }
    };
    match wanted {
        "u8" => range("255"),
        "u16" => range("65535"),
        "u32" => range("4294967295"),
        "u64" | "usize" | "u128" if value => "a whole number, 0 or more".to_owned(),
        "u64" | "usize" | "u128" | "i8" | "i16" | "i32" | "i64" | "isize" | "i128" => {
            "a whole number".to_owned()
        }
        "f32" | "f64" => "a number".to_owned(),
        "a string" => "text in quotes".to_owned(),
        "a boolean" => "true or false".to_owned(),
        "a sequence" => "a list ([...])".to_owned(),
        "a map" => "a table".to_owned(),
        "a character" => "a single character".to_owned(),
        other if other.starts_with("struct ") => "a table".to_owned(),
        other => other.to_owned(),
    }
}

/// What was found instead, in plain terms.
fn plain_got(got: &str) -> String {
    let quoted =
        |prefix: &str| got.strip_prefix(prefix).map(|rest| rest.trim_matches('`').to_owned());
    if let Some(text) = got.strip_prefix("string ") {
        return format!("the text {text}");
    }
    if let Some(number) = quoted("integer ").or_else(|| quoted("floating point ")) {
        return format!("the number {number}");
    }
    if let Some(flag) = quoted("boolean ") {
        return flag;
    }
    match got {
        "sequence" => "a list".to_owned(),
        "map" => "a table".to_owned(),
        other => other.to_owned(),
    }
}

/// A setting that loads but cannot do what it looks like it does (a rule that never
/// applies, or one another rule always decides before). Shown by `check-config` and
/// logged by `serve` at start; it stops nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigWarning {
    /// The file that set the key (or the embedded defaults).
    pub file: String,
    /// 1-based line and column in `file`, when known.
    pub position: Option<(usize, usize)>,
    /// The key, as `[permissions] allow #2`.
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&render_invalid(&self.file, self.position, &self.key, &self.message))
    }
}

/// Where configuration comes from. Everything the loader would otherwise read from the
/// process (its environment, its current directory, its uid) is a field here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// `--config FILE`: read last, and an error if missing.
    pub explicit: Option<PathBuf>,
    /// The directory holding the system-wide `config.toml` (normally `/etc/toolgate`);
    /// `None` skips that layer.
    pub system_dir: Option<PathBuf>,
    /// The directory holding the user's `config.toml` (normally
    /// `$XDG_CONFIG_HOME/toolgate`); also the parent of the default skills directory.
    pub user_dir: Option<PathBuf>,
    /// The directory toolgate was started in: relative paths resolve against it, and
    /// the default root `"."` is this directory.
    pub start_dir: PathBuf,
    /// Expands a leading `~`.
    pub home: Option<PathBuf>,
    /// `$XDG_RUNTIME_DIR`: parent of the default socket directory.
    pub runtime_dir: Option<PathBuf>,
    /// `$XDG_STATE_HOME` (or `~/.local/state`): parent of the default audit log.
    pub state_home: Option<PathBuf>,
    /// Names the fallback socket directory when there is no runtime directory.
    pub uid: u32,
}

impl LoadOptions {
    /// The options of a real process: its current directory, `$HOME`, the XDG base
    /// directories (relative values are ignored, as the XDG specification asks) and
    /// its uid.
    pub fn from_process(explicit: Option<PathBuf>) -> Result<LoadOptions, ConfigError> {
        let start_dir = std::env::current_dir().map_err(ConfigError::CurrentDir)?;
        let uid = rustix::process::getuid().as_raw();
        let home = absolute_env("HOME").or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .map(|user| user.dir)
                .filter(|dir| dir.is_absolute())
        });
        let config_home =
            absolute_env("XDG_CONFIG_HOME").or_else(|| home.as_ref().map(|h| h.join(".config")));
        let state_home = absolute_env("XDG_STATE_HOME")
            .or_else(|| home.as_ref().map(|h| h.join(".local").join("state")));
        Ok(LoadOptions {
            explicit,
            system_dir: Some(PathBuf::from(SYSTEM_CONFIG_DIR)),
            user_dir: config_home.map(|dir| dir.join("toolgate")),
            start_dir,
            home,
            runtime_dir: absolute_env("XDG_RUNTIME_DIR"),
            state_home,
            uid,
        })
    }
}

fn absolute_env(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).map(PathBuf::from).filter(|path| path.is_absolute())
}

/// The effective configuration after every layer has been applied and resolved:
/// paths are absolute, roots canonical, and every value validated.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    pub server: ServerConfig,
    pub workspace: WorkspaceConfig,
    pub limits: LimitsConfig,
    pub permissions: PermissionsConfig,
    pub hooks: HooksConfig,
    pub skills: SkillsConfig,
    pub env: EnvConfig,
    pub mcp_servers: Vec<McpServerConfig>,
    /// `[audit]`: rotation of the audit log and what it records of arguments.
    pub audit: crate::audit::AuditSettings,
    pub sandbox: crate::sandbox::SandboxConfig,
    /// The files that were read, in layer order (the embedded defaults not included).
    #[serde(skip)]
    pub sources: Vec<PathBuf>,
    /// What loads but cannot do what it looks like it does, in the order of the keys.
    #[serde(skip)]
    pub warnings: Vec<ConfigWarning>,
}

/// `[server]`: listeners, the audit log and the daemon's own bounds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServerConfig {
    /// The native protocol's Unix socket.
    pub socket: PathBuf,
    /// Native HTTP + WebSocket endpoint for remote agents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<SocketAddr>,
    /// MCP Streamable HTTP endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_http: Option<SocketAddr>,
    /// Holds the bearer token of the HTTP endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The audit log's file; `None` when auditing is off.
    #[serde(serialize_with = "serialize_audit_log")]
    pub audit_log: Option<PathBuf>,
    pub max_connections: usize,
    pub max_message_bytes: usize,
    pub shutdown_grace_ms: u64,
    pub event_buffer: usize,
    pub max_calls_per_session: usize,
}

impl ServerConfig {
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }
}

/// A disabled audit log is written as `false`, so that a dump loads back the same.
fn serialize_audit_log<S: Serializer>(value: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(path) => path.serialize(s),
        None => s.serialize_bool(false),
    }
}

/// `[workspace]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkspaceConfig {
    /// Absolute, canonical, existing directories; never empty, no duplicates.
    pub roots: Vec<PathBuf>,
}

/// `[limits]`, in the units the file uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    pub max_output_bytes: usize,
    pub max_read_bytes: u64,
    pub approval_timeout_ms: u64,
    /// Background processes one session may have running at once.
    pub max_background_processes: usize,
    /// Output kept on disk per background process (the oldest part is dropped).
    pub process_output_bytes: u64,
    /// Output kept on disk per session, all its background processes together.
    pub session_process_output_bytes: u64,
    /// How long a session with running background processes outlives its connection.
    pub detached_session_ttl_ms: u64,
    /// What a command that outlives its deadline becomes: `kill` or `background`.
    pub on_timeout: crate::tools::jobs::OnTimeout,
}

impl LimitsConfig {
    pub fn default_timeout(&self) -> Duration {
        Duration::from_millis(self.default_timeout_ms)
    }

    pub fn max_timeout(&self) -> Duration {
        Duration::from_millis(self.max_timeout_ms)
    }

    pub fn approval_timeout(&self) -> Duration {
        Duration::from_millis(self.approval_timeout_ms)
    }
}

/// `[permissions]`. Rules stay strings here; the permission engine parses them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionsConfig {
    /// One of [`PERMISSION_MODES`]; the ceiling no client can widen.
    pub mode: String,
    pub allow: Vec<String>,
    pub ask: Vec<String>,
    pub deny: Vec<String>,
    /// Built-in protections turned off, by name (see [`crate::permission::PROTECTIONS`]).
    pub unprotect: Vec<String>,
}

/// `[hooks]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HooksConfig {
    pub pre_tool_use: Vec<HookConfig>,
    pub post_tool_use: Vec<HookConfig>,
}

/// One `[[mcp_servers]]` entry: an MCP server whose tools are proxied.
///
/// The transport keys are flat (as users write them); after loading exactly one of
/// `command` and `url` is set, and [`McpServerConfig::transport`] gives the typed view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Absolute after loading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "default_mcp_startup_timeout_ms")]
    pub startup_timeout_ms: u64,
    /// The deadline of one call; `None` means the session's default timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout_ms: Option<u64>,
    /// Whether the server's `readOnlyHint` is believed. Off by default: a proxied tool
    /// is side-effecting unless the user vouches for the server.
    #[serde(default)]
    pub trust_annotations: bool,
    /// Whether a stdio server runs in the kernel sandbox (when `[sandbox] enabled`).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub sandbox: bool,
    /// More paths the server may write beneath (`~` is the daemon's home).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable: Vec<String>,
    /// More paths the server may read beneath.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readable: Vec<String>,
    /// Whether the server may open TCP and UDP connections; default: `[sandbox] network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
}

fn default_true() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

/// Starting a stdio server often means a package manager fetching it first
/// (`uvx`, `npx`): half a minute covers that without hiding a hung server for long.
fn default_mcp_startup_timeout_ms() -> u64 {
    30_000
}

/// How toolgate reaches an MCP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McpTransport<'a> {
    Stdio {
        command: &'a str,
        args: &'a [String],
        env: &'a BTreeMap<String, String>,
        cwd: Option<&'a Path>,
    },
    StreamableHttp {
        url: &'a str,
        headers: &'a BTreeMap<String, String>,
    },
}

impl McpServerConfig {
    /// The typed transport. Loading guarantees exactly one of `command` and `url`;
    /// for a hand-built value `command` wins.
    pub fn transport(&self) -> McpTransport<'_> {
        match (&self.command, &self.url) {
            (None, Some(url)) => McpTransport::StreamableHttp { url, headers: &self.headers },
            (command, _) => McpTransport::Stdio {
                command: command.as_deref().unwrap_or_default(),
                args: &self.args,
                env: &self.env,
                cwd: self.cwd.as_deref(),
            },
        }
    }

    pub fn startup_timeout(&self) -> Duration {
        Duration::from_millis(self.startup_timeout_ms)
    }

    /// The configured deadline of one call, if any (otherwise the session's default).
    pub fn call_timeout(&self) -> Option<Duration> {
        self.call_timeout_ms.map(Duration::from_millis)
    }
}

/// `[skills]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkillsConfig {
    /// Absolute directories, searched in order; they need not exist.
    pub dirs: Vec<PathBuf>,
    /// `trusted`: directories whose skills run as they declare even inside a
    /// workspace, with the file that said so (see `skills::skill_dirs`).
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "trusted_dirs")]
    pub trusted: Vec<TrustedSkillDir>,
}

/// `trusted` as written: the directories (where each came from is not a setting).
fn trusted_dirs<S: serde::Serializer>(
    trusted: &[TrustedSkillDir],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(trusted.iter().map(|grant| &grant.dir))
}

/// One `[skills] trusted` entry and where it was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TrustedSkillDir {
    pub dir: PathBuf,
    /// The configuration file that lists it.
    pub source: PathBuf,
    /// The file is `--config`'s (whose trust depends on where it lies), not the
    /// system or user file.
    pub explicit: bool,
}

/// `[env]`: the environment of commands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    pub inherit: bool,
    /// Name substrings never inherited, beyond the built-in secret-looking ones.
    pub exclude: Vec<String>,
    pub set: BTreeMap<String, String>,
}

impl Config {
    /// Loads, merges, resolves and validates every layer.
    pub fn load(options: &LoadOptions) -> Result<Config, ConfigError> {
        let start_dir = std::fs::canonicalize(&options.start_dir)
            .map_err(|source| ConfigError::Read { path: options.start_dir.clone(), source })?;
        let options = LoadOptions { start_dir, ..options.clone() };

        let mut layers = Layers::default();
        layers.push(Layer::parse(DEFAULTS_NAME.to_owned(), DEFAULT_TOML)?);
        let mut sources = Vec::new();
        let optional = [&options.system_dir, &options.user_dir]
            .into_iter()
            .flatten()
            .map(|dir| dir.join(CONFIG_FILE_NAME));
        for path in optional {
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    check_trusted(&path, options.uid)?;
                    layers.push(Layer::parse(path.display().to_string(), &text)?);
                    sources.push(path);
                }
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(ConfigError::Read { path, source }),
            }
        }
        if let Some(path) = &options.explicit {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::Read { path: path.clone(), source })?;
            check_trusted(path, options.uid)?;
            layers.push(Layer::parse(path.display().to_string(), &text)?);
            sources.push(path.clone());
        }

        let raw = layers.deserialize()?;
        let mut config = raw.resolve(&options, &layers)?;
        config.sources = sources;
        Ok(config)
    }

    /// The environment policy of commands: the built-in secret patterns, the service
    /// manager's variables and `[env] exclude`, then `[env] set`.
    pub fn env_policy(&self) -> EnvPolicy {
        env_policy_of(&self.env)
    }

    /// A new session's Env as this configuration grants it: every root, the first one
    /// as cwd, the configured limits and environment policy.
    pub fn session_env(&self, session_id: &str) -> Env {
        let roots = self.workspace.roots.clone();
        Env {
            session_id: session_id.to_owned(),
            cwd: roots.first().cloned().unwrap_or_default(),
            roots,
            timeout: self.limits.default_timeout(),
            max_timeout: self.limits.max_timeout(),
            max_output_bytes: self.limits.max_output_bytes,
            max_read_bytes: self.limits.max_read_bytes,
            env_policy: self.env_policy(),
            files: Default::default(),
            access: Default::default(),
            control: Default::default(),
        }
    }

    /// The effective configuration as TOML (for `toolgate check-config`). It loads
    /// back to the same configuration, except that values of secret-looking MCP
    /// headers and environment variables are replaced by `"[redacted]"`: a dump is
    /// made to be shown and pasted.
    pub fn to_toml_string(&self) -> Result<String, ConfigError> {
        let mut shown = self.clone();
        for server in &mut shown.mcp_servers {
            redact_values(&mut server.headers);
            redact_values(&mut server.env);
        }
        redact_values(&mut shown.env.set);
        toml::to_string(&shown).map_err(|err| ConfigError::Encode(err.to_string()))
    }
}

fn redact_values(map: &mut BTreeMap<String, String>) {
    for (name, value) in map.iter_mut() {
        if crate::audit::looks_secret(name) {
            *value = REDACTED.to_owned();
        }
    }
}

// ---------------------------------------------------------------------------------
// Layers and positions.

/// One step of a key path: a table key or an array position.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Seg {
    Key(String),
    Index(usize),
}

type KeyPath = Vec<Seg>;

/// One parsed source.
struct Layer {
    /// How errors name the source: its path, or [`DEFAULTS_NAME`].
    name: String,
    table: toml::Table,
    /// 1-based (line, column) of every key and array element the source sets.
    positions: HashMap<KeyPath, (usize, usize)>,
}

impl Layer {
    fn parse(name: String, text: &str) -> Result<Layer, ConfigError> {
        let syntax = |err: toml::de::Error| {
            let (line, column) = err.span().map_or((1, 1), |span| line_column(text, span.start));
            ConfigError::Syntax {
                file: name.clone(),
                line,
                column,
                message: err.message().trim().to_owned(),
            }
        };
        let spanned = toml::de::DeTable::parse(text).map_err(syntax)?;
        let table: toml::Table = toml::from_str(text).map_err(syntax)?;
        let mut nodes = Vec::new();
        collect_nodes(spanned.get_ref(), &mut Vec::new(), &mut nodes);
        let mut positions = HashMap::new();
        for (path, span) in nodes {
            positions.entry(path).or_insert_with(|| line_column(text, span.start));
        }
        Ok(Layer { name, table, positions })
    }
}

/// Every key and array element of a parsed document with its spans: the key's span
/// first, then the value's.
fn collect_nodes(
    table: &toml::de::DeTable<'_>,
    prefix: &mut KeyPath,
    out: &mut Vec<(KeyPath, Range<usize>)>,
) {
    for (key, value) in table.iter() {
        prefix.push(Seg::Key(key.get_ref().to_string()));
        out.push((prefix.clone(), key.span()));
        collect_value(value, prefix, out);
        prefix.pop();
    }
}

fn collect_value(
    value: &toml::Spanned<toml::de::DeValue<'_>>,
    prefix: &mut KeyPath,
    out: &mut Vec<(KeyPath, Range<usize>)>,
) {
    out.push((prefix.clone(), value.span()));
    match value.get_ref() {
        toml::de::DeValue::Table(table) => collect_nodes(table, prefix, out),
        toml::de::DeValue::Array(items) => {
            for (idx, item) in items.iter().enumerate() {
                prefix.push(Seg::Index(idx));
                collect_value(item, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |idx| idx + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

/// The deepest key path whose key or value span holds `offset`.
fn path_at(nodes: &[(KeyPath, Range<usize>)], offset: usize) -> Option<KeyPath> {
    nodes
        .iter()
        .filter(|(_, span)| span.start <= offset && (offset < span.end || span.start == offset))
        .max_by_key(|(path, span)| (path.len(), std::cmp::Reverse(span.len())))
        .map(|(path, _)| path.clone())
}

/// Renders a key path for humans: `[limits] default_timeout_ms`,
/// `[[mcp_servers]] #2 command`, `[workspace] roots #1` (array positions 1-based).
fn render_key(path: &[Seg]) -> String {
    fn dotted(segs: &[Seg]) -> String {
        let mut out = String::new();
        let mut previous: Option<&Seg> = None;
        for seg in segs {
            match (seg, previous) {
                (Seg::Key(key), None) => out.push_str(key),
                // After an array position: `#2 name`, not `#2.name`.
                (Seg::Key(key), Some(Seg::Index(_))) => {
                    let _ = write!(out, " {key}");
                }
                (Seg::Key(key), Some(Seg::Key(_))) => {
                    let _ = write!(out, ".{key}");
                }
                (Seg::Index(idx), _) => {
                    let _ = write!(out, " #{}", idx + 1);
                }
            }
            previous = Some(seg);
        }
        out
    }
    let first_index = path.iter().position(|seg| matches!(seg, Seg::Index(_)));
    match first_index {
        // An element of an array of tables, and a key inside it.
        Some(idx) if idx > 0 && idx + 1 < path.len() => {
            format!("[[{}]] {}", dotted(&path[..idx]), dotted(&path[idx..]).trim_start())
        }
        _ if path.len() >= 2 => {
            let split = match first_index {
                Some(idx) if idx > 0 => idx - 1,
                _ => path.len() - 1,
            };
            if split == 0 {
                dotted(path)
            } else {
                format!("[{}] {}", dotted(&path[..split]), dotted(&path[split..]))
            }
        }
        _ => dotted(path),
    }
}

fn key_path(keys: &[&str]) -> KeyPath {
    keys.iter().map(|key| Seg::Key((*key).to_owned())).collect()
}

/// The sources in layer order.
#[derive(Default)]
struct Layers {
    layers: Vec<Layer>,
}

impl Layers {
    fn push(&mut self, layer: Layer) {
        self.layers.push(layer);
    }

    /// Merges every layer and deserializes the result, mapping an error back to the
    /// layer and position of the offending key.
    fn deserialize(&self) -> Result<RawConfig, ConfigError> {
        let mut merged = toml::Table::new();
        for layer in &self.layers {
            merge_tables(&mut merged, layer.table.clone());
        }
        let text = toml::to_string(&merged).map_err(|err| ConfigError::Encode(err.to_string()))?;
        match toml::from_str::<RawConfig>(&text) {
            Ok(raw) => Ok(raw),
            Err(err) => {
                let path = match (err.span(), toml::de::DeTable::parse(&text)) {
                    (Some(span), Ok(doc)) => {
                        let mut nodes = Vec::new();
                        collect_nodes(doc.get_ref(), &mut Vec::new(), &mut nodes);
                        path_at(&nodes, span.start).unwrap_or_default()
                    }
                    _ => KeyPath::new(),
                };
                let said = err.message().trim();
                let plain = plain_message(said);
                let translated = plain != said;
                let mut error = self.invalid(&path, plain);
                // In plain words the key begins the sentence: "[server] max_connections
                // must be a whole number, not the text "10"".
                if translated
                    && let ConfigError::Invalid { key, message, .. } = &mut error
                    && !key.is_empty()
                {
                    *message = format!("{} {message}", std::mem::take(key));
                }
                Err(error)
            }
        }
    }

    /// The index of the last layer that set exactly `path`.
    fn set_by(&self, path: &[Seg]) -> Option<usize> {
        self.layers.iter().rposition(|layer| layer.positions.contains_key(path))
    }

    /// An error about `path`, located in the last layer that set it (or, for a key a
    /// layer did not set itself, its nearest enclosing table or array).
    fn invalid(&self, path: &[Seg], message: impl Into<String>) -> ConfigError {
        let ConfigWarning { file, position, key, message } = self.warning(path, message);
        ConfigError::Invalid { file, position, key, message }
    }

    /// A warning about `path`, located as [`Layers::invalid`] locates an error.
    fn warning(&self, path: &[Seg], message: impl Into<String>) -> ConfigWarning {
        let key = render_key(path);
        for len in (1..=path.len()).rev() {
            let prefix = &path[..len];
            for layer in self.layers.iter().rev() {
                if let Some(position) = layer.positions.get(prefix) {
                    return ConfigWarning {
                        file: layer.name.clone(),
                        position: Some(*position),
                        key,
                        message: message.into(),
                    };
                }
            }
        }
        let file = self.layers.last().map_or_else(|| DEFAULTS_NAME.to_owned(), |l| l.name.clone());
        ConfigWarning { file, position: None, key, message: message.into() }
    }
}

/// Refuses a file toolgate takes instructions from (configuration, skill, hook) that
/// someone other than root or the daemon's user could change, as OpenSSH does: the
/// file and every directory on its path (symlinks followed) must be owned by root or
/// the daemon's user and writable by nobody else. A directory writable by everyone but
/// sticky and owned by root (such as `/tmp`) is fine: nobody else can replace what is
/// in it. The error names the file or directory and the command that fixes it.
pub fn check_trusted_file(path: &Path) -> Result<(), ConfigError> {
    check_trusted(path, rustix::process::geteuid().as_raw())
}

/// [`check_trusted_file`] for a daemon running as `uid`.
pub fn check_trusted(path: &Path, uid: u32) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt;

    let canonical = std::fs::canonicalize(path)
        .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    let mut current = Some(canonical.as_path());
    let mut is_file = true;
    while let Some(at) = current {
        let meta = std::fs::metadata(at)
            .map_err(|source| ConfigError::Read { path: at.to_path_buf(), source })?;
        let mode = meta.mode() & 0o7777;
        let owner = meta.uid();
        let shown = path.to_path_buf();
        let what = if is_file {
            String::new()
        } else {
            format!("the directory {} on its path ", at.display())
        };
        if owner != 0 && owner != uid {
            return Err(ConfigError::Untrusted {
                problem: format!(
                    "{what}is owned by uid {owner}, not by root or uid {uid} (the user \
                     toolgate runs as), so its owner could change what toolgate runs"
                ),
                fix: format!("run `chown {} {}`", user_name(uid), at.display()),
                path: shown,
            });
        }
        let sticky_root_dir = !is_file && owner == 0 && mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !sticky_root_dir {
            let who = if mode & 0o002 != 0 { "every user" } else { "its group" };
            return Err(ConfigError::Untrusted {
                problem: format!(
                    "{what}is writable by {who} (mode {mode:04o}), so others could change \
                     what toolgate runs"
                ),
                fix: format!("run `chmod go-w {}`", at.display()),
                path: shown,
            });
        }
        is_file = false;
        current = at.parent();
    }
    Ok(())
}

/// The name of a user for a message, else the number.
fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |user| user.name)
}

/// Deep merge: tables merge key by key, anything else replaces.
fn merge_tables(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(base_table)), toml::Value::Table(over_table)) => {
                merge_tables(base_table, over_table);
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// The file schema and its resolution.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    server: RawServer,
    workspace: RawWorkspace,
    limits: LimitsConfig,
    permissions: PermissionsConfig,
    hooks: HooksConfig,
    mcp_servers: Vec<McpServerConfig>,
    skills: RawSkills,
    env: EnvConfig,
    audit: crate::audit::AuditSettings,
    sandbox: crate::sandbox::SandboxConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default)]
    socket: Option<String>,
    #[serde(default)]
    tcp: Option<SocketAddr>,
    #[serde(default)]
    mcp_http: Option<SocketAddr>,
    #[serde(default)]
    token_file: Option<String>,
    audit_log: AuditLogSetting,
    max_connections: usize,
    max_message_bytes: usize,
    shutdown_grace_ms: u64,
    event_buffer: usize,
    max_calls_per_session: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkspace {
    roots: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSkills {
    #[serde(default)]
    dirs: Option<Vec<String>>,
    /// Read per layer (see `resolve`); here only to check the type.
    #[serde(default)]
    trusted: Option<Vec<String>>,
}

/// `audit_log = true | false | "path"`; `""` is the same as `false`.
enum AuditLogSetting {
    Default,
    Off,
    Path(String),
}

impl<'de> Deserialize<'de> for AuditLogSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AuditLogSetting, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = AuditLogSetting;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true, false or a path")
            }

            fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<AuditLogSetting, E> {
                Ok(if value { AuditLogSetting::Default } else { AuditLogSetting::Off })
            }

            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<AuditLogSetting, E> {
                Ok(if value.is_empty() {
                    AuditLogSetting::Off
                } else {
                    AuditLogSetting::Path(value.to_owned())
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Resolves `~`, `~/…` and relative paths.
fn expand_path(raw: &str, options: &LoadOptions) -> Result<PathBuf, String> {
    if raw.is_empty() {
        return Err("must not be empty".to_owned());
    }
    let path = if raw == "~" || raw.starts_with("~/") {
        let Some(home) = &options.home else {
            return Err(format!("cannot expand `~` in {raw:?}: the home directory is unknown"));
        };
        home.join(raw.trim_start_matches('~').trim_start_matches('/'))
    } else if raw.starts_with('~') {
        return Err(format!("only `~` and `~/` are expanded, not {raw:?}"));
    } else {
        PathBuf::from(raw)
    };
    Ok(if path.is_absolute() { path } else { options.start_dir.join(path) })
}

impl RawConfig {
    fn resolve(self, options: &LoadOptions, layers: &Layers) -> Result<Config, ConfigError> {
        let at = |keys: &[&str], message: String| layers.invalid(&key_path(keys), message);
        let path_at = |keys: &[&str], raw: &str| {
            expand_path(raw, options).map_err(|message| at(keys, message))
        };

        // [server]
        let raw_server = self.server;
        let socket = match &raw_server.socket {
            Some(raw) => path_at(&["server", "socket"], raw)?,
            None => match &options.runtime_dir {
                Some(dir) => dir.join("toolgate").join("toolgate.sock"),
                None => PathBuf::from("/tmp")
                    .join(format!("toolgate-{}", options.uid))
                    .join("toolgate.sock"),
            },
        };
        let token_file = match &raw_server.token_file {
            Some(raw) => Some(path_at(&["server", "token_file"], raw)?),
            None => None,
        };
        let audit_log = match &raw_server.audit_log {
            AuditLogSetting::Off => None,
            AuditLogSetting::Path(raw) => Some(path_at(&["server", "audit_log"], raw)?),
            AuditLogSetting::Default => match &options.state_home {
                Some(dir) => Some(dir.join("toolgate").join("audit.jsonl")),
                None => {
                    return Err(at(
                        &["server", "audit_log"],
                        "neither $XDG_STATE_HOME nor the home directory is known; \
                         set audit_log to a path, or to false"
                            .to_owned(),
                    ));
                }
            },
        };
        let server = ServerConfig {
            socket,
            tcp: raw_server.tcp,
            mcp_http: raw_server.mcp_http,
            token_file,
            audit_log,
            max_connections: raw_server.max_connections,
            max_message_bytes: raw_server.max_message_bytes,
            shutdown_grace_ms: raw_server.shutdown_grace_ms,
            event_buffer: raw_server.event_buffer,
            max_calls_per_session: raw_server.max_calls_per_session,
        };
        validate_server(&server, layers)?;

        // [workspace]
        if self.workspace.roots.is_empty() {
            return Err(at(&["workspace", "roots"], "at least one root is required".to_owned()));
        }
        let mut roots: Vec<PathBuf> = Vec::new();
        for (idx, raw) in self.workspace.roots.iter().enumerate() {
            let root_path = || {
                let mut path = key_path(&["workspace", "roots"]);
                path.push(Seg::Index(idx));
                path
            };
            let expanded = expand_path(raw, options)
                .map_err(|message| layers.invalid(&root_path(), message))?;
            let canonical = std::fs::canonicalize(&expanded).map_err(|err| {
                layers.invalid(
                    &root_path(),
                    format!("workspace root {} does not exist: {err}", expanded.display()),
                )
            })?;
            if !canonical.is_dir() {
                return Err(layers.invalid(
                    &root_path(),
                    format!("workspace root {} is not a directory", canonical.display()),
                ));
            }
            if !roots.contains(&canonical) {
                roots.push(canonical);
            }
        }

        validate_limits(&self.limits, layers)?;
        validate_hooks(&self.hooks, &hook_search_path(&self.env), options, layers)?;
        let mut mcp_servers = self.mcp_servers;
        validate_mcp_servers(&mut mcp_servers, &self.limits, options, layers)?;
        validate_env(&self.env, layers)?;
        if let Err((key, message)) = self.audit.validate() {
            return Err(layers.invalid(&key_path(&["audit", key]), message));
        }

        // [skills]
        let dirs = match &self.skills.dirs {
            Some(raw_dirs) => {
                let mut dirs = Vec::new();
                for (idx, raw) in raw_dirs.iter().enumerate() {
                    let mut path = key_path(&["skills", "dirs"]);
                    path.push(Seg::Index(idx));
                    dirs.push(
                        expand_path(raw, options)
                            .map_err(|message| layers.invalid(&path, message))?,
                    );
                }
                dirs
            }
            None => options
                .user_dir
                .iter()
                .map(|dir| dir.join("skills"))
                .chain(roots.iter().map(|root| root.join(".toolgate").join("skills")))
                .collect(),
        };

        // `trusted` counts per file: where each entry was written decides whether it
        // is the user's own word (see `skills::skill_dirs`), so layers are not merged.
        let _checked_above = &self.skills.trusted;
        let mut trusted = Vec::new();
        for layer in &layers.layers {
            let Some(entries) = layer
                .table
                .get("skills")
                .and_then(|skills| skills.get("trusted"))
                .and_then(toml::Value::as_array)
            else {
                continue;
            };
            for (idx, entry) in entries.iter().enumerate() {
                let mut path = key_path(&["skills", "trusted"]);
                path.push(Seg::Index(idx));
                let raw = entry.as_str().unwrap_or_default();
                if !(raw.starts_with('/') || raw.starts_with("~/")) {
                    return Err(layers.invalid(
                        &path,
                        format!("{raw:?}: a trusted directory is an absolute path (or ~/...)"),
                    ));
                }
                let dir =
                    expand_path(raw, options).map_err(|message| layers.invalid(&path, message))?;
                let source = PathBuf::from(&layer.name);
                let explicit = options.explicit.as_ref().is_some_and(|file| *file == source);
                trusted.push(TrustedSkillDir { dir, source, explicit });
            }
        }

        // Rules last: a rule may name a skill's tool, found in the skill directories.
        let skill_tools = skill_tools(&dirs);
        let skill_names: Vec<String> = skill_tools.keys().cloned().collect();
        validate_permissions(&self.permissions, &skill_names, options, layers)?;
        let warnings =
            permission_warnings(&self.permissions, &roots, &skill_tools, options, layers);

        Ok(Config {
            server,
            workspace: WorkspaceConfig { roots },
            limits: self.limits,
            permissions: self.permissions,
            hooks: self.hooks,
            skills: SkillsConfig { dirs, trusted },
            env: self.env,
            mcp_servers,
            audit: self.audit,
            sandbox: self.sandbox,
            sources: Vec::new(),
            warnings,
        })
    }
}

fn nonzero(layers: &Layers, keys: &[&str], value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(layers.invalid(&key_path(keys), "must be greater than zero"));
    }
    Ok(())
}

fn validate_server(server: &ServerConfig, layers: &Layers) -> Result<(), ConfigError> {
    let counts = [
        ("max_connections", server.max_connections),
        ("max_message_bytes", server.max_message_bytes),
        ("event_buffer", server.event_buffer),
        ("max_calls_per_session", server.max_calls_per_session),
    ];
    for (key, value) in counts {
        nonzero(layers, &["server", key], u64::try_from(value).unwrap_or(u64::MAX))?;
    }
    for (key, addr) in [("tcp", server.tcp), ("mcp_http", server.mcp_http)] {
        if let Some(addr) = addr
            && !addr.ip().is_loopback()
            && server.token_file.is_none()
        {
            return Err(layers.invalid(
                &key_path(&["server", key]),
                format!(
                    "{addr} is reachable beyond this machine; set [server] token_file \
                     so that clients must present a bearer token"
                ),
            ));
        }
    }
    if let (Some(tcp), Some(mcp_http)) = (server.tcp, server.mcp_http)
        && tcp == mcp_http
    {
        return Err(layers.invalid(
            &key_path(&["server", "mcp_http"]),
            format!("{mcp_http} is also the tcp address; the two endpoints need their own"),
        ));
    }
    Ok(())
}

fn validate_limits(limits: &LimitsConfig, layers: &Layers) -> Result<(), ConfigError> {
    nonzero(layers, &["limits", "default_timeout_ms"], limits.default_timeout_ms)?;
    nonzero(layers, &["limits", "max_timeout_ms"], limits.max_timeout_ms)?;
    nonzero(
        layers,
        &["limits", "max_output_bytes"],
        u64::try_from(limits.max_output_bytes).unwrap_or(u64::MAX),
    )?;
    nonzero(layers, &["limits", "max_read_bytes"], limits.max_read_bytes)?;
    nonzero(layers, &["limits", "approval_timeout_ms"], limits.approval_timeout_ms)?;
    nonzero(layers, &["limits", "process_output_bytes"], limits.process_output_bytes)?;
    nonzero(layers, &["limits", "detached_session_ttl_ms"], limits.detached_session_ttl_ms)?;
    if limits.session_process_output_bytes < limits.process_output_bytes {
        return Err(layers.invalid(
            &key_path(&["limits", "session_process_output_bytes"]),
            format!(
                "{} is below process_output_bytes ({}): no process could start",
                limits.session_process_output_bytes, limits.process_output_bytes
            ),
        ));
    }
    if limits.default_timeout_ms > limits.max_timeout_ms {
        // Blame whichever of the two was set last: that is the change that broke it.
        let default_path = key_path(&["limits", "default_timeout_ms"]);
        let max_path = key_path(&["limits", "max_timeout_ms"]);
        let blamed = if layers.set_by(&max_path) > layers.set_by(&default_path) {
            max_path
        } else {
            default_path
        };
        return Err(layers.invalid(
            &blamed,
            format!(
                "default_timeout_ms ({}) is more than max_timeout_ms ({})",
                limits.default_timeout_ms, limits.max_timeout_ms
            ),
        ));
    }
    Ok(())
}

/// The tools the command skills of `dirs` declare (`name` in each `*.toml`), so that
/// rules may name them, with the names of their arguments when the skill's
/// `input_schema` lists `properties`. Files that cannot be read are left to the skill
/// loader to report.
fn skill_tools(dirs: &[PathBuf]) -> BTreeMap<String, Option<Vec<String>>> {
    let mut tools = BTreeMap::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|ext| ext != "toml") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let Ok(table) = text.parse::<toml::Table>() else { continue };
            if let Some(name) = table.get("name").and_then(toml::Value::as_str) {
                let properties = table
                    .get("input_schema")
                    .and_then(|schema| schema.get("properties"))
                    .and_then(toml::Value::as_table)
                    .map(|properties| properties.keys().cloned().collect());
                // Directories are searched in order: the first skill of a name is the one.
                tools.entry(name.to_owned()).or_insert(properties);
            }
        }
    }
    tools
}

/// The argument names of a built-in tool, from its input schema.
fn builtin_properties(tool: &str) -> Option<Vec<String>> {
    static SCHEMAS: std::sync::LazyLock<HashMap<String, Vec<String>>> =
        std::sync::LazyLock::new(|| {
            crate::tools::builtin::all()
                .iter()
                .filter_map(|tool| {
                    let definition = tool.definition();
                    let properties = definition.input_schema.get("properties")?.as_object()?;
                    Some((definition.name.clone(), properties.keys().cloned().collect()))
                })
                .collect()
        });
    SCHEMAS.get(tool).cloned()
}

/// The rules that load but cannot do what they look like they do: each rule's own
/// problems ([`crate::permission::rule_warnings`]), and a rule that an identical rule
/// of a list decided first (deny, then ask, then allow) always overrides, the built-in
/// protections in force counted as deny rules.
fn permission_warnings(
    permissions: &PermissionsConfig,
    roots: &[PathBuf],
    skill_tools: &BTreeMap<String, Option<Vec<String>>>,
    options: &LoadOptions,
    layers: &Layers,
) -> Vec<ConfigWarning> {
    let home = options.home.as_deref();
    let properties = |tool: &str| match skill_tools.get(tool) {
        Some(properties) => properties.clone(),
        None => builtin_properties(tool),
    };
    let lists =
        [("deny", &permissions.deny), ("ask", &permissions.ask), ("allow", &permissions.allow)];
    let protected: Vec<&str> = crate::permission::protections_in_force(&permissions.unprotect)
        .into_iter()
        .flat_map(|protection| protection.rules.iter().copied())
        .collect();
    let mut warnings = Vec::new();
    for (rank, (key, rules)) in lists.iter().enumerate() {
        for (idx, rule) in rules.iter().enumerate() {
            let mut path = key_path(&["permissions", key]);
            path.push(Seg::Index(idx));
            for message in crate::permission::rule_warnings(rule, home, roots, &properties) {
                warnings.push(layers.warning(&path, format!("the rule {rule:?} {message}")));
            }
            let earlier = lists[..rank].iter().flat_map(|(earlier_key, earlier_rules)| {
                earlier_rules.iter().enumerate().map(move |(at, text)| {
                    (
                        format!(
                            "the {earlier_key} rule {text:?} ([permissions] {earlier_key} #{})",
                            at + 1
                        ),
                        text.as_str(),
                    )
                })
            });
            let builtin =
                protected.iter().map(|text| (format!("the built-in protection {text:?}"), *text));
            if *key == "deny" {
                continue;
            }
            let shadow = earlier
                .chain(builtin)
                .find(|(_, text)| crate::permission::covered_by(rule, text, home));
            if let Some((by, _)) = shadow {
                let effect = match *key {
                    "allow" => "it never allows anything",
                    _ => "it never asks",
                };
                warnings.push(layers.warning(
                    &path,
                    format!(
                        "the rule {rule:?} matches nothing that {by} does not, and that rule \
                         is decided first: {effect}"
                    ),
                ));
            }
        }
    }
    warnings
}

fn validate_permissions(
    permissions: &PermissionsConfig,
    skill_tools: &[String],
    options: &LoadOptions,
    layers: &Layers,
) -> Result<(), ConfigError> {
    if !PERMISSION_MODES.contains(&permissions.mode.as_str()) {
        return Err(layers.invalid(
            &key_path(&["permissions", "mode"]),
            format!(
                "unknown mode {:?}, expected one of {}",
                permissions.mode,
                PERMISSION_MODES.join(", ")
            ),
        ));
    }
    for (key, rules) in
        [("allow", &permissions.allow), ("ask", &permissions.ask), ("deny", &permissions.deny)]
    {
        for (idx, rule) in rules.iter().enumerate() {
            let mut path = key_path(&["permissions", key]);
            path.push(Seg::Index(idx));
            if rule.trim().is_empty() {
                return Err(layers.invalid(&path, "a rule must not be empty"));
            }
            crate::permission::check_rule(rule, options.home.as_deref(), skill_tools).map_err(
                |problem| layers.invalid(&path, format!("invalid rule {rule:?}: {problem}")),
            )?;
        }
    }
    for (idx, name) in permissions.unprotect.iter().enumerate() {
        let mut path = key_path(&["permissions", "unprotect"]);
        path.push(Seg::Index(idx));
        crate::permission::protection(name)
            .map_err(|problem| layers.invalid(&path, problem.to_string()))?;
    }
    Ok(())
}

fn validate_hooks(
    hooks: &HooksConfig,
    search_path: &Option<String>,
    options: &LoadOptions,
    layers: &Layers,
) -> Result<(), ConfigError> {
    for (event, list) in
        [("pre_tool_use", &hooks.pre_tool_use), ("post_tool_use", &hooks.post_tool_use)]
    {
        for (idx, hook) in list.iter().enumerate() {
            let path = |key: &str| {
                vec![
                    Seg::Key("hooks".to_owned()),
                    Seg::Key(event.to_owned()),
                    Seg::Index(idx),
                    Seg::Key(key.to_owned()),
                ]
            };
            if hook.matcher != "*"
                && !hook.matcher.is_empty()
                && let Err(err) = regex::Regex::new(&hook.matcher)
            {
                // The regex error is a multi-line diagram; its last line says what is wrong.
                let detail = err.to_string().lines().last().unwrap_or_default().to_owned();
                return Err(layers.invalid(
                    &path("matcher"),
                    format!("{:?} is not a valid regex: {}", hook.matcher, detail.trim()),
                ));
            }
            if hook.command.trim().is_empty() {
                return Err(layers.invalid(&path("command"), "must not be empty"));
            }
            if hook.timeout_ms == 0 {
                return Err(layers.invalid(&path("timeout_ms"), "must be greater than zero"));
            }
            // A hook that cannot start fails every call it matches (closed) or never
            // runs (open): either way the configuration does not do what it says.
            if let Some(why) = crate::hooks::missing_program(
                &hook.command,
                options.home.as_deref(),
                search_path.as_deref(),
            ) {
                return Err(layers
                    .invalid(&path("command"), format!("{:?} cannot run: {why}", hook.command)));
            }
            for file in hook_command_files(&hook.command, options.home.as_deref()) {
                check_trusted(&file, options.uid)?;
            }
        }
    }
    Ok(())
}

/// The environment policy `[env]` sets: the built-in secret patterns, the service
/// manager's variables and `exclude`, then `set`.
fn env_policy_of(env: &EnvConfig) -> EnvPolicy {
    let mut policy = EnvPolicy { inherit: env.inherit, ..EnvPolicy::default() };
    policy.exclude_patterns.extend(SERVICE_MANAGER_VARS.iter().map(|name| (*name).to_owned()));
    policy.exclude_patterns.extend(env.exclude.iter().cloned());
    policy.set = env.set.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    policy
}

/// The `PATH` hook processes get (the environment policy of [`Config::env_policy`]
/// applied to the daemon's environment); `None` when they get none.
fn hook_search_path(env: &EnvConfig) -> Option<String> {
    if let Some(path) = env.set.get("PATH") {
        return Some(path.clone());
    }
    if !env_policy_of(env).inherits("PATH") {
        return None;
    }
    crate::sandbox::daemon_environment()
        .into_iter()
        .find_map(|(name, value)| (name == "PATH").then_some(value))
}

/// The files a hook command runs that exist now: its program when named by a path, and
/// the script an interpreter runs (`python3 ~/hooks/x.py`). Programs looked up in
/// `PATH` are left to the system's own permissions.
fn hook_command_files(command: &str, home: Option<&Path>) -> Vec<PathBuf> {
    const INTERPRETERS: &[&str] =
        &["sh", "bash", "dash", "zsh", "python", "python3", "node", "perl", "ruby", "deno", "bun"];
    let expand = |word: &str| -> Option<PathBuf> {
        let word = word.trim_matches(['"', '\'']);
        let path = match (word.strip_prefix("~/"), home) {
            (Some(rest), Some(home)) => home.join(rest),
            (Some(_), None) => return None,
            (None, _) if word.starts_with('/') || word.starts_with("./") => PathBuf::from(word),
            (None, _) => return None,
        };
        path.is_file().then_some(path)
    };
    let mut words = command.split_whitespace();
    let mut files = Vec::new();
    if let Some(program) = words.next() {
        files.extend(expand(program));
        let name = program.rsplit('/').next().unwrap_or(program);
        if INTERPRETERS.contains(&name)
            && let Some(script) = words.find(|word| !word.starts_with('-'))
        {
            files.extend(expand(script));
        }
    }
    files
}

fn validate_mcp_servers(
    servers: &mut [McpServerConfig],
    limits: &LimitsConfig,
    options: &LoadOptions,
    layers: &Layers,
) -> Result<(), ConfigError> {
    let mut names = HashSet::new();
    for (idx, server) in servers.iter_mut().enumerate() {
        let path = |key: &str| {
            let mut path = vec![Seg::Key("mcp_servers".to_owned()), Seg::Index(idx)];
            if !key.is_empty() {
                path.push(Seg::Key(key.to_owned()));
            }
            path
        };
        if let Err(message) = check_server_name(&server.name) {
            return Err(layers.invalid(&path("name"), message));
        }
        if !names.insert(server.name.clone()) {
            return Err(layers.invalid(
                &path("name"),
                format!("another server is already named {:?}", server.name),
            ));
        }
        match (&server.command, &server.url) {
            (Some(_), Some(_)) => {
                return Err(layers.invalid(
                    &path("url"),
                    "set either command (stdio) or url (Streamable HTTP), not both",
                ));
            }
            (None, None) => {
                return Err(layers
                    .invalid(&path(""), "set either command (stdio) or url (Streamable HTTP)"));
            }
            (Some(command), None) => {
                if command.trim().is_empty() {
                    return Err(layers.invalid(&path("command"), "must not be empty"));
                }
                if !server.headers.is_empty() {
                    return Err(layers.invalid(
                        &path("headers"),
                        "headers apply to a url server; a stdio server takes env",
                    ));
                }
            }
            (None, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(layers.invalid(
                        &path("url"),
                        format!("{url:?} is not an http:// or https:// URL"),
                    ));
                }
                let stdio_key = [
                    ("args", !server.args.is_empty()),
                    ("env", !server.env.is_empty()),
                    ("cwd", server.cwd.is_some()),
                ]
                .into_iter()
                .find(|(_, set)| *set);
                if let Some((key, _)) = stdio_key {
                    return Err(layers.invalid(
                        &path(key),
                        format!(
                            "{key} applies to a stdio server (command); a url server takes headers"
                        ),
                    ));
                }
            }
        }
        if server.startup_timeout_ms == 0 {
            return Err(layers.invalid(&path("startup_timeout_ms"), "must be greater than zero"));
        }
        if let Some(call_timeout_ms) = server.call_timeout_ms {
            if call_timeout_ms == 0 {
                return Err(layers.invalid(&path("call_timeout_ms"), "must be greater than zero"));
            }
            if call_timeout_ms > limits.max_timeout_ms {
                return Err(layers.invalid(
                    &path("call_timeout_ms"),
                    format!(
                        "{call_timeout_ms} is more than [limits] max_timeout_ms ({})",
                        limits.max_timeout_ms
                    ),
                ));
            }
        }
        for (key, paths) in [("writable", &server.writable), ("readable", &server.readable)] {
            if let Some(bad) =
                paths.iter().find(|raw| !(raw.starts_with('/') || raw.starts_with('~')))
            {
                return Err(layers.invalid(
                    &path(key),
                    format!("{bad:?} is not an absolute path (or one starting with ~)"),
                ));
            }
            if !paths.is_empty() && server.url.is_some() {
                return Err(layers.invalid(&path(key), "applies to a stdio server (command)"));
            }
        }
        if let Some(cwd) = &server.cwd {
            let raw = cwd.to_string_lossy().into_owned();
            server.cwd = Some(
                expand_path(&raw, options)
                    .map_err(|message| layers.invalid(&path("cwd"), message))?,
            );
        }
    }
    Ok(())
}

fn validate_env(env: &EnvConfig, layers: &Layers) -> Result<(), ConfigError> {
    for (idx, pattern) in env.exclude.iter().enumerate() {
        if pattern.is_empty() {
            let mut path = key_path(&["env", "exclude"]);
            path.push(Seg::Index(idx));
            return Err(layers.invalid(&path, "an empty pattern would exclude every variable"));
        }
    }
    for name in env.set.keys() {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(layers.invalid(
                &key_path(&["env", "set", name]),
                format!("{name:?} is not a valid environment variable name"),
            ));
        }
    }
    Ok(())
}

/// Checks a configured server's name. Letters, digits, `_` and `-`, but no `__` and no
/// `_` at either end: then the server's part of every proxied name ends at the first
/// `__` after the prefix, so no server can take a name in another server's namespace
/// (a server `gh__enterprise` would own `mcp__gh__enterprise__x`, which server `gh`
/// reaches with a tool named `enterprise__x`), and rules written for one server never
/// match another's tools.
pub fn check_server_name(name: &str) -> Result<(), String> {
    let valid =
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(format!(
            "{name:?} is not a valid server name: use letters, digits, `_` and `-`"
        ));
    }
    if name.contains("__") || name.starts_with('_') || name.ends_with('_') {
        return Err(format!(
            "{name:?} is not a valid server name: `__` separates the server from the tool in \
             mcp__<server>__<tool>, so a server name may not contain `__` or start or end with `_`"
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
