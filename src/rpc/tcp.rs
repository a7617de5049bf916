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
//!   nothing about the daemon.
//!
//! Every request to `/rpc` and `/ws` needs `Authorization: Bearer <token>`, compared in
//! constant time with each configured token; the token's name becomes the connection's
//! identity (`token:<name>`) for the audit log. A missing or wrong token is answered
//! `401` with `WWW-Authenticate: Bearer`. Unlike the Unix socket, a TCP peer's user
//! cannot be checked, so there is no unauthenticated access even on loopback; [`serve`]
//! refuses to listen beyond loopback without tokens at all.
//!
//! Limits: request bodies over `max_message_bytes` get `413`, and WebSocket messages
//! over it a JSON-RPC error; open TCP connections are capped at `max_connections`
//! (a connection holds its slot while it lives, a WebSocket for its whole session),
//! and a client past the cap gets `429 Too Many Requests` rather than a place in an
//! unbounded queue. Idle keep-alive connections and slow headers are cut after
//! [`HEADER_READ_TIMEOUT`], slow bodies after [`BODY_READ_TIMEOUT`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::ws::{self, WsIn, WsOut};
use super::{Connection, connection};
use crate::daemon::Daemon;

/// Open TCP connections served at once by default. Remote agents are few and each
/// needs one WebSocket or a small keep-alive pool; a connection costs a task and a few
/// KiB of buffers, so this bounds memory well below what the daemon may use.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// How long a connection may take to send a request's headers, counted from when the
/// daemon starts waiting for them: it also closes idle keep-alive connections, which
/// would otherwise hold a connection slot forever.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a request body may take to arrive: a 16 MiB body (the default message
/// limit) still fits over a link of about 1 Mbit/s, while a client trickling bytes
/// cannot hold a slot indefinitely.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Connections past the cap being told `429` at once; beyond these, a connection is
/// closed without an answer, so a flood cannot grow the daemon's work without bound.
const MAX_REFUSALS_IN_FLIGHT: usize = 64;

/// Header timeout for a connection that is only going to be refused: it gets no more
/// patience than it needs to send one request line.
const REFUSAL_HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// After shutdown starts, how long an HTTP connection may take to finish the request
/// it is serving (its calls are canceled, so this is only a bound on writing the
/// answer to a slow peer).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Tokens shorter than this are refused: a bearer token is the only thing between a
/// network peer and command execution, so it must not be guessable.
pub const MIN_TOKEN_LEN: usize = 16;

/// The prefix of every notification line the dispatch core sends (events); anything
/// else on a connection's outbound queue is a response.
const NOTIFICATION_PREFIX: &str = "{\"jsonrpc\":\"2.0\",\"method\":";

/// Why a token set could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the token file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "the token file {path} is readable by other users (mode {mode:03o}); \
         run `chmod 600` on it"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("the token file {path} holds no token")]
    NoTokens { path: PathBuf },
    #[error("token file line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    #[error("token {name:?}: a token needs at least {MIN_TOKEN_LEN} characters")]
    TooShort { name: String },
    #[error("token name {0:?} is not made of letters, digits, `-`, `_` and `.`")]
    BadName(String),
    #[error("token name {0:?} is used twice")]
    DuplicateName(String),
    #[error("tokens {0:?} and {1:?} have the same secret")]
    DuplicateSecret(String, String),
}

/// One named bearer token.
#[derive(Clone)]
struct Token {
    name: String,
    secret: Vec<u8>,
}

/// The bearer tokens the TCP transport accepts, each with a name that identifies its
/// holder in the audit log. Cheap to clone.
#[derive(Clone, Default)]
pub struct TokenSet {
    tokens: Arc<[Token]>,
}

impl std::fmt::Debug for TokenSet {
    /// Names only: secrets never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSet").field("names", &self.names()).finish()
    }
}

