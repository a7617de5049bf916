//! End-to-end tests of the TCP transport: a real listener on 127.0.0.1:0 served by
//! `rpc::tcp::serve`, driven by raw HTTP/1.1 over `TcpStream` and by a
//! `tokio-tungstenite` WebSocket client.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test setup fails its test by panicking"
)]

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use support::within;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use toolgate::auth::{TokenError, TokenSet};
use toolgate::daemon::{Daemon, Settings};
use toolgate::rpc::tcp::{self, TcpError, TcpOptions};
use toolgate::tools::{Definition, Registry, Safety, Tool, ToolContext, ToolResult};

const TOKEN: &str = "ci-secret-0123456789abcdef";
const OTHER_TOKEN: &str = "laptop-secret-fedcba9876543210";

/// Arguments of the test tools.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ProbeArgs {
    text: String,
}

/// Answers `probe:<text>`: shows that arguments reach a tool and its result comes back.
struct Probe(Definition);

#[async_trait::async_trait]
impl Tool for Probe {
    fn definition(&self) -> &Definition {
        &self.0
    }

    async fn execute(&self, args: Value, _ctx: ToolContext) -> ToolResult {
        match toolgate::tools::parse_args::<ProbeArgs>(args) {
            Ok(args) => ToolResult::success(format!("probe:{}", args.text)),
            Err(result) => result,
        }
    }
}

/// Runs until its call is canceled: stands for a long call whose client goes away.
struct Hold(Definition);

#[async_trait::async_trait]
impl Tool for Hold {
    fn definition(&self) -> &Definition {
        &self.0
    }

    async fn execute(&self, _args: Value, ctx: ToolContext) -> ToolResult {
        ctx.cancel.cancelled().await;
        ToolResult::success("released")
    }
}

fn definition(name: &str, input_schema: Value) -> Definition {
    Definition {
        name: name.to_owned(),
        description: format!("test tool {name}"),
        input_schema,
        safety: Safety::ReadOnly,
        system: false,
        timeout: None,
        facts: Default::default(),
    }
}

/// A daemon over a temporary root with a TCP listener, shut down on drop.
struct Server {
    _dir: tempfile::TempDir,
    root: PathBuf,
    addr: SocketAddr,
    daemon: Arc<Daemon>,
    serving: tokio::task::JoinHandle<Result<(), TcpError>>,
}

impl Server {
    async fn start() -> Server {
        Server::start_with(|_| {}).await
    }

    async fn start_with(adjust: impl FnOnce(&mut TcpOptions)) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("notes.txt"), "first line\nsecond line\n").unwrap();
        let registry = Registry::with_builtins();
        registry
            .register(Some(Arc::new(Probe(definition(
                "probe",
                toolgate::tools::schema_for::<ProbeArgs>(),
            )))))
            .unwrap();
        registry
            .register(Some(Arc::new(Hold(definition("hold", json!({"type": "object"}))))))
            .unwrap();
        let daemon = Daemon::new(Arc::new(registry), Settings::for_roots(vec![root.clone()]), None);
        let mut options = TcpOptions::new(
            TokenSet::from_pairs([("ci", TOKEN), ("laptop", OTHER_TOKEN)]).unwrap(),
        );
        adjust(&mut options);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = tokio::spawn(tcp::serve(daemon.clone(), listener, options));
        Server { _dir: dir, root, addr, daemon, serving }
    }

    async fn post(&self, token: Option<&str>, body: &str) -> HttpResponse {
        let auth = token.map(|token| format!("Authorization: Bearer {token}\r\n"));
        let request = format!(
            "POST /rpc HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
             Content-Type: application/json\r\n{}Content-Length: {}\r\n\r\n{body}",
            auth.unwrap_or_default(),
            body.len()
        );
        http(self.addr, request.as_bytes()).await
    }

    async fn websocket(&self, token: &str) -> WsClient {
        let mut request = format!("ws://{}/ws", self.addr).into_client_request().unwrap();
        request.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        let (socket, response) = within(tokio_tungstenite::connect_async(request)).await.unwrap();
        assert_eq!(response.status(), 101);
        socket
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.daemon.begin_shutdown();
    }
}

