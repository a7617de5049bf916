//! Skills: tools declared by files in the configured skill directories (`[skills]
//! dirs`), loaded at start-up and reloaded when those files change or on SIGHUP.
//!
//! Two kinds live side by side in a skill directory:
//!
//! - **Command tools**, one `*.toml` file each: a name, a description, an input
//!   schema, a safety and a `command` given as an argv template such as
//!   `["git", "log", "-n", "{count}", "--", "{path}"]`. Each placeholder fills exactly
//!   one argv element with the argument's value; every argument is also passed as the
//!   environment variable `TOOLGATE_ARG_<NAME>`. Arguments are never interpolated
//!   into a shell string, so no value can be read as shell syntax. The command runs in
//!   the session's cwd with the session's environment policy, in its own process
//!   group that is killed on cancel, deadline or when the call is dropped.
//! - **Instruction skills** in the Agent Skills layout: a folder holding `SKILL.md`,
//!   whose YAML front matter names and describes it. Each becomes the read-only tool
//!   `skill__<name>`, returning the Markdown instructions and the files bundled with
//!   them.
//!
//! **Arguments.** Every string property of a command tool's `input_schema` declares a
//! `kind` (numbers, booleans, arrays and objects are values of their JSON type):
//!
//! - `text`: passed as it is;
//! - `path`: resolved beneath the session roots like any tool path (symlinks
//!   followed, never leaving a root; the parent must exist when the file does not),
//!   and passed as the absolute path that was resolved;
//! - `url`: must use one of the schemes the property lists in `schemes`.
//!
//! A value starting with `-` fills a placeholder at the start of an argv element only
//! when the property says `allow_options = true` or a literal `--` element comes
//! before it, so no argument becomes an option of the command. `kind`, `schemes` and
//! `allow_options` are toolgate's and are removed from the schema tools are listed
//! with. Arguments the schema does not declare are refused (`additionalProperties`
//! defaults to false), and two properties whose `TOOLGATE_ARG_*` names would be the
//! same (`max-count`, `max_count`) make the file fail to load.
//!
//! **Trust.** A skill directory inside a workspace root belongs to whoever wrote that
//! workspace (a cloned repository, say), not to the user: its command tools run as
//! `side_effect` whatever they declare, so they ask (or are refused in plan mode),
//! until the user trusts the directory in their own configuration (`[skills] trusted`
//! in the system or user file, or a `--config` file outside every root; never a file
//! inside the workspace). Instruction skills only return text and keep `read_only`.
//!
//! A broken file is logged with its path and reason and skipped; the others load. A
//! skill never replaces a built-in, a system tool or a proxied MCP tool: names that
//! another source holds are refused by the Registry, and the `mcp__` prefix is
//! refused here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::Watcher;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::exec::{self as process, ExitStatus, Outcome, Program, Spec};
use crate::tools::{
    Definition, ErrorType, Registry, Safety, Tool, ToolContext, ToolResult, ToolSource,
};
use crate::upstream::PROXY_PREFIX;

/// Prefix of every instruction skill's tool name; command tools may not use it.
pub const INSTRUCTION_PREFIX: &str = "skill__";

/// Quiet time after a change in a skill directory before reloading: editors write a
/// file in several steps (truncate, write, rename), and one reload should see them all.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// Longest a reload waits for changes to settle: a directory that never goes quiet (a
/// log file written into it, say) still gets its skills reloaded.
const MAX_SETTLE: Duration = Duration::from_secs(2);

/// Largest command skill file; a declaration is a few hundred bytes.
const MAX_TOML_BYTES: u64 = 64 * 1024;
/// Largest `SKILL.md`; instructions are read by a model, so anything beyond this would
/// not fit a prompt usefully anyway.
const MAX_SKILL_MD_BYTES: u64 = 256 * 1024;
/// Bundled files listed per skill, and how deep the listing goes: enough for scripts,
/// references and templates, bounded against a skill folder that holds a whole tree.
const MAX_BUNDLED_FILES: usize = 500;
const MAX_BUNDLED_DEPTH: usize = 8;
/// Longest tool name a skill may declare; model APIs reject longer names.
const MAX_NAME: usize = 64;

/// A skill file that did not load, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// What one load did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Tool names registered, with the file that declares each.
    pub loaded: Vec<(String, PathBuf)>,
    pub skipped: Vec<Skipped>,
}

/// A skill directory and whether its command tools may run as they declare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkillDir {
    pub path: PathBuf,
    /// `false`: every command tool loaded from it is `side_effect`.
    pub trusted: bool,
}

impl SkillDir {
    pub fn trusted(path: impl Into<PathBuf>) -> SkillDir {
        SkillDir { path: path.into(), trusted: true }
    }

