//! `tools/call` requests answered from the stdio reader, not through rmcp's service
//! loop (see [`Direct`]).

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, ClientCapabilities,
    ClientJsonRpcMessage, ClientNotification, ClientRequest, GetMeta, JsonRpcMessage,
    JsonRpcNotification, JsonRpcRequest, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    RequestId, RequestMetaObject, ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler as _};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use super::{LineSender, Listing, encode_line, plain_answer_line};
use crate::mcp::server::{Answer, McpHandler, panicked};
use crate::rpc::requests::{self, Running, Started, Ticket};

/// How long answers of calls still running at end of input (or at shutdown) are
/// waited for before the calls are canceled: rmcp's own waits for the requests it
/// dispatched, so that both kinds of request end alike.
const ANSWER_GRACE_AT_EOF: Duration = Duration::from_secs(5);
const ANSWER_GRACE_AT_SHUTDOWN: Duration = Duration::from_secs(2);

/// What became of a message the reader handed to [`Direct::take`].
pub(super) enum Taken {
    /// Not for this path: rmcp's engine takes it.
    Engine(Box<ClientJsonRpcMessage>),
    /// A call answered at once: its line, to write.
    Answer(Vec<u8>),
    /// Nothing more to do here (a call goes on in its own task).
    Done,
}

/// `tools/call` requests of an initialized conversation, run by the reader itself up
/// to their first wait and answered from there, or from a task of their own when
/// they must wait (see [`Direct::start`]).
///
/// rmcp's service loop would take each request in, start its task, take its answer
/// back and start another task to send it: two wake-ups of the loop and one more task
/// per call, which is a good share of what a small call costs. The handler run here
/// is the same, with what rmcp's `Service::handle_request` checks of such a call
/// (see [`legacy_call`]), and what the loop does around a request is done here too:
/// the request's cancellation token, `notifications/cancelled` canceling it and
/// suppressing its answer, the token canceled once the answer is out, answers of
/// calls still running at end of input written first (for as long as rmcp waits for
/// its own), and calls still running after that canceled. A plain result is written
/// straight from the tool's result ([`plain_answer_line`]), the same line rmcp's
/// types would make of it.
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
    due: Running<RequestId>,
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
    /// The last `tools/list` answer, shared with rmcp's lines.
    listing: Arc<Listing>,
}

/// A request this path takes.
enum Served {
    Call(CallToolRequest),
    List(Option<PaginatedRequestParams>),
}