impl TokenSet {
    /// No tokens: every authenticated route answers 401 (only valid on loopback).
    pub fn empty() -> TokenSet {
        TokenSet::default()
    }

    /// Builds a set from `(name, secret)` pairs. Names must be unique and plain, secrets
    /// unique and at least [`MIN_TOKEN_LEN`] characters without whitespace.
    pub fn from_pairs<I, N, S>(pairs: I) -> Result<TokenSet, TokenError>
    where
        I: IntoIterator<Item = (N, S)>,
        N: Into<String>,
        S: Into<String>,
    {
        let mut tokens: Vec<Token> = Vec::new();
        for (name, secret) in pairs {
            let name = name.into();
            let secret = secret.into();
            validate_name(&name)?;
            if secret.chars().count() < MIN_TOKEN_LEN {
                return Err(TokenError::TooShort { name });
            }
            if secret.chars().any(char::is_whitespace) {
                return Err(TokenError::Malformed {
                    line: tokens.len() + 1,
                    reason: format!("token {name:?} contains whitespace"),
                });
            }
            if tokens.iter().any(|token| token.name == name) {
                return Err(TokenError::DuplicateName(name));
            }
            if let Some(twin) = tokens.iter().find(|token| token.secret == secret.as_bytes()) {
                return Err(TokenError::DuplicateSecret(twin.name.clone(), name));
            }
            tokens.push(Token { name, secret: secret.into_bytes() });
        }
        Ok(TokenSet { tokens: tokens.into() })
    }

    /// Reads a token file: one token per line, either `secret` or `name:secret` (the
    /// name is what precedes the first `:`); blank lines and lines starting with `#`
    /// are ignored. A token without a name is called `line<N>` after its line number.
    /// The file must not be readable or writable by group or others, and must hold at
    /// least one token.
    pub fn load(path: &Path) -> Result<TokenSet, TokenError> {
        let read_error = |source| TokenError::Read { path: path.to_path_buf(), source };
        // The mode is checked on the handle that is read, so the file cannot be swapped
        // between the check and the read.
        let file = std::fs::File::open(path).map_err(read_error)?;
        let mode = file.metadata().map_err(read_error)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(TokenError::Permissions { path: path.to_path_buf(), mode: mode & 0o777 });
        }
        let text = std::io::read_to_string(file).map_err(read_error)?;
        let set = TokenSet::parse(&text)?;
        if set.is_empty() {
            return Err(TokenError::NoTokens { path: path.to_path_buf() });
        }
        Ok(set)
    }

    /// Parses the token file format (see [`TokenSet::load`]).
    pub fn parse(text: &str) -> Result<TokenSet, TokenError> {
        let mut pairs = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line_number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, secret) = match line.split_once(':') {
                Some((name, secret)) => (name.trim().to_owned(), secret.trim().to_owned()),
                None => (format!("line{line_number}"), line.to_owned()),
            };
            if secret.is_empty() {
                return Err(TokenError::Malformed {
                    line: line_number,
                    reason: "a name without a token".to_owned(),
                });
            }
            pairs.push((name, secret));
        }
        TokenSet::from_pairs(pairs)
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The tokens' names, in file order.
    pub fn names(&self) -> Vec<&str> {
        self.tokens.iter().map(|token| token.name.as_str()).collect()
    }

    /// The name of the token equal to `presented`, if any. Every token is compared in
    /// full, whatever matches, so the time taken tells nothing about the secrets.
    pub fn authenticate(&self, presented: &[u8]) -> Option<&str> {
        let mut found = None;
        for token in self.tokens.iter() {
            if constant_time_eq(&token.secret, presented) {
                found = Some(token.name.as_str());
            }
        }
        found
    }
}

fn validate_name(name: &str) -> Result<(), TokenError> {
    let plain = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if plain { Ok(()) } else { Err(TokenError::BadName(name.to_owned())) }
}