    pub fn untrusted(path: impl Into<PathBuf>) -> SkillDir {
        SkillDir { path: path.into(), trusted: false }
    }
}

/// The workspace skill directory of a root.
pub fn workspace_skill_dir(root: &Path) -> PathBuf {
    root.join(".toolgate").join("skills")
}

/// Whether `path` (as written, and as resolved when it exists) lies in one of `roots`.
fn inside_any(path: &Path, roots: &[PathBuf]) -> bool {
    let resolved = std::fs::canonicalize(path).ok();
    roots.iter().any(|root| {
        path.starts_with(root)
            || resolved.as_ref().is_some_and(|resolved| resolved.starts_with(root))
    })
}

/// The configured skill directories with their trust. A directory outside every root
/// is the user's; one inside a root is trusted only when a `[skills] trusted` entry
/// covers it and comes from the user's own configuration: the system or user file, or
/// a `--config` file that lies outside every root.
pub fn skill_dirs(config: &crate::config::Config) -> Vec<SkillDir> {
    let roots = &config.workspace.roots;
    let grants: Vec<&PathBuf> = config
        .skills
        .trusted
        .iter()
        .filter(|grant| {
            // A --config file counts only where it can be seen to lie outside the roots.
            !grant.explicit
                || (std::fs::canonicalize(&grant.source).is_ok()
                    && !inside_any(&grant.source, roots))
        })
        .map(|grant| &grant.dir)
        .collect();
    config
        .skills
        .dirs
        .iter()
        .map(|dir| {
            let trusted = !inside_any(dir, roots)
                || grants.iter().any(|grant| {
                    dir.starts_with(grant)
                        || std::fs::canonicalize(dir).is_ok_and(|dir| dir.starts_with(grant))
                });
            SkillDir { path: dir.clone(), trusted }
        })
        .collect()
}

/// The skills of the daemon: loads them into the Registry and keeps them in step with
/// the skill directories.
pub struct Skills {
    registry: Arc<Registry>,
    watch: Mutex<Option<WatchHandle>>,
}

/// A running watch: the watcher (dropping it stops the notifications) and the task
/// that reloads.
struct WatchHandle {
    task: JoinHandle<()>,
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Skills {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Skills").finish_non_exhaustive()
    }
}

impl Skills {
    pub fn new(registry: Arc<Registry>) -> Arc<Skills> {
        Arc::new(Skills { registry, watch: Mutex::new(None) })
    }

    /// Loads every skill of `dirs` and makes the Registry's skill tools exactly these
    /// (one `tools_list_changed` at most). Broken files are logged and skipped.
    pub fn load(&self, dirs: &[SkillDir]) -> LoadReport {
        let Scan { found, mut skipped } = scan(dirs);
        let mut tools: Vec<(Arc<dyn Tool>, ToolSource)> = Vec::with_capacity(found.len());
        let mut paths = BTreeMap::new();
        for (tool, path) in found {
            paths.insert(tool.definition().name.clone(), path.clone());
            tools.push((tool, ToolSource::Skill(path)));
        }
        let mut report = self.registry.sync(&ToolSource::Skill(PathBuf::new()), tools);
        for (name, err) in std::mem::take(&mut report.refused) {
            let path = paths.remove(&name).unwrap_or_default();
            let reason = format!("not registered: {err}");
            tracing::warn!(path = %path.display(), %reason, "skipping a skill");
            skipped.push(Skipped { path, reason });
        }
        if report.changed_anything() {
            tracing::info!(
                added = report.added.len(),
                changed = report.changed.len(),
                removed = report.removed.len(),
                "skills reloaded"
            );
        }
        let mut loaded: Vec<(String, PathBuf)> = paths.into_iter().collect();
        loaded.sort();
        LoadReport { loaded, skipped }
    }

    /// Loads `dirs`, then reloads whenever a file in them changes (debounced by
    /// [`DEBOUNCE`]). Replaces any earlier watch (a reload with new directories).
    /// Must be called inside a Tokio runtime.
    pub fn watch(self: &Arc<Skills>, dirs: Vec<SkillDir>) -> LoadReport {
        let report = self.load(&dirs);
        let (events, receiver) = mpsc::channel(1);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let relevant = match &event {
                Ok(event) => !matches!(event.kind, notify::EventKind::Access(_)),
                Err(_) => true,
            };
            // One pending wake-up is enough: every reload rescans everything.
            if relevant {
                let _ = events.try_send(());
            }
        });
        let mut watcher = match watcher {
            Ok(watcher) => watcher,
            Err(err) => {
                tracing::warn!(%err, "cannot watch the skill directories; reload with SIGHUP");
                self.set_watch(None);
                return report;
            }
        };
        let paths: Vec<PathBuf> = dirs.iter().map(|dir| dir.path.clone()).collect();
        let watched = watch_dirs(&mut watcher, &paths, &mut Vec::new());
        let weak = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            reload_on_change(weak, watcher, dirs, watched, receiver).await;
        });
        self.set_watch(Some(WatchHandle { task }));
        report
    }

    /// Stops watching (shutdown). The loaded tools stay registered.
    pub fn stop(&self) {
        self.set_watch(None);
    }

    fn set_watch(&self, handle: Option<WatchHandle>) {
        let previous = std::mem::replace(
            &mut *self.watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
            handle,
        );
        drop(previous);
    }
}

