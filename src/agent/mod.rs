//! The agent layer: one model turn of calls, between the caller and the Registry.
//!
//! ```text
//! call -> tool_call_start -> PreToolUse hooks -> permission (allow | deny | ask ->
//!      approval) -> re-check of safety, mode and allowlist -> Registry::execute ->
//!      PostToolUse hooks -> tool_result -> tool_call_done
//! ```
//!
//! Every call, whatever happens to it, ends in one `ToolResult` carrying its call id
//! and in the same closing events. This layer is transport-free: the daemon, the MCP
//! face and the CLI only call [`Session::execute_calls`] / [`Session::execute_one`].

pub mod approval;
pub mod events;
pub mod system_tools;

mod confinement;
mod session;

pub use approval::{
    ApprovalAnswer, ApprovalBroker, NoApprover, PermissionRequest, RequestKind, Unavailable,
};
pub use events::{ApprovalDecision, ApprovalScope, Event, EventSink, NullSink};
pub use session::{
    CallObserver, CallRecord, Preflight, Prepared, Question, Ready, Session, SessionOptions,
};

#[cfg(test)]
mod tests;
