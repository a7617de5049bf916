//! The native API, defined once: every method's name, params and result, from which
//! comes the typed client every Rust program uses ([`NativeApiClient`], over any
//! jsonrpsee client: the Unix socket's NDJSON, WebSocket, HTTP). The daemon serves
//! the same methods with its own dispatch core ([`super::Connection`]) on every
//! transport; `tests/rpc_api.rs` holds the two to each other.
//!
//! The wire types are `crate::protocol`'s, unchanged: a method's params are one JSON
//! object, the fields of its `*Params` type. jsonrpsee's `#[rpc]` macro would send a
//! method's arguments as a positional array or as an object keyed by argument name,
//! which is another protocol; so the definition is [`native_api!`] below, a table the
//! client trait is generated from, with the params passed through as they are
//! ([`AsParams`]).
//!
//! A program that only talks to a daemon builds this module alone, with `protocol` and
//! `wire`: `toolgate = { version = "0.1", default-features = false, features = ["client"] }`
//! (the server side below is compiled with the feature `daemon` only).
//!
//! Events are a jsonrpsee subscription: `events/subscribe` answers a subscription id
//! and every event arrives as an `events` notification whose params are
//! `{"subscription", "result"}`, which is the native protocol's notification as it
//! always was. Closing a subscription sends `events/unsubscribe` with the id.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use std::pin::Pin;

use jsonrpsee::client_transport::ws::{Url, WsHandshakeError};
use jsonrpsee::core::client::{
    BatchResponse, ClientBuilder, ClientT, Error, ReceivedMessage, Subscription,
    SubscriptionClientT, TransportReceiverT, TransportSenderT,
};
use jsonrpsee::core::params::BatchRequestBuilder;
use jsonrpsee::core::traits::ToRpcParams;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::protocol::*;

/// A method's params sent as the JSON-RPC `params` object itself (the native
/// protocol's shape), not wrapped in an array.
pub struct AsParams<T>(pub T);

impl<T: Serialize> ToRpcParams for AsParams<T> {
    fn to_rpc_params(self) -> Result<Option<Box<RawValue>>, serde_json::Error> {
        serde_json::value::to_raw_value(&self.0).map(Some)
    }
}

/// The params of a method that takes none: sent as `{}`, and anything received is
/// accepted (the daemon ignores them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NoParams {}

impl<'de> Deserialize<'de> for NoParams {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<NoParams, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer)?;
        Ok(NoParams {})
    }
}