/// Waits for changes, lets them settle, reloads; until the Skills are gone.
async fn reload_on_change(
    skills: std::sync::Weak<Skills>,
    mut watcher: notify::RecommendedWatcher,
    dirs: Vec<SkillDir>,
    mut watched: Vec<PathBuf>,
    mut changes: mpsc::Receiver<()>,
) {
    let paths: Vec<PathBuf> = dirs.iter().map(|dir| dir.path.clone()).collect();
    while changes.recv().await.is_some() {
        // Debounce: wait until nothing has changed for a while (or for long enough).
        let settle_by = tokio::time::Instant::now() + MAX_SETTLE;
        while tokio::time::Instant::now() < settle_by {
            match tokio::time::timeout(DEBOUNCE, changes.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        let Some(skills) = skills.upgrade() else { return };
        // A skill directory created since the last look is watched from now on.
        watched = watch_dirs(&mut watcher, &paths, &mut watched);
        let report = skills.load(&dirs);
        tracing::debug!(
            loaded = report.loaded.len(),
            skipped = report.skipped.len(),
            "skill directories changed"
        );
    }
}

/// Watches every existing skill directory (recursively: instruction skills are
/// folders) and the parent of each missing one, so that its creation is noticed.
/// Returns what is watched now.
fn watch_dirs(
    watcher: &mut notify::RecommendedWatcher,
    dirs: &[PathBuf],
    already: &mut Vec<PathBuf>,
) -> Vec<PathBuf> {
    let mut watched = std::mem::take(already);
    for dir in dirs {
        let (target, mode) = if dir.is_dir() {
            (dir.clone(), notify::RecursiveMode::Recursive)
        } else {
            match dir.parent() {
                Some(parent) if parent.is_dir() => {
                    (parent.to_path_buf(), notify::RecursiveMode::NonRecursive)
                }
                _ => continue,
            }
        };
        if watched.contains(&target) {
            continue;
        }
        match watcher.watch(&target, mode) {
            Ok(()) => watched.push(target),
            Err(err) => {
                tracing::warn!(dir = %target.display(), %err, "cannot watch a skill directory")
            }
        }
    }
    watched
}

/// What a scan of the skill directories found.
struct Scan {
    /// Each tool with the file that declares it.
    found: Vec<(Arc<dyn Tool>, PathBuf)>,
    skipped: Vec<Skipped>,
}

/// Reads every skill of `dirs`, in order (directories as given, entries by name). The
/// first skill of a name wins; later ones are skipped.
fn scan(dirs: &[SkillDir]) -> Scan {
    let mut found: Vec<(Arc<dyn Tool>, PathBuf)> = Vec::new();
    let mut skipped = Vec::new();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for SkillDir { path: dir, trusted } in dirs {
        let trusted = *trusted;
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => {
                let reason = format!("cannot read the skill directory: {err}");
                tracing::warn!(path = %dir.display(), %reason, "skipping a skill directory");
                skipped.push(Skipped { path: dir.clone(), reason });
                continue;
            }
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            // Hidden files include editors' swap and backup files.
            if file_name.starts_with('.') {
                continue;
            }
            if (file_name.ends_with(".toml") || path.join("SKILL.md").is_file())
                && let Err(err) = crate::config::check_trusted_file(&if path.is_dir() {
                    path.join("SKILL.md")
                } else {
                    path.clone()
                })
            {
                tracing::warn!(path = %path.display(), %err, "skipping an untrusted skill");
                skipped.push(Skipped { path, reason: err.to_string() });
                continue;
            }
            // The file a skill comes from: named in logs, reports and `tools/list`.
            let (loaded, source) = if path.is_dir() {
                let skill_md = path.join("SKILL.md");
                if !skill_md.is_file() {
                    continue;
                }
                let loaded =
                    InstructionSkill::load(&path).map(|tool| Arc::new(tool) as Arc<dyn Tool>);
                (loaded, skill_md)
            } else if file_name.ends_with(".toml") {
                let loaded =
                    CommandSkill::load(&path, trusted).map(|tool| Arc::new(tool) as Arc<dyn Tool>);
                (loaded, path)
            } else {
                continue;
            };
            match loaded {
                Ok(tool) => {
                    let name = tool.definition().name.clone();
                    if let Some(first) = seen.get(&name) {
                        let reason = format!(
                            "the tool name {name:?} is already declared by {}",
                            first.display()
                        );
                        tracing::warn!(path = %source.display(), %reason, "skipping a skill");
                        skipped.push(Skipped { path: source, reason });
                        continue;
                    }
                    seen.insert(name, source.clone());
                    found.push((tool, source));
                }
                Err(reason) => {
                    tracing::warn!(path = %source.display(), %reason, "skipping a broken skill");
                    skipped.push(Skipped { path: source, reason });
                }
            }
        }
    }
    Scan { found, skipped }
}

/// Checks a declared tool name: a short identifier, none of the reserved prefixes.
fn check_name(name: &str, reserved: &[&str]) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(format!(
            "{name:?} is not a valid tool name: use up to {MAX_NAME} letters, digits, `_` and `-`"
        ));
    }
    if let Some(prefix) = reserved.iter().find(|prefix| name.starts_with(**prefix)) {
        return Err(format!("the prefix {prefix:?} is reserved"));
    }
    Ok(())
}

