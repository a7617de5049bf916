//! The native protocol's wire types: params and results of every method, named after
//! the method (`tools/call` → `ToolsCallParams` / `ToolsCallResult`).
//!
//! These types are the source of `proto/*.schema.json`; a test fails when the committed
//! schemas drift from them. Editor plugins and remote agents read `proto/`, not Rust.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[cfg(feature = "daemon")]
use crate::daemon::{SessionSpec, SessionState, Status};
// The wire types the methods' params and results are made of, for clients to name.
pub use crate::wire::{
    ApprovalDecision, ApprovalScope, Attachment, CallDecision, DecidedBy, Definition, ErrorType,
    Event, Explanation, Layer, Listener, Metadata, Mode, Outcome, OutputStream, RuleList, Safety,
    Todo, TodoStatus, ToolResult, UpstreamState, UpstreamStatus,
};

/// The largest message a peer accepts by default (a longer line is refused with an
/// error and skipped; the connection stays usable). Tool arguments are small; file
/// contents written by write_file are the largest legitimate payloads.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Method names, in one place.
pub mod method {
    pub const SESSION_OPEN: &str = "session/open";
    pub const SESSION_UPDATE: &str = "session/update";
    pub const SESSION_CLOSE: &str = "session/close";
    pub const TOOLS_LIST: &str = "tools/list";
    pub const TOOLS_CALL: &str = "tools/call";
    pub const TOOLS_CALL_BATCH: &str = "tools/call_batch";
    pub const TOOLS_CANCEL: &str = "tools/cancel";
    pub const TOOLS_EXPLAIN: &str = "tools/explain";
    pub const EVENTS_SUBSCRIBE: &str = "events/subscribe";
    pub const EVENTS_UNSUBSCRIBE: &str = "events/unsubscribe";
    pub const PERMISSION_RESPOND: &str = "permission/respond";
    pub const DAEMON_STATUS: &str = "daemon/status";
    /// Server → client notification carrying one event.
    pub const EVENTS: &str = "events";
    /// Client → server notifications that cancel a request by its JSON-RPC id.
    pub const CANCEL_REQUEST: &str = "$/cancelRequest";
    pub const NOTIFICATIONS_CANCELLED: &str = "notifications/cancelled";
}

/// `session/open`: a new session on this connection (e.g. for a sub-agent). Every
/// field narrows what the daemon's configuration grants; nothing can widen it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionOpenParams {
    /// Working directory; must be inside the roots. Default: the first root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Roots; each must be inside a configured root. Default: the configured roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<Vec<String>>,
    /// Permission mode; never more permissive than the configured mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Only these tools (system tools are always available). Intersected with the
    /// connection's own allowlist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowlist: Option<Vec<String>>,
    /// Default call deadline; capped at the configured maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_read_bytes: Option<u64>,
    /// Keep the session under this name after the connection ends, for a later
    /// connection of the same client identity to open again (the other fields then
    /// apply only when the session is first opened). A kept session waits 30 minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Re-attach to an existing session: the `resume_token` its `session/open` (or
    /// `session/update`) answer carried. A session whose connection ended while its
    /// background processes ran waits for this for `[limits] detached_session_ttl_ms`.
    /// Only the client identity that opened it can resume it; the other fields are
    /// ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
}

/// What a session is, as the daemon granted it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionInfo {
    pub session_id: String,
    pub cwd: String,
    pub roots: Vec<String>,
    pub mode: Mode,
    pub allowlist: Vec<String>,
    pub timeout_ms: u64,
    pub max_output_bytes: usize,
    pub max_read_bytes: u64,
    pub todos: Vec<Todo>,
    /// Give it to `session/open {resume_token}` to re-attach to this session from a
    /// new connection (keep it secret: it is the session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
}

pub type SessionOpenResult = SessionInfo;

