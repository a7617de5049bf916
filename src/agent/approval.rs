//! Asking a person: the approval broker interface the transports implement.
//!
//! The agent layer owns the policy around a question (the approval timeout,
//! cancellation while waiting, what "nobody can answer" means); a broker only delivers
//! the question and the answer. The native daemon answers through
//! `permission/respond`, the MCP face through elicitation, the CLI on the terminal.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use super::events::{ApprovalDecision, ApprovalScope};
use crate::permission::Explanation;

/// What a person is asked to decide.
#[derive(Clone, Debug, PartialEq)]
pub struct PermissionRequest {
    pub session_id: String,
    /// Unique per daemon; the answer names it.
    pub request_id: String,
    pub call_id: Arc<str>,
    pub tool: String,
    pub arguments: Value,
    /// Which layer and rule made this call ask.
    pub explanation: Explanation,
    /// Rules that would allow such a call without asking.
    pub suggestions: Vec<String>,
    /// What an "allow for this session" answer grants, as shown to the person; `None`
    /// when that answer allows this call only once.
    pub session_grant: Option<String>,
    /// What is being asked: running a tool, or a control-plane request such as leaving
    /// plan mode (then `tool` names the system tool).
    pub kind: RequestKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    RunTool,
    ExitPlanMode,
}

impl PermissionRequest {
    /// The question as every face shows it to a person
    /// ([`crate::permission::display::question`]).
    pub fn question(&self) -> crate::permission::display::Question<'_> {
        crate::permission::display::Question {
            tool: &self.tool,
            arguments: &self.arguments,
            reason: &self.explanation.reason,
            suggestions: &self.suggestions,
            session_grant: self.session_grant.as_deref(),
        }
    }
}

/// A broker's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalAnswer {
    pub decision: ApprovalDecision,
    pub scope: ApprovalScope,
    /// Optional words from the person, passed on to the model on a deny.
    pub reason: Option<String>,
}

impl ApprovalAnswer {
    pub fn allow(scope: ApprovalScope) -> ApprovalAnswer {
        ApprovalAnswer { decision: ApprovalDecision::Allow, scope, reason: None }
    }

    pub fn deny(reason: impl Into<String>) -> ApprovalAnswer {
        ApprovalAnswer {
            decision: ApprovalDecision::Deny,
            scope: ApprovalScope::Once,
            reason: Some(reason.into()),
        }
    }
}

/// Why a question could not be put to anyone.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("no approver is connected")]
    NoApprover,
    #[error("{0}")]
    Other(String),
}

/// Delivers permission questions to whoever can answer them.
///
/// `begin` registers the question synchronously and returns the future of its answer,
/// so that the `permission_request` event the agent emits right after can never be
/// answered before the broker knows the request id. Dropping the future withdraws the
/// question (timeout, cancel): implementations must forget it then.
pub trait ApprovalBroker: Send + Sync {
    fn begin(
        &self,
        request: &PermissionRequest,
    ) -> Result<BoxFuture<'static, ApprovalAnswer>, Unavailable>;
}

/// A broker with nobody behind it: every question is unanswerable.
#[derive(Debug, Default)]
pub struct NoApprover;

impl ApprovalBroker for NoApprover {
    fn begin(
        &self,
        _request: &PermissionRequest,
    ) -> Result<BoxFuture<'static, ApprovalAnswer>, Unavailable> {
        Err(Unavailable::NoApprover)
    }
}