type WsClient =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Polls a condition until it holds (the safety timeout turns "never" into a failure).
async fn eventually(mut condition: impl FnMut() -> bool) {
    within(async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[derive(Debug)]
struct HttpResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl HttpResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// Sends one raw request (which must ask for `Connection: close`) and reads the whole
/// answer.
async fn http(addr: SocketAddr, request: &[u8]) -> HttpResponse {
    within(async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        parse_response(&raw)
    })
    .await
}

fn parse_response(raw: &[u8]) -> HttpResponse {
    let split = raw.windows(4).position(|window| window == b"\r\n\r\n").unwrap();
    let head = std::str::from_utf8(&raw[..split]).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|line| {
            let (key, value) = line.split_once(':').unwrap();
            (key.trim().to_owned(), value.trim().to_owned())
        })
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(key, value)| {
        key.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body);
    }
    HttpResponse { status, headers, body }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|window| window == b"\r\n").unwrap();
        let size_text = std::str::from_utf8(&raw[..line_end]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// Reads WebSocket messages until the response with `id`, returning it and the event
/// types seen on the way.
async fn ws_until_response(socket: &mut WsClient, id: u64) -> (Value, Vec<String>) {
    let mut events = Vec::new();
    within(async {
        loop {
            let message = socket.next().await.unwrap().unwrap();
            let Message::Text(text) = message else { continue };
            let value: Value = serde_json::from_str(&text).unwrap();
            if value["method"] == "events" {
                events.push(value["params"]["result"]["type"].as_str().unwrap().to_owned());
            } else if value["id"] == id {
                return (value, events);
            }
        }
    })
    .await
}

async fn ws_send(socket: &mut WsClient, message: Value) {
    within(socket.send(Message::text(message.to_string()))).await.unwrap();
}

#[tokio::test]
async fn healthz_answers_without_a_token() {
    let server = Server::start().await;
    let response =
        http(server.addr, b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").await;
    assert_eq!((response.status, response.body.as_slice()), (200, &b"ok\n"[..]));
}

#[tokio::test]
async fn rpc_without_a_valid_bearer_token_is_refused() {
    let server = Server::start().await;
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

    let missing = server.post(None, list).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.header("www-authenticate"), Some("Bearer realm=\"toolgate\""));

    let wrong = server.post(Some("ci-secret-0123456789abcdeX"), list).await;
    assert_eq!(wrong.status, 401);
    let challenge = wrong.header("www-authenticate").unwrap_or_default();
    assert!(
        challenge.starts_with("Bearer realm=\"toolgate\", error=\"invalid_token\""),
        "{challenge}"
    );

    // A prefix of a valid token is not a valid token.
    let prefix = server.post(Some(&TOKEN[..TOKEN.len() - 1]), list).await;
    assert_eq!(prefix.status, 401);

    let request = format!(
        "POST /rpc HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Basic {TOKEN}\r\n\
         Content-Length: {}\r\n\r\n{list}",
        list.len()
    );
    let basic = http(server.addr, request.as_bytes()).await;
    assert_eq!(basic.status, 401);

    let mut ws_request = format!("ws://{}/ws", server.addr).into_client_request().unwrap();
    ws_request.headers_mut().insert("authorization", "Bearer nope-nope-nope-nope".parse().unwrap());
    match within(tokio_tungstenite::connect_async(ws_request)).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 401);
        }
        other => panic!("expected a 401 refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn post_with_a_token_lists_and_calls_tools() {
    let server = Server::start().await;
    let response =
        server.post(Some(TOKEN), r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("application/json"));
    let body = response.json();
    assert_eq!(body["id"], 1);
    let names: Vec<&str> = body["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"read_file"), "{names:?}");
    assert!(names.contains(&"probe"), "{names:?}");

    // The second token works too.
    let call = json!({"jsonrpc": "2.0", "id": "c1", "method": "tools/call",
        "params": {"name": "probe", "arguments": {"text": "over http"}}});
    let response = server.post(Some(OTHER_TOKEN), &call.to_string()).await;
    assert_eq!(response.status, 200);
    let body = response.json();
    assert_eq!(body["id"], "c1");
    assert_eq!(body["result"]["ok"], true, "{body}");
    assert_eq!(body["result"]["content"], "probe:over http");
    assert_eq!(body["result"]["metadata"]["call_id"], "c1");

    // read_file goes through the registry of the same daemon.
    let read = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "read_file", "arguments": {"path": "notes.txt"}}});
    let body = server.post(Some(TOKEN), &read.to_string()).await.json();
    assert_eq!(body["id"], 2);
    assert_eq!(body["result"]["tool"], "read_file", "{body}");
    assert_eq!(body["result"]["metadata"]["call_id"], "2", "{body}");
}

