//! MCP over Streamable HTTP: the `/mcp` endpoint.
//!
//! rmcp's `StreamableHttpService` serves the protocol (POST with JSON or SSE
//! answers, GET for the server's own SSE stream, DELETE to end a session,
//! `MCP-Protocol-Version` checks, 404 for unknown sessions, and the stateless
//! 2026-07-28 requests). In front of it sit toolgate's own guards, in this order:
//! 1. `Host` and `Origin` must name this machine (localhost, 127.0.0.1, [::1]) or a
//!    configured name, else 403 — DNS-rebinding protection for a server that can run
//!    commands;
//! 2. the bearer token ([`crate::auth`], the same check as the native TCP transport),
//!    else 401 with a body that says how to pass it. There is no unauthenticated MCP
//!    over HTTP: with no tokens every request is refused, and `toolgate mcp --http`
//!    without a token file generates one. The challenge points at no OAuth metadata
//!    and none is served (`/.well-known/...` answers 404), so MCP clients report that a
//!    bearer token is needed instead of starting an OAuth flow toolgate cannot finish.
//!
//! The authenticated token's name is the client identity of the sessions its requests
//! open (`token:<name>`), read from the request by the handler. A session is bound to
//! the identity that opened it ([`RandomIdSessions`]): a request that carries its id
//! with any other token is answered as for a session that does not exist (404 for a
//! POST or GET, the acknowledgement of a DELETE of an unknown id, which ends nothing),
//! so holding another client's session id reaches nothing of that session, and the
//! answer does not tell whether the session exists.
//!
//! Connections are admitted by [`crate::admission`] ([`serve_http`]): header and
//! authentication deadlines, unauthenticated connections counted apart from the
//! authenticated ones, idle keep-alive connections cut.
//!
//! Behind them, two answers are adjusted: rmcp's 202 for a DELETE that ended a session
//! becomes the 200 that the reference servers send and the Python SDK expects; and a
//! body that is not a JSON-RPC message, which rmcp refuses with `415` and a text body,
//! gets the JSON-RPC error every other face answers (`-32700` parse error for
//! malformed JSON, `-32600` invalid request for JSON that is no message) with `400`
//! (see [`json_rpc_errors`]).
//!
//! Session ids are 128 bits from the OS CSPRNG (see [`RandomIdSessions`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::WorkerTransport;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, create_local_session,
};
use rmcp::transport::streamable_http_server::session::{
    EventStore, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::server::McpHandler;
use super::{Face, McpOptions};
use crate::admission::Limits;
use crate::auth::Gate;
use crate::daemon::Daemon;
use crate::rpc::jsonrpc::{INVALID_REQUEST, PARSE_ERROR};

/// What MCP clients need to hear besides the common advice of a 401.
const HINT: &str = "toolgate runs no OAuth authorization server: give the header to the MCP \
client in its server entry (e.g. \"headers\": {\"Authorization\": \"Bearer <token>\"}).";

/// Host names that always mean this machine.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The `/mcp` endpoint as an axum router (the daemon mounts it on its `mcp_http`
/// listener; loopback by default).
pub fn http_router(daemon: Arc<Daemon>, options: McpOptions) -> axum::Router {
    let face = Face::new(daemon.clone(), options.clone());
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = daemon.shutdown_token().child_token();
    config.max_request_body_bytes = options.max_message_bytes;
    // Host and Origin are checked by `guard` below with the same lists; rmcp's own
    // Host check must agree so that it never rejects what the guard accepted.
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|host| (*host).to_owned()).collect();
    hosts.extend(options.allowed_hosts.iter().cloned());
    config.allowed_hosts = hosts;
    let service = StreamableHttpService::new(
        move || Ok(McpHandler::new(face.clone())),
        Arc::new(RandomIdSessions::default()),
        config,
    );
    let gate = Arc::new(Gate { tokens: options.tokens.clone(), hint: HINT });
    let guard = Arc::new(Guard {
        allowed_hosts: options.allowed_hosts.iter().map(|host| host.to_ascii_lowercase()).collect(),
        allowed_origins: options.allowed_origins.clone(),
    });
    // Layers run last-added first: Host and Origin, then the token, then (for an
    // authenticated request only) the JSON-RPC error answers and the requester's
    // identity for the session checks. Only `/mcp` is routed; anything else (OAuth
    // metadata and client registration included) is 404 with a body that says how to
    // authenticate instead.
    let limit = options.max_message_bytes;
    axum::Router::new()
        .route_service("/mcp", service)
        .fallback(not_served)
        .route_layer(middleware::from_fn(as_requester))
        .route_layer(middleware::from_fn(move |request, next| {
            json_rpc_errors(limit, request, next)
        }))
        .route_layer(middleware::from_fn_with_state(gate, crate::auth::require_bearer))
        .layer(middleware::from_fn_with_state(guard, check))
}

/// Serves the `/mcp` endpoint on `listener` until `shutdown`, with the connection
/// limits of [`crate::admission`].
pub async fn serve_http(
    daemon: Arc<Daemon>,
    listener: tokio::net::TcpListener,
    options: McpOptions,
    limits: Limits,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let tasks = daemon.tasks().clone();
    let router = http_router(daemon, options);
    crate::admission::serve_http(listener, router, limits, shutdown, tasks).await;
}

