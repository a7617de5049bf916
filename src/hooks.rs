//! PreToolUse / PostToolUse command hooks, compatible with Claude Code's command hooks
//! so that users can reuse the scripts they already have.
//!
//! A hook is a shell command configured per event with a regex `matcher` on the tool
//! name. Before a call runs, every matching `pre_tool_use` hook gets the call as JSON on
//! its stdin and may let it continue, allow it (skip the approval step), ask for
//! approval, deny it, block it, or rewrite its arguments. After the call, every matching
//! `post_tool_use` hook sees the call and its result and may only add feedback for the
//! model: a finished call cannot be un-run.
//!
//! Hooks are local configuration, but their *processes* are treated like any other
//! child of the daemon: an explicit environment, the session's cwd, the supervision of
//! [`crate::exec`], capped output, a deadline, and the whole tree killed when
//! the deadline passes, when the call is canceled, or when the hook exits. A hook
//! that could not be run is never reported as a policy decision: the outcome records it
//! as an error, and `on_error` alone decides whether the call goes on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::tools::facts::ClaudeTool;
use crate::tools::{Env, ToolResult, builtin};

/// One configured command hook (compatible with Claude Code's command hooks).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// Regex on the tool name; empty or "*" matches every tool.
    #[serde(default)]
    pub matcher: String,
    /// Run through `/bin/sh -c`; a leading `~/` is expanded to the home directory.
    pub command: String,
    /// Killed (with its whole process group) after this long.
    #[serde(default = "default_hook_timeout_ms")]
    pub timeout_ms: u64,
    /// What a hook that fails to run or exits with an unexpected code means.
    #[serde(default)]
    pub on_error: OnError,
    /// Which shape of input the hook reads (and of `updatedInput` it writes).
    #[serde(default)]
    pub format: HookFormat,
}

/// The input a hook reads on stdin.
///
/// - `claude`: Claude Code's shape. `tool_name` is Claude Code's name for the tool
///   (`Bash`, `Read`, `Write`, `Edit`, `NotebookEdit`, `Glob`, `Grep`: what each
///   built-in's facts declare; other tools keep their names) and `tool_input` uses its
///   field names (`file_path`, `notebook_path`, `timeout`, `-i`, `-C`, `head_limit`); a
///   PostToolUse hook gets the result as `tool_response` too. An
///   `updatedInput` it answers with is read back in the same shape.
/// - `toolgate`: toolgate's own names (`run_command`, `path`, ...).
/// - `auto` (the default): `claude` when the matcher names one of Claude Code's tools
///   (`Bash`, `Edit|Write`, ...), otherwise `toolgate`. A hook for every tool (`*`)
///   written for Claude Code says `format = "claude"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookFormat {
    #[default]
    Auto,
    Claude,
    Toolgate,
}

/// Claude Code's counterpart of `tool`, as the built-in tool's facts declare it.
fn claude_tool(tool: &str) -> Option<&'static ClaudeTool> {
    builtin::facts(tool).and_then(|facts| facts.claude_code.tool())
}

/// The name a Claude Code hook sees for `tool`: Claude Code's name for a built-in
/// that has a counterpart, the tool's own otherwise.
pub fn claude_tool_name(tool: &str) -> &str {
    claude_tool(tool).map_or(tool, |claude| claude.name)
}

/// Renames the fields of an arguments object between the two shapes: the argument
/// names a built-in's facts declare different in Claude Code.
fn rename_fields(tool: &str, input: &Value, to_claude: bool) -> Value {
    let Value::Object(map) = input else { return input.clone() };
    let fields = claude_tool(tool).map_or(&[][..], |claude| claude.fields);
    let mut out = serde_json::Map::with_capacity(map.len());
    for (key, value) in map {
        let renamed = fields.iter().find_map(|(ours, claude)| {
            let (from, to) = if to_claude { (ours, claude) } else { (claude, ours) };
            (key == from).then_some(*to)
        });
        out.insert(renamed.unwrap_or(key).to_owned(), value.clone());
    }
    Value::Object(out)
}

/// A tool's arguments as a Claude Code hook reads them.
pub fn claude_tool_input(tool: &str, input: &Value) -> Value {
    rename_fields(tool, input, true)
}

/// Arguments a Claude Code hook wrote (`updatedInput`), in the tool's own names.
pub fn tool_input_from_claude(tool: &str, input: &Value) -> Value {
    rename_fields(tool, input, false)
}

/// Claude Code's name for a permission mode.
fn claude_mode(mode: &str) -> &str {
    match mode {
        "accept_edits" => "acceptEdits",
        "bypass" => "bypassPermissions",
        "dont_ask" => "dontAsk",
        other => other,
    }
}

/// Whether a failing hook lets the call through (fail open) or blocks it (fail closed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    #[default]
    Allow,
    Deny,
}

fn default_hook_timeout_ms() -> u64 {
    60_000
}

/// The shell every hook command runs through, as in Claude Code.
const SHELL: &str = "/bin/sh";

/// The variable telling a hook which event it serves, so one script can handle both.
pub const HOOK_EVENT_VAR: &str = "TOOLGATE_HOOK_EVENT";

/// Captured bytes kept per stream of one hook. A decision is a few hundred bytes of JSON
/// and a block reason a few lines; 64 KiB still holds a long lint report while bounding
/// the memory of many hooks running at once. Output beyond it is read and discarded so
/// that a chatty hook never stalls on a full pipe.
pub const MAX_HOOK_OUTPUT_BYTES: usize = 64 * 1024;

/// Longest reason or feedback text taken from one hook. It lands in the model's context:
/// enough for a sentence or a short list of findings, not enough to flood the prompt.
pub const MAX_REASON_BYTES: usize = 8 * 1024;

/// Which hook event is running; serialized with Claude Code's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HookEvent {
    PreToolUse,
    PostToolUse,
}

impl HookEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PostToolUse => "PostToolUse",
        }
    }

    /// The configuration key of the event (`pre_tool_use` / `post_tool_use`).
    pub fn config_key(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "pre_tool_use",
            HookEvent::PostToolUse => "post_tool_use",
        }
    }
}

