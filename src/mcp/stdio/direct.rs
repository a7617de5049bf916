//! `tools/call` requests answered from the stdio reader, not through rmcp's service
//! loop (see [`Direct`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, GetExtensions, GetMeta,
    JsonRpcMessage, JsonRpcNotification, JsonRpcRequest, ProtocolVersion, RequestId,
    ServerJsonRpcMessage,
};
use rmcp::service::{Peer, RequestContext, Service};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use super::{LineSender, encode_line};
use crate::mcp::server::McpHandler;

/// How long answers of calls still running at end of input (or at shutdown) are
/// waited for before the calls are canceled: rmcp's own waits for the requests it
/// dispatched, so that both kinds of request end alike.
const ANSWER_GRACE_AT_EOF: Duration = Duration::from_secs(5);
const ANSWER_GRACE_AT_SHUTDOWN: Duration = Duration::from_secs(2);

/// `tools/call` requests of an initialized conversation, taken from the reader
/// straight to a task of their own and answered from there.
///
/// rmcp's service loop would take each request in, start its task, take its answer
/// back and start another task to send it: two wake-ups of the loop and one more task
/// per call, which is a good share of what a small call costs. The handler run here
/// is the same (`Service::handle_request`, so rmcp's own checks of a call, the tasks
/// extension's included, still apply), and what the loop does around a request is
/// done here too: the request's cancellation token, `notifications/cancelled`
/// canceling it and suppressing its answer, the token canceled once the answer is
/// out, answers of calls still running at end of input written first (for as long
/// as rmcp waits for its own), and calls still running after that canceled.
///
/// Only calls whose protocol is the conversation's initialize-era version take this
/// path: a call that names its own version in `_meta` (the 2026-07-28 inline
/// lifecycle) and everything else go through rmcp.
pub(super) struct Direct {
    handler: McpHandler,
    /// The conversation's peer, once `initialize` is done; until then every request
    /// goes to rmcp.
    peer: OnceLock<Peer<RoleServer>>,
    /// The request tokens of calls whose answer is still due, by request id.
    due: Mutex<HashMap<RequestId, CancellationToken>>,
    tasks: TaskTracker,
    /// Where answers go; taken away when the conversation ends, so that a call that
    /// outlives it cannot keep stdout open.
    outbound: Mutex<Option<LineSender>>,
    /// Canceled when the conversation ends: the parent of every request token.
    ended: CancellationToken,
    /// Canceled when the reader is done (end of input or a failed read).
    input_ended: CancellationToken,
    /// The size of the last answer, as [`LineEncoder::size_hint`].
    size_hint: AtomicUsize,
}

impl Direct {
    pub(super) fn new(handler: McpHandler, outbound: LineSender) -> Direct {
        Direct {
            handler,
            peer: OnceLock::new(),
            due: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            outbound: Mutex::new(Some(outbound)),
            ended: CancellationToken::new(),
            input_ended: CancellationToken::new(),
            size_hint: AtomicUsize::new(0),
        }
    }

    /// Held by the reader while it reads: dropped at end of input (or a failed read),
    /// which starts the wind-down.
    pub(super) fn reading(&self) -> DropGuard {
        self.input_ended.clone().drop_guard()
    }

    pub(super) fn open(&self, peer: Peer<RoleServer>) {
        let _ = self.peer.set(peer);
    }

