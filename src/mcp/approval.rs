//! Permission questions over MCP.
//!
//! The agent layer decides *when* a call must ask and enforces the approval timeout
//! and cancellation; this broker only knows *how* to ask the MCP client behind one
//! call:
//! - a client of the initialize era that declared the `elicitation` capability gets
//!   an `elicitation/create` form with one enum field, `decision`;
//! - a 2026-07-28 client is asked through the multi-round-trip pattern, without this
//!   broker: the handler's first round stops at the session's preflight and answers
//!   `input_required`; the retry carries the answer and resumes the call;
//! - any other client cannot be asked: the call is denied with a message naming
//!   what would allow it.
//!
//! Each in-flight call registers its [`Asker`] under its call id before it enters
//! the pipeline, and removes it when it ends.

use std::sync::Arc;

use dashmap::DashMap;
use futures::FutureExt;
use futures::future::BoxFuture;
use rmcp::RoleServer;
use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};
use rmcp::service::Peer;
use serde_json::{Value, json};

use crate::agent::{
    ApprovalAnswer, ApprovalBroker, ApprovalScope, PermissionRequest, RequestKind, Unavailable,
};

/// Why a client that cannot answer elicitations gets no question.
pub const NO_ELICITATION: &str = "the MCP client does not support elicitation; start toolgate \
                                  mcp with --mode bypass (or accept_edits for file edits) or add \
                                  an allow rule";

/// The key of the approval question in an `input_required` result.
pub const APPROVAL_INPUT_KEY: &str = "toolgate/approval";

/// The field of the elicitation form, and its three answers.
pub const DECISION_FIELD: &str = "decision";
pub const ALLOW_ONCE: &str = "allow_once";
pub const ALLOW_SESSION: &str = "allow_session";
pub const DENY: &str = "deny";

/// How the client behind one call can be asked.
#[derive(Clone)]
pub(crate) enum Asker {
    /// Send `elicitation/create` to this peer and wait for the answer.
    Elicit(Peer<RoleServer>),
    /// The client declared no way to answer.
    Unsupported,
}

/// The broker of one MCP connection (or one stateless request): it looks up how to
/// ask by the call id of the question.
#[derive(Default)]
pub(crate) struct McpBroker {
    pub(crate) askers: DashMap<Arc<str>, Asker>,
}

impl ApprovalBroker for McpBroker {
    fn begin(
        &self,
        request: &PermissionRequest,
    ) -> Result<BoxFuture<'static, ApprovalAnswer>, Unavailable> {
        let Some(asker) = self.askers.get(&*request.call_id).map(|entry| entry.value().clone())
        else {
            return Err(Unavailable::NoApprover);
        };
        match &asker {
            Asker::Elicit(peer) => {
                let peer = peer.clone();
                let params = elicitation_params(request);
                let tool = request.tool.clone();
                Ok(async move {
                    let params = match params {
                        Ok(params) => params,
                        Err(err) => {
                            return ApprovalAnswer::deny(format!(
                                "the approval question could not be built: {err}"
                            ));
                        }
                    };
                    match peer.create_elicitation(params).await {
                        Ok(result) => answer_from(&result, &tool),
                        Err(err) => ApprovalAnswer::deny(format!(
                            "the MCP client did not answer the approval request: {err}"
                        )),
                    }
                }
                .boxed())
            }
            Asker::Unsupported => Err(Unavailable::Other(NO_ELICITATION.to_owned())),
        }
    }
}

/// The human message of the question.
pub fn question_text(request: &PermissionRequest) -> String {
    match request.kind {
        RequestKind::ExitPlanMode => {
            let plan = request.arguments.get("plan").and_then(Value::as_str).unwrap_or("");
            let plan = crate::permission::display::visible_lines(plan);
            format!("toolgate: leave plan mode and carry out this plan?\n\n{plan}")
        }
        RequestKind::RunTool => crate::permission::display::question(&request.question()),
    }
}

/// The `elicitation/create` params as JSON: a flat form with a single enum field.
pub fn elicitation_json(request: &PermissionRequest) -> Value {
    json!({
        "mode": "form",
        "message": question_text(request),
        "requestedSchema": {
            "type": "object",
            "properties": {
                DECISION_FIELD: {
                    "type": "string",
                    "title": "Decision",
                    "description": "allow_once: run this call; allow_session: run it and \
                                    similar calls for the rest of the session; deny: refuse",
                    "enum": [ALLOW_ONCE, ALLOW_SESSION, DENY],
                }
            },
            "required": [DECISION_FIELD],
        },
    })
}

