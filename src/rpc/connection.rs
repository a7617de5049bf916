//! The dispatch core: one client connection speaking the native JSON-RPC protocol,
//! whatever carries its frames (NDJSON on a Unix socket or stdio, WebSocket messages,
//! HTTP bodies). Every transport feeds frames in and drains `outbound`; the methods
//! behave the same everywhere.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use dashmap::DashMap;
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::jsonrpc::{self, Incoming, RpcError};
use crate::agent::ApprovalAnswer;
use crate::daemon::approvals::RespondError;
use crate::daemon::{ConnectionGuard, Daemon, SessionEntry, SessionError};
use crate::protocol::*;
use crate::tools::Call;

/// Requests of one connection handled at the same time; past this the connection
/// stops reading until one finishes (backpressure instead of memory growth).
pub const MAX_REQUESTS_IN_FLIGHT: usize = 256;
/// Lines queued for the writer of one connection (responses wait for room; events
/// are dropped and counted when a client does not read).
pub const OUTBOUND_CAPACITY: usize = 4096;
/// Calls in one `tools/call_batch`.
pub const MAX_BATCH_CALLS: usize = 256;

/// One connected client.
pub struct Connection {
    daemon: Arc<Daemon>,
    guard: ConnectionGuard,
    /// Who is on the other end (`uid:1000`, `token:ci`), for the audit log.
    identity: String,
    default_session: Arc<SessionEntry>,
    outbound: mpsc::Sender<String>,
    /// Running requests by JSON-RPC id, for `$/cancelRequest`; the number tells a
    /// request from a later one that reused its id.
    requests: DashMap<String, (u64, CancellationToken)>,
    next_request: AtomicU64,
    limiter: Arc<Semaphore>,
    /// Canceled when the connection goes away: every request of it stops.
    closed: CancellationToken,
    next_subscription: AtomicU64,
}

