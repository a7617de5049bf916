//! The dispatch core: one client connection speaking the native JSON-RPC protocol,
//! whatever carries its frames (NDJSON on a Unix socket or stdio, WebSocket messages,
//! HTTP bodies). Every transport feeds frames in and drains `outbound`; the methods
//! behave the same everywhere.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::jsonrpc::{self, Incoming, Params, RpcError};
use super::requests::{self, Panicked, Running, Started};
use crate::agent::{ApprovalAnswer, Event};
use crate::daemon::events::Subscriber;
use crate::daemon::{Client, Daemon, SessionError};
use crate::protocol::*;
use crate::tools::Call;
use crate::tools::registry::Listing;

/// Requests of one connection handled at the same time; past this the connection
/// stops reading until one finishes (backpressure instead of memory growth).
pub const MAX_REQUESTS_IN_FLIGHT: usize = 256;
/// Lines queued for the writer of a connection fed through a plain channel (responses
/// wait for room; events are dropped and counted when a client does not read).
pub const OUTBOUND_CAPACITY: usize = 4096;
/// Bytes of lines queued for the writer of one connection (see [`outbound_queue`]):
/// past them, responses wait for room and events are dropped and counted, so a client
/// that stops reading costs at most this much, however fast its calls produce output.
pub const OUTBOUND_BYTES: usize = 4 * 1024 * 1024;
/// What a queued line costs beyond its bytes (its slot in the queue), so that many
/// short lines are bounded too.
const LINE_OVERHEAD: usize = 64;
/// Calls in one `tools/call_batch`.
pub const MAX_BATCH_CALLS: usize = 256;

/// One connected client: its framing state around the daemon's [`Client`].
pub struct Connection {
    daemon: Arc<Daemon>,
    client: Client,
    outbound: Outbound,
    /// Running requests by JSON-RPC id, for `$/cancelRequest`.
    requests: Running<Arc<str>>,
    limiter: Arc<Semaphore>,
    /// Canceled when the connection goes away: every request of it stops.
    closed: CancellationToken,
    /// Pipelined calls handed to tasks whose first poll has not run yet.
    first_polls: TaskTracker,
}

/// The largest pipelined `tools/call` line handed to a task of its own: the calls
/// worth spreading over the cores are small; a large one is answered on the
/// connection's task, where its memory is given back when it is done.
const HAND_OFF_BYTES: usize = 64 * 1024;