/// `session/update`: narrow a session. Every field may only narrow what the session
/// has (roots inside its roots, a cwd inside them, limits at most its own, an
/// allowlist inside its allowlist; the mode within the configured one); anything
/// wider is refused with `invalid_params` and nothing changes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionUpdateParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowlist: Option<Vec<String>>,
    /// Working directory; must be inside the session's roots (relative: to the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Roots; each must be inside one of the session's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_read_bytes: Option<u64>,
}

pub type SessionUpdateResult = SessionInfo;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionCloseParams {
    pub session_id: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionCloseResult {
    pub closed: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsListParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolsListResult {
    /// Sorted by name; the session's allowlist and mode applied.
    pub tools: Vec<Definition>,
    /// Where each listed tool comes from, by name: `builtin`, `mcp:<server>` (a
    /// proxied MCP server), `skill:<path>` (a skill file or folder) or `conformance`
    /// (the MCP conformance suite's fixtures, only under that option).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, String>,
}

/// `tools/call`: one call, like MCP's. The result is the tool Result itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsCallParams {
    pub name: String,
    /// A JSON object, or a string holding the model's raw argument text.
    #[serde(default)]
    pub arguments: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The call id used in events and for `tools/cancel`; default: the request id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// `ToolsCallParams::new("read_file", json!({"path": "README.md"}))` is a call on the
/// connection's default session; [`ToolsCallParams::session`] and
/// [`ToolsCallParams::call_id`] set the rest.
impl ToolsCallParams {
    /// A call of `name` with `arguments` (a JSON object, or a string holding the
    /// model's raw argument text) on the connection's default session.
    pub fn new(name: impl Into<String>, arguments: impl Into<Value>) -> ToolsCallParams {
        ToolsCallParams { name: name.into(), arguments: arguments.into(), ..Default::default() }
    }

    /// The call runs in this session (one `session/open` answered) instead of the
    /// connection's default one.
    pub fn session(mut self, session_id: impl Into<String>) -> ToolsCallParams {
        self.session_id = Some(session_id.into());
        self
    }

    /// The call's id in events and for `tools/cancel` (default: the request id).
    pub fn call_id(mut self, call_id: impl Into<String>) -> ToolsCallParams {
        self.call_id = Some(call_id.into());
        self
    }
}

pub type ToolsCallResult = ToolResult;

/// One call of a batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchCall {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

/// `tools/call_batch`: one model turn; results come back in call order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsCallBatchParams {
    pub calls: Vec<BatchCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolsCallBatchResult {
    pub results: Vec<ToolResult>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsCancelParams {
    pub call_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolsCancelResult {
    /// How many in-flight calls were canceled (0: none with that id was running).
    pub canceled: usize,
}

/// `tools/explain`: which layer and rule would decide a call, without running it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsExplainParams {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolsExplainResult {
    /// `allow`, `ask`, `deny`, `not_allowed` or `unknown_tool`.
    pub decision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Explanation>,
    /// One explanation per layer consulted, in the order a call passes them (each hook
    /// that would run, whose answer is known only when the call runs, then the
    /// permission engine, then confinement of the call's paths, then for a command the
    /// kernel sandbox it runs in); `explanation` is the one that decided.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<Explanation>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsSubscribeParams {
    /// Default: the connection's default session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// The subscription id; every `events` notification names it.
pub type EventsSubscribeResult = String;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsUnsubscribeParams {
    pub subscription: String,
}

/// The `events` notification's params.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EventsNotification {
    pub subscription: String,
    pub result: Event,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionRespondParams {
    pub request_id: String,
    pub decision: ApprovalDecision,
    #[serde(default)]
    pub scope: ApprovalScope,
    /// Passed to the model with a deny.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PermissionRespondResult {
    /// False when no such request is pending (answered, timed out or canceled).
    pub resolved: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DaemonStatusResult {
    pub version: String,
    pub pid: u32,
    pub uptime_ms: u64,
    pub connections: usize,
    pub sessions: usize,
    pub calls_in_flight: usize,
    pub tools: usize,
    /// The configured upstream MCP servers, by name.
    #[serde(default)]
    pub upstreams: Vec<UpstreamStatus>,
    /// The kernel sandbox and process containment commands get: `landlock_abi` (0:
    /// none), `enabled`, `required`, `network`, `containment` (`cgroup` or
    /// `supervisor`), `containment_note` (why not a cgroup), `limit_controllers` (the cgroup
    /// controllers that carry `max_processes` and `max_memory_mb`), `unenforced_limits`
    /// (each configured limit this machine cannot enforce, with why), `grants` (what
    /// every command may `read` and `write` beyond its call's roots and temporary
    /// directory, as `{paths, why}` parts, and what it may `never` touch: the secret
    /// locations that exist and toolgate's own files) and a `summary` line.
    #[serde(default)]
    pub sandbox: Value,
    /// Audit records lost since the daemon started: a call finished while the audit
    /// log's queue was full (its writer could not keep up) or its writer had stopped.
    /// Calls never wait for the audit log; they are counted here instead (and logged).
    #[serde(default)]
    pub audit_records_dropped: u64,
    /// The configured workspace roots: every session's, unless it narrowed them.
    #[serde(default)]
    pub roots: Vec<String>,
    /// The configured permission mode: every session's default, and the most it may
    /// ask for.
    #[serde(default)]
    pub mode: Mode,
    /// Where the daemon accepts connections.
    #[serde(default)]
    pub listeners: Vec<Listener>,
}

/// `$/cancelRequest` and `notifications/cancelled` params (either key is accepted).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CancelRequestParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    #[serde(default, rename = "requestId", skip_serializing_if = "Option::is_none")]
    pub request_id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

// Conversions between the wire types and the daemon's own.

#[cfg(feature = "daemon")]
impl SessionOpenParams {
    pub fn spec(&self) -> SessionSpec {
        SessionSpec {
            cwd: self.cwd.clone(),
            roots: self.roots.clone(),
            mode: self.mode,
            allowlist: self.allowlist.clone(),
            timeout: self.timeout_ms.map(std::time::Duration::from_millis),
            max_output_bytes: self.max_output_bytes,
            max_read_bytes: self.max_read_bytes,
            name: self.name.clone(),
            resume_token: self.resume_token.clone(),
        }
    }
}

#[cfg(feature = "daemon")]
impl SessionUpdateParams {
    pub fn spec(&self) -> SessionSpec {
        SessionSpec {
            cwd: self.cwd.clone(),
            roots: self.roots.clone(),
            mode: self.mode,
            allowlist: self.allowlist.clone(),
            timeout: self.timeout_ms.map(std::time::Duration::from_millis),
            max_output_bytes: self.max_output_bytes,
            max_read_bytes: self.max_read_bytes,
            name: None,
            resume_token: None,
        }
    }
}

#[cfg(feature = "daemon")]
impl From<SessionState> for SessionInfo {
    fn from(state: SessionState) -> SessionInfo {
        SessionInfo {
            session_id: state.session_id,
            cwd: state.cwd.display().to_string(),
            roots: state.roots.iter().map(|root| root.display().to_string()).collect(),
            mode: state.mode,
            allowlist: state.allowlist,
            timeout_ms: u64::try_from(state.timeout.as_millis()).unwrap_or(u64::MAX),
            max_output_bytes: state.max_output_bytes,
            max_read_bytes: state.max_read_bytes,
            todos: state.todos,
            resume_token: state.resume_token,
        }
    }
}

#[cfg(feature = "daemon")]
impl From<Status> for DaemonStatusResult {
    fn from(status: Status) -> DaemonStatusResult {
        DaemonStatusResult {
            version: status.version.to_owned(),
            pid: status.pid,
            uptime_ms: u64::try_from(status.uptime.as_millis()).unwrap_or(u64::MAX),
            connections: status.connections,
            sessions: status.sessions,
            calls_in_flight: status.calls_in_flight,
            tools: status.tools,
            upstreams: status.upstreams,
            sandbox: status.sandbox,
            audit_records_dropped: status.audit_records_dropped,
            roots: status.roots.iter().map(|root| root.display().to_string()).collect(),
            mode: status.mode,
            listeners: status.listeners,
        }
    }
}