impl std::fmt::Display for HookEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a hook configuration was rejected. Reported when the configuration is loaded,
/// never at call time.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{event} hook #{index}: invalid matcher {matcher:?}: {source}")]
    InvalidMatcher {
        event: &'static str,
        index: usize,
        matcher: String,
        #[source]
        source: regex::Error,
    },
    #[error("{event} hook #{index}: the command is empty")]
    EmptyCommand { event: &'static str, index: usize },
    #[error("{event} hook #{index}: timeout_ms must be greater than zero")]
    ZeroTimeout { event: &'static str, index: usize },
    #[error("{event} hook #{index}: cannot expand `~/` in {command:?}: no home directory known")]
    NoHomeDirectory { event: &'static str, index: usize, command: String },
}

/// The facts about one call that its hooks receive, supplied by the caller. The runner
/// adds `hook_event_name` (and `tool_result` after the call) itself, so the payload can
/// never name another event than the one running.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallInput {
    pub session_id: String,
    /// The session's working directory; also the hook's working directory.
    pub cwd: PathBuf,
    pub tool_name: String,
    /// The call's arguments object. A caller whose arguments are not valid JSON passes
    /// the raw text as a JSON string.
    pub tool_input: Value,
    pub call_id: String,
    /// The session's permission mode, as the session names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
}

impl ToolCallInput {
    /// The input for a call in a session: session id and cwd come from its Env.
    pub fn new(
        env: &Env,
        call_id: impl Into<String>,
        tool_name: impl Into<String>,
        tool_input: Value,
    ) -> ToolCallInput {
        ToolCallInput {
            session_id: env.session_id.clone(),
            cwd: env.cwd.clone(),
            tool_name: tool_name.into(),
            tool_input,
            call_id: call_id.into(),
            permission_mode: None,
        }
    }

    pub fn with_permission_mode(mut self, mode: impl Into<String>) -> ToolCallInput {
        self.permission_mode = Some(mode.into());
        self
    }
}

/// What a PreToolUse hook reads on stdin (Claude Code's field names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreToolUseInput {
    /// Always [`HookEvent::PreToolUse`].
    pub hook_event_name: HookEvent,
    #[serde(flatten)]
    pub call: ToolCallInput,
}

/// What a PostToolUse hook reads on stdin: the call plus its result, whatever the
/// outcome (success, tool error, or a refusal before the tool ran).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PostToolUseInput {
    /// Always [`HookEvent::PostToolUse`].
    pub hook_event_name: HookEvent,
    #[serde(flatten)]
    pub call: ToolCallInput,
    pub tool_result: ToolResult,
}

/// What the PreToolUse hooks of a call decided, strongest first in precedence:
/// `Block` > `Deny` > `Ask` > `Allow` > `Continue`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookVerdict {
    /// No hook expressed an opinion (or none matched): the normal permission flow runs.
    Continue,
    /// A hook approved the call. This only skips the "ask" step; it never overrides a
    /// deny rule or the mode's restrictions, which the caller still enforces.
    Allow,
    /// A hook wants the user to approve the call even if the rules would allow it.
    Ask,
    /// A hook's JSON decision refused the call (`deny`, or the legacy `block`).
    Deny,
    /// A hook exited with status 2 or answered `continue: false`, or a fail-closed hook
    /// failed to run properly.
    Block,
}

/// Why one hook did not produce a usable answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HookFailure {
    /// The process could not be spawned at all (shell missing, cwd gone, ...). Never a
    /// policy decision.
    #[error("could not be started: {0}")]
    NotStarted(String),
    /// Exited with a status other than 0 (continue) or 2 (block).
    #[error("exited with status {code}{}", stderr_suffix(.stderr))]
    ExitStatus { code: i32, stderr: String },
    /// Killed by a signal it did not get from us.
    #[error("was killed by signal {0}")]
    Signaled(i32),
    #[error("timed out after {timeout_ms} ms")]
    TimedOut { timeout_ms: u64 },
    /// The call was canceled while the hook ran; its process group was killed.
    #[error("was canceled")]
    Canceled,
    /// Exit 0 with a JSON object on stdout that is not a valid hook answer.
    #[error("printed an invalid answer: {0}")]
    InvalidOutput(String),
    /// Waiting for the process failed, or the input could not be encoded.
    #[error("failed: {0}")]
    Io(String),
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() { String::new() } else { format!(": {stderr}") }
}

/// One hook that failed to run properly, recorded in an outcome so that callers and
/// audit logs can tell a hook error from a hook decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookRunError {
    pub event: HookEvent,
    /// Position of the hook in its event's configuration list.
    pub index: usize,
    pub command: String,
    /// How the failure was treated: `Allow` let the call continue, `Deny` blocked it.
    pub on_error: OnError,
    pub failure: HookFailure,
}

impl std::fmt::Display for HookRunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} hook `{}` {}", self.event, self.command, self.failure)
    }
}

/// The combined answer of every PreToolUse hook matching one call.
#[derive(Clone, Debug, PartialEq)]
pub struct PreOutcome {
    pub verdict: HookVerdict,
    /// The reasons given by the hooks that produced `verdict`, in configuration order,
    /// one per line. Always present for `Deny` and `Block`.
    pub reason: Option<String>,
    /// Replacement arguments. When several hooks rewrite the input, the last one in
    /// configuration order wins (they run concurrently on the same original input, so
    /// rewrites cannot be chained). The caller must validate it like any arguments.
    pub updated_input: Option<Value>,
    /// Hooks that failed to run properly, whatever `on_error` made of them.
    pub errors: Vec<HookRunError>,
    /// How many hooks matched and ran.
    pub hook_count: usize,
}

impl PreOutcome {
    /// The outcome when no hook matches: nothing to say.
    pub fn none() -> PreOutcome {
        PreOutcome {
            verdict: HookVerdict::Continue,
            reason: None,
            updated_input: None,
            errors: Vec::new(),
            hook_count: 0,
        }
    }

    /// Whether the call must not run (`Deny` or `Block`).
    pub fn refuses(&self) -> bool {
        self.verdict >= HookVerdict::Deny
    }
}

/// The combined answer of every PostToolUse hook matching one call. Post hooks cannot
/// undo the call; the caller attaches `feedback` to the result's metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct PostOutcome {
    /// What the hooks want the model to know (exit 2 stderr, a `block` decision's
    /// reason, `additionalContext`, or a fail-closed hook's failure), one per line.
    pub feedback: Option<String>,
    pub errors: Vec<HookRunError>,
    pub hook_count: usize,
}