/// The one definition of the native API. Each line: the Rust name, the method, the
/// params type and the result type. Adding a method here gives it to the typed client;
/// `tests/rpc_api.rs` fails until the daemon's dispatch core answers it.
macro_rules! native_api {
    ($( $(#[$doc:meta])* $name:ident => $method:expr, $params:ty => $result:ty; )*) => {
        /// The native API's methods, by their wire name, in definition order.
        pub const METHODS: &[&str] = &[$($method,)* method::EVENTS_SUBSCRIBE];

        /// The typed client of the native API, for every jsonrpsee client (the Unix
        /// socket's NDJSON from [`connect_unix`], [`connect_ws`], [`connect_http`]).
        pub trait NativeApiClient: SubscriptionClientT + Sync {
            $(
                $(#[$doc])*
                fn $name(&self, params: $params)
                    -> impl Future<Output = Result<$result, Error>> + Send
                {
                    self.request($method, AsParams(params))
                }
            )*

            /// `events/subscribe`: the session's events, its backlog first. Dropping
            /// the subscription (or [`Subscription::unsubscribe`]) sends
            /// `events/unsubscribe`. Events this client does not know (from a newer
            /// daemon) arrive as `Err` items, and the stream goes on.
            fn subscribe_events(&self, params: EventsSubscribeParams)
                -> impl Future<Output = Result<Subscription<Event>, Error>> + Send
            {
                self.subscribe(
                    method::EVENTS_SUBSCRIBE,
                    AsParams(params),
                    method::EVENTS_UNSUBSCRIBE,
                )
            }
        }

        impl<C: SubscriptionClientT + Sync> NativeApiClient for C {}
    };
}

native_api! {
    /// `session/open`: a new session on this connection, narrowed from the configuration.
    session_open => method::SESSION_OPEN, SessionOpenParams => SessionOpenResult;
    /// `session/update`: narrows a session (anything wider is refused, nothing changes).
    session_update => method::SESSION_UPDATE, SessionUpdateParams => SessionUpdateResult;
    /// `session/close`: closes a session this connection opened.
    session_close => method::SESSION_CLOSE, SessionCloseParams => SessionCloseResult;
    /// `tools/list`: the tools the session may see, sorted by name, with their sources.
    tools_list => method::TOOLS_LIST, ToolsListParams => ToolsListResult;
    /// `tools/call`: one call through the session's whole pipeline.
    tools_call => method::TOOLS_CALL, ToolsCallParams => ToolsCallResult;
    /// `tools/call_batch`: one model turn; results in call order.
    tools_call_batch => method::TOOLS_CALL_BATCH, ToolsCallBatchParams => ToolsCallBatchResult;
    /// `tools/cancel`: cancels the running calls with an id.
    tools_cancel => method::TOOLS_CANCEL, ToolsCancelParams => ToolsCancelResult;
    /// `tools/explain`: which layer and rule would decide a call, without running it.
    tools_explain => method::TOOLS_EXPLAIN, ToolsExplainParams => ToolsExplainResult;
    /// `events/unsubscribe`: ends a subscription; false when there was none.
    events_unsubscribe => method::EVENTS_UNSUBSCRIBE, EventsUnsubscribeParams => bool;
    /// `permission/respond`: answers a `permission_request` event.
    permission_respond => method::PERMISSION_RESPOND, PermissionRespondParams => PermissionRespondResult;
    /// `daemon/status`: the daemon's version, load, upstreams and sandbox.
    daemon_status => method::DAEMON_STATUS, NoParams => DaemonStatusResult;
}

/// How long the typed client waits for one answer. Calls may wait for a person or run
/// a long command; the daemon bounds them itself (the session's deadline, the approval
/// timeout), so the client's bound is only against a daemon that never answers.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// Events a subscription holds for a reader that is behind; past it the subscription
/// is closed (the daemon counts its own losses separately).
pub const SUBSCRIPTION_BUFFER: usize = 4096;

/// The largest message the typed client reads.
pub const MAX_MESSAGE_BYTES: usize = 4 * DEFAULT_MAX_MESSAGE_BYTES;

/// The typed client on a stream that speaks the native NDJSON framing (one message per
/// line), e.g. a Unix socket or a `toolgate serve --stdio` child's pipes.
pub fn ndjson_client<R, W>(reader: R, writer: W) -> jsonrpsee::core::client::Client
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    ClientBuilder::default()
        .request_timeout(REQUEST_TIMEOUT)
        .max_buffer_capacity_per_subscription(SUBSCRIPTION_BUFFER)
        .build_with_tokio(
            LineSender { writer },
            LineReceiver { reader: BufReader::new(reader), max: MAX_MESSAGE_BYTES },
        )
}

/// The typed client on the daemon's Unix socket.
pub async fn connect_unix(path: &Path) -> std::io::Result<jsonrpsee::core::client::Client> {
    let stream = tokio::net::UnixStream::connect(path).await?;
    Ok(unix_client(stream))
}

/// The typed client on an already connected Unix socket.
pub fn unix_client(stream: tokio::net::UnixStream) -> jsonrpsee::core::client::Client {
    let (reader, writer) = stream.into_split();
    ndjson_client(reader, writer)
}

/// `Authorization: Bearer <token>`, for the TCP face's clients.
fn bearer(token: &str) -> Result<jsonrpsee::client_transport::ws::HeaderMap, Error> {
    let mut headers = jsonrpsee::client_transport::ws::HeaderMap::new();
    let value = jsonrpsee::client_transport::ws::HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|err| Error::Custom(format!("the token cannot be sent in a header: {err}")))?;
    headers.insert("authorization", value);
    Ok(headers)
}

/// The typed client over the TCP face's WebSocket (`ws://host:port/ws`) with a bearer
/// token: the streaming path (events, approvals, long sessions).
///
/// A refused token fails with the daemon's answer: its status and the body that says
/// how to pass the token.
pub async fn connect_ws(url: &str, token: &str) -> Result<jsonrpsee::core::client::Client, Error> {
    let address = url;
    let url: Url = url.parse().map_err(|err| Error::Transport(format!("{url}: {err}").into()))?;
    let limit = u32::try_from(MAX_MESSAGE_BYTES).unwrap_or(u32::MAX);
    let connected = jsonrpsee::client_transport::ws::WsTransportClientBuilder {
        headers: bearer(token)?,
        max_request_size: limit,
        max_response_size: limit,
        ..Default::default()
    }
    .build(url)
    .await
    .map_err(|err| match err {
        WsHandshakeError::Rejected { status_code } => Refused::Status(status_code),
        other => Refused::Other(Error::Transport(other.into())),
    });
    let (sender, receiver) = match connected {
        Ok(transport) => transport,
        Err(Refused::Status(status)) => return Err(refused(address, token, status).await),
        Err(Refused::Other(error)) => return Err(error),
    };
    Ok(ClientBuilder::default()
        .request_timeout(REQUEST_TIMEOUT)
        .max_buffer_capacity_per_subscription(SUBSCRIPTION_BUFFER)
        .build_with_tokio(sender, receiver))
}

/// The typed client over the TCP face's plain HTTP (`http://host:port/rpc`) with a
/// bearer token. Each request is a connection of its own with a fresh default session:
/// no events (subscribing fails), nothing carried from one request to the next.
///
/// A request refused for its token fails with the daemon's answer: its status and the
/// body that says how to pass the token.
pub fn connect_http(url: &str, token: &str) -> Result<HttpClient, Error> {
    let limit = u32::try_from(MAX_MESSAGE_BYTES).unwrap_or(u32::MAX);
    let inner = jsonrpsee_http_client::HttpClientBuilder::default()
        .set_headers(bearer(token)?)
        .request_timeout(REQUEST_TIMEOUT)
        .max_request_size(limit)
        .max_response_size(limit)
        .build(url)?;
    Ok(HttpClient { inner, url: url.to_owned(), token: token.to_owned() })
}

/// The typed client over HTTP ([`connect_http`]): jsonrpsee's HTTP client, whose
/// refusals carry what the daemon said (jsonrpsee's own keep only the status).
#[derive(Clone, Debug)]
pub struct HttpClient {
    inner: jsonrpsee_http_client::HttpClient,
    url: String,
    token: String,
}

impl HttpClient {
    /// `error` with the daemon's answer when the daemon refused the request.
    async fn explained(&self, error: Error) -> Error {
        let status = match &error {
            Error::Transport(source) => match source.downcast_ref() {
                Some(jsonrpsee_http_client::transport::Error::Rejected { status_code }) => {
                    *status_code
                }
                _ => return error,
            },
            _ => return error,
        };
        refused(&self.url, &self.token, status).await
    }
}

impl ClientT for HttpClient {
    async fn notification<Params>(&self, method: &str, params: Params) -> Result<(), Error>
    where
        Params: ToRpcParams + Send,
    {
        let error = match self.inner.notification(method, params).await {
            Ok(()) => return Ok(()),
            Err(error) => error,
        };
        Err(self.explained(error).await)
    }

    async fn request<R, Params>(&self, method: &str, params: Params) -> Result<R, Error>
    where
        R: DeserializeOwned,
        Params: ToRpcParams + Send,
    {
        let error = match self.inner.request(method, params).await {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        Err(self.explained(error).await)
    }

    async fn batch_request<'a, R>(
        &self,
        batch: BatchRequestBuilder<'a>,
    ) -> Result<BatchResponse<'a, R>, Error>
    where
        R: DeserializeOwned + std::fmt::Debug + 'a,
    {
        let error = match self.inner.batch_request(batch).await {
            Ok(answers) => return Ok(answers),
            Err(error) => error,
        };
        Err(self.explained(error).await)
    }
}

impl SubscriptionClientT for HttpClient {
    /// Fails: HTTP carries no events.
    fn subscribe<'a, Notif, Params>(
        &self,
        subscribe_method: &'a str,
        params: Params,
        unsubscribe_method: &'a str,
    ) -> impl Future<Output = Result<Subscription<Notif>, Error>> + Send
    where
        Params: ToRpcParams + Send,
        Notif: DeserializeOwned,
    {
        self.inner.subscribe(subscribe_method, params, unsubscribe_method)
    }

    /// Fails: HTTP carries no events.
    fn subscribe_to_method<Notif>(
        &self,
        method: &str,
    ) -> impl Future<Output = Result<Subscription<Notif>, Error>> + Send
    where
        Notif: DeserializeOwned,
    {
        self.inner.subscribe_to_method(method)
    }
}