fn read_capped(path: &Path, max: u64) -> Result<String, String> {
    let metadata = std::fs::metadata(path).map_err(|err| format!("cannot read: {err}"))?;
    if metadata.len() > max {
        return Err(format!("larger than {max} bytes"));
    }
    std::fs::read_to_string(path).map_err(|err| format!("cannot read: {err}"))
}

// ---------------------------------------------------------------------------------
// Command tools
// ---------------------------------------------------------------------------------

/// A command skill file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandFile {
    name: String,
    description: String,
    /// JSON Schema of the arguments (as a TOML table). Default: no arguments.
    #[serde(default)]
    input_schema: Option<Value>,
    /// Default `side_effect`: a command is assumed to change something unless its
    /// author says otherwise.
    #[serde(default = "side_effect")]
    safety: Safety,
    #[serde(default)]
    timeout_ms: Option<u64>,
    command: Vec<String>,
}

fn side_effect() -> Safety {
    Safety::SideEffect
}

/// One piece of an argv element template.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Arg(String),
}

/// Parses one argv element: `{name}` is a placeholder, `{{` and `}}` are literal braces.
fn parse_template(element: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = element.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                            name.push(c)
                        }
                        _ => {
                            return Err(format!(
                                "{element:?}: a placeholder is `{{name}}` (write `{{{{` for a literal brace)"
                            ));
                        }
                    }
                }
                if name.is_empty() {
                    return Err(format!("{element:?}: empty placeholder `{{}}`"));
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Arg(name));
            }
            '}' => {
                return Err(format!(
                    "{element:?}: unmatched `}}` (write `}}}}` for a literal brace)"
                ));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() || pieces.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// An argument's value as one string: strings as they are, anything else as JSON.
fn render_value(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The environment variable carrying an argument: `TOOLGATE_ARG_` and the name in
/// upper case, anything but letters and digits as `_`.
pub fn arg_env_name(name: &str) -> String {
    let mut var = String::from("TOOLGATE_ARG_");
    var.extend(
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }),
    );
    var
}

/// What a property's value is, as its `kind` declares.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// A string passed as it is.
    Text,
    /// A file path, resolved beneath the session roots.
    Path,
    /// A URL with one of these (lower-case) schemes.
    Url(Vec<String>),
    /// A number, boolean, array or object (rendered as JSON).
    Value,
}

/// One declared argument.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Param {
    kind: Kind,
    /// A value may start with `-` wherever it is placed.
    allow_options: bool,
}

