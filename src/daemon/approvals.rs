//! Pending permission questions of the whole daemon, answered by `permission/respond`.

use std::sync::Arc;

use dashmap::DashMap;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::events::EventHub;
use crate::agent::{ApprovalAnswer, ApprovalBroker, PermissionRequest, Unavailable};

struct Pending {
    session_id: String,
    answer: oneshot::Sender<ApprovalAnswer>,
}

/// Every question waiting for an answer, by request id.
#[derive(Default)]
pub struct ApprovalHub {
    pending: DashMap<String, Pending>,
}

/// Why an answer was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum RespondError {
    /// No such request is pending (answered, timed out, canceled, or never asked).
    NotPending,
    /// The request belongs to a session this client does not own.
    NotYours,
}

impl ApprovalHub {
    /// Answers a pending question on behalf of a client owning `may_answer` sessions.
    pub fn respond(
        &self,
        request_id: &str,
        answer: ApprovalAnswer,
        may_answer: impl Fn(&str) -> bool,
    ) -> Result<(), RespondError> {
        let Some(entry) = self.pending.get(request_id) else {
            return Err(RespondError::NotPending);
        };
        if !may_answer(&entry.session_id) {
            return Err(RespondError::NotYours);
        }
        drop(entry);
        let Some((_, pending)) = self.pending.remove(request_id) else {
            return Err(RespondError::NotPending);
        };
        pending.answer.send(answer).map_err(|_| RespondError::NotPending)
    }

    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }
}

/// The broker of one session: it can ask only while a client listens to the session's
/// events (that client sees the `permission_request` and can answer).
pub struct SessionBroker {
    pub hub: Arc<ApprovalHub>,
    pub events: Arc<EventHub>,
}

impl ApprovalBroker for SessionBroker {
    fn begin(
        &self,
        request: &PermissionRequest,
    ) -> Result<BoxFuture<'static, ApprovalAnswer>, Unavailable> {
        if !self.events.has_subscribers() {
            return Err(Unavailable::NoApprover);
        }
        let (sender, receiver) = oneshot::channel();
        self.hub.pending.insert(
            request.request_id.clone(),
            Pending { session_id: request.session_id.clone(), answer: sender },
        );
        let guard = Withdraw { hub: self.hub.clone(), request_id: request.request_id.clone() };
        Ok(Box::pin(async move {
            let _guard = guard;
            receiver.await.unwrap_or_else(|_| ApprovalAnswer::deny("the request was withdrawn"))
        }))
    }
}

/// Forgets a question when its waiter goes away (timeout, cancel, answer).
struct Withdraw {
    hub: Arc<ApprovalHub>,
    request_id: String,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.hub.pending.remove(&self.request_id);
    }
}