#[tokio::test]
async fn post_answers_batches_and_notifications() {
    let server = Server::start().await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "probe", "arguments": {"text": "a"}}},
        {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 99}},
        {"jsonrpc": "2.0", "id": 2, "method": "no/such_method"}
    ]);
    let response = server.post(Some(TOKEN), &batch.to_string()).await;
    assert_eq!(response.status, 200);
    let answers = response.json();
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(answers[0]["result"]["content"], "probe:a");
    assert_eq!(answers[1]["error"]["code"], -32601);

    let notification = r#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":1}}"#;
    let response = server.post(Some(TOKEN), notification).await;
    assert_eq!((response.status, response.body.len()), (204, 0));

    let response = server.post(Some(TOKEN), "{broken").await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["error"]["code"], -32700);

    let response = server.post(Some(TOKEN), "   ").await;
    assert_eq!(response.status, 400);
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_413() {
    let server = Server::start_with(|options| options.max_message_bytes = 1024).await;
    // The declared length alone is enough to refuse: the body is never sent.
    let request = format!(
        "POST /rpc HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 1025\r\n\r\n"
    );
    let response = http(server.addr, request.as_bytes()).await;
    assert_eq!(response.status, 413);

    // Without a declared length, the body is cut off where it passes the limit.
    let chunk = "x".repeat(2000);
    let request = format!(
        "POST /rpc HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    let response = http(server.addr, request.as_bytes()).await;
    assert_eq!(response.status, 413);

    // A message just under the limit is served.
    let padding = "x".repeat(900);
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "probe", "arguments": {"text": padding}}});
    let body = call.to_string();
    assert!(body.len() <= 1024);
    let response = server.post(Some(TOKEN), &body).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["result"]["ok"], true);
}

#[tokio::test]
async fn websocket_calls_tools_and_streams_events() {
    let server = Server::start().await;
    let mut socket = server.websocket(TOKEN).await;

    ws_send(&mut socket, json!({"jsonrpc": "2.0", "id": 1, "method": "events/subscribe"})).await;
    let (subscribed, _) = ws_until_response(&mut socket, 1).await;
    let subscription = subscribed["result"].as_str().unwrap().to_owned();
    assert!(subscription.starts_with("sub-"), "{subscribed}");

    ws_send(
        &mut socket,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "probe", "arguments": {"text": "over ws"}}}),
    )
    .await;
    let (answer, events) = ws_until_response(&mut socket, 2).await;
    assert_eq!(answer["result"]["content"], "probe:over ws", "{answer}");
    assert_eq!(events, ["tool_call_start", "tool_result", "tool_call_done"]);

    ws_send(
        &mut socket,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "read_file", "arguments": {"path": "notes.txt"}}}),
    )
    .await;
    let (answer, events) = ws_until_response(&mut socket, 3).await;
    assert_eq!(answer["result"]["tool"], "read_file", "{answer}");
    assert_eq!(answer["result"]["metadata"]["call_id"], "3", "{answer}");
    assert_eq!(events, ["tool_call_start", "tool_result", "tool_call_done"]);
    assert!(server.root.join("notes.txt").exists());

    within(socket.close(None)).await.unwrap();
    eventually(|| server.daemon.connection_count() == 0).await;
}

