//! The lifecycle events a session emits (wire types: they go to clients as they are, in
//! one enum with a `type` tag), and the answers to its permission requests.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CallDecision, Explanation, Mode, OutputStream, Todo, ToolResult};

/// Everything a client can observe about a session's calls.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// A call entered the pipeline (before hooks and permission).
    ToolCallStart {
        session_id: Arc<str>,
        call_id: Arc<str>,
        name: Arc<str>,
        // Shared with the call's other records (one parse per call).
        arguments: Arc<Value>,
    },
    /// A chunk of live output; `seq` increases by one per chunk of a call (or of a
    /// background process), from 0.
    ToolOutput {
        session_id: Arc<str>,
        call_id: Arc<str>,
        seq: u64,
        stream: OutputStream,
        text: String,
        /// The background process this output comes from (its output goes on after
        /// the call that started it has ended).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        process_id: Option<String>,
        /// With `process_id`: the byte offset of `text` in the process's output, the
        /// number to give `process_read` to read on after `offset + len(text)`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
    },
    /// The call needs a human decision; answer with `permission/respond`.
    PermissionRequest {
        session_id: Arc<str>,
        request_id: String,
        call_id: Arc<str>,
        tool: String,
        arguments: Value,
        explanation: Explanation,
        /// Rules that would allow this call without asking.
        suggestions: Vec<String>,
        /// What answering with scope `session` grants; absent when such an answer
        /// allows this call once only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_grant: Option<String>,
    },
    PermissionResolved {
        session_id: Arc<str>,
        request_id: String,
        call_id: Arc<str>,
        decision: ApprovalDecision,
        scope: ApprovalScope,
        /// Why, when the answer did not come from a person (timeout, cancel, nobody).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The final result of a call, as returned to the caller.
    ToolResult {
        session_id: Arc<str>,
        call_id: Arc<str>,
        /// Milliseconds since `tool_call_start`, hooks and approval waiting included.
        elapsed_ms: f64,
        // Shared with the caller's answer: buffering the event copies no content.
        result: Arc<ToolResult>,
    },
    /// The last event of a call, with who decided it.
    ToolCallDone {
        session_id: Arc<str>,
        call_id: Arc<str>,
        elapsed_ms: f64,
        decision: CallDecision,
    },
    TodosUpdated {
        session_id: Arc<str>,
        todos: Vec<Todo>,
    },
    /// The session's permission mode changed (e.g. after `exit_plan_mode`).
    ModeChanged {
        session_id: Arc<str>,
        mode: Mode,
    },
    /// The set of tools changed; clients should list them again.
    ToolsListChanged {},
    /// A background process ended; it and everything it started are gone.
    ProcessExited {
        session_id: Arc<str>,
        process_id: String,
        /// The call that started it.
        call_id: Arc<str>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        runtime_ms: u64,
        /// Bytes of output it wrote in all (the end offset).
        output_bytes: u64,
        /// Why toolgate ended it, when it did (`process_kill`, its session ended, ...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        killed: Option<String>,
        /// Why it could not run, when it could not.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

impl Event {
    /// The call an event belongs to, if any.
    pub fn call_id(&self) -> Option<&str> {
        match self {
            Event::ToolCallStart { call_id, .. }
            | Event::ToolOutput { call_id, .. }
            | Event::PermissionRequest { call_id, .. }
            | Event::PermissionResolved { call_id, .. }
            | Event::ToolResult { call_id, .. }
            | Event::ToolCallDone { call_id, .. } => Some(call_id),
            Event::TodosUpdated { .. }
            | Event::ModeChanged { .. }
            | Event::ToolsListChanged {}
            | Event::ProcessExited { .. } => None,
        }
    }

    /// The wire name of the event (`type`).
    pub fn kind(&self) -> &'static str {
        match self {
            Event::ToolCallStart { .. } => "tool_call_start",
            Event::ToolOutput { .. } => "tool_output",
            Event::PermissionRequest { .. } => "permission_request",
            Event::PermissionResolved { .. } => "permission_resolved",
            Event::ToolResult { .. } => "tool_result",
            Event::ToolCallDone { .. } => "tool_call_done",
            Event::TodosUpdated { .. } => "todos_updated",
            Event::ModeChanged { .. } => "mode_changed",
            Event::ToolsListChanged {} => "tools_list_changed",
            Event::ProcessExited { .. } => "process_exited",
        }
    }
}

/// A person's (or a policy's) answer to a permission request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    Allow,
    Deny,
}

/// How long an `allow` holds: this call only, or the rest of the session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalScope {
    #[default]
    Once,
    Session,
}