impl PostOutcome {
    pub fn none() -> PostOutcome {
        PostOutcome { feedback: None, errors: Vec::new(), hook_count: 0 }
    }
}

/// One hook ready to run: its configuration, compiled matcher and expanded command.
#[derive(Clone, Debug)]
struct CompiledHook {
    index: usize,
    /// `None` matches every tool.
    matcher: Option<Regex>,
    /// The matcher as configured, for people.
    matcher_text: String,
    command: String,
    timeout: Duration,
    timeout_ms: u64,
    on_error: OnError,
    /// Whether the hook reads Claude Code's shape (`auto` resolved).
    claude: bool,
}

impl CompiledHook {
    fn compile(
        event: HookEvent,
        index: usize,
        config: &HookConfig,
        home: Option<&Path>,
    ) -> Result<CompiledHook, HookError> {
        let event_key = event.config_key();
        let pattern = config.matcher.trim();
        let matcher = if pattern.is_empty() || pattern == "*" {
            None
        } else {
            let anchored = format!("^(?:{pattern})$");
            match Regex::new(&anchored) {
                Ok(regex) => Some(regex),
                Err(source) => {
                    return Err(HookError::InvalidMatcher {
                        event: event_key,
                        index,
                        matcher: config.matcher.clone(),
                        source,
                    });
                }
            }
        };
        if config.command.trim().is_empty() {
            return Err(HookError::EmptyCommand { event: event_key, index });
        }
        if config.timeout_ms == 0 {
            return Err(HookError::ZeroTimeout { event: event_key, index });
        }
        let Some(command) = expand_home(&config.command, home) else {
            return Err(HookError::NoHomeDirectory {
                event: event_key,
                index,
                command: config.command.clone(),
            });
        };
        let claude = match config.format {
            HookFormat::Claude => true,
            HookFormat::Toolgate => false,
            HookFormat::Auto => matcher.as_ref().is_some_and(|regex| {
                crate::permission::claude_code_aliases()
                    .iter()
                    .any(|(alias, _)| regex.is_match(alias))
            }),
        };
        Ok(CompiledHook {
            index,
            matcher,
            matcher_text: config.matcher.clone(),
            command,
            timeout: Duration::from_millis(config.timeout_ms),
            timeout_ms: config.timeout_ms,
            on_error: config.on_error,
            claude,
        })
    }

    /// Whether the hook is for this tool: its matcher matches the tool's name or a
    /// Claude Code name that stands for the tool (the rules' alias table: `Bash` for
    /// `run_command`, `Edit` for `edit_file` and `write_file`, ...).
    fn matches(&self, tool_name: &str) -> bool {
        let Some(regex) = &self.matcher else { return true };
        regex.is_match(tool_name)
            || crate::permission::claude_code_aliases()
                .iter()
                .any(|(alias, tools)| tools.contains(&tool_name) && regex.is_match(alias))
    }
}

/// Expands a leading `~/`; `None` when one is present but no home directory is known.
/// The daemon expands it itself because hooks get an explicit environment that may not
/// carry `HOME` for the shell to expand it.
fn expand_home(command: &str, home: Option<&Path>) -> Option<String> {
    let Some(rest) = command.strip_prefix("~/") else {
        return Some(command.to_owned());
    };
    let home = home?;
    let home = home.to_str()?.trim_end_matches('/');
    Some(format!("{home}/{rest}"))
}

/// Words `/bin/sh` runs itself (keywords and built-ins): a command starting with one
/// needs no program.
const SHELL_WORDS: &[&str] = &[
    "!", "{", "}", "case", "for", "if", "until", "while", ":", ".", "[", "alias", "bg", "break",
    "cd", "command", "continue", "echo", "eval", "exec", "exit", "export", "false", "fg",
    "getopts", "hash", "jobs", "kill", "local", "printf", "pwd", "read", "readonly", "return",
    "set", "shift", "test", "times", "trap", "true", "type", "ulimit", "umask", "unalias", "unset",
    "wait",
];

/// The directories `/bin/sh` searches when the environment has no `PATH`.
const SHELL_DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why the program a hook command starts cannot run, judged as `/bin/sh` would find
/// it: the first word of the command, with a leading `~/` expanded as the runner
/// expands it ([`expand_home`]); a word with a `/` is a path, anything else a built-in
/// or a name looked up in `search_path` (the hooks' `PATH`; the shell's default when
/// `None`). `None` when the program is there and executable, or when the first word
/// is not a plain word (a variable, an assignment, a quote with expansions, a relative
/// path the session's directory decides): those are known only when the hook runs.
pub fn missing_program(
    command: &str,
    home: Option<&Path>,
    search_path: Option<&str>,
) -> Option<String> {
    let command = command.trim_start();
    let word = if let Some(quote @ ('"' | '\'')) = command.chars().next() {
        let rest = &command[1..];
        let end = rest.find(quote)?;
        let word = &rest[..end];
        let after = &rest[end + 1..];
        let ends = after.is_empty() || after.starts_with(char::is_whitespace);
        if !ends || (quote == '"' && word.contains(['$', '`', '\\'])) {
            return None;
        }
        word.to_owned()
    } else {
        let word = command.split(char::is_whitespace).next().unwrap_or_default();
        let word = match (word.strip_prefix("~/"), home) {
            (Some(rest), Some(home)) => format!("{}/{rest}", home.to_str()?.trim_end_matches('/')),
            (Some(_), None) => return None,
            (None, _) => word.to_owned(),
        };
        const SPECIAL: &[char] = &[
            '$', '`', '\\', '"', '\'', ';', '&', '|', '<', '>', '(', ')', '*', '?', '[', ']', '=',
            '#', '~',
        ];
        if word.is_empty() || (word != "[" && word.contains(SPECIAL)) {
            return None;
        }
        word
    };
    if word.contains('/') {
        if !word.starts_with('/') {
            return None;
        }
        return not_executable(Path::new(&word)).map(|why| format!("{word} {why}"));
    }
    if SHELL_WORDS.contains(&word.as_str()) {
        return None;
    }
    let search_path = search_path.unwrap_or(SHELL_DEFAULT_PATH);
    let found = search_path
        .split(':')
        .filter(|dir| dir.starts_with('/'))
        .any(|dir| not_executable(&Path::new(dir).join(&word)).is_none());
    (!found).then(|| format!("`{word}` is not a program in any directory of PATH ({search_path})"))
}