impl Connection {
    /// A connection with its default session. `outbound` carries every line the
    /// client must receive (responses and notifications), in order.
    pub fn open(
        daemon: &Arc<Daemon>,
        identity: impl Into<String>,
        outbound: impl Into<Outbound>,
    ) -> Result<Arc<Connection>, SessionError> {
        let client = Client::open(daemon, identity)?;
        Ok(Arc::new(Connection {
            daemon: daemon.clone(),
            client,
            outbound: outbound.into(),
            requests: Running::default(),
            limiter: Arc::new(Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
            closed: daemon.shutdown_token().child_token(),
            first_polls: TaskTracker::new(),
        }))
    }

    pub fn id(&self) -> u64 {
        self.client.id()
    }

    pub fn identity(&self) -> &str {
        self.client.identity()
    }

    pub fn default_session_id(&self) -> &str {
        self.client.default_session().map_or("", |entry| entry.session.id())
    }

    /// Ends the connection: its requests are canceled, its sessions closed.
    pub fn close(&self) {
        self.closed.cancel();
        self.client.close();
    }

    /// At the end of the input, before [`Connection::close`]: waits until every call
    /// handed to a task has run up to its first wait, so that a pipelined call that
    /// needs none is answered, as it would be on the connection's own task, and only
    /// calls that wait are canceled with the connection.
    pub async fn settle_hand_offs(&self) {
        self.first_polls.close();
        self.first_polls.wait().await;
    }

    /// Whether a request could start now without waiting for one in flight to end.
    pub fn has_capacity(&self) -> bool {
        self.limiter.available_permits() > 0
    }

    /// Returns once a request could start (see [`Connection::has_capacity`]).
    pub async fn capacity(&self) {
        let _ = self.limiter.acquire().await;
    }

    /// Handles one incoming frame. Returns once the frame is parsed and its requests are
    /// under way (long calls continue in their own tasks); answers go to `outbound`.
    pub async fn handle_frame(self: &Arc<Self>, text: &str) {
        if let Some(answer) = self.handle_line(text).await {
            self.send(answer).await;
        }
    }

    /// Handles one incoming frame and returns the answer when it is ready at once.
    ///
    /// A request is run right here, on the caller's task, up to its first wait: most
    /// calls (a small read, a listing, a denial) complete without one, and their
    /// response comes back from this method, with no task, queue or thread hand-off
    /// in between. A request that must wait (for a process, an approval, the
    /// blocking pool) continues in a task of its own and answers through `outbound`,
    /// as do batches. Events always go through `outbound`.
    pub async fn handle_line(self: &Arc<Self>, text: &str) -> Option<String> {
        self.handle_line_with(text, false).await
    }

    /// [`Connection::handle_line`] for a line read while more wait behind it (the
    /// client pipelines): a small `tools/call` goes to a task of its own at once, so
    /// that pipelined calls run on every core while this task reads on. Other methods
    /// keep their order (a client may pipeline `events/unsubscribe` behind anything).
    pub async fn handle_pipelined_line(self: &Arc<Self>, text: &str) -> Option<String> {
        self.handle_line_with(text, text.len() <= HAND_OFF_BYTES).await
    }

    async fn handle_line_with(self: &Arc<Self>, text: &str, hand_off: bool) -> Option<String> {
        let trimmed = text.trim_start();
        if trimmed.is_empty() {
            return None;
        }
        if trimmed.starts_with('[') {
            self.handle_batch(trimmed).await;
            return None;
        }
        match jsonrpc::parse(trimmed) {
            Err(malformed) => Some(jsonrpc::error_response(&malformed.id, &malformed.error)),
            Ok(Incoming::Response) => None,
            Ok(Incoming::Notification { method, params }) => {
                self.notification(&method, params);
                None
            }
            Ok(Incoming::Request { id, method, params }) => {
                // At the limit, the connection waits here (and stops reading).
                let permit = self.limiter.clone().acquire_owned().await.ok()?;
                if hand_off && method == method::TOOLS_CALL {
                    // The request's future lives in the task itself, with no box of its
                    // own: one allocation, made here and freed on whichever core ran
                    // the call. Its first poll is counted until it has run (see
                    // `Connection::settle_hand_offs`).
                    let mut first_poll = Some(self.first_polls.token());
                    let this = self.clone();
                    self.daemon.tasks().spawn(async move {
                        let request = requests::caught(this.run_request(&id, &method, params));
                        let mut request = std::pin::pin!(request);
                        let answer = std::future::poll_fn(|context| {
                            let polled = request.as_mut().poll(context);
                            first_poll.take();
                            polled
                        })
                        .await;
                        drop(permit);
                        if let Some(answer) = answered(answer, &id, &method) {
                            this.send(answer).await;
                        }
                    });
                    return None;
                }
                // Kept for the answer to a request that panics (its own copy goes
                // with its future); for the usual numeric id, a copy of a number.
                let answer_to = (id.clone(), method.clone());
                let this = self.clone();
                let request = Box::pin(async move {
                    let answer = this.run_request(&id, &method, params).await;
                    drop(permit);
                    answer
                });
                match requests::start(request) {
                    Started::Done(answer) => answered(answer, &answer_to.0, &answer_to.1),
                    Started::Waiting(rest) => {
                        let this = self.clone();
                        self.daemon.tasks().spawn(async move {
                            let (id, method) = answer_to;
                            if let Some(answer) = answered(rest.await, &id, &method) {
                                this.send(answer).await;
                            }
                        });
                        None
                    }
                }
            }
        }
    }

    /// Runs one request with its own cancel token (registered for `$/cancelRequest`)
    /// and renders its response line (`None` when the method answered by itself).
    async fn run_request(&self, id: &Value, method: &str, params: Params) -> Option<String> {
        let cancel = self.closed.child_token();
        let registered = self.requests.register(jsonrpc::id_key(id), &cancel);
        let reply = self.request(method, params, id, &cancel).await;
        drop(registered);
        match reply {
            Ok(Reply::Line(line)) => Some(line),
            Ok(Reply::Sent) => None,
            Err(error) => Some(jsonrpc::error_response(id, &error)),
        }
    }

    /// A JSON-RPC batch: every element handled, one array of responses.
    async fn handle_batch(self: &Arc<Self>, text: &str) {
        let items: Vec<Box<serde_json::value::RawValue>> = match serde_json::from_str(text) {
            Ok(items) => items,
            Err(err) => {
                let error = RpcError::new(jsonrpc::PARSE_ERROR, format!("parse error: {err}"));
                self.send(jsonrpc::error_response(&Value::Null, &error)).await;
                return;
            }
        };
        if items.is_empty() {
            let error = RpcError::new(jsonrpc::INVALID_REQUEST, "invalid request: empty batch");
            self.send(jsonrpc::error_response(&Value::Null, &error)).await;
            return;
        }
        let this = self.clone();
        self.daemon.tasks().spawn(async move {
            let runs = items.iter().map(|item| this.answer_one(item.get()));
            let answers: Vec<String> =
                futures::future::join_all(runs).await.into_iter().flatten().collect();
            if !answers.is_empty() {
                this.send(format!("[{}]", answers.join(","))).await;
            }
        });
    }

    /// One element of a batch: its response line, or nothing for a notification.
    async fn answer_one(self: &Arc<Self>, text: &str) -> Option<String> {
        match jsonrpc::parse(text) {
            Err(malformed) => Some(jsonrpc::error_response(&malformed.id, &malformed.error)),
            Ok(Incoming::Response) => None,
            Ok(Incoming::Notification { method, params }) => {
                self.notification(&method, params);
                None
            }
            Ok(Incoming::Request { id, method, params }) => {
                let answer = requests::caught(self.run_request(&id, &method, params)).await;
                answered(answer, &id, &method)
            }
        }
    }

    fn notification(&self, method: &str, params: Params) {
        match method {
            method::CANCEL_REQUEST | method::NOTIFICATIONS_CANCELLED => {
                let Ok(params) = params.parse::<CancelRequestParams>() else {
                    return;
                };
                if let Some(id) = params.id.or(params.request_id) {
                    self.requests.cancel(&jsonrpc::id_key(&id));
                }
            }
            // Unknown notifications are ignored, as JSON-RPC requires.
            _ => {}
        }
    }

    /// One method: its params parsed, the client API called, its answer rendered.
    async fn request(
        &self,
        name: &str,
        params: Params,
        id: &Value,
        cancel: &CancellationToken,
    ) -> Result<Reply, RpcError> {
        let client = &self.client;
        match name {
            method::TOOLS_CALL => {
                let params: CallParams<'_> = params.parse()?;
                let call_id = match params.call_id {
                    Some(call_id) => Arc::from(call_id),
                    None => id_text(id),
                };
                let call = Call::new(call_id, params.name, arguments_text(params.arguments)?);
                let result = client
                    .call(params.session_id.as_deref(), call, cancel)
                    .await
                    .map_err(session_error)?;
                // Room for the content, its escapes, and the fields around it.
                let size = result.content.len() + result.content.len() / 8 + 512;
                Ok(Reply::Line(jsonrpc::response_sized(id, &result, size)))
            }
            method::TOOLS_CALL_BATCH => {
                let params: BatchParams<'_> = params.parse()?;
                if params.calls.len() > MAX_BATCH_CALLS {
                    return Err(RpcError::new(
                        jsonrpc::SERVER_BUSY,
                        format!("a batch holds at most {MAX_BATCH_CALLS} calls"),
                    ));
                }
                let calls = params
                    .calls
                    .into_iter()
                    .map(|call| Ok(Call::new(call.id, call.name, arguments_text(call.arguments)?)))
                    .collect::<Result<Vec<Call>, RpcError>>()?;
                let results = client
                    .batch(params.session_id.as_deref(), &calls, cancel)
                    .await
                    .map_err(session_error)?;
                reply(id, &ToolsCallBatchResult { results })
            }
            method::TOOLS_LIST => {
                let params: ToolsListParams = jsonrpc::params(params)?;
                let entry = client.session(params.session_id.as_deref()).map_err(session_error)?;
                let (listing, shown) = entry.session.listed();
                Ok(Reply::Line(render_listing(id, &listing, &shown)))
            }
            method::TOOLS_CANCEL => {
                let params: ToolsCancelParams = jsonrpc::params(params)?;
                let canceled = client
                    .cancel(params.session_id.as_deref(), &params.call_id)
                    .map_err(session_error)?;
                reply(id, &ToolsCancelResult { canceled })
            }
            method::TOOLS_EXPLAIN => {
                let params: ExplainParams<'_> = params.parse()?;
                let call = Call::new("explain", params.name, arguments_text(params.arguments)?);
                let (decision, explanation, layers) =
                    client.explain(params.session_id.as_deref(), &call).map_err(session_error)?;
                reply(id, &ToolsExplainResult { decision, explanation, layers })
            }
            method::EVENTS_SUBSCRIBE => {
                let params: EventsSubscribeParams = jsonrpc::params(params)?;
                let entry = client.session(params.session_id.as_deref()).map_err(session_error)?;
                if entry.events.is_none() {
                    return Err(session_error(SessionError::NotSubscribable));
                }
                let subscription = client.subscription_id();
                // The response must reach the client before the backlog: send it here,
                // then subscribe, and tell the caller not to answer again.
                let line = jsonrpc::response(id, &subscription);
                self.send(line).await;
                client
                    .subscribe(&entry, subscription, Arc::new(Notifications(self.outbound.clone())))
                    .map_err(session_error)?;
                Ok(Reply::Sent)
            }
            method::EVENTS_UNSUBSCRIBE => {
                let params: EventsUnsubscribeParams = jsonrpc::params(params)?;
                reply(id, &client.unsubscribe(&params.subscription))
            }
            method::PERMISSION_RESPOND => {
                let params: PermissionRespondParams = jsonrpc::params(params)?;
                let answer = ApprovalAnswer {
                    decision: params.decision,
                    scope: params.scope,
                    reason: params.reason,
                };
                match client.respond(&params.request_id, answer) {
                    Ok(resolved) => reply(id, &PermissionRespondResult { resolved }),
                    Err(_) => Err(RpcError::invalid_params(
                        "that request belongs to a session of another connection",
                    )),
                }
            }
            method::SESSION_OPEN => {
                let params: SessionOpenParams = jsonrpc::params(params)?;
                let state = client.open_session(&params.spec()).map_err(session_error)?;
                reply(id, &SessionInfo::from(state))
            }
            method::SESSION_UPDATE => {
                let params: SessionUpdateParams = jsonrpc::params(params)?;
                let state = client
                    .update(params.session_id.as_deref(), &params.spec())
                    .map_err(session_error)?;
                reply(id, &SessionInfo::from(state))
            }
            method::SESSION_CLOSE => {
                let params: SessionCloseParams = jsonrpc::params(params)?;
                let closed = client.close_session(&params.session_id).map_err(session_error)?;
                reply(id, &SessionCloseResult { closed })
            }
            method::DAEMON_STATUS => reply(id, &DaemonStatusResult::from(client.status())),
            other => {
                Err(RpcError::new(jsonrpc::METHOD_NOT_FOUND, format!("unknown method: {other}")))
            }
        }
    }

    /// Queues one line for the client (used by transports for framing errors).
    pub async fn send_line(&self, line: String) {
        self.send(line).await;
    }

    async fn send(&self, line: String) {
        if line.is_empty() {
            return;
        }
        // A closed queue means the client is gone; nothing left to tell it.
        self.outbound.send(line).await;
    }
}

/// The sending side of a connection's outbound lines: a queue bounded in bytes
/// ([`outbound_queue`]), or a plain channel bounded in lines.
#[derive(Clone)]
pub struct Outbound(OutboundTx);

#[derive(Clone)]
enum OutboundTx {
    Lines(mpsc::Sender<String>),
    Bytes { tx: mpsc::UnboundedSender<Queued>, room: Arc<Semaphore> },
}

/// A line in a byte-bounded queue, holding its share of the room until the writer
/// takes it.
pub struct Queued {
    line: String,
    _room: OwnedSemaphorePermit,
}

/// The writer's side of [`outbound_queue`].
pub struct OutboundQueue(mpsc::UnboundedReceiver<Queued>);

/// A connection's outbound queue, bounded by [`OUTBOUND_BYTES`] (a line longer than
/// that waits for the queue to be empty and goes alone).
pub fn outbound_queue() -> (Outbound, OutboundQueue) {
    let (tx, rx) = mpsc::unbounded_channel();
    let room = Arc::new(Semaphore::new(OUTBOUND_BYTES));
    (Outbound(OutboundTx::Bytes { tx, room }), OutboundQueue(rx))
}

impl From<mpsc::Sender<String>> for Outbound {
    fn from(tx: mpsc::Sender<String>) -> Outbound {
        Outbound(OutboundTx::Lines(tx))
    }
}

/// The room a line takes in a byte-bounded queue.
fn room_for(line: &str) -> u32 {
    u32::try_from(line.len().saturating_add(LINE_OVERHEAD).min(OUTBOUND_BYTES)).unwrap_or(u32::MAX)
}

impl Outbound {
    /// Queues a line, waiting for room; nothing happens when the writer is gone.
    pub async fn send(&self, line: String) {
        match &self.0 {
            OutboundTx::Lines(tx) => {
                let _ = tx.send(line).await;
            }
            OutboundTx::Bytes { tx, room } => {
                let Ok(permit) = room.clone().acquire_many_owned(room_for(&line)).await else {
                    return;
                };
                let _ = tx.send(Queued { line, _room: permit });
            }
        }
    }