/// Takes toolgate's keys (`kind`, `schemes`, `allow_options`) out of one property of
/// the input schema and checks them against the property's type.
fn take_param(name: &str, property: &mut Value) -> Result<Param, String> {
    let Value::Object(map) = property else {
        return Err(format!("input_schema property {name:?} must be a table"));
    };
    let kind = map.remove("kind");
    let schemes = map.remove("schemes");
    let allow_options = match map.remove("allow_options") {
        None => false,
        Some(Value::Bool(allow)) => allow,
        Some(_) => return Err(format!("property {name:?}: allow_options must be true or false")),
    };
    let declared_type = map.get("type").and_then(Value::as_str);
    let kind = match kind.as_ref().map(|kind| kind.as_str()) {
        None => match declared_type {
            Some("integer" | "number" | "boolean" | "array" | "object") => Kind::Value,
            _ => {
                return Err(format!(
                    "property {name:?}: declare its kind: kind = \"text\", \"path\" or \"url\""
                ));
            }
        },
        Some(Some(kind)) if declared_type != Some("string") => {
            return Err(format!("property {name:?}: kind = {kind:?} needs type = \"string\""));
        }
        Some(Some("text")) => Kind::Text,
        Some(Some("path")) => Kind::Path,
        Some(Some("url")) => {
            let list = schemes.as_ref().and_then(Value::as_array).ok_or_else(|| {
                format!("property {name:?}: a url lists the schemes it allows, e.g. schemes = [\"https\"]")
            })?;
            let mut allowed = Vec::with_capacity(list.len());
            for scheme in list {
                let scheme = scheme.as_str().unwrap_or_default().to_ascii_lowercase();
                let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                    && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c));
                if !valid {
                    return Err(format!("property {name:?}: {scheme:?} is not a URL scheme"));
                }
                allowed.push(scheme);
            }
            if allowed.is_empty() {
                return Err(format!("property {name:?}: schemes must not be empty"));
            }
            Kind::Url(allowed)
        }
        Some(other) => {
            return Err(format!(
                "property {name:?}: kind must be \"text\", \"path\" or \"url\", not {other:?}",
                other = other
                    .map_or_else(|| kind.clone().unwrap_or_default().to_string(), str::to_owned)
            ));
        }
    };
    if schemes.is_some() && !matches!(kind, Kind::Url(_)) {
        return Err(format!("property {name:?}: schemes apply to kind = \"url\" only"));
    }
    Ok(Param { kind, allow_options })
}

