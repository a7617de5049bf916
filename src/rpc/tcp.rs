//! The TCP transport for remote agents: HTTP and WebSocket on one listener, off unless
//! configured and on loopback by default.
//!
//! Routes:
//! - `POST /rpc`: one JSON-RPC message (or batch) per request body, its response in the
//!   response body. Each request is a connection of its own with a fresh default
//!   session that ends with the request: events and other notifications are not
//!   delivered over plain POST, and nothing (read-file records for stale checks,
//!   session grants, todos) carries over from one POST to the next. A message that
//!   produces no response (notifications only) is answered `204 No Content`.
//! - `GET /ws`: a WebSocket speaking the native protocol, one message per text frame,
//!   served by the same [`ws::serve_frames`] as the Unix socket's WebSocket: the
//!   streaming, stateful path (events, approvals, long sessions).
//! - `GET /healthz`: `200 ok` without authentication, for load balancers; it reveals
//!   nothing about the daemon, and its connection is closed after the answer (like
//!   every connection that has not authenticated).
//!
//! Every request to `/rpc` and `/ws` needs `Authorization: Bearer <token>`, checked by
//! [`crate::auth`] (the same check as MCP over HTTP); the token's name becomes the
//! connection's identity (`token:<name>`) for sessions and the audit log. A missing or
//! wrong token is answered `401`. Unlike the Unix socket, a TCP peer's user cannot be
//! checked, so there is no unauthenticated access even on loopback; [`serve`] refuses
//! to listen beyond loopback without tokens at all.
//!
//! Limits: request bodies over `max_message_bytes` get `413`, and WebSocket messages
//! over it a JSON-RPC error. Connections are admitted by [`crate::admission`]:
//! connections that have not authenticated are counted apart, get no keep-alive and
//! a deadline, so they cannot take the `max_connections` slots of authenticated
//! clients (a connection holds its slot while it lives, a WebSocket for its whole
//! session; past the cap a client gets `429 Too Many Requests`). Idle keep-alive
//! connections and slow headers are cut after the header timeout, slow bodies after
//! [`BODY_READ_TIMEOUT`].

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::ws::{self, WsIn, WsOut};
use super::{Connection, connection};
use crate::admission::{self, Admission, Limits};
use crate::auth::{Gate, Identity, TokenSet};
use crate::daemon::Daemon;

/// Open TCP connections served at once by default. Remote agents are few and each
/// needs one WebSocket or a small keep-alive pool; a connection costs a task and a few
/// KiB of buffers, so this bounds memory well below what the daemon may use.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// How long a request body may take to arrive: a 16 MiB body (the default message
/// limit) still fits over a link of about 1 Mbit/s, while a client trickling bytes
/// cannot hold a slot indefinitely.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// The prefix of every notification line the dispatch core sends (events); anything
/// else on a connection's outbound queue is a response.
const NOTIFICATION_PREFIX: &str = "{\"jsonrpc\":\"2.0\",\"method\":";

/// How the TCP transport is limited and who may use it.
#[derive(Clone, Debug)]
pub struct TcpOptions {
    /// The accepted bearer tokens; empty is only allowed on a loopback address, and
    /// then nothing but `/healthz` can be used.
    pub tokens: TokenSet,
    /// The largest request body or WebSocket message.
    pub max_message_bytes: usize,
    /// Authenticated connections served at once (past it clients get `429`), and
    /// connections waiting to authenticate (past it the oldest is closed), with their
    /// deadlines.
    pub limits: Limits,
}

impl TcpOptions {
    /// The given tokens with the default limits.
    pub fn new(tokens: TokenSet) -> TcpOptions {
        TcpOptions {
            tokens,
            max_message_bytes: super::DEFAULT_MAX_MESSAGE_BYTES,
            limits: Limits::new(DEFAULT_MAX_CONNECTIONS),
        }
    }
}

/// Why the TCP transport would not start.
#[derive(Debug, thiserror::Error)]
pub enum TcpError {
    #[error(
        "refusing to listen on {0} without tokens: configure a token file, or listen on \
         a loopback address"
    )]
    TokensRequired(SocketAddr),
    #[error("cannot read the listener's address: {0}")]
    Address(std::io::Error),
}