#[tokio::test]
async fn an_oversized_websocket_message_gets_an_error_and_the_socket_stays_open() {
    let server = Server::start_with(|options| options.max_message_bytes = 1024).await;
    let mut socket = server.websocket(TOKEN).await;
    let padding = "x".repeat(1025);
    within(socket.send(Message::text(padding))).await.unwrap();
    let reply = within(socket.next()).await.unwrap().unwrap();
    let reply: Value = serde_json::from_str(reply.to_text().unwrap()).unwrap();
    assert_eq!(reply["error"]["code"], -32600, "{reply}");

    ws_send(&mut socket, json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})).await;
    let (answer, _) = ws_until_response(&mut socket, 7).await;
    assert!(answer["result"]["tools"].is_array(), "{answer}");
}

#[tokio::test]
async fn connections_past_the_cap_get_429() {
    let server = Server::start_with(|options| options.limits.max_authenticated = 1).await;
    let mut socket = server.websocket(TOKEN).await;
    // The WebSocket holds the only slot for as long as it lives.
    ws_send(&mut socket, json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await;
    ws_until_response(&mut socket, 1).await;

    // Connections that have not authenticated are counted apart: `/healthz` answers.
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    assert_eq!(http(server.addr, healthz).await.status, 200);
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let refused = server.post(Some(TOKEN), list).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("1"));

    // Once the WebSocket is gone its slot is free again.
    within(socket.close(None)).await.unwrap();
    drop(socket);
    within(async {
        loop {
            if server.post(Some(TOKEN), list).await.status == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_post_client_that_goes_away_cancels_its_call() {
    let server = Server::start().await;
    let call =
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"hold","arguments":{}}}"#;
    let request = format!(
        "POST /rpc HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Length: {}\r\n\r\n{call}",
        call.len()
    );
    let mut stream = within(TcpStream::connect(server.addr)).await.unwrap();
    within(stream.write_all(request.as_bytes())).await.unwrap();
    eventually(|| server.daemon.calls_in_flight() == 1).await;
    assert_eq!(server.daemon.connection_count(), 1);
    drop(stream);
    eventually(|| server.daemon.calls_in_flight() == 0 && server.daemon.connection_count() == 0)
        .await;
}

#[tokio::test]
async fn serve_stops_on_daemon_shutdown() {
    let server = Server::start().await;
    let mut socket = server.websocket(TOKEN).await;
    ws_send(&mut socket, json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await;
    ws_until_response(&mut socket, 1).await;

    server.daemon.begin_shutdown();
    within(async {
        while !server.serving.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // The WebSocket session ends with the daemon.
    within(async { while let Some(Ok(_)) = socket.next().await {} }).await;
    assert!(TcpStream::connect(server.addr).await.is_err());
    // Every connection task and session the transport started has ended.
    server.daemon.tasks().close();
    within(server.daemon.tasks().wait()).await;
    assert_eq!(server.daemon.connection_count(), 0);
}

#[tokio::test]
async fn serve_refuses_no_tokens_only_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let daemon =
        Daemon::new(Arc::new(Registry::with_builtins()), Settings::for_roots(vec![root]), None);
    // On loopback, no tokens is allowed, and then only /healthz answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving =
        tokio::spawn(tcp::serve(daemon.clone(), listener, TcpOptions::new(TokenSet::empty())));
    let request = b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    assert_eq!(http(addr, request).await.status, 200);
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let request = format!(
        "POST /rpc HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Length: {}\r\n\r\n{list}",
        list.len()
    );
    assert_eq!(http(addr, request.as_bytes()).await.status, 401);
    daemon.begin_shutdown();
    within(serving).await.unwrap().unwrap();
    // Beyond loopback the same options are refused (checked without binding one).
    let public: SocketAddr = "0.0.0.0:7810".parse().unwrap();
    assert!(matches!(
        tcp::check_exposure(public, &TokenSet::empty()),
        Err(TcpError::TokensRequired(addr)) if addr == public
    ));
}

fn write_private(dir: &std::path::Path, text: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("tokens");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[test]
fn token_files_hold_named_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_private(
        dir.path(),
        "# remote agents\n\nci:0123456789abcdef0123\n  \nlaptop:abcdefghijklmnopqrstu\n# done\n",
        0o600,
    );
    let tokens = TokenSet::load(&path).unwrap();
    assert_eq!(tokens.names(), ["ci", "laptop"]);
    assert_eq!(tokens.authenticate(b"0123456789abcdef0123"), Some("ci"));
    assert_eq!(tokens.authenticate(b"abcdefghijklmnopqrstu"), Some("laptop"));
    assert_eq!(tokens.authenticate(b"ci:0123456789abcdef0123"), None);
    assert_eq!(tokens.authenticate(b""), None);
    // The Debug form shows names, never secrets.
    let shown = format!("{tokens:?}");
    assert!(shown.contains("ci") && !shown.contains("0123456789abcdef0123"), "{shown}");
    // A line without a name is an error, not a token named after its line.
    let path = write_private(dir.path(), "abcdefghijklmnopqrstu\n", 0o600);
    assert!(matches!(TokenSet::load(&path), Err(TokenError::Unnamed { line: 1 })));
}

#[test]
fn token_files_readable_by_others_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for mode in [0o640, 0o604, 0o660, 0o644] {
        let path = write_private(dir.path(), "ci:0123456789abcdef0123\n", mode);
        match TokenSet::load(&path) {
            Err(TokenError::Permissions { mode: reported, .. }) => assert_eq!(reported, mode),
            other => panic!("mode {mode:o}: expected a permissions error, got {other:?}"),
        }
    }
    let path = write_private(dir.path(), "ci:0123456789abcdef0123\n", 0o400);
    assert_eq!(TokenSet::load(&path).unwrap().len(), 1);
    let path = write_private(dir.path(), "# nothing yet\n", 0o600);
    assert!(matches!(TokenSet::load(&path), Err(TokenError::NoTokens { .. })));
    assert!(matches!(TokenSet::load(&dir.path().join("missing")), Err(TokenError::Read { .. })));
}

#[test]
fn token_sets_refuse_weak_or_ambiguous_tokens() {
    assert!(matches!(
        TokenSet::from_pairs([("ci", "short")]),
        Err(TokenError::TooShort { name }) if name == "ci"
    ));
    assert!(matches!(
        TokenSet::from_pairs([("ci", "0123456789abcdef"), ("ci", "fedcba9876543210")]),
        Err(TokenError::DuplicateName(name)) if name == "ci"
    ));
    assert!(matches!(
        TokenSet::from_pairs([("a", "0123456789abcdef"), ("b", "0123456789abcdef")]),
        Err(TokenError::DuplicateSecret(first, second)) if first == "a" && second == "b"
    ));
    assert!(matches!(
        TokenSet::from_pairs([("has space", "0123456789abcdef")]),
        Err(TokenError::BadName(_))
    ));
    assert!(matches!(
        TokenSet::from_pairs([("ci", "0123456789 abcdef")]),
        Err(TokenError::Malformed { .. })
    ));
    assert!(matches!(TokenSet::parse("ci:\n"), Err(TokenError::Malformed { line: 1, .. })));
    let set = TokenSet::parse("a:0123456789abcdef\nb : fedcba9876543210 \n").unwrap();
    assert_eq!(set.names(), ["a", "b"]);
    assert_eq!(set.authenticate(b"fedcba9876543210"), Some("b"));
}