/// Compares a secret with a presented value without an early return: every byte of
/// the secret is visited and the differences are folded together, so the time taken
/// does not tell where the first difference is.
fn constant_time_eq(secret: &[u8], presented: &[u8]) -> bool {
    let mut difference = secret.len() ^ presented.len();
    for (index, byte) in secret.iter().enumerate() {
        let other = presented.get(index).copied().unwrap_or(!*byte);
        difference |= usize::from(byte ^ other);
    }
    std::hint::black_box(difference) == 0
}

/// How the TCP transport is limited and who may use it.
#[derive(Clone, Debug)]
pub struct TcpOptions {
    /// The accepted bearer tokens; empty is only allowed on a loopback address, and
    /// then nothing but `/healthz` can be used.
    pub tokens: TokenSet,
    /// The largest request body or WebSocket message.
    pub max_message_bytes: usize,
    /// Open TCP connections served at once; past it clients get `429`.
    pub max_connections: usize,
}

impl TcpOptions {
    /// The given tokens with the default limits.
    pub fn new(tokens: TokenSet) -> TcpOptions {
        TcpOptions {
            tokens,
            max_message_bytes: super::DEFAULT_MAX_MESSAGE_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
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
    tokens: TokenSet,
    max_message_bytes: usize,
}

/// Who authenticated a request: `token:<name>`.
#[derive(Clone)]
struct Identity(String);

/// The address a request came from, for the log.
#[derive(Clone, Copy)]
struct Peer(SocketAddr);

/// A connection's slot under the connection cap. A WebSocket keeps a clone for its
/// whole life, since it outlives the HTTP connection task that upgraded it.
#[derive(Clone)]
struct ConnectionSlot(#[expect(dead_code, reason = "held, never read")] Arc<OwnedSemaphorePermit>);

/// The routes, with authentication and the body limit but without the connection cap
/// (that belongs to [`serve`]'s accept loop).
pub fn router(daemon: Arc<Daemon>, options: &TcpOptions) -> Router {
    let shared = Arc::new(Shared {
        daemon,
        tokens: options.tokens.clone(),
        max_message_bytes: options.max_message_bytes,
    });
    let authenticated = Router::new()
        .route("/rpc", post(rpc_post))
        .route("/ws", get(rpc_ws))
        .route_layer(middleware::from_fn_with_state(shared.clone(), require_token))
        .layer(DefaultBodyLimit::max(options.max_message_bytes));
    Router::new().route("/healthz", get(healthz)).merge(authenticated).with_state(shared)
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Lets a request through only with a known bearer token, recording whose it is.
async fn require_token(
    State(shared): State<Arc<Shared>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(presented) = bearer_token(request.headers()) else {
        return unauthorized("Bearer realm=\"toolgate\"", "a bearer token is required\n");
    };
    let Some(name) = shared.tokens.authenticate(presented) else {
        let peer = request.extensions().get::<Peer>().map(|peer| peer.0);
        tracing::info!(?peer, "request with an unknown bearer token refused");
        return unauthorized(
            "Bearer realm=\"toolgate\", error=\"invalid_token\"",
            "the bearer token is not valid\n",
        );
    };
    let identity = Identity(format!("token:{name}"));
    request.extensions_mut().insert(identity);
    next.run(request).await
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = value[7..].trim_ascii();
    if token.is_empty() { None } else { Some(token) }
}

fn unauthorized(challenge: &'static str, message: &'static str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge))],
        message,
    )
        .into_response()
}