impl Direct {
    pub(super) fn new(handler: McpHandler, outbound: LineSender, listing: Arc<Listing>) -> Direct {
        Direct {
            handler,
            peer: OnceLock::new(),
            due: Running::default(),
            tasks: TaskTracker::new(),
            outbound: Mutex::new(Some(outbound)),
            ended: CancellationToken::new(),
            input_ended: CancellationToken::new(),
            size_hint: AtomicUsize::new(0),
            listing,
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

    /// Takes a message from the reader: a call this path serves is run up to its first
    /// wait (and answered at once when it needs none, or goes on in a task of its
    /// own); anything else is handed back for rmcp. A cancellation of a call started
    /// here cancels it (and is handed on as well: rmcp ignores ids it does not know,
    /// and the handler sees every notification as before).
    pub(super) fn take(self: &Arc<Self>, message: ClientJsonRpcMessage) -> Taken {
        match message {
            JsonRpcMessage::Request(JsonRpcRequest { id, request, .. }) => {
                let answered = match self.serves(request) {
                    Ok((Served::Call(call), peer)) => self.start(id, call, peer),
                    Ok((Served::List(params), peer)) => self.list(id, params, peer),
                    Err(request) => {
                        return Taken::Engine(Box::new(ClientJsonRpcMessage::request(request, id)));
                    }
                };
                match answered {
                    Some(line) => Taken::Answer(line),
                    None => Taken::Done,
                }
            }
            JsonRpcMessage::Notification(JsonRpcNotification {
                notification: ClientNotification::CancelledNotification(cancelled),
                ..
            }) => {
                if let Some(id) = &cancelled.params.request_id
                    && self.due.cancel(id)
                {
                    tracing::debug!(%id, reason = ?cancelled.params.reason, "cancelled");
                }
                Taken::Engine(Box::new(ClientJsonRpcMessage::notification(
                    ClientNotification::CancelledNotification(cancelled),
                )))
            }
            message => Taken::Engine(Box::new(message)),
        }
    }

    /// The request and the peer to serve it with, when `request` is a call or a
    /// listing of the tools this path takes; the request back otherwise.
    fn serves(&self, request: ClientRequest) -> Result<(Served, Peer<RoleServer>), ClientRequest> {
        let peer = match &request {
            ClientRequest::CallToolRequest(_) | ClientRequest::ListToolsRequest(_)
                if request.get_meta().protocol_version().is_none() =>
            {
                self.legacy_peer()
            }
            _ => None,
        };
        match (request, peer) {
            (ClientRequest::CallToolRequest(call), Some(peer)) => Ok((Served::Call(call), peer)),
            (ClientRequest::ListToolsRequest(list), Some(peer)) => {
                Ok((Served::List(list.params), peer))
            }
            (request, _) => Err(request),
        }
    }

    /// `tools/list`, as rmcp's `Service::handle_request` answers it for a peer before
    /// 2026-07-28, run here up to its first wait like a call: a listing is answered
    /// at once nearly always (the session is open, the tools are mapped), from the
    /// JSON of the last one when it has not changed, without the hand-offs of rmcp's
    /// loop.
    fn list(
        self: &Arc<Self>,
        id: RequestId,
        params: Option<PaginatedRequestParams>,
        peer: Peer<RoleServer>,
    ) -> Option<Vec<u8>> {
        let ctx = RequestContext::new(id.clone(), peer);
        let handler = self.handler.clone();
        let listing = Box::pin(async move { handler.list_tools(params, ctx).await });
        self.run_here(
            id,
            listing,
            |direct, id, listed| direct.listing_line(id, listed),
            "listing the tools",
        )
    }

    /// The line answering a `tools/list`, shaped for a peer before 2026-07-28 as rmcp
    /// shapes it, the listing's JSON taken from the last one when it has not changed.
    fn listing_line(
        &self,
        id: RequestId,
        result: Result<ListToolsResult, McpError>,
    ) -> Option<Vec<u8>> {
        let message = legacy_message(id, result.map(ServerResult::ListToolsResult));
        self.listing
            .encode(&message, 0)
            .map_err(|err| tracing::error!(%err, "a listing could not be serialized"))
            .ok()
    }

    /// Queues a line from a task of its own, unless the conversation has ended.
    async fn send_later(&self, line: Vec<u8>) {
        let outbound = self.outbound.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(outbound) = outbound {
            let _ = outbound.send(line).await;
        }
    }

    /// The peer, once it has initialized with a version before 2026-07-28.
    fn legacy_peer(&self) -> Option<Peer<RoleServer>> {
        let peer = self.peer.get()?;
        let info = peer.peer_info()?;
        (info.protocol_version.as_str() < ProtocolVersion::V_2026_07_28.as_str())
            .then(|| peer.clone())
    }

    /// Runs a call up to its first wait, right here on the reader's task: most calls
    /// (a small read, a denial) need none, and their answer line comes back from here
    /// with no task, wake-up or thread hand-off in between, as a server that answers
    /// line by line would have it. A call that must wait (for a process, an approval,
    /// the blocking pool) goes on in a task of its own and answers from there.
    fn start(
        self: &Arc<Self>,
        id: RequestId,
        mut call: CallToolRequest,
        peer: Peer<RoleServer>,
    ) -> Option<Vec<u8>> {
        let token = self.ended.child_token();
        let mut ctx = RequestContext::new(id.clone(), peer);
        // Canceled with the request's token: by `notifications/cancelled`, once the
        // answer is out, or when the conversation ends.
        ctx.ct = token.clone();
        // As rmcp's loop does: the `_meta` first, then what else came with the request
        // (taken out, not swapped for an empty one: nothing reads it there).
        if let Some(meta) = call.extensions.remove::<RequestMetaObject>() {
            ctx.meta = meta;
        }
        std::mem::swap(&mut ctx.extensions, &mut call.extensions);
        // Registered before the next line is read, so that a cancellation right
        // behind the call finds it.
        let ticket = self.due.insert(id.clone(), token);
        // The handler's future can run any request and is large (~10 KB): it is
        // built in place on the heap, where it stays, rather than inside a task,
        // whose future tokio moves on spawn and writes over at each change of state.
        let handler = self.handler.clone();
        let call = Box::pin(async move { legacy_call(&handler, call.params, ctx).await });
        let answer = move |direct: &Direct, id, result| direct.answer(id, ticket, result);
        self.run_here(id, call, answer, "the call")
    }

    /// Runs a request's handler (`work`) up to its first wait, right here on the
    /// reader's task ([`requests::start`]), and returns the line `answer` makes of its
    /// result. Work that is not done goes on in a task of its own, which queues the
    /// answer. A panic, on the first poll or in the task, costs the request, not the
    /// conversation: it is answered as an internal error.
    fn run_here<T, F, A>(
        self: &Arc<Self>,
        id: RequestId,
        work: Pin<Box<F>>,
        answer: A,
        what: &'static str,
    ) -> Option<Vec<u8>>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, McpError>> + Send + 'static,
        A: FnOnce(&Direct, RequestId, Result<T, McpError>) -> Option<Vec<u8>> + Send + 'static,
    {
        match requests::start(work) {
            Started::Done(result) => {
                let result = result.unwrap_or_else(|_| panicked(&id, what));
                answer(self, id, result)
            }
            Started::Waiting(rest) => {
                let direct = self.clone();
                self.tasks.spawn(async move {
                    let result = rest.await.unwrap_or_else(|_| panicked(&id, what));
                    if let Some(line) = answer(&direct, id, result) {
                        direct.send_later(line).await;
                    }
                });
                None
            }
        }
    }

    /// The line answering a finished call, `None` when the call was canceled (a
    /// canceled call is not answered) or its answer cannot be serialized. The call's
    /// token is canceled: its answer is out.
    fn answer(
        &self,
        id: RequestId,
        ticket: Ticket,
        result: Result<Answer, McpError>,
    ) -> Option<Vec<u8>> {
        let Some(token) = self.due.finish(&id, ticket) else {
            tracing::debug!(%id, "dropping the answer of a canceled call");
            return None;
        };
        token.cancel();
        match answer_line(id, result, self.size_hint.load(Ordering::Relaxed)) {
            Ok(line) => {
                self.size_hint.store(line.len(), Ordering::Relaxed);
                Some(line)
            }
            Err(err) => {
                tracing::error!(%err, "an answer could not be serialized");
                None
            }
        }
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

/// `tools/call` as rmcp's `Service::handle_request` runs it for a conversation that
/// initialized with a version before 2026-07-28 and a call that names no version of
/// its own (the only calls this path takes): no per-request metadata is required, and
/// a task may only answer a client that declared the tasks extension.
async fn legacy_call(
    handler: &McpHandler,
    params: CallToolRequestParams,
    ctx: RequestContext<RoleServer>,
) -> Result<Answer, McpError> {
    let client_declared_tasks = ctx.client_capabilities().is_some_and(|caps| caps.supports_tasks());
    let answer = handler.call_tool_answer(params, ctx).await?;
    if matches!(answer, Answer::Response(CallToolResponse::Task(_))) && !client_declared_tasks {
        return Err(McpError::missing_required_client_capability(
            ClientCapabilities::builder().enable_tasks().build(),
        ));
    }
    Ok(answer)
}

/// The line answering a call: a plain result written straight from it, anything else
/// in rmcp's types, shaped for a peer before 2026-07-28 as rmcp shapes it.
fn answer_line(
    id: RequestId,
    answer: Result<Answer, McpError>,
    size_hint: usize,
) -> std::io::Result<Vec<u8>> {
    let response = match answer {
        Ok(Answer::Plain(result)) => match plain_answer_line(&id, &result, size_hint) {
            Some(line) => return line.map_err(std::io::Error::other),
            None => Answer::Plain(result).into_response(),
        },
        Ok(Answer::Response(response)) => Ok(response),
        Err(error) => Err(error),
    };
    encode_line(&legacy_message(id, response.map(ServerResult::from)), size_hint)
}

/// The answer to request `id` as rmcp's `Service::handle_request` shapes it for a peer
/// before 2026-07-28: no `resultType`, no output schema or structured content that is
/// not an object.
fn legacy_message(id: RequestId, result: Result<ServerResult, McpError>) -> ServerJsonRpcMessage {
    match result {
        Ok(mut result) => {
            result.strip_result_type_for_legacy_peer();
            result.strip_non_object_output_for_legacy_peer();
            ServerJsonRpcMessage::response(result, id)
        }
        Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
    }
}
