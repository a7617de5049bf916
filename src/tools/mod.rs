//! The tool contract: what a tool declares, what a call carries, the environment a
//! call runs in, and the one structured result every outcome becomes.
//!
//! This layer is transport-free. Nothing here knows about JSON-RPC, MCP or HTTP; the
//! types that cross the wire derive `Serialize` because they *are* the wire payloads
//! (a serializable type is part of some IPC boundary), not because this layer speaks
//! a protocol.
//!
//! The model only ever sees a [`Definition`]. Everything it sends back arrives as a
//! [`Call`] and is untrusted until [`Registry::execute`] has checked it.

pub mod builtin;
pub mod confined;
pub(crate) mod duration;
pub mod fs;
pub mod jobs;
pub mod registry;
pub mod schema;
pub(crate) mod scratch;
pub(crate) mod walk;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use crate::exec::{DEFAULT_MAX_OUTPUT_BYTES, OutputSink};
use fs::access::Access;
use fs::tracker::FileTracker;
pub use registry::{RegisterError, Registry, SyncReport, ToolSource};

// The tool contract's wire types (what a tool declares, the result every outcome
// becomes) are defined in the bottom layer, which the client-only build compiles too.
pub use crate::wire::{
    Attachment, Definition, ErrorType, Facts, Metadata, OutputStream, Safety, Todo, TodoStatus,
    ToolResult, facts, json_text, metadata,
};

/// One tool call as the model produced it. `arguments` is raw text on purpose: it is
/// untrusted, and what decides whether it is valid is the registry's boundary, which
/// parses it and checks it against the tool's schema. (The session parses it once more,
/// before that, for what the policy, the events and the audit record see of it.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Shared, not copied, by the call's events, records and output.
    pub id: Arc<str>,
    /// Shared like `id`.
    pub name: Arc<str>,
    pub arguments: String,
}

impl Call {
    pub fn new(
        id: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
        arguments: impl Into<String>,
    ) -> Call {
        Call { id: id.into(), name: name.into(), arguments: arguments.into() }
    }

    /// Builds a call from already-parsed JSON arguments (transports that received a
    /// JSON object rather than a string).
    pub fn from_value(
        id: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
        arguments: &Value,
    ) -> Call {
        let arguments = match arguments {
            Value::Null => "{}".to_owned(),
            // Into one buffer of serde_json's first size, not one regrown by `Display`.
            other => serde_json::to_string(other).unwrap_or_else(|_| other.to_string()),
        };
        Call { id: id.into(), name: name.into(), arguments }
    }
}

pub use fs::FsError;

/// Whether `needle` occurs in `haystack`, ASCII letters compared without their case
/// (as `str::contains` on both uppercased).
pub(crate) fn contains_ignoring_ascii_case(haystack: &str, needle: &str) -> bool {
    needle.is_empty()
        || haystack
            .as_bytes()
            .windows(needle.len())
            .any(|window| window.eq_ignore_ascii_case(needle.as_bytes()))
}

/// Which variables of the daemon's environment a child process inherits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EnvPolicy {
    /// Inherit the daemon's environment (minus the secret-looking names below).
    pub inherit: bool,
    /// Substrings (case-insensitive) of variable names that are never inherited.
    pub exclude_patterns: Vec<String>,
    /// Variables set explicitly for every child, after filtering.
    pub set: Vec<(String, String)>,
}

impl Default for EnvPolicy {
    fn default() -> EnvPolicy {
        EnvPolicy {
            inherit: true,
            exclude_patterns: ["TOKEN", "SECRET", "KEY", "PASSWORD", "PASSWD", "CREDENTIAL"]
                .into_iter()
                .map(str::to_owned)
                .collect(),
            set: Vec::new(),
        }
    }
}

impl EnvPolicy {
    /// Whether a variable of the daemon's own environment may reach a child.
    pub fn inherits(&self, name: &str) -> bool {
        if !self.inherit {
            return false;
        }
        // Compared in place: this runs for every variable of the daemon's environment
        // at every command's start.
        !self.exclude_patterns.iter().any(|pattern| contains_ignoring_ascii_case(name, pattern))
    }

    /// The complete environment for a child process: filtered inheritance plus the
    /// explicit variables.
    pub fn build(&self) -> Vec<(String, String)> {
        let mut vars: Vec<(String, String)> = crate::sandbox::daemon_environment()
            .into_iter()
            .filter(|(name, _)| self.inherits(name))
            .collect();
        for (name, value) in &self.set {
            vars.retain(|(existing, _)| existing != name);
            vars.push((name.clone(), value.clone()));
        }
        vars
    }
}

/// Default deadline for a call when neither the session nor the tool says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest deadline anything may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// Largest file read_file will load.
pub const DEFAULT_MAX_READ_BYTES: u64 = 10 * 1024 * 1024;