/// Why `path` is not a program the daemon's user can run; `None` when it is.
fn not_executable(path: &Path) -> Option<String> {
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Some("does not exist".to_owned()),
        Err(err) => Some(format!("cannot be read: {err}")),
        Ok(meta) if !meta.is_file() => Some("is not a file".to_owned()),
        Ok(_) => rustix::fs::access(path, rustix::fs::Access::EXEC_OK)
            .err()
            .map(|_| "is not executable by the user toolgate runs as (chmod +x it)".to_owned()),
    }
}

/// The daemon user's home directory: `$HOME`, else the password database.
fn home_dir() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("HOME").filter(|home| !home.is_empty()) {
        return Some(PathBuf::from(home));
    }
    nix::unistd::User::from_uid(nix::unistd::getuid()).ok().flatten().map(|user| user.dir)
}

/// The configured hooks of both events, compiled once and shared by every call.
///
/// Matchers follow Claude Code: the matcher is a regex tested against the tool name, and
/// `*` or an empty matcher selects every tool. Every pattern is anchored at both ends, so
/// a plain name matches exactly that tool (`write_file` never matches
/// `write_file_backup`), and alternatives or wildcards (`read_file|find_files`,
/// `mcp__.*`) still work as users expect.
#[derive(Clone, Debug, Default)]
pub struct Hooks {
    pre: Vec<CompiledHook>,
    post: Vec<CompiledHook>,
}

impl Hooks {
    pub fn new(pre: &[HookConfig], post: &[HookConfig]) -> Result<Hooks, HookError> {
        let needs_home = pre.iter().chain(post).any(|hook| hook.command.starts_with("~/"));
        let home = if needs_home { home_dir() } else { None };
        let compile = |event, configs: &[HookConfig]| {
            configs
                .iter()
                .enumerate()
                .map(|(index, config)| CompiledHook::compile(event, index, config, home.as_deref()))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Hooks {
            pre: compile(HookEvent::PreToolUse, pre)?,
            post: compile(HookEvent::PostToolUse, post)?,
        })
    }

    /// No hook configured at all: the agent layer can skip hooks entirely.
    pub fn is_empty(&self) -> bool {
        self.pre.is_empty() && self.post.is_empty()
    }

    /// Whether any PreToolUse hook matches this tool (no process is started to know).
    pub fn has_pre(&self, tool_name: &str) -> bool {
        self.pre.iter().any(|hook| hook.matches(tool_name))
    }

    /// Whether any PostToolUse hook matches this tool.
    pub fn has_post(&self, tool_name: &str) -> bool {
        self.post.iter().any(|hook| hook.matches(tool_name))
    }

    /// One sentence for each hook that would run for a call of `tool_name` (PreToolUse
    /// first, each event in configuration order), saying which hook it is and that its
    /// answer is known only when the call runs: no hook is run to find out, since a
    /// hook is a program that may do anything.
    pub fn explain(&self, tool_name: &str) -> Vec<String> {
        let describe = |event: HookEvent, hook: &CompiledHook| {
            let matcher = match hook.matcher_text.trim() {
                "" | "*" => "every tool".to_owned(),
                text => format!("matcher {text:?}"),
            };
            let what = match event {
                HookEvent::PreToolUse => {
                    "runs before the permission rules; its answer (continue, allow, ask, deny, \
                     block or new arguments) is known only when the call runs, so the call may \
                     be refused or changed where this says otherwise"
                }
                HookEvent::PostToolUse => {
                    "runs after the call; it can only add feedback to the result"
                }
            };
            format!(
                "{} hook #{} `{}` ({matcher}) {what}",
                event.config_key(),
                hook.index + 1,
                hook.command
            )
        };
        let pre = self.pre.iter().filter(|hook| hook.matches(tool_name));
        let post = self.post.iter().filter(|hook| hook.matches(tool_name));
        pre.map(|hook| describe(HookEvent::PreToolUse, hook))
            .chain(post.map(|hook| describe(HookEvent::PostToolUse, hook)))
            .collect()
    }

    /// Runs every PreToolUse hook matching `call.tool_name`, concurrently, and combines
    /// their answers: any block wins, then any deny, then ask, then allow.
    ///
    /// `env` is the complete environment of the hook processes (e.g. from
    /// `EnvPolicy::build()`); only [`HOOK_EVENT_VAR`] is added. `cancel` kills every
    /// running hook's process group when it fires.
    pub async fn run_pre(
        &self,
        call: &ToolCallInput,
        env: &[(String, String)],
        cancel: &CancellationToken,
    ) -> PreOutcome {
        let matching: Vec<&CompiledHook> =
            self.pre.iter().filter(|hook| hook.matches(&call.tool_name)).collect();
        if matching.is_empty() {
            return PreOutcome::none();
        }
        let payload =
            PreToolUseInput { hook_event_name: HookEvent::PreToolUse, call: call.clone() };
        let inputs = Inputs::new(&matching, &payload, |value| claude_payload(value, call, None));
        let runs = run_all(&matching, HookEvent::PreToolUse, &inputs, &call.cwd, env, cancel).await;
        let answers = matching
            .iter()
            .zip(runs)
            .map(|(hook, run)| pre_answer(hook, &call.tool_name, run))
            .collect::<Vec<_>>();
        combine_pre(answers)
    }