/// `POST /rpc`: one message in, its response out, on a connection of its own.
async fn rpc_post(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let Some(Identity(identity)) = request.extensions().get::<Identity>().cloned() else {
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
    let Some(Identity(identity)) = request.extensions().get::<Identity>().cloned() else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let slot = request.extensions().get::<ConnectionSlot>().cloned();
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

/// Answers every request with `429` and closes: what a connection past the cap gets.
async fn too_many(_request: Request) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, HeaderValue::from_static("1"))],
        "too many connections\n",
    )
        .into_response()
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
    let slots = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    let connections = TaskTracker::new();
    let shutdown = daemon.shutdown_token().clone();
    tracing::info!(%address, "listening for remote agents");
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                // EMFILE and friends: log, breathe, and keep serving.
                tracing::warn!(%err, "accept failed on the tcp listener");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Requests and responses are small and latency-bound.
        let _ = stream.set_nodelay(true);
        if let Ok(permit) = slots.clone().try_acquire_owned() {
            let slot = ConnectionSlot(Arc::new(permit));
            let app = app.clone();
            let service = hyper::service::service_fn(move |request: HyperRequest| {
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(slot.clone());
                request.extensions_mut().insert(Peer(peer));
                app.clone().oneshot(request)
            });
            let shutdown = shutdown.clone();
            let serving = serve_connection(stream, service, Admission::Served, shutdown);
            tokio::spawn(connections.track_future(daemon.tasks().track_future(serving)));
        } else if let Ok(permit) = refusals.clone().try_acquire_owned() {
            tracing::debug!(%peer, "connection past the cap refused with 429");
            let service = hyper::service::service_fn(|request: HyperRequest| async move {
                Ok::<_, Infallible>(too_many(request.map(Body::new)).await)
            });
            let shutdown = shutdown.clone();
            let refusing = async move {
                serve_connection(stream, service, Admission::Refused, shutdown).await;
                drop(permit);
            };
            tokio::spawn(connections.track_future(daemon.tasks().track_future(refusing)));
        } else {
            tracing::debug!(%peer, "connection past every cap closed unanswered");
            drop(stream);
        }
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

type HyperRequest = axum::http::Request<hyper::body::Incoming>;

/// Whether a connection got a slot under the cap or is only going to be told `429`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Admission {
    Served,
    Refused,
}

/// Serves one HTTP/1.1 connection (with upgrades, for WebSocket) until it closes, or
/// until shutdown plus a grace period. A refused connection gets no keep-alive and
/// less patience.
async fn serve_connection<S>(
    stream: TcpStream,
    service: S,
    admission: Admission,
    shutdown: CancellationToken,
) where
    S: hyper::service::Service<HyperRequest, Response = Response, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let header_timeout = match admission {
        Admission::Served => HEADER_READ_TIMEOUT,
        Admission::Refused => REFUSAL_HEADER_TIMEOUT,
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(admission == Admission::Served);
    let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service).with_upgrades());
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(err) = result {
                tracing::debug!(%err, "http connection ended with an error");
            }
        }
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            if tokio::time::timeout(SHUTDOWN_GRACE, conn).await.is_err() {
                tracing::debug!("http connection cut at shutdown");
            }
        }
    }
}

fn is_connection_error(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_matches_only_equal_bytes() {
        assert!(constant_time_eq(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcdeX"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcde"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcdef0"));
        assert!(!constant_time_eq(b"0123456789abcdef", b""));
        // A presented value whose missing bytes would read as equal still differs.
        assert!(!constant_time_eq(&[0u8; 16], &[0u8; 15]));
    }

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
    fn bearer_token_reads_the_authorization_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer_token(&headers), None);
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer  abc "));
        assert_eq!(bearer_token(&headers), Some(&b"abc"[..]));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer abc"));
        assert_eq!(bearer_token(&headers), Some(&b"abc"[..]));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer_token(&headers), None);
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer_token(&headers), None);
    }

    #[test]
    fn notifications_are_told_from_responses_by_their_prefix() {
        let event = super::super::jsonrpc::notification("events", &serde_json::json!({}));
        assert!(event.starts_with(NOTIFICATION_PREFIX));
        let response = super::super::jsonrpc::response(&serde_json::json!(1), &"x");
        assert!(!response.starts_with(NOTIFICATION_PREFIX));
    }
}