fn elicitation_params(
    request: &PermissionRequest,
) -> Result<ElicitRequestParams, serde_json::Error> {
    serde_json::from_value(elicitation_json(request))
}

/// Turns the client's answer into an approval answer. Anything but an explicit
/// allow is a deny.
pub(crate) fn answer_from(result: &ElicitResult, tool: &str) -> ApprovalAnswer {
    match result.action {
        ElicitationAction::Accept => {
            let decision = result
                .content
                .as_ref()
                .and_then(|content| content.get(DECISION_FIELD))
                .and_then(Value::as_str);
            match decision {
                Some(ALLOW_ONCE) => ApprovalAnswer::allow(ApprovalScope::Once),
                Some(ALLOW_SESSION) => ApprovalAnswer::allow(ApprovalScope::Session),
                _ => ApprovalAnswer::deny(format!("the user denied {tool}")),
            }
        }
        ElicitationAction::Decline | ElicitationAction::Cancel => {
            ApprovalAnswer::deny(format!("the user declined to approve {tool}"))
        }
        // A newer action this build does not know: never an allow.
        #[allow(unreachable_patterns)]
        _ => ApprovalAnswer::deny(format!("the user did not approve {tool}")),
    }
}

/// Reads an answer sent back as a multi-round-trip input response (an
/// `ElicitResult` as JSON).
pub(crate) fn answer_from_json(value: &Value, tool: &str) -> Result<ApprovalAnswer, String> {
    let result: ElicitResult = serde_json::from_value(value.clone())
        .map_err(|err| format!("the approval answer is not an elicitation result: {err}"))?;
    Ok(answer_from(&result, tool))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::ApprovalDecision;
    use crate::permission::{Explanation, Layer};

    fn request() -> PermissionRequest {
        PermissionRequest {
            session_id: "s1".into(),
            request_id: "p-s1-1".into(),
            call_id: "7".into(),
            tool: "run_command".into(),
            arguments: json!({"command": "ls"}),
            explanation: Explanation {
                layer: Layer::Mode,
                rule: None,
                list: None,
                reason: "default mode".into(),
            },
            suggestions: vec!["run_command(ls:*)".into()],
            session_grant: Some("run_command(ls:*)".into()),
            kind: RequestKind::RunTool,
        }
    }

    #[test]
    fn the_form_has_one_enum_field() {
        let form = elicitation_json(&request());
        assert_eq!(
            form["requestedSchema"]["properties"][DECISION_FIELD]["enum"],
            json!([ALLOW_ONCE, ALLOW_SESSION, DENY])
        );
        assert_eq!(form["requestedSchema"]["required"], json!([DECISION_FIELD]));
        assert!(form["message"].as_str().unwrap_or("").contains("run_command"));
        assert!(elicitation_params(&request()).is_ok());
    }

    #[test]
    fn answers_map_to_decisions() {
        let answer = |value: Value| answer_from_json(&value, "run_command");
        let allow_once = answer(json!({"action": "accept", "content": {"decision": "allow_once"}}));
        assert_eq!(allow_once, Ok(ApprovalAnswer::allow(ApprovalScope::Once)));
        let allow_session =
            answer(json!({"action": "accept", "content": {"decision": "allow_session"}}));
        assert_eq!(allow_session, Ok(ApprovalAnswer::allow(ApprovalScope::Session)));
        for denied in [
            json!({"action": "accept", "content": {"decision": "deny"}}),
            json!({"action": "accept", "content": {"decision": "whatever"}}),
            json!({"action": "accept"}),
            json!({"action": "decline"}),
            json!({"action": "cancel"}),
        ] {
            let answer = answer(denied.clone());
            assert!(
                matches!(&answer, Ok(a) if a.decision == ApprovalDecision::Deny),
                "{denied} gave {answer:?}"
            );
        }
        assert!(answer(json!({"nope": 1})).is_err());
    }

    #[tokio::test]
    async fn brokers_follow_the_asker_of_the_call() {
        let broker = McpBroker::default();
        // No asker registered: nobody can approve.
        assert_eq!(broker.begin(&request()).err(), Some(Unavailable::NoApprover));

        broker.askers.insert("7".into(), Asker::Unsupported);
        assert_eq!(
            broker.begin(&request()).err(),
            Some(Unavailable::Other(NO_ELICITATION.to_owned()))
        );
    }
}