    /// Runs every PostToolUse hook matching `call.tool_name`, concurrently, with the
    /// call's `result`; their answers can only add feedback.
    pub async fn run_post(
        &self,
        call: &ToolCallInput,
        result: &ToolResult,
        env: &[(String, String)],
        cancel: &CancellationToken,
    ) -> PostOutcome {
        let matching: Vec<&CompiledHook> =
            self.post.iter().filter(|hook| hook.matches(&call.tool_name)).collect();
        if matching.is_empty() {
            return PostOutcome::none();
        }
        let payload = PostToolUseInput {
            hook_event_name: HookEvent::PostToolUse,
            call: call.clone(),
            tool_result: result.clone(),
        };
        let inputs =
            Inputs::new(&matching, &payload, |value| claude_payload(value, call, Some(result)));
        let runs =
            run_all(&matching, HookEvent::PostToolUse, &inputs, &call.cwd, env, cancel).await;
        let mut outcome = PostOutcome { hook_count: matching.len(), ..PostOutcome::none() };
        let mut feedback = Vec::new();
        for (hook, run) in matching.iter().zip(runs) {
            let answer = post_answer(hook, &call.tool_name, run);
            feedback.extend(answer.feedback);
            outcome.errors.extend(answer.error);
        }
        outcome.feedback = join_lines(feedback);
        outcome
    }
}

/// The encoded stdin of one event's hooks, in each shape some matching hook reads.
struct Inputs {
    toolgate: Option<Result<Vec<u8>, String>>,
    claude: Option<Result<Vec<u8>, String>>,
}

impl Inputs {
    fn new(
        matching: &[&CompiledHook],
        payload: &impl Serialize,
        to_claude: impl FnOnce(Value) -> Value,
    ) -> Inputs {
        let encode = |value: &Value| serde_json::to_vec(value).map_err(|err| err.to_string());
        let needs_claude = matching.iter().any(|hook| hook.claude);
        let needs_toolgate = matching.iter().any(|hook| !hook.claude);
        let value = serde_json::to_value(payload).map_err(|err| err.to_string());
        let toolgate =
            needs_toolgate.then(|| value.as_ref().map_err(Clone::clone).and_then(encode));
        let claude = needs_claude.then(|| match &value {
            Ok(value) => encode(&to_claude(value.clone())),
            Err(err) => Err(err.clone()),
        });
        Inputs { toolgate, claude }
    }

    fn for_hook(&self, hook: &CompiledHook) -> Result<&[u8], HookFailure> {
        let input = if hook.claude { &self.claude } else { &self.toolgate };
        match input {
            Some(Ok(bytes)) => Ok(bytes),
            Some(Err(err)) => Err(HookFailure::Io(format!("cannot encode the input: {err}"))),
            None => Err(HookFailure::Io("no input was prepared for this hook".to_owned())),
        }
    }
}

/// A payload in Claude Code's shape: its tool name and argument names, its mode
/// names, and (after the call) the result as `tool_response` as well.
fn claude_payload(mut value: Value, call: &ToolCallInput, result: Option<&ToolResult>) -> Value {
    if let Value::Object(map) = &mut value {
        map.insert("tool_name".to_owned(), Value::from(claude_tool_name(&call.tool_name)));
        map.insert("tool_input".to_owned(), claude_tool_input(&call.tool_name, &call.tool_input));
        if let Some(mode) = &call.permission_mode {
            map.insert("permission_mode".to_owned(), Value::from(claude_mode(mode)));
        }
        if let Some(result) = result
            && let Ok(response) = serde_json::to_value(result)
        {
            map.insert("tool_response".to_owned(), response);
        }
    }
    value
}

/// Runs the matching hooks of one event concurrently; the results are in configuration
/// order.
async fn run_all(
    matching: &[&CompiledHook],
    event: HookEvent,
    inputs: &Inputs,
    cwd: &Path,
    env: &[(String, String)],
    cancel: &CancellationToken,
) -> Vec<Result<Finished, HookFailure>> {
    futures::future::join_all(matching.iter().map(|hook| async move {
        let input = inputs.for_hook(hook)?;
        run_hook(hook, event, input, cwd, env, cancel).await
    }))
    .await
}

/// How a hook process ended, before any interpretation.
#[derive(Debug)]
struct Finished {
    code: i32,
    stdout: String,
    /// Stdout went over [`MAX_HOOK_OUTPUT_BYTES`] and was cut.
    stdout_truncated: bool,
    stderr: String,
}

/// Runs one hook process to its end (or its deadline, or cancellation) and returns its
/// exit code and output. It runs contained exactly like a command (see
/// [`crate::exec`]): everything the hook started, `setsid` and double-forked
/// children included, is killed before this returns. A hook is a synchronous check,
/// not a way to start services.
async fn run_hook(
    hook: &CompiledHook,
    event: HookEvent,
    input: &[u8],
    cwd: &Path,
    env: &[(String, String)],
    cancel: &CancellationToken,
) -> Result<Finished, HookFailure> {
    use crate::exec::{self as process, ExitStatus, Program, Spec, Stdin};

    if cancel.is_cancelled() {
        return Err(HookFailure::Canceled);
    }
    let mut spec = Spec::new(Program::Shell(hook.command.clone()), cwd);
    spec.env = env.to_vec();
    spec.env.retain(|(name, _)| name != HOOK_EVENT_VAR);
    spec.env.push((HOOK_EVENT_VAR.to_owned(), event.as_str().to_owned()));
    spec.stdin = Stdin::Bytes(input.to_vec());
    spec.timeout = Some(hook.timeout);
    spec.cancel = cancel.child_token();
    // Room for the whole cap on each stream: stdout is an answer, not a log.
    spec.output_cap = 2 * MAX_HOOK_OUTPUT_BYTES;
    let outcome = match process::run(spec).await {
        Ok(outcome) => outcome,
        Err(
            err @ (process::ProcessError::Spawn { .. }
            | process::ProcessError::StartSupervisor { .. }
            | process::ProcessError::Handshake { .. }
            | process::ProcessError::Setup(_)),
        ) => return Err(HookFailure::NotStarted(format!("{SHELL} in {}: {err}", cwd.display()))),
        Err(err) => return Err(HookFailure::Io(err.to_string())),
    };
    if outcome.canceled {
        return Err(HookFailure::Canceled);
    }
    if outcome.timed_out {
        return Err(HookFailure::TimedOut { timeout_ms: hook.timeout_ms });
    }
    if outcome.truncated() {
        tracing::debug!(command = %hook.command, "hook output truncated to {MAX_HOOK_OUTPUT_BYTES} bytes");
    }
    match outcome.status {
        Some(ExitStatus::Code(code)) => Ok(Finished {
            code,
            stdout_truncated: outcome.stdout.omitted_bytes > 0,
            stdout: outcome.stdout.text,
            stderr: outcome.stderr.text,
        }),
        Some(ExitStatus::Signal(signal)) => Err(HookFailure::Signaled(signal)),
        None => Err(HookFailure::Io("the hook's exit status could not be determined".to_owned())),
    }
}