impl Connection {
    /// A connection with its default session. `outbound` carries every line the
    /// client must receive (responses and notifications), in order.
    pub fn open(
        daemon: &Arc<Daemon>,
        identity: impl Into<String>,
        outbound: mpsc::Sender<String>,
    ) -> Result<Arc<Connection>, SessionError> {
        let guard = daemon.connect();
        let identity = identity.into();
        let default_session =
            daemon.open_session(guard.id, &identity, &SessionOpenParams::default())?;
        Ok(Arc::new(Connection {
            daemon: daemon.clone(),
            identity,
            default_session,
            outbound,
            requests: DashMap::new(),
            limiter: Arc::new(Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
            closed: daemon.shutdown_token().child_token(),
            next_subscription: AtomicU64::new(1),
            next_request: AtomicU64::new(0),
            guard,
        }))
    }

    pub fn id(&self) -> u64 {
        self.guard.id
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn default_session_id(&self) -> &str {
        self.default_session.session.id()
    }

    /// Ends the connection: its requests are canceled, its sessions closed (when the
    /// last reference drops).
    pub fn close(&self) {
        self.closed.cancel();
        self.daemon.disconnect(self.guard.id);
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
                let this = self.clone();
                let mut request = Box::pin(async move {
                    let answer = this.run_request(id, &method, params).await;
                    drop(permit);
                    answer
                });
                // The first poll needs no waker of its own: a request that is not done
                // is handed to a task, whose first poll registers that task's waker
                // with whatever the request waits on.
                let mut context = Context::from_waker(Waker::noop());
                match request.as_mut().poll(&mut context) {
                    Poll::Ready(answer) => answer,
                    Poll::Pending => {
                        let this = self.clone();
                        self.daemon.tasks().spawn(async move {
                            if let Some(answer) = request.await {
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
    async fn run_request(&self, id: Value, method: &str, params: Value) -> Option<String> {
        let cancel = self.closed.child_token();
        let key = jsonrpc::id_key(&id);
        let number = self.next_request.fetch_add(1, Ordering::Relaxed);
        self.requests.insert(key.clone(), (number, cancel.clone()));
        let reply = self.request(method, params, &id, &cancel).await;
        self.requests.remove_if(&key, |_, (registered, _)| *registered == number);
        match reply {
            Ok(Reply::Line(line)) => Some(line),
            Ok(Reply::Sent) => None,
            Err(error) => Some(jsonrpc::error_response(&id, &error)),
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
                self.run_request(id, &method, params).await
            }
        }
    }

    fn notification(&self, method: &str, params: Value) {
        match method {
            method::CANCEL_REQUEST | method::NOTIFICATIONS_CANCELLED => {
                let Ok(params) = serde_json::from_value::<CancelRequestParams>(params) else {
                    return;
                };
                if let Some(id) = params.id.or(params.request_id)
                    && let Some(entry) = self.requests.get(&jsonrpc::id_key(&id))
                {
                    entry.1.cancel();
                }
            }
            // Unknown notifications are ignored, as JSON-RPC requires.
            _ => {}
        }
    }

    async fn request(
        &self,
        name: &str,
        params: Value,
        id: &Value,
        cancel: &CancellationToken,
    ) -> Result<Reply, RpcError> {
        match name {
            method::TOOLS_CALL => {
                let params: ToolsCallParams = jsonrpc::params(params)?;
                let entry = self.session(params.session_id.as_deref())?;
                let call_id = params.call_id.unwrap_or_else(|| id_text(id));
                let call = match &params.arguments {
                    Value::String(raw) => Call::new(call_id, params.name, raw.clone()),
                    other => Call::from_value(call_id, params.name, other),
                };
                let result = entry.session.execute_shared(&call, cancel).await;
                // Room for the content, its escapes, and the fields around it.
                let size = result.content.len() + result.content.len() / 8 + 512;
                Ok(Reply::Line(jsonrpc::response_sized(id, &result, size)))
            }
            method::TOOLS_CALL_BATCH => {
                let params: ToolsCallBatchParams = jsonrpc::params(params)?;
                if params.calls.len() > MAX_BATCH_CALLS {
                    return Err(RpcError::new(
                        jsonrpc::SERVER_BUSY,
                        format!("a batch holds at most {MAX_BATCH_CALLS} calls"),
                    ));
                }
                let entry = self.session(params.session_id.as_deref())?;
                let calls: Vec<Call> = params
                    .calls
                    .iter()
                    .map(|call| match &call.arguments {
                        Value::String(raw) => Call::new(&call.id, &call.name, raw.clone()),
                        other => Call::from_value(&call.id, &call.name, other),
                    })
                    .collect();
                let results = entry.session.execute_calls(&calls, cancel).await;
                reply(id, &ToolsCallBatchResult { results })
            }
            method::TOOLS_LIST => {
                let params: ToolsListParams = jsonrpc::params(params)?;
                let entry = self.session(params.session_id.as_deref())?;
                let tools = entry.session.definitions();
                let registered = self.daemon.registry().sources();
                let sources = tools
                    .iter()
                    .filter_map(|tool| {
                        let source = registered.get(&tool.name)?;
                        Some((tool.name.clone(), source.to_string()))
                    })
                    .collect();
                reply(id, &ToolsListResult { tools, sources })
            }
            method::TOOLS_CANCEL => {
                let params: ToolsCancelParams = jsonrpc::params(params)?;
                let entry = self.session(params.session_id.as_deref())?;
                reply(
                    id,
                    &ToolsCancelResult { canceled: entry.session.cancel_call(&params.call_id) },
                )
            }
            method::TOOLS_EXPLAIN => {
                let params: ToolsExplainParams = jsonrpc::params(params)?;
                let entry = self.session(params.session_id.as_deref())?;
                let call = match &params.arguments {
                    Value::String(raw) => Call::new("explain", params.name, raw.clone()),
                    other => Call::from_value("explain", params.name, other),
                };
                let (decision, explanation) = entry.session.explain(&call);
                reply(id, &ToolsExplainResult { decision, explanation })
            }
            method::EVENTS_SUBSCRIBE => {
                let params: EventsSubscribeParams = jsonrpc::params(params)?;
                let entry = self.session(params.session_id.as_deref())?;
                let subscription = format!(
                    "sub-{}-{}",
                    self.guard.id,
                    self.next_subscription.fetch_add(1, Ordering::Relaxed)
                );
                // The response must reach the client before the backlog: send it here,
                // then subscribe, and tell the caller not to answer again.
                let line = jsonrpc::response(id, &subscription);
                self.send(line).await;
                entry.events.subscribe(subscription, self.guard.id, self.outbound.clone());
                Ok(Reply::Sent)
            }
            method::EVENTS_UNSUBSCRIBE => {
                let params: EventsUnsubscribeParams = jsonrpc::params(params)?;
                let mut removed = false;
                for session_id in self.owned_session_ids() {
                    if let Ok(entry) = self.daemon.session_for(self.guard.id, &session_id) {
                        removed |= entry.events.unsubscribe(&params.subscription);
                    }
                }
                reply(id, &removed)
            }
            method::PERMISSION_RESPOND => {
                let params: PermissionRespondParams = jsonrpc::params(params)?;
                let answer = ApprovalAnswer {
                    decision: params.decision,
                    scope: params.scope,
                    reason: params.reason,
                };
                let owner = self.guard.id;
                let daemon = &self.daemon;
                let outcome =
                    daemon.approvals().respond(&params.request_id, answer, |session_id| {
                        daemon.session_for(owner, session_id).is_ok()
                    });
                match outcome {
                    Ok(()) => reply(id, &PermissionRespondResult { resolved: true }),
                    Err(RespondError::NotPending) => {
                        reply(id, &PermissionRespondResult { resolved: false })
                    }
                    Err(RespondError::NotYours) => Err(RpcError::invalid_params(
                        "that request belongs to a session of another connection",
                    )),
                }
            }
            method::SESSION_OPEN => {
                let params: SessionOpenParams = jsonrpc::params(params)?;
                let entry = self
                    .daemon
                    .open_session(self.guard.id, &self.identity, &params)
                    .map_err(session_error)?;
                reply(id, &self.daemon.info(&entry.session))
            }
            method::SESSION_UPDATE => {
                let params: SessionUpdateParams = jsonrpc::params(params)?;
                let entry = self.session(params.session_id.as_deref())?;
                if let Some(mode) = params.mode {
                    let granted = entry.session.set_mode(mode);
                    if granted != mode {
                        return Err(RpcError::invalid_params(format!(
                            "mode {mode} is beyond what the configuration grants ({})",
                            entry.session.mode_ceiling()
                        )));
                    }
                }
                if let Some(allowlist) = params.allowlist {
                    let current = entry.session.allowlist();
                    if !current.is_empty() && allowlist.iter().any(|name| !current.contains(name)) {
                        return Err(RpcError::invalid_params(
                            "an allowlist can only be narrowed, not widened",
                        ));
                    }
                    entry.session.set_allowlist(allowlist);
                }
                reply(id, &self.daemon.info(&entry.session))
            }
            method::SESSION_CLOSE => {
                let params: SessionCloseParams = jsonrpc::params(params)?;
                if params.session_id == self.default_session_id() {
                    return Err(RpcError::invalid_params(
                        "the connection's default session closes with the connection",
                    ));
                }
                let closed = self.daemon.close_session(self.guard.id, &params.session_id).is_ok();
                reply(id, &SessionCloseResult { closed })
            }
            method::DAEMON_STATUS => reply(
                id,
                &DaemonStatusResult {
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    pid: std::process::id(),
                    uptime_ms: u64::try_from(self.daemon.uptime().as_millis()).unwrap_or(u64::MAX),
                    connections: self.daemon.connection_count(),
                    sessions: self.daemon.session_count(),
                    calls_in_flight: self.daemon.calls_in_flight(),
                    tools: self.daemon.registry().names().len(),
                    upstreams: self.daemon.upstreams(),
                    sandbox: crate::sandbox::status(),
                },
            ),
            other => {
                Err(RpcError::new(jsonrpc::METHOD_NOT_FOUND, format!("unknown method: {other}")))
            }
        }
    }

    fn session(&self, session_id: Option<&str>) -> Result<Arc<SessionEntry>, RpcError> {
        match session_id {
            None => Ok(self.default_session.clone()),
            Some(id) if id == self.default_session_id() => Ok(self.default_session.clone()),
            Some(id) => self.daemon.session_for(self.guard.id, id).map_err(session_error),
        }
    }

    fn owned_session_ids(&self) -> Vec<String> {
        let mut ids = vec![self.default_session_id().to_owned()];
        ids.extend(self.daemon.session_ids_of(self.guard.id));
        ids.sort();
        ids.dedup();
        ids
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
        let _ = self.outbound.send(line).await;
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

fn session_error(err: SessionError) -> RpcError {
    RpcError::invalid_params(err.to_string())
}

fn reply<T: serde::Serialize>(id: &Value, result: &T) -> Result<Reply, RpcError> {
    Ok(Reply::Line(jsonrpc::response(id, result)))
}

fn id_text(id: &Value) -> String {
    match id {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}