/// Checks that an address may be served with these tokens: beyond loopback, at least
/// one token is required.
pub fn check_exposure(address: SocketAddr, tokens: &TokenSet) -> Result<(), TcpError> {
    if tokens.is_empty() && !address.ip().is_loopback() {
        return Err(TcpError::TokensRequired(address));
    }
    Ok(())
}

/// What every handler needs.
struct Shared {
    daemon: Arc<Daemon>,
    max_message_bytes: usize,
}

/// The routes, with authentication and the body limit but without the connection cap
/// (that belongs to [`serve`]'s accept loop).
pub fn router(daemon: Arc<Daemon>, options: &TcpOptions) -> Router {
    let shared = Arc::new(Shared { daemon, max_message_bytes: options.max_message_bytes });
    let gate = Arc::new(Gate { tokens: options.tokens.clone(), hint: "" });
    let authenticated = Router::new()
        .route("/rpc", post(rpc_post))
        .route("/ws", get(rpc_ws))
        .route_layer(middleware::from_fn_with_state(gate, crate::auth::require_bearer))
        .layer(DefaultBodyLimit::max(options.max_message_bytes));
    Router::new().route("/healthz", get(healthz)).merge(authenticated).with_state(shared)
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// `POST /rpc`: one message in, its response out, on a connection of its own.
async fn rpc_post(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().map(Identity::to_string) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if declared_length(request.headers()).is_some_and(|length| length > shared.max_message_bytes) {
        // Refused before a byte of the body is read.
        return body_too_large(shared.max_message_bytes);
    }
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, Bytes::from_request(request, &()))
        .await
    {
        Err(_) => return (StatusCode::REQUEST_TIMEOUT, "the body took too long\n").into_response(),
        Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return body_too_large(shared.max_message_bytes);
        }
        Ok(Err(rejection)) => return rejection.into_response(),
        Ok(Ok(body)) => body,
    };
    let text = match std::str::from_utf8(&body) {
        Ok(text) if !text.trim().is_empty() => text,
        Ok(_) => return (StatusCode::BAD_REQUEST, "empty body\n").into_response(),
        Err(_) => {
            let error = super::jsonrpc::not_utf8();
            let line = super::jsonrpc::error_response(&serde_json::Value::Null, &error);
            return json_response(line);
        }
    };
    let (outbound, mut lines) = mpsc::channel(connection::OUTBOUND_CAPACITY);
    let connection = match Connection::open(&shared.daemon, identity, outbound) {
        Ok(connection) => connection,
        Err(err) => {
            tracing::debug!(%err, "connection refused");
            return (StatusCode::SERVICE_UNAVAILABLE, "the daemon is shutting down\n")
                .into_response();
        }
    };
    // Ends the connection however this handler ends: with its answer, or dropped
    // because the client went away (which cancels its calls).
    let _close = CloseOnDrop(Arc::downgrade(&connection));
    connection.handle_frame(text).await;
    // Only running requests keep the connection (and with it the sending side of
    // `lines`) alive now: when they are done without answering, `lines` ends.
    drop(connection);
    while let Some(line) = lines.recv().await {
        if !line.starts_with(NOTIFICATION_PREFIX) {
            return json_response(line);
        }
    }
    StatusCode::NO_CONTENT.into_response()
}

/// The body length a request announces, if it does.
fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

fn body_too_large(max: usize) -> Response {
    (StatusCode::PAYLOAD_TOO_LARGE, format!("a message holds at most {max} bytes\n"))
        .into_response()
}

fn json_response(line: String) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], line).into_response()
}

/// Closes a per-request connection when dropped, unless it is already gone.
struct CloseOnDrop(Weak<Connection>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if let Some(connection) = self.0.upgrade() {
            connection.close();
        }
    }
}