/// The JSON a hook may print on stdout after exiting 0. Unknown fields are ignored:
/// Claude Code defines more (`suppressOutput`, `systemMessage`, ...) that mean nothing
/// here.
#[derive(Debug, Default, Deserialize)]
struct HookAnswerJson {
    #[serde(default)]
    decision: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    updated_input: Option<Value>,
    #[serde(default, rename = "continue")]
    keep_going: Option<bool>,
    #[serde(default, rename = "stopReason")]
    stop_reason: Option<String>,
    #[serde(default, rename = "hookSpecificOutput")]
    hook_specific: Option<HookSpecificJson>,
}

/// Claude Code's per-event answer block.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HookSpecificJson {
    #[serde(default)]
    permission_decision: Option<String>,
    #[serde(default)]
    permission_decision_reason: Option<String>,
    #[serde(default)]
    updated_input: Option<Value>,
    #[serde(default)]
    additional_context: Option<String>,
}

/// A decision a hook printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// `allow`, or the legacy `approve`.
    Allow,
    Ask,
    /// `deny`, or the legacy `block` (Claude Code treats both as refusing the call).
    Deny,
}

/// A hook's stdout, understood.
#[derive(Debug, Default, PartialEq)]
struct Directive {
    decision: Option<Decision>,
    reason: Option<String>,
    updated_input: Option<Value>,
    /// `continue: false`: stop, with `stopReason` if given.
    stop: Option<Option<String>>,
    additional_context: Option<String>,
}

/// Parses a hook's stdout. Output that is not a JSON object is plain log text
/// (`Ok(None)`); a JSON object that is not a valid answer is an error, and so is an
/// answer cut at the capture limit (reading it as plain text would silently drop a
/// decision the hook meant to make).
fn parse_directive(stdout: &str, truncated: bool) -> Result<Option<Directive>, String> {
    let text = stdout.trim();
    if !text.starts_with('{') {
        return Ok(None);
    }
    if truncated {
        return Err(format!("the answer is longer than {MAX_HOOK_OUTPUT_BYTES} bytes"));
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(value @ Value::Object(_)) => value,
        _ => return Ok(None),
    };
    let answer: HookAnswerJson = serde_json::from_value(value).map_err(|err| err.to_string())?;
    let specific = answer.hook_specific.unwrap_or_default();
    // Claude Code's newer hookSpecificOutput fields take precedence over the top level.
    let decision = match specific.permission_decision.as_deref().or(answer.decision.as_deref()) {
        None | Some("") => None,
        Some("allow" | "approve") => Some(Decision::Allow),
        Some("ask") => Some(Decision::Ask),
        Some("deny" | "block") => Some(Decision::Deny),
        Some(other) => return Err(format!("unknown decision {other:?}")),
    };
    let updated_input = specific.updated_input.or(answer.updated_input);
    if updated_input.as_ref().is_some_and(|input| !input.is_object()) {
        return Err("updated_input is not a JSON object".to_owned());
    }
    let reason = specific.permission_decision_reason.or(answer.reason).filter(|r| !r.is_empty());
    let stop = (answer.keep_going == Some(false)).then_some(answer.stop_reason);
    Ok(Some(Directive {
        decision,
        reason,
        updated_input,
        stop,
        additional_context: specific.additional_context.filter(|c| !c.is_empty()),
    }))
}

/// Trims and caps a reason taken from hook output, on a character boundary.
fn cap_reason(text: &str) -> String {
    let text = text.trim();
    if text.len() <= MAX_REASON_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_REASON_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [truncated]", &text[..end])
}

fn join_lines(lines: Vec<String>) -> Option<String> {
    if lines.is_empty() { None } else { Some(lines.join("\n")) }
}

/// One pre hook's contribution to the combined outcome.
#[derive(Debug)]
struct PreAnswer {
    verdict: HookVerdict,
    reason: Option<String>,
    updated_input: Option<Value>,
    error: Option<HookRunError>,
}

/// Records a failure and turns it into what `on_error` says it means.
fn failure_answer(
    hook: &CompiledHook,
    event: HookEvent,
    tool_name: &str,
    failure: HookFailure,
) -> (HookRunError, Option<String>) {
    let error = HookRunError {
        event,
        index: hook.index,
        command: hook.command.clone(),
        on_error: hook.on_error,
        failure,
    };
    tracing::warn!(
        event = %event,
        hook = hook.index,
        tool = tool_name,
        on_error = ?hook.on_error,
        error = %error.failure,
        command = %hook.command,
        "hook failed",
    );
    let reason = match hook.on_error {
        OnError::Allow => None,
        OnError::Deny => Some(cap_reason(&format!("{error} (the hook fails closed)"))),
    };
    (error, reason)
}