    /// Takes a message from the reader: a call this path serves is started (and
    /// `None` returned); anything else is handed back for rmcp. A cancellation of a
    /// call started here cancels it (and is handed on as well: rmcp ignores ids it
    /// does not know, and the handler sees every notification as before).
    pub(super) fn take(
        self: &Arc<Self>,
        message: ClientJsonRpcMessage,
    ) -> Option<ClientJsonRpcMessage> {
        match message {
            JsonRpcMessage::Request(JsonRpcRequest { id, request, .. }) => {
                match self.serves(&request) {
                    Some(peer) => {
                        self.start(id, request, peer);
                        None
                    }
                    None => Some(ClientJsonRpcMessage::request(request, id)),
                }
            }
            JsonRpcMessage::Notification(JsonRpcNotification {
                notification: ClientNotification::CancelledNotification(cancelled),
                ..
            }) => {
                if let Some(id) = &cancelled.params.request_id
                    && let Some(token) = self.due().remove(id)
                {
                    tracing::debug!(%id, reason = ?cancelled.params.reason, "cancelled");
                    token.cancel();
                }
                Some(ClientJsonRpcMessage::notification(ClientNotification::CancelledNotification(
                    cancelled,
                )))
            }
            message => Some(message),
        }
    }

    /// The peer to serve `request` with, when it is a call this path takes.
    fn serves(&self, request: &ClientRequest) -> Option<Peer<RoleServer>> {
        if !matches!(request, ClientRequest::CallToolRequest(_))
            || request.get_meta().protocol_version().is_some()
        {
            return None;
        }
        let peer = self.peer.get()?;
        let info = peer.peer_info()?;
        (info.protocol_version.as_str() < ProtocolVersion::V_2026_07_28.as_str())
            .then(|| peer.clone())
    }

    fn start(self: &Arc<Self>, id: RequestId, mut request: ClientRequest, peer: Peer<RoleServer>) {
        let token = self.ended.child_token();
        let mut ctx = RequestContext::new(id.clone(), peer);
        ctx.ct = token.child_token();
        std::mem::swap(&mut ctx.meta, request.get_meta_mut());
        std::mem::swap(&mut ctx.extensions, request.extensions_mut());
        // Registered before the next line is read, so that a cancellation right
        // behind the call finds it.
        self.due().insert(id.clone(), token);
        // The handler's future can run any request and is large (~10 KB): it is
        // built in place on the heap, where it stays, rather than inside the task,
        // whose future tokio moves on spawn and writes over at each change of state.
        let handler = self.handler.clone();
        let call = Box::pin(async move { handler.handle_request(request, ctx).await });
        let direct = self.clone();
        self.tasks.spawn(async move {
            let result = call.await;
            // A canceled call is not answered.
            let Some(token) = direct.due().remove(&id) else {
                tracing::debug!(%id, "dropping the answer of a canceled call");
                return;
            };
            token.cancel();
            let answer = match result {
                Ok(result) => ServerJsonRpcMessage::response(result, id),
                Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
            };
            let line = match encode_line(&answer, direct.size_hint.load(Ordering::Relaxed)) {
                Ok(line) => {
                    direct.size_hint.store(line.len(), Ordering::Relaxed);
                    line
                }
                Err(err) => {
                    tracing::error!(%err, "an answer could not be serialized");
                    return;
                }
            };
            let outbound = direct.outbound.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some(outbound) = outbound {
                let _ = outbound.send(line).await;
            }
        });
    }

    fn due(&self) -> std::sync::MutexGuard<'_, HashMap<RequestId, CancellationToken>> {
        self.due.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Once the input has ended (or the conversation is stopped, or rmcp's loop has
    /// ended), waits a bounded time for the answers of calls still running, as rmcp
    /// does for its own.
    pub(super) async fn wind_down(&self, shutdown: &CancellationToken, served: &CancellationToken) {
        let grace = tokio::select! {
            () = self.input_ended.cancelled() => ANSWER_GRACE_AT_EOF,
            () = served.cancelled() => ANSWER_GRACE_AT_EOF,
            () = shutdown.cancelled() => ANSWER_GRACE_AT_SHUTDOWN,
        };
        self.tasks.close();
        let _ = tokio::time::timeout(grace, self.tasks.wait()).await;
    }

    /// Ends the conversation for this path: calls still running are canceled and
    /// can no longer answer.
    pub(super) fn close(&self) {
        self.ended.cancel();
        self.outbound.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}