/// What a request must satisfy before it reaches the protocol.
struct Guard {
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
}

async fn check(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    if let Err(response) = guard.admit(request.headers()) {
        return response;
    }
    let is_delete = request.method() == axum::http::Method::DELETE;
    let mut response = next.run(request).await;
    // A session ended by DELETE is answered 200, as the reference servers (TypeScript
    // and Python SDKs) do; rmcp says 202, which the Python SDK's client (1.x and 2.x)
    // reports as "Session termination failed: 202".
    if is_delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

/// Answers a POSTed JSON body that is not a JSON-RPC message the way every other face
/// does: HTTP 400 with a JSON-RPC error, `-32700` when the body is not JSON at all and
/// `-32600` when it is JSON but no message, instead of rmcp's `415` with a text body
/// (which it also uses, rightly, for a body that is not declared as JSON). The body is
/// kept (a cheap shared copy of what rmcp reads anyway) and parsed again only when rmcp
/// refused it.
async fn json_rpc_errors(limit: usize, request: Request, next: Next) -> Response {
    let declared_json = request.method() == axum::http::Method::POST
        && request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| {
                let essence = value.split_once(';').map_or(value, |(essence, _)| essence);
                essence.trim().eq_ignore_ascii_case("application/json")
            });
    if !declared_json {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => bytes,
        Err(_) => {
            let text = format!("Payload Too Large: request body exceeds {limit} bytes");
            return (StatusCode::PAYLOAD_TOO_LARGE, text).into_response();
        }
    };
    let request = Request::from_parts(parts, axum::body::Body::from(bytes.clone()));
    let response = next.run(request).await;
    if response.status() != StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return response;
    }
    let (id, error) = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Err(err) => (serde_json::Value::Null, (PARSE_ERROR, format!("parse error: {err}"))),
        Ok(value) => {
            let id = value.get("id").filter(|id| id.is_string() || id.is_number()).cloned();
            (
                id.unwrap_or_default(),
                (
                    INVALID_REQUEST,
                    "invalid request: not a JSON-RPC request, notification or response of MCP"
                        .to_owned(),
                ),
            )
        }
    };
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": error.0, "message": error.1},
    });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

tokio::task_local! {
    /// The identity (`token:<name>`) of the request rmcp is handling, for
    /// [`RandomIdSessions`]: set around every authenticated request.
    static REQUESTER: Arc<str>;
}

/// Runs the rest of an authenticated request as its identity ([`REQUESTER`]). A request
/// without one (the bearer check lets none through) runs as nobody, which owns no
/// session and may open none.
async fn as_requester(request: Request, next: Next) -> Response {
    let Some(identity) = request.extensions().get::<crate::auth::Identity>() else {
        return next.run(request).await;
    };
    let requester: Arc<str> = identity.to_string().into();
    REQUESTER.scope(requester, next.run(request)).await
}

/// Every path but `/mcp`: 404. An MCP client that answered a 401 by starting an
/// OAuth flow looks for metadata under `/.well-known/` and then registers itself at
/// `/register`; clients show the body of the refusal that ends the flow (the MCP
/// Inspector: "Dynamic Client Registration rejected (HTTP 404): <body>"), so the body
/// says what to do instead.
async fn not_served() -> Response {
    let body = format!(
        "Not found: toolgate serves MCP at /mcp only and runs no OAuth authorization server \
         (no metadata, no client registration). {} {HINT}\n",
        crate::auth::HOW_TO_AUTHENTICATE
    );
    (StatusCode::NOT_FOUND, body).into_response()
}

impl Guard {
    fn admit(&self, headers: &HeaderMap) -> Result<(), Response> {
        let host = headers.get(header::HOST).and_then(|value| value.to_str().ok());
        match host {
            Some(host) if self.host_allowed(host) => {}
            Some(_) => return Err(forbidden("Host not allowed")),
            None => return Err((StatusCode::BAD_REQUEST, "Host header required").into_response()),
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let allowed = origin.to_str().is_ok_and(|origin| self.origin_allowed(origin));
            if !allowed {
                return Err(forbidden("Origin not allowed"));
            }
        }
        Ok(())
    }

    /// `host` is a Host header: `name`, `name:port`, `[v6]` or `[v6]:port`.
    fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        if self.allowed_hosts.iter().any(|allowed| allowed == &host) {
            return true;
        }
        let name = host_name(&host);
        LOOPBACK_HOSTS.contains(&name) || self.allowed_hosts.iter().any(|allowed| allowed == name)
    }

    /// `origin` is `scheme://host[:port]`; `null` and anything unparsable are refused.
    fn origin_allowed(&self, origin: &str) -> bool {
        if self.allowed_origins.iter().any(|allowed| allowed == origin) {
            return true;
        }
        let Some((scheme, authority)) = origin.split_once("://") else {
            return false;
        };
        if !matches!(scheme, "http" | "https") || authority.contains('/') {
            return false;
        }
        let name = host_name(&authority.to_ascii_lowercase()).to_owned();
        LOOPBACK_HOSTS.contains(&name.as_str())
            || self.allowed_hosts.iter().any(|allowed| allowed == &name)
    }
}