fn pre_answer(
    hook: &CompiledHook,
    tool_name: &str,
    run: Result<Finished, HookFailure>,
) -> PreAnswer {
    let event = HookEvent::PreToolUse;
    let fail = |failure| {
        let (error, reason) = failure_answer(hook, event, tool_name, failure);
        let verdict = match hook.on_error {
            OnError::Allow => HookVerdict::Continue,
            OnError::Deny => HookVerdict::Block,
        };
        PreAnswer { verdict, reason, updated_input: None, error: Some(error) }
    };
    let finished = match run {
        Ok(finished) => finished,
        Err(failure) => return fail(failure),
    };
    match finished.code {
        0 => {}
        2 => {
            let reason = cap_reason(&finished.stderr);
            let reason = if reason.is_empty() {
                format!("blocked by hook `{}` (exit status 2)", hook.command)
            } else {
                reason
            };
            return PreAnswer {
                verdict: HookVerdict::Block,
                reason: Some(reason),
                updated_input: None,
                error: None,
            };
        }
        code => {
            return fail(HookFailure::ExitStatus { code, stderr: cap_reason(&finished.stderr) });
        }
    }
    let directive = match parse_directive(&finished.stdout, finished.stdout_truncated) {
        Ok(Some(directive)) => directive,
        Ok(None) => {
            log_plain_stdout(hook, event, &finished.stdout);
            return PreAnswer {
                verdict: HookVerdict::Continue,
                reason: None,
                updated_input: None,
                error: None,
            };
        }
        Err(message) => return fail(HookFailure::InvalidOutput(message)),
    };
    if let Some(stop_reason) = directive.stop {
        let reason = stop_reason
            .map(|r| cap_reason(&r))
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| format!("hook `{}` asked to stop", hook.command));
        return PreAnswer {
            verdict: HookVerdict::Block,
            reason: Some(reason),
            updated_input: None,
            error: None,
        };
    }
    let reason = directive.reason.map(|r| cap_reason(&r));
    let (verdict, reason) = match directive.decision {
        None => (HookVerdict::Continue, None),
        Some(Decision::Allow) => (HookVerdict::Allow, reason),
        Some(Decision::Ask) => (HookVerdict::Ask, reason),
        Some(Decision::Deny) => (
            HookVerdict::Deny,
            Some(reason.unwrap_or_else(|| format!("denied by hook `{}`", hook.command))),
        ),
    };
    let updated_input = match directive.updated_input {
        Some(input) if hook.claude => Some(tool_input_from_claude(tool_name, &input)),
        other => other,
    };
    PreAnswer { verdict, reason, updated_input, error: None }
}

/// Combines the answers of one event's hooks (given in configuration order).
fn combine_pre(answers: Vec<PreAnswer>) -> PreOutcome {
    let verdict =
        answers.iter().map(|answer| answer.verdict).max().unwrap_or(HookVerdict::Continue);
    let mut outcome = PreOutcome { verdict, hook_count: answers.len(), ..PreOutcome::none() };
    let mut reasons = Vec::new();
    for answer in answers {
        if answer.verdict == verdict {
            reasons.extend(answer.reason);
        }
        if answer.updated_input.is_some() {
            outcome.updated_input = answer.updated_input;
        }
        outcome.errors.extend(answer.error);
    }
    outcome.reason = join_lines(reasons);
    outcome
}

/// One post hook's contribution.
struct PostAnswer {
    feedback: Option<String>,
    error: Option<HookRunError>,
}

fn post_answer(
    hook: &CompiledHook,
    tool_name: &str,
    run: Result<Finished, HookFailure>,
) -> PostAnswer {
    let event = HookEvent::PostToolUse;
    let fail = |failure| {
        let (error, feedback) = failure_answer(hook, event, tool_name, failure);
        PostAnswer { feedback, error: Some(error) }
    };
    let finished = match run {
        Ok(finished) => finished,
        Err(failure) => return fail(failure),
    };
    match finished.code {
        0 => {}
        2 => {
            let feedback = cap_reason(&finished.stderr);
            let feedback = if feedback.is_empty() {
                format!("hook `{}` flagged the result (exit status 2)", hook.command)
            } else {
                feedback
            };
            return PostAnswer { feedback: Some(feedback), error: None };
        }
        code => {
            return fail(HookFailure::ExitStatus { code, stderr: cap_reason(&finished.stderr) });
        }
    }
    let directive = match parse_directive(&finished.stdout, finished.stdout_truncated) {
        Ok(Some(directive)) => directive,
        Ok(None) => {
            log_plain_stdout(hook, event, &finished.stdout);
            return PostAnswer { feedback: None, error: None };
        }
        Err(message) => return fail(HookFailure::InvalidOutput(message)),
    };
    let mut lines = Vec::new();
    if let Some(stop_reason) = directive.stop {
        lines.push(
            stop_reason
                .map(|r| cap_reason(&r))
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| format!("hook `{}` asked to stop", hook.command)),
        );
    }
    if directive.decision == Some(Decision::Deny) {
        lines.push(
            directive
                .reason
                .map(|r| cap_reason(&r))
                .unwrap_or_else(|| format!("hook `{}` flagged the result", hook.command)),
        );
    }
    lines.extend(directive.additional_context.map(|c| cap_reason(&c)));
    PostAnswer { feedback: join_lines(lines), error: None }
}