    /// Queues a line if there is room now; false when it was not queued.
    pub fn try_send(&self, line: String) -> bool {
        match &self.0 {
            OutboundTx::Lines(tx) => tx.try_send(line).is_ok(),
            OutboundTx::Bytes { tx, room } => {
                let Ok(permit) = room.clone().try_acquire_many_owned(room_for(&line)) else {
                    return false;
                };
                tx.send(Queued { line, _room: permit }).is_ok()
            }
        }
    }

    /// Whether the writer is gone.
    pub fn is_closed(&self) -> bool {
        match &self.0 {
            OutboundTx::Lines(tx) => tx.is_closed(),
            OutboundTx::Bytes { tx, .. } => tx.is_closed(),
        }
    }
}

impl OutboundQueue {
    /// The next line; `None` once every sender is gone and the queue is empty. The
    /// line's room is given back as it is taken.
    pub async fn recv(&mut self) -> Option<String> {
        self.0.recv().await.map(|queued| queued.line)
    }

    /// The next line if one is queued.
    pub fn try_recv(&mut self) -> Option<String> {
        self.0.try_recv().ok().map(|queued| queued.line)
    }
}

/// What a method produced.
enum Reply {
    /// The whole response line: a result is serialized once, straight from its type
    /// into the line, rather than through a `Value` tree (which would copy every
    /// string and reorder the fields by name).
    Line(String),
    /// The method wrote its response itself (to order it before what follows).
    Sent,
}

/// Delivers a subscription's events as `events` notifications through the
/// connection's bounded queue.
struct Notifications(Outbound);

impl Subscriber for Notifications {
    fn deliver(&self, subscription: &str, event: &Event) -> bool {
        self.0.try_send(render_event(subscription, event))
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// The `events` notification line (the borrowed twin of `EventsNotification`).
fn render_event(subscription: &str, event: &Event) -> String {
    #[derive(serde::Serialize)]
    struct Borrowed<'a> {
        subscription: &'a str,
        result: &'a Event,
    }
    jsonrpc::notification(method::EVENTS, &Borrowed { subscription, result: event })
}

/// `tools/call`'s params as read off the wire: [`ToolsCallParams`] with the
/// arguments left as the text they arrived as (parsed once, by the registry).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(borrow, default)]
    call_id: Option<Cow<'a, str>>,
}

/// One call of [`BatchParams`] ([`BatchCall`] with raw arguments).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatchCall<'a> {
    id: String,
    name: String,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// [`ToolsCallBatchParams`] with raw arguments.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchParams<'a> {
    #[serde(borrow)]
    calls: Vec<RawBatchCall<'a>>,
    #[serde(default)]
    session_id: Option<String>,
}