/// The name part of `host[:port]` or `[v6][:port]` (brackets removed).
fn host_name(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => authority,
    }
}

fn forbidden(why: &'static str) -> Response {
    (StatusCode::FORBIDDEN, why).into_response()
}

/// rmcp's in-memory sessions under ids of 128 random bits from the OS CSPRNG
/// (rmcp's own ids are UUIDv4, 122 bits), each bound to the identity of the request
/// that created it. Sessions are created here with our id and their owner; every other
/// operation is rmcp's, for the owner only: to any other requester a session is
/// unknown (`has_session` is false, so rmcp answers 404; a DELETE closes nothing and is
/// acknowledged as for an unknown id). Only rmcp itself, ending a session whose service
/// has stopped, closes a session outside a request.
#[derive(Default)]
pub(crate) struct RandomIdSessions {
    inner: LocalSessionManager,
    /// Who opened each live session.
    owners: std::sync::Mutex<HashMap<SessionId, Arc<str>>>,
}

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionsError {
    #[error(transparent)]
    Inner(#[from] LocalSessionManagerError),
    #[error("the system random generator failed: {0}")]
    Random(getrandom::Error),
    #[error("a session is opened only by an authenticated request")]
    Anonymous,
}

impl RandomIdSessions {
    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<str>>> {
        self.owners.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the request being handled may see session `id`: it exists and was
    /// opened by the requester's identity.
    fn visible(&self, id: &SessionId) -> bool {
        REQUESTER
            .try_with(|requester| self.owners().get(id).is_some_and(|owner| owner == requester))
            .unwrap_or(false)
    }

    /// `Ok` when the requester may use session `id`, else the error rmcp's manager
    /// gives for a session it does not have.
    fn check(&self, id: &SessionId) -> Result<(), SessionsError> {
        if self.visible(id) {
            return Ok(());
        }
        Err(LocalSessionManagerError::SessionNotFound(id.clone()).into())
    }
}

impl SessionManager for RandomIdSessions {
    type Error = SessionsError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let owner = REQUESTER.try_with(Arc::clone).map_err(|_| SessionsError::Anonymous)?;
        let id: SessionId = super::random_hex().map_err(SessionsError::Random)?.into();
        let (handle, worker) = create_local_session(id.clone(), self.inner.session_config.clone());
        // Bound before it exists: there is no moment at which it has no owner.
        self.owners().insert(id.clone(), owner);
        self.inner.sessions.write().await.insert(id.clone(), handle);
        Ok((id, WorkerTransport::spawn(worker)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.check(id)?;
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.visible(id) && self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        // In a request (a DELETE), only the owner closes; to anyone else the session is
        // unknown, and closing an unknown session does nothing. Outside a request, rmcp
        // is ending a session whose service stopped.
        if REQUESTER.try_with(|_| ()).is_ok() && !self.visible(id) {
            return Ok(());
        }
        let closed = self.inner.close_session(id).await;
        self.owners().remove(id);
        Ok(closed?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.check(id)?;
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.check(id)?;
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.check(id)?;
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.check(id)?;
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    async fn restore_session(
        &self,
        _id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        Ok(RestoreOutcome::NotSupported)
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> Guard {
        Guard {
            allowed_hosts: vec!["toolgate.internal".to_owned()],
            allowed_origins: vec!["https://app.example.com".to_owned()],
        }
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            if let Ok(value) = value.parse() {
                map.insert(name.clone(), value);
            }
        }
        map
    }

    fn status(guard: &Guard, pairs: &[(header::HeaderName, &str)]) -> StatusCode {
        match guard.admit(&headers(pairs)) {
            Ok(()) => StatusCode::OK,
            Err(response) => response.status(),
        }
    }

    #[test]
    fn hosts_and_origins() {
        let g = guard();
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:9",
            "[::1]",
            "toolgate.internal:80",
        ] {
            assert_eq!(status(&g, &[(header::HOST, host)]), StatusCode::OK, "{host}");
        }
        for host in
            ["evil.example.com", "evil.example.com:80", "127.0.0.1.evil.com", "localhost.evil"]
        {
            assert_eq!(status(&g, &[(header::HOST, host)]), StatusCode::FORBIDDEN, "{host}");
        }
        assert_eq!(status(&g, &[]), StatusCode::BAD_REQUEST);
        for origin in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "http://[::1]:5",
            "https://app.example.com",
        ] {
            assert_eq!(
                status(&g, &[(header::HOST, "localhost"), (header::ORIGIN, origin)]),
                StatusCode::OK,
                "{origin}"
            );
        }
        for origin in [
            "http://evil.example.com",
            "null",
            "file://",
            "http://localhost.evil.com",
            "ftp://localhost",
        ] {
            assert_eq!(
                status(&g, &[(header::HOST, "localhost"), (header::ORIGIN, origin)]),
                StatusCode::FORBIDDEN,
                "{origin}"
            );
        }
    }
}