/// Plain (non-JSON) stdout is a hook's log, not an answer.
fn log_plain_stdout(hook: &CompiledHook, event: HookEvent, stdout: &str) {
    let text = stdout.trim();
    if !text.is_empty() {
        tracing::debug!(event = %event, hook = hook.index, output = %cap_reason(text), "hook output");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(matcher: &str) -> HookConfig {
        HookConfig {
            matcher: matcher.to_owned(),
            command: "true".to_owned(),
            timeout_ms: default_hook_timeout_ms(),
            on_error: OnError::Allow,
            format: HookFormat::Auto,
        }
    }

    #[test]
    fn config_defaults_and_unknown_fields() {
        let config: HookConfig = serde_json::from_str(r#"{"command": "lint.sh"}"#).unwrap();
        assert_eq!(
            config,
            HookConfig {
                matcher: String::new(),
                command: "lint.sh".to_owned(),
                timeout_ms: 60_000,
                on_error: OnError::Allow,
                format: HookFormat::Auto,
            }
        );
        let config: HookConfig =
            serde_json::from_str(r#"{"command": "x", "on_error": "deny"}"#).unwrap();
        assert_eq!(config.on_error, OnError::Deny);
        assert!(serde_json::from_str::<HookConfig>(r#"{"command": "x", "type": "y"}"#).is_err());
    }

    #[test]
    fn matchers_are_anchored_regexes() {
        let hooks =
            Hooks::new(&[hook("read_file|find_files"), hook("write_.*")], &[hook("*"), hook("")])
                .unwrap();
        let cases = [
            ("read_file", true),
            ("find_files", true),
            ("write_file", true),
            ("read", false),
            ("xread_file", false),
            ("read_files", false),
            ("edit_file", false),
            ("rewrite_file", false),
        ];
        for (tool, expected) in cases {
            assert_eq!(hooks.has_pre(tool), expected, "{tool}");
            assert!(hooks.has_post(tool), "{tool}");
        }
        assert!(!hooks.is_empty());
        assert!(Hooks::new(&[], &[]).unwrap().is_empty());
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let err = Hooks::new(&[hook("read_file"), hook("(")], &[]).unwrap_err();
        assert!(matches!(err, HookError::InvalidMatcher { index: 1, .. }), "{err}");
        let mut empty = hook("");
        empty.command = "  ".to_owned();
        let err = Hooks::new(&[], &[empty]).unwrap_err();
        assert!(matches!(err, HookError::EmptyCommand { event: "post_tool_use", index: 0 }));
        let mut zero = hook("");
        zero.timeout_ms = 0;
        let err = Hooks::new(&[zero], &[]).unwrap_err();
        assert!(matches!(err, HookError::ZeroTimeout { index: 0, .. }));
    }

    #[test]
    fn home_expansion() {
        let home = Path::new("/home/ann/");
        assert_eq!(
            expand_home("~/bin/check.sh x", Some(home)).unwrap(),
            "/home/ann/bin/check.sh x"
        );
        assert_eq!(expand_home("echo ~/x", Some(home)).unwrap(), "echo ~/x");
        assert_eq!(expand_home("~user/x", Some(home)).unwrap(), "~user/x");
        assert_eq!(expand_home("~/x", None), None);
        assert_eq!(expand_home("plain", None).unwrap(), "plain");
    }

    #[test]
    fn the_program_of_a_command_is_found_as_the_shell_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let program = bin.join("check");
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        let mode = |mode| {
            std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
        };
        mode(0o755);
        let search = bin.to_str().unwrap();
        let missing = |command: &str| missing_program(command, Some(dir.path()), Some(search));
        assert_eq!(missing("check --all"), None);
        assert_eq!(missing("~/bin/check"), None);
        assert_eq!(missing(&format!("{} x", program.display())), None);
        assert_eq!(missing(&format!("'{}' x", program.display())), None);
        // Built-ins, and words whose meaning only the running shell knows.
        for command in ["exit 2", "[ -e x ]", "$HOOK x", "A=1 gone", "./gone", "\"$HOME/gone\""] {
            assert_eq!(missing(command), None, "{command}");
        }
        assert!(missing("gone x").unwrap().contains("`gone` is not a program"));
        assert!(missing("~/bin/gone").unwrap().ends_with("bin/gone does not exist"));
        assert!(missing("~/bin").unwrap().ends_with("bin is not a file"));
        assert_eq!(missing_program("~/bin/check", None, Some(search)), None);
        mode(0o644);
        // Root may run what any execute bit allows, and none is left.
        assert!(missing("~/bin/check").unwrap().contains("is not executable"));
        assert!(missing("check").is_some());
    }

    #[test]
    fn directives() {
        let parse = |text: &str| parse_directive(text, /*truncated*/ false);
        assert_eq!(parse("not json"), Ok(None));
        assert_eq!(parse("[1, 2]"), Ok(None));
        assert_eq!(parse("{broken"), Ok(None));
        assert_eq!(parse("{}"), Ok(Some(Directive::default())));
        assert_eq!(
            parse(r#"{"decision": "deny", "reason": "no"}"#),
            Ok(Some(Directive {
                decision: Some(Decision::Deny),
                reason: Some("no".to_owned()),
                ..Directive::default()
            }))
        );
        assert_eq!(
            parse(r#"{"decision": "approve"}"#).unwrap().unwrap().decision,
            Some(Decision::Allow)
        );
        assert_eq!(
            parse(r#"{"decision": "block"}"#).unwrap().unwrap().decision,
            Some(Decision::Deny)
        );
        assert_eq!(
            parse(
                r#"{"decision": "allow", "reason": "top",
                    "hookSpecificOutput": {"hookEventName": "PreToolUse",
                      "permissionDecision": "ask", "permissionDecisionReason": "inner",
                      "updatedInput": {"path": "b"}}}"#
            ),
            Ok(Some(Directive {
                decision: Some(Decision::Ask),
                reason: Some("inner".to_owned()),
                updated_input: Some(serde_json::json!({"path": "b"})),
                ..Directive::default()
            }))
        );
        assert_eq!(
            parse(r#"{"continue": false, "stopReason": "halt"}"#).unwrap().unwrap().stop,
            Some(Some("halt".to_owned()))
        );
        assert_eq!(parse(r#"{"continue": true}"#).unwrap().unwrap().stop, None);
        assert!(parse(r#"{"decision": "maybe"}"#).is_err());
        assert!(parse(r#"{"reason": 5}"#).is_err());
        assert!(parse(r#"{"updated_input": "x"}"#).is_err());
        assert!(parse_directive(r#"{"decision": "allow"}"#, /*truncated*/ true).is_err());
        assert_eq!(parse_directive("log line", /*truncated*/ true), Ok(None));
    }

    #[test]
    fn reasons_are_trimmed_and_capped() {
        assert_eq!(cap_reason("  why\n"), "why");
        let long = "é".repeat(MAX_REASON_BYTES);
        let capped = cap_reason(&long);
        assert!(capped.len() <= MAX_REASON_BYTES + "… [truncated]".len());
        assert!(capped.ends_with("… [truncated]"));
    }

    #[test]
    fn combine_precedence_and_last_updated_input_wins() {
        let answer = |verdict, reason: Option<&str>, input: Option<Value>| PreAnswer {
            verdict,
            reason: reason.map(str::to_owned),
            updated_input: input,
            error: None,
        };
        let outcome = combine_pre(vec![
            answer(HookVerdict::Allow, Some("fine"), Some(serde_json::json!({"a": 1}))),
            answer(HookVerdict::Ask, Some("check 1"), None),
            answer(HookVerdict::Continue, None, Some(serde_json::json!({"a": 2}))),
            answer(HookVerdict::Ask, Some("check 2"), None),
        ]);
        assert_eq!(
            outcome,
            PreOutcome {
                verdict: HookVerdict::Ask,
                reason: Some("check 1\ncheck 2".to_owned()),
                updated_input: Some(serde_json::json!({"a": 2})),
                errors: Vec::new(),
                hook_count: 4,
            }
        );
        let outcome = combine_pre(vec![
            answer(HookVerdict::Deny, Some("no"), None),
            answer(HookVerdict::Block, Some("stop"), None),
        ]);
        assert_eq!(
            (outcome.verdict, outcome.reason.as_deref()),
            (HookVerdict::Block, Some("stop"))
        );
        assert!(outcome.refuses());
    }
}