/// The environment one session's calls run in. Local configuration, trusted.
///
/// Tools never read the daemon's current directory: every relative path is resolved
/// against `cwd`, and every path must stay inside `roots`.
#[derive(Clone, Debug)]
pub struct Env {
    pub session_id: String,
    /// Absolute, canonical working directory; inside one of the roots.
    pub cwd: PathBuf,
    /// Absolute, canonical directories the session may touch.
    pub roots: Vec<PathBuf>,
    /// Default deadline of a call.
    pub timeout: Duration,
    /// Upper bound for any deadline (a tool's own or one asked for in arguments).
    pub max_timeout: Duration,
    pub max_output_bytes: usize,
    pub max_read_bytes: u64,
    pub env_policy: EnvPolicy,
    /// What this session has read, for stale-write checks. Shared by every clone of
    /// the session's Env.
    pub files: Arc<FileTracker>,
    /// What no lookup may open, checked on resolved paths: toolgate's own files and
    /// the configured deny and ask rules. Shared by every session of a daemon.
    pub access: Access,
    /// The session itself, for control-plane tools (task list, leaving plan mode).
    /// Unset for an Env that no session owns (tests, one-shot calls).
    pub control: Control,
}

/// What control-plane tools may ask of the session that runs them.
#[async_trait::async_trait]
pub trait SessionControl: Send + Sync {
    /// Replaces the session's task list (and tells its clients).
    fn set_todos(&self, todos: Vec<Todo>);

    /// Asks the session's approver to leave plan mode; `Ok` once the mode changed.
    async fn request_exit_plan_mode(
        &self,
        call_id: &str,
        plan: &str,
        cancel: &CancellationToken,
    ) -> Result<(), String>;

    /// The session's background processes; `None` where the session keeps none.
    fn processes(&self) -> Option<Arc<jobs::Processes>> {
        None
    }
}

/// A weak handle on the owning session (weak: the session owns its Env).
#[derive(Clone, Default)]
pub struct Control(Option<std::sync::Weak<dyn SessionControl>>);

impl Control {
    pub fn new(session: std::sync::Weak<dyn SessionControl>) -> Control {
        Control(Some(session))
    }

    /// The session, if there is one and it is still alive.
    pub fn get(&self) -> Option<Arc<dyn SessionControl>> {
        self.0.as_ref().and_then(std::sync::Weak::upgrade)
    }
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Control(session)" } else { "Control(none)" })
    }
}

impl Env {
    /// An Env confined to one root, with that root as cwd and default limits.
    /// The root is canonicalized; fails if it does not exist.
    pub fn for_root(root: impl AsRef<Path>) -> std::io::Result<Env> {
        let root = std::fs::canonicalize(root.as_ref())?;
        Ok(Env {
            session_id: String::new(),
            cwd: root.clone(),
            roots: vec![root],
            timeout: DEFAULT_TIMEOUT,
            max_timeout: MAX_TIMEOUT,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_read_bytes: DEFAULT_MAX_READ_BYTES,
            env_policy: EnvPolicy::default(),
            files: Arc::new(FileTracker::default()),
            access: Access::default(),
            control: Control::default(),
        })
    }

    /// Fills unset values with the defaults (the registry's step 3).
    pub(crate) fn with_defaults(&self) -> Option<Env> {
        let needs_fix = self.timeout.is_zero()
            || self.max_timeout.is_zero()
            || self.max_output_bytes == 0
            || self.max_read_bytes == 0
            || self.cwd.as_os_str().is_empty();
        if !needs_fix {
            return None;
        }
        let mut env = self.clone();
        if env.max_timeout.is_zero() {
            env.max_timeout = MAX_TIMEOUT;
        }
        if env.timeout.is_zero() {
            env.timeout = DEFAULT_TIMEOUT.min(env.max_timeout);
        }
        if env.max_output_bytes == 0 {
            env.max_output_bytes = DEFAULT_MAX_OUTPUT_BYTES;
        }
        if env.max_read_bytes == 0 {
            env.max_read_bytes = DEFAULT_MAX_READ_BYTES;
        }
        if env.cwd.as_os_str().is_empty()
            && let Some(root) = env.roots.first()
        {
            env.cwd = root.clone();
        }
        Some(env)
    }
}

/// Everything a tool gets for one execution besides its (already validated) arguments.
#[derive(Clone, Debug)]
pub struct ToolContext {
    pub call_id: Arc<str>,
    /// The session's Env with defaults filled in.
    pub env: Arc<Env>,
    /// Canceled when the call is canceled *or* its deadline passes. A tool that does
    /// blocking work must check it; a tool that spawns processes must kill them.
    pub cancel: CancellationToken,
    /// The deadline the registry enforces for this call.
    pub timeout: Duration,
    pub output: OutputSink,
}

/// A tool: a Definition bound to its execution. Tools are stateless values; one
/// instance serves every session, each call bringing its own Env.
#[async_trait::async_trait]
pub trait Tool: Send + Sync + 'static {
    fn definition(&self) -> &Definition;

    /// A deadline the call itself asks for (e.g. run_command's `timeout_ms`); the
    /// registry clamps it to the Env's maximum.
    fn requested_timeout(&self, _args: &Value) -> Option<Duration> {
        None
    }

    /// Runs the tool. `args` has already been checked against `input_schema`.
    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult;
}