/// How a WebSocket handshake failed: refused with a status, or otherwise.
enum Refused {
    Status(u16),
    Other(Error),
}

/// The most of a refusal's body read.
const REFUSAL_MAX_BYTES: usize = 16 * 1024;

/// How long reading a refusal's body may take.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(10);

/// The error for a request the daemon answered with `status`: for a 401, what the
/// daemon says to it (the reason and how to pass the token) read by asking `url` once
/// more, with the same token, since jsonrpsee's transports keep only the status.
async fn refused(url: &str, token: &str, status: u16) -> Error {
    let said = match status {
        401 => tokio::time::timeout(REFUSAL_TIMEOUT, refusal_body(url, token))
            .await
            .ok()
            .flatten()
            .filter(|body| !body.is_empty()),
        _ => None,
    };
    let message = match said {
        Some(body) => format!("{url}: the daemon refused the request (HTTP {status}): {body}"),
        None => format!("{url}: the daemon refused the request (HTTP {status})"),
    };
    Error::Transport(message.into())
}

/// The body of the answer to `GET url` with the bearer `token` when it is a 401 (the
/// daemon's authentication layer answers every route before the route itself).
async fn refusal_body(url: &str, token: &str) -> Option<String> {
    use hyper::body::Body as _;

    let url: Url = url.parse().ok()?;
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    let stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.ok()?;
    let connection = tokio::spawn(connection);
    let authority = match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    };
    let request = hyper::Request::get(url.path())
        .header(hyper::header::HOST, authority)
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(String::new())
        .ok()?;
    let response = sender.send_request(request).await.ok();
    let mut body = Vec::new();
    if let Some(response) = response.filter(|response| response.status() == 401) {
        let mut incoming = response.into_body();
        while body.len() < REFUSAL_MAX_BYTES {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_frame(cx)).await;
            let Some(Ok(frame)) = frame else { break };
            if let Some(data) = frame.data_ref() {
                body.extend_from_slice(data);
            }
        }
    }
    connection.abort();
    let text = String::from_utf8_lossy(&body[..body.len().min(REFUSAL_MAX_BYTES)]);
    Some(text.trim().to_owned())
}