/// `GET /ws`: upgrades and serves the native protocol over WebSocket frames.
async fn rpc_ws(
    State(shared): State<Arc<Shared>>,
    upgrade: WebSocketUpgrade,
    request: Request,
) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().map(Identity::to_string) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    // The WebSocket outlives the HTTP connection task: it keeps the connection's
    // authenticated slot for its whole session.
    let slot = request.extensions().get::<Admission>().and_then(Admission::slot);
    let max = shared.max_message_bytes;
    // One byte over the limit passes the library, so that `serve_frames` answers an
    // oversized message with an error instead of the connection just dropping.
    upgrade
        .max_message_size(max.saturating_add(1))
        .max_frame_size(max.saturating_add(1))
        .on_upgrade(move |socket| {
            let daemon = shared.daemon.clone();
            let tasks = daemon.tasks().clone();
            tasks.track_future(async move {
                serve_websocket(&daemon, identity, socket, max).await;
                drop(slot);
            })
        })
}

/// Adapts axum's WebSocket to the frames `serve_frames` speaks.
async fn serve_websocket(daemon: &Arc<Daemon>, identity: String, socket: WebSocket, max: usize) {
    let socket = socket
        .map(|message| {
            message.map(|message| match message {
                Message::Text(text) => WsIn::Text(text.as_str().to_owned()),
                Message::Binary(bytes) => WsIn::Binary(bytes.to_vec()),
                Message::Pong(_) => WsIn::Pong,
                Message::Close(_) => WsIn::Close,
                Message::Ping(_) => WsIn::Other,
            })
        })
        .with(|out: WsOut| {
            futures::future::ok::<Message, axum::Error>(match out {
                WsOut::Text(text) => Message::text(text),
                WsOut::Ping => Message::Ping(Bytes::new()),
            })
        });
    ws::serve_frames(daemon, identity, Box::pin(socket), max).await;
}

/// Serves the TCP transport on `listener` until the daemon shuts down, then waits for
/// its HTTP connections to finish. Every connection task (and every WebSocket session)
/// is also tracked by the daemon's task tracker, so a caller that stops this accept
/// loop early (by dropping it) still finds them in the daemon's shutdown wait.
pub async fn serve(
    daemon: Arc<Daemon>,
    listener: TcpListener,
    options: TcpOptions,
) -> Result<(), TcpError> {
    let address = listener.local_addr().map_err(TcpError::Address)?;
    check_exposure(address, &options.tokens)?;
    if options.tokens.is_empty() {
        tracing::warn!(%address, "no bearer tokens configured: only /healthz will answer");
    }
    let app = router(daemon.clone(), &options);
    tracing::info!(%address, "listening for remote agents");
    let shutdown = daemon.shutdown_token().clone();
    admission::serve_http(listener, app, options.limits, shutdown, daemon.tasks().clone()).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_loopback_tokens_are_required() {
        let empty = TokenSet::empty();
        let some = TokenSet::from_pairs([("ci", "0123456789abcdef")]).unwrap();
        let public: SocketAddr = "0.0.0.0:7810".parse().unwrap();
        let lan: SocketAddr = "192.0.2.7:7810".parse().unwrap();
        let loopback: SocketAddr = "127.0.0.1:7810".parse().unwrap();
        let loopback6: SocketAddr = "[::1]:7810".parse().unwrap();
        assert!(matches!(check_exposure(public, &empty), Err(TcpError::TokensRequired(_))));
        assert!(matches!(check_exposure(lan, &empty), Err(TcpError::TokensRequired(_))));
        assert!(check_exposure(loopback, &empty).is_ok());
        assert!(check_exposure(loopback6, &empty).is_ok());
        assert!(check_exposure(public, &some).is_ok());
    }

    #[test]
    fn notifications_are_told_from_responses_by_their_prefix() {
        let event = super::super::jsonrpc::notification("events", &serde_json::json!({}));
        assert!(event.starts_with(NOTIFICATION_PREFIX));
        let response = super::super::jsonrpc::response(&serde_json::json!(1), &"x");
        assert!(!response.starts_with(NOTIFICATION_PREFIX));
    }
}