/// Parses a tool's arguments into its typed struct after schema validation. A
/// mismatch here means the schema and the struct disagree: reported, never a panic.
pub fn parse_args<T: serde::de::DeserializeOwned>(args: Value) -> Result<T, ToolResult> {
    serde_json::from_value(args)
        .map_err(|err| ToolResult::failure(ErrorType::InvalidArguments, err.to_string()))
}

/// Builds an input schema from a typed argument struct (schemars), as a plain
/// 2020-12 JSON Schema object.
pub fn schema_for<T: JsonSchema>() -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let schema = generator.root_schema_for::<T>();
    let mut value = serde_json::to_value(schema).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.remove("$schema");
        map.remove("title");
    }
    without_null_types(&mut value);
    value
}

/// Makes a generated schema portable to hosts with a stricter schema dialect: an
/// optional property is described without `null` (`"type": ["integer", "null"]`
/// becomes `"type": "integer"`; an `anyOf` with a `null` branch becomes its other
/// branch), at every depth. The meaning stays: the registry takes a `null` given for
/// such a property as the property left out ([`null_means_absent`]).
fn without_null_types(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let required: Vec<String> = map
                .get("required")
                .and_then(Value::as_array)
                .map(|names| names.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default();
            if let Some(Value::Object(properties)) = map.get_mut("properties") {
                for (name, property) in properties.iter_mut() {
                    if !required.contains(name) {
                        strip_null(property);
                    }
                }
            }
            for child in map.values_mut() {
                without_null_types(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(without_null_types),
        _ => {}
    }
}

fn strip_null(property: &mut Value) {
    let Value::Object(map) = property else { return };
    if let Some(Value::Array(types)) = map.get_mut("type") {
        types.retain(|kind| kind != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            map.insert("type".to_owned(), only);
        }
    }
    let is_null = |branch: &Value| branch.get("type").and_then(Value::as_str) == Some("null");
    if let Some(Value::Array(branches)) = map.get("anyOf")
        && branches.iter().any(is_null)
    {
        let rest: Vec<Value> = branches.iter().filter(|branch| !is_null(branch)).cloned().collect();
        map.remove("anyOf");
        match rest.as_slice() {
            [Value::Object(only)] => {
                for (key, value) in only {
                    map.entry(key.clone()).or_insert_with(|| value.clone());
                }
            }
            _ => {
                map.insert("anyOf".to_owned(), Value::Array(rest));
            }
        }
    }
}

/// The top-level properties of `schema` for which a `null` means "left out": optional
/// ones whose own schema does not take `null`. Models (and hosts that make every
/// property required) send `null` for what they leave out; the registry drops those
/// before validation, so a portable schema takes them as before.
pub fn null_means_absent(schema: &Value) -> Vec<String> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    properties
        .iter()
        .filter(|(name, property)| {
            !required.contains(&name.as_str()) && !takes_null(schema, property, 0)
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Whether `property` may be `null`; in doubt (no type, a reference it cannot follow),
/// yes, so that nothing a schema accepts is ever dropped.
fn takes_null(root: &Value, property: &Value, depth: usize) -> bool {
    if depth > 8 {
        return true;
    }
    if let Some(target) = property.get("$ref").and_then(Value::as_str) {
        return match target.strip_prefix('#').and_then(|pointer| root.pointer(pointer)) {
            Some(resolved) => takes_null(root, resolved, depth + 1),
            None => true,
        };
    }
    for keyword in ["anyOf", "oneOf"] {
        if let Some(branches) = property.get(keyword).and_then(Value::as_array) {
            return branches.iter().any(|branch| takes_null(root, branch, depth + 1));
        }
    }
    if let Some(values) = property.get("enum").and_then(Value::as_array) {
        return values.iter().any(Value::is_null);
    }
    if property.get("const").is_some() {
        return property.get("const").is_some_and(Value::is_null);
    }
    match property.get("type") {
        Some(Value::String(kind)) => kind == "null",
        Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "null"),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_matched_against_patterns_without_their_case() {
        let cases = [
            ("GITHUB_TOKEN", "TOKEN", true),
            ("github_token", "TOKEN", true),
            ("MyPassWord", "password", true),
            ("aws_secret_access_key", "Secret", true),
            ("TOKE", "TOKEN", false),
            ("PATH", "TOKEN", false),
            ("ÄPFEL_key", "KEY", true),
            ("clé_SECRET", "clé_secret", true),
            ("CLÉ", "clé", false),
            ("ANYTHING", "", true),
            ("", "KEY", false),
        ];
        for (name, pattern, excluded) in cases {
            let reference = name.to_ascii_uppercase().contains(&pattern.to_ascii_uppercase());
            assert_eq!(reference, excluded, "the table itself: {name} {pattern}");
            assert_eq!(contains_ignoring_ascii_case(name, pattern), excluded, "{name} {pattern}");
            let policy = EnvPolicy {
                inherit: true,
                exclude_patterns: vec![pattern.to_owned()],
                set: Vec::new(),
            };
            assert_eq!(policy.inherits(name), !excluded, "{name} {pattern}");
        }
    }
}