/// Writes one message per line.
struct LineSender<W> {
    writer: W,
}

impl<W: AsyncWrite + Unpin + Send + 'static> TransportSenderT for LineSender<W> {
    type Error = std::io::Error;

    async fn send(&mut self, message: String) -> Result<(), Self::Error> {
        let mut line = message.into_bytes();
        line.push(b'\n');
        self.writer.write_all(&line).await?;
        self.writer.flush().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.writer.shutdown().await
    }
}

/// Reads one message per line, at most `max` bytes each.
struct LineReceiver<R> {
    reader: BufReader<R>,
    max: usize,
}

impl<R: AsyncRead + Unpin + Send + 'static> TransportReceiverT for LineReceiver<R> {
    type Error = std::io::Error;

    async fn receive(&mut self) -> Result<ReceivedMessage, Self::Error> {
        loop {
            let mut line = Vec::new();
            let limit = u64::try_from(self.max).unwrap_or(u64::MAX).saturating_add(1);
            let read = (&mut self.reader).take(limit).read_until(b'\n', &mut line).await?;
            if read == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if line.last() != Some(&b'\n') && line.len() > self.max {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a message longer than {} bytes", self.max),
                ));
            }
            let text = String::from_utf8(line)
                .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidData, err))?;
            if !text.trim().is_empty() {
                return Ok(ReceivedMessage::Text(text));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test fixtures fail loudly")]

    use super::*;

    #[test]
    fn params_are_sent_as_the_object_itself() {
        let raw = AsParams(ToolsCancelParams { call_id: "c1".into(), session_id: None })
            .to_rpc_params()
            .unwrap()
            .unwrap();
        assert_eq!(raw.get(), r#"{"call_id":"c1"}"#);
        let raw = AsParams(NoParams {}).to_rpc_params().unwrap().unwrap();
        assert_eq!(raw.get(), "{}");
    }

    #[test]
    fn every_method_of_the_protocol_is_defined_once() {
        let mut methods = METHODS.to_vec();
        methods.sort_unstable();
        let before = methods.len();
        methods.dedup();
        assert_eq!(before, methods.len(), "a method is defined twice");
        for name in [
            method::SESSION_OPEN,
            method::SESSION_UPDATE,
            method::SESSION_CLOSE,
            method::TOOLS_LIST,
            method::TOOLS_CALL,
            method::TOOLS_CALL_BATCH,
            method::TOOLS_CANCEL,
            method::TOOLS_EXPLAIN,
            method::EVENTS_SUBSCRIBE,
            method::EVENTS_UNSUBSCRIBE,
            method::PERMISSION_RESPOND,
            method::DAEMON_STATUS,
        ] {
            assert!(METHODS.contains(&name), "{name} is not defined");
        }
    }

    #[test]
    fn an_unsubscribe_by_position_reads_as_the_named_one() {
        // jsonrpsee's client closes a subscription with `[id]`; the daemon reads it.
        let params: EventsUnsubscribeParams =
            serde_json::from_value(serde_json::json!(["sub-1-1"])).unwrap();
        assert_eq!(params.subscription, "sub-1-1");
    }
}