/// Checks a URL value: `scheme://...` with an allowed scheme, and nothing a command
/// line or a URL parser could read two ways (whitespace, control characters).
fn check_url(name: &str, value: &str, schemes: &[String]) -> Result<(), String> {
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("argument {name}: a URL cannot contain spaces or control characters"));
    }
    let scheme = value.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
    match scheme {
        Some(scheme) if schemes.contains(&scheme) => Ok(()),
        _ => Err(format!(
            "argument {name}: only {} URLs are allowed",
            schemes.iter().map(|scheme| format!("{scheme}://")).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// A tool that runs a declared command with its arguments as argv elements.
pub struct CommandSkill {
    definition: Definition,
    /// The argv template; element 0 is the program and never holds a placeholder.
    /// With each element: whether a literal `--` element comes before it.
    argv: Vec<(Vec<Piece>, bool)>,
    /// Every declared argument, by name.
    params: BTreeMap<String, Param>,
    /// The folder of the declaring file: relative program paths resolve against it,
    /// and the command sees it as `TOOLGATE_SKILL_DIR`.
    dir: PathBuf,
}

impl CommandSkill {
    fn load(path: &Path, trusted: bool) -> Result<CommandSkill, String> {
        let text = read_capped(path, MAX_TOML_BYTES)?;
        let file: CommandFile = toml::from_str(&text).map_err(|err| err.to_string())?;
        check_name(&file.name, &[PROXY_PREFIX, INSTRUCTION_PREFIX])?;
        if file.description.trim().is_empty() {
            return Err("description must not be empty".to_owned());
        }
        let mut schema = match file.input_schema {
            None => json!({"type": "object", "properties": {}}),
            Some(schema) => schema,
        };
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err("input_schema must have type = \"object\"".to_owned());
        }
        let Value::Object(schema_map) = &mut schema else {
            return Err("input_schema must be a table".to_owned());
        };
        // Unknown arguments are refused unless the author says otherwise.
        schema_map.entry("additionalProperties").or_insert(Value::Bool(false));
        let mut params = BTreeMap::new();
        let mut env_names: BTreeMap<String, String> = BTreeMap::new();
        if let Some(properties) = schema_map.get_mut("properties") {
            let Value::Object(properties) = properties else {
                return Err("input_schema.properties must be a table".to_owned());
            };
            for (name, property) in properties.iter_mut() {
                let param = take_param(name, property)?;
                let var = arg_env_name(name);
                if let Some(other) = env_names.insert(var.clone(), name.clone()) {
                    return Err(format!(
                        "properties {other:?} and {name:?} would both be passed as {var}; rename one"
                    ));
                }
                params.insert(name.clone(), param);
            }
        }
        let Some(program) = file.command.first() else {
            return Err("command must name a program".to_owned());
        };
        if program.is_empty() {
            return Err("command must name a program".to_owned());
        }
        let mut argv = Vec::with_capacity(file.command.len());
        let mut after_double_dash = false;
        for (idx, element) in file.command.iter().enumerate() {
            let pieces = parse_template(element)?;
            for piece in &pieces {
                if let Piece::Arg(name) = piece {
                    if idx == 0 {
                        return Err("the program (command[0]) cannot be a placeholder".to_owned());
                    }
                    if !params.contains_key(name) {
                        return Err(format!(
                            "placeholder {{{name}}} is not a property of input_schema"
                        ));
                    }
                }
            }
            argv.push((pieces, after_double_dash));
            after_double_dash |= idx > 0 && element == "--";
        }
        if file.timeout_ms == Some(0) {
            return Err("timeout_ms must be greater than zero".to_owned());
        }
        let safety = if trusted { file.safety } else { Safety::SideEffect };
        if !trusted && file.safety != Safety::SideEffect {
            tracing::info!(
                path = %path.display(),
                "a workspace skill declares {:?} but its directory is not trusted: it runs as side_effect",
                file.safety
            );
        }
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(CommandSkill {
            definition: Definition {
                name: file.name,
                description: file.description,
                input_schema: schema,
                safety,
                system: false,
                timeout: file.timeout_ms.map(Duration::from_millis),
                facts: Default::default(),
            },
            argv,
            params,
            dir,
        })
    }

    /// Every declared argument of a call, checked and rendered as the command gets it
    /// (a path as the absolute path it resolved to). Undeclared and null ones are left
    /// out.
    fn values(
        &self,
        args: &serde_json::Map<String, Value>,
        env: &crate::tools::Env,
    ) -> Result<BTreeMap<String, String>, ToolResult> {
        let invalid = |message: String| ToolResult::failure(ErrorType::InvalidArguments, message);
        let mut values = BTreeMap::new();
        for (name, param) in &self.params {
            let value = match args.get(name) {
                None | Some(Value::Null) => continue,
                Some(value) => value,
            };
            let text = match (&param.kind, value) {
                (Kind::Path, Value::String(path)) => match crate::tools::fs::resolve(env, path) {
                    Ok(resolved) => resolved.path.display().to_string(),
                    Err(crate::tools::fs::FsError::NotFound(_)) => {
                        // A path that does not exist (yet): its directory must.
                        let parent = crate::tools::fs::resolve_parent(
                            env,
                            path,
                            crate::tools::fs::ParentDirs::MustExist,
                        )
                        .map_err(|err| {
                            ToolResult::failure(err.error_type(), format!("argument {name}: {err}"))
                        })?;
                        parent.path().display().to_string()
                    }
                    Err(err) => {
                        return Err(ToolResult::failure(
                            err.error_type(),
                            format!("argument {name}: {err}"),
                        ));
                    }
                },
                (Kind::Url(schemes), Value::String(url)) => {
                    check_url(name, url, schemes).map_err(invalid)?;
                    url.clone()
                }
                (Kind::Path | Kind::Url(_), _) => {
                    return Err(invalid(format!("argument {name} must be a string")));
                }
                (Kind::Text | Kind::Value, value) => render_value(value),
            };
            if text.contains('\0') {
                return Err(invalid(format!(
                    "argument {name} contains a NUL byte, which no command line can carry"
                )));
            }
            values.insert(name.clone(), text);
        }
        Ok(values)
    }

    /// The argv for one call. An element whose placeholder has no value (an optional
    /// argument left out, or null) is left out as a whole. A value starting with `-` at
    /// the start of an element is refused unless its property allows options or a
    /// `--` element comes before it.
    fn render(&self, values: &BTreeMap<String, String>) -> Result<Vec<String>, ToolResult> {
        let mut argv = Vec::with_capacity(self.argv.len());
        'elements: for (pieces, after_double_dash) in &self.argv {
            let mut element = String::new();
            for (position, piece) in pieces.iter().enumerate() {
                match piece {
                    Piece::Text(text) => element.push_str(text),
                    Piece::Arg(name) => {
                        let Some(value) = values.get(name) else { continue 'elements };
                        let allowed = *after_double_dash
                            || self.params.get(name).is_some_and(|param| param.allow_options);
                        if position == 0 && value.starts_with('-') && !allowed {
                            return Err(ToolResult::failure(
                                ErrorType::InvalidArguments,
                                format!(
                                    "argument {name} starts with `-`, which the command would read as an option"
                                ),
                            ));
                        }
                        element.push_str(value);
                    }
                }
            }
            argv.push(element);
        }
        Ok(argv)
    }

    fn program(&self, name: &str) -> PathBuf {
        let path = Path::new(name);
        if path.is_relative() && name.contains('/') {
            // A script shipped next to the declaration.
            self.dir.join(path)
        } else {
            path.to_path_buf()
        }
    }
}

#[async_trait::async_trait]
impl Tool for CommandSkill {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let args = match args {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let values = match self.values(&args, &ctx.env) {
            Ok(values) => values,
            Err(res) => return res,
        };
        let argv = match self.render(&values) {
            Ok(argv) => argv,
            Err(res) => return res,
        };
        let arg_env: Vec<(String, String)> =
            values.iter().map(|(name, value)| (arg_env_name(name), value.clone())).collect();
        let Some((program, rest)) = argv.split_first() else {
            return ToolResult::failure(ErrorType::InternalError, "the command is empty");
        };
        let program = Program::Exec {
            program: self.program(program).into_os_string(),
            args: rest.iter().map(Into::into).collect(),
        };
        // The same spawn path as run_command: supervised, contained and sandboxed
        // alike, with the skill's own folder readable besides.
        let mut spec = match Spec::for_call(program, ctx.env.cwd.clone(), &ctx) {
            Ok(spec) => spec,
            Err(reason) => return ToolResult::failure(ErrorType::AccessDenied, reason),
        };
        spec.env.extend(arg_env);
        spec.env.push(("TOOLGATE_SKILL_DIR".to_owned(), self.dir.display().to_string()));
        if let Some(profile) = &mut spec.sandbox {
            profile.own_read.push(self.dir.clone());
        }
        let profile = spec.sandbox.clone();
        let res = match process::run(spec).await {
            Ok(outcome) => result_for(&self.definition.name, &outcome, profile.as_ref()),
            Err(err) => ToolResult::failure(
                ErrorType::CommandFailed,
                format!("{}: cannot start the command: {err}", self.definition.name),
            ),
        };
        res.with_meta("argv", argv)
    }
}

/// A skill command's result: stdout, then stderr under a header; a non-zero exit is
/// `command_failed`; the sandbox and containment it ran under in the metadata.
fn result_for(
    tool: &str,
    outcome: &Outcome,
    profile: Option<&crate::sandbox::Profile>,
) -> ToolResult {
    let mut content = outcome.stdout.text.clone();
    if !outcome.stderr.text.is_empty() {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str("--- stderr ---\n");
        content.push_str(&outcome.stderr.text);
    }
    let res = if outcome.timed_out {
        ToolResult::failure(
            ErrorType::Timeout,
            format!("{tool} timed out; it and every process it started were killed"),
        )
    } else if outcome.canceled {
        ToolResult::failure(ErrorType::Canceled, "the call was canceled")
    } else {
        match outcome.status {
            Some(ExitStatus::Code(0)) => ToolResult::success(String::new()),
            Some(ExitStatus::Code(code)) => ToolResult::failure(
                ErrorType::CommandFailed,
                format!("{tool} exited with status {code}"),
            ),
            Some(ExitStatus::Signal(signal)) => ToolResult::failure(
                ErrorType::CommandFailed,
                format!("{tool} was killed by signal {signal}"),
            ),
            None => ToolResult::failure(
                ErrorType::IoError,
                format!("{tool}: the command's exit status could not be determined"),
            ),
        }
    };
    let res = match outcome.status {
        Some(ExitStatus::Code(code)) => res.with_meta("exit_code", code),
        _ => res,
    };
    let res = crate::tools::confined::annotate(
        res.with_content(content)
            .with_meta("truncated", outcome.truncated())
            .with_meta("containment", outcome.containment.as_str()),
        outcome,
        profile,
    );
    match &outcome.limit_hit {
        Some(limit) => res.with_meta("limit", limit.as_str()),
        None => res,
    }
}

// ---------------------------------------------------------------------------------
// Instruction skills
// ---------------------------------------------------------------------------------

/// The front matter of a `SKILL.md`; other keys (license, allowed-tools, metadata)
/// are allowed and ignored.
#[derive(Deserialize)]
struct FrontMatter {
    name: String,
    description: String,
}

/// A read-only tool returning a skill's instructions and the files bundled with them.
pub struct InstructionSkill {
    definition: Definition,
    body: String,
    /// Absolute folder of the skill.
    dir: PathBuf,
    /// Bundled files, relative to `dir`, sorted.
    files: Vec<String>,
    /// Set when the listing hit its bounds.
    files_truncated: bool,
}

impl InstructionSkill {
    fn load(dir: &Path) -> Result<InstructionSkill, String> {
        let text = read_capped(&dir.join("SKILL.md"), MAX_SKILL_MD_BYTES)?;
        let (front, body) = split_front_matter(&text)?;
        let front: FrontMatter =
            yaml_serde::from_str(front).map_err(|err| format!("front matter: {err}"))?;
        check_name(&front.name, &[])?;
        if front.description.trim().is_empty() {
            return Err("front matter: description must not be empty".to_owned());
        }
        let dir = std::fs::canonicalize(dir).map_err(|err| format!("cannot resolve: {err}"))?;
        let mut files = Vec::new();
        let files_truncated = list_files(&dir, Path::new(""), 0, &mut files);
        files.retain(|file| file != "SKILL.md");
        files.sort();
        Ok(InstructionSkill {
            definition: Definition {
                name: format!("{INSTRUCTION_PREFIX}{}", front.name),
                description: format!(
                    "{}\n\nReturns this skill's instructions; read them before doing such a task.",
                    front.description.trim()
                ),
                input_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
                safety: Safety::ReadOnly,
                system: false,
                timeout: None,
                facts: Default::default(),
            },
            body: body.trim_start_matches(['\n', '\r']).to_owned(),
            dir,
            files,
            files_truncated,
        })
    }
}

/// Splits `---\n<yaml>\n---\n<body>`.
fn split_front_matter(text: &str) -> Result<(&str, &str), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let Some(rest) = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")) else {
        return Err("SKILL.md must start with YAML front matter (a `---` line)".to_owned());
    };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Ok((&rest[..offset], &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    Err("the front matter has no closing `---` line".to_owned())
}

/// Lists the files under `dir/rel` (not following symbolic links to directories),
/// skipping hidden entries. Returns whether a bound was hit.
fn list_files(dir: &Path, rel: &Path, depth: usize, out: &mut Vec<String>) -> bool {
    let Ok(entries) = std::fs::read_dir(dir.join(rel)) else { return false };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|entry| entry.file_name());
    let mut truncated = false;
    for entry in entries {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = rel.join(&name);
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            if depth + 1 >= MAX_BUNDLED_DEPTH {
                truncated = true;
                continue;
            }
            truncated |= list_files(dir, &path, depth + 1, out);
        } else {
            if out.len() >= MAX_BUNDLED_FILES {
                return true;
            }
            out.push(path.to_string_lossy().into_owned());
        }
    }
    truncated
}