/// [`ToolsExplainParams`] with raw arguments.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplainParams<'a> {
    name: String,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(default)]
    session_id: Option<String>,
}

/// A call's argument text: a JSON object as it was written, or the model's raw text
/// when the client sent it as a string; absent or `null` is `{}`.
fn arguments_text(arguments: Option<&RawValue>) -> Result<String, RpcError> {
    let Some(raw) = arguments.map(RawValue::get) else {
        return Ok("{}".to_owned());
    };
    if raw == "null" {
        return Ok("{}".to_owned());
    }
    if raw.starts_with('"') {
        return serde_json::from_str(raw)
            .map_err(|err| RpcError::invalid_params(format!("invalid params: {err}")));
    }
    Ok(raw.to_owned())
}

/// The `tools/list` response ([`ToolsListResult`]) from the registry's rendered
/// definitions: text copied, nothing serialized again.
fn render_listing(id: &Value, listing: &Listing, shown: &[usize]) -> String {
    let tools = shown.iter().map(|&index| &listing.tools[index]);
    let size: usize = tools.clone().map(|tool| tool.json.len() + tool.source_json.len() + 2).sum();
    let mut line = String::with_capacity(size + 96);
    line.push_str(r#"{"jsonrpc":"2.0","id":"#);
    line.push_str(&id.to_string());
    line.push_str(r#","result":{"tools":["#);
    for (n, tool) in tools.clone().enumerate() {
        if n > 0 {
            line.push(',');
        }
        line.push_str(&tool.json);
    }
    line.push(']');
    if !shown.is_empty() {
        line.push_str(r#","sources":{"#);
        for (n, tool) in tools.enumerate() {
            if n > 0 {
                line.push(',');
            }
            line.push_str(&tool.source_json);
        }
        line.push('}');
    }
    line.push_str("}}");
    line
}

fn session_error(err: SessionError) -> RpcError {
    RpcError::invalid_params(err.to_string())
}

fn reply<T: serde::Serialize>(id: &Value, result: &T) -> Result<Reply, RpcError> {
    Ok(Reply::Line(jsonrpc::response(id, result)))
}

fn id_text(id: &Value) -> Arc<str> {
    match id {
        Value::String(text) => Arc::from(text.as_str()),
        Value::Number(number) => jsonrpc::number_text(number),
        other => Arc::from(other.to_string()),
    }
}

/// A request's answer, where a panic in its handling (see [`requests`]) becomes its
/// internal error, logged.
fn answered(answer: Result<Option<String>, Panicked>, id: &Value, method: &str) -> Option<String> {
    answer.unwrap_or_else(|Panicked| {
        tracing::error!(%id, method, "request panicked");
        let error = RpcError::new(jsonrpc::INTERNAL_ERROR, format!("{method} failed"));
        Some(jsonrpc::error_response(id, &error))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bug() -> Option<String> {
        panic!("a bug in a request's handling")
    }

    #[tokio::test]
    async fn a_request_that_panics_is_answered_with_an_internal_error() {
        let id = Value::from(7);
        // On the first poll (the connection's own task) and after a wait (a task of its
        // own), alike.
        let at_once = match requests::start(Box::pin(async { bug() })) {
            Started::Done(answer) => answer,
            Started::Waiting(_) => panic!("waited"),
        };
        let later = requests::caught(async {
            tokio::task::yield_now().await;
            bug()
        })
        .await;
        for answer in [at_once, later] {
            let answer = answered(answer, &id, method::TOOLS_CALL).expect("answered");
            let answer: Value = serde_json::from_str(&answer).unwrap();
            assert_eq!(answer["id"], 7);
            assert_eq!(answer["error"]["code"], jsonrpc::INTERNAL_ERROR);
            assert_eq!(answer["error"]["message"], "tools/call failed");
        }
        // A request that does not panic keeps its own answer.
        let fine = requests::caught(async { Some("answer".to_owned()) }).await;
        assert_eq!(answered(fine, &id, method::TOOLS_CALL).as_deref(), Some("answer"));
    }
}