#[async_trait::async_trait]
impl Tool for InstructionSkill {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, _args: Value, ctx: ToolContext) -> ToolResult {
        let mut content = self.body.clone();
        if !self.files.is_empty() {
            if !content.ends_with('\n') {
                content.push('\n');
            }
            content.push_str(&format!(
                "\nFiles bundled with this skill (relative to {}):\n",
                self.dir.display()
            ));
            for file in &self.files {
                content.push_str("- ");
                content.push_str(file);
                content.push('\n');
            }
            if self.files_truncated {
                content.push_str("- (more files not listed)\n");
            }
        }
        // read_file can open the bundled files only when the folder is in the roots.
        let readable = ctx.env.roots.iter().any(|root| self.dir.starts_with(root));
        ToolResult::success(content)
            .with_meta("skill_dir", self.dir.display().to_string())
            .with_meta("files", self.files.clone())
            .with_meta("files_readable", readable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_placeholders_and_escapes() {
        assert_eq!(parse_template("plain").unwrap(), vec![Piece::Text("plain".to_owned())]);
        assert_eq!(parse_template("{path}").unwrap(), vec![Piece::Arg("path".to_owned())]);
        assert_eq!(
            parse_template("--n={count}!").unwrap(),
            vec![
                Piece::Text("--n=".to_owned()),
                Piece::Arg("count".to_owned()),
                Piece::Text("!".to_owned())
            ]
        );
        assert_eq!(
            parse_template("{{literal}}").unwrap(),
            vec![Piece::Text("{literal}".to_owned())]
        );
        assert_eq!(parse_template("").unwrap(), vec![Piece::Text(String::new())]);
        for bad in ["{", "{}", "{a b}", "x}", "{$(x)}"] {
            assert!(parse_template(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn front_matter_is_split_from_the_body() {
        let (front, body) = split_front_matter("---\nname: a\n---\n# Body\n").unwrap();
        assert_eq!(front, "name: a\n");
        assert_eq!(body, "# Body\n");
        assert!(split_front_matter("# no front matter").is_err());
        assert!(split_front_matter("---\nname: a\n").is_err());
    }

    #[test]
    fn argument_variables_are_upper_case_identifiers() {
        assert_eq!(arg_env_name("path"), "TOOLGATE_ARG_PATH");
        assert_eq!(arg_env_name("max-count"), "TOOLGATE_ARG_MAX_COUNT");
    }
}
