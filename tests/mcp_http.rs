//! The Streamable HTTP endpoint on a real loopback listener, spoken to in raw
//! HTTP/1.1: sessions, protocol-version checks, DNS-rebinding protection, the
//! bearer token, and a call with progress over SSE.

// Helpers below are test code: a failed setup step is a failed test.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod mcp_support;
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;

use mcp_support::TestDaemon;
use serde_json::{Value, json};
use support::dechunk;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolgate::admission::Limits;
use toolgate::auth::TokenSet;
use toolgate::mcp::{McpOptions, serve_http};

struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Reply {
    /// The JSON-RPC messages of the body, whether plain JSON or SSE `data:` lines.
    fn messages(&self) -> Vec<Value> {
        if self.headers.get("content-type").is_some_and(|ct| ct.starts_with("text/event-stream")) {
            self.body
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str(data.trim()).ok())
                .collect()
        } else {
            serde_json::from_str(&self.body).into_iter().collect()
        }
    }
}

/// The token every request of these tests presents (see `http`).
const TOKEN: &str = "mcp-test-7Hq2xLp9Vw4Zr8Nb3Kd6";

fn options() -> McpOptions {
    let tokens = TokenSet::from_pairs([("test", TOKEN)]).expect("a valid token");
    McpOptions { tokens, ..McpOptions::default() }
}

async fn serve(options: McpOptions) -> (TestDaemon, SocketAddr) {
    let test = TestDaemon::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = test.daemon.shutdown_token().clone();
    let limits = Limits::new(64);
    tokio::spawn(serve_http(test.daemon.clone(), listener, options, limits, shutdown));
    (test, addr)
}

async fn http(
    addr: SocketAddr,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut request = format!("{method} /mcp HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    // Every request presents the test token unless it says otherwise (an empty value
    // sends no Authorization header at all).
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("authorization")) {
        request.push_str(&format!("Authorization: Bearer {TOKEN}\r\n"));
    }
    for (name, value) in headers.iter().filter(|(_, value)| !value.is_empty()) {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" {
        request.push_str(
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n",
        );
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(mcp_support::PATIENCE, stream.read_to_end(&mut raw))
        .await
        .expect("the response ended in time")
        .expect("read");
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let body = if headers.get("transfer-encoding").is_some_and(|te| te.contains("chunked")) {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Reply { status, headers, body }
}

fn initialize_body() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}
    }})
}

/// Opens a session and completes the handshake; returns its id.
async fn open_session(addr: SocketAddr, extra: &[(&str, &str)]) -> String {
    let reply = http(addr, "POST", extra, Some(&initialize_body())).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let session = reply.headers.get("mcp-session-id").cloned().unwrap_or_default();
    assert_eq!(session.len(), 32, "128-bit hex session id: {session:?}");
    assert!(session.chars().all(|c| c.is_ascii_hexdigit()));
    let messages = reply.messages();
    assert_eq!(
        messages.first().map(|m| m["result"]["protocolVersion"].clone()),
        Some(json!("2025-11-25"))
    );
    let mut headers: Vec<(&str, &str)> = extra.to_vec();
    headers.push(("Mcp-Session-Id", &session));
    headers.push(("MCP-Protocol-Version", "2025-11-25"));
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let reply = http(addr, "POST", &headers, Some(&initialized)).await;
    assert_eq!(reply.status, 202, "{}", reply.body);
    session
}

#[tokio::test]
async fn sessions_live_until_deleted() {
    let (_test, addr) = serve(options()).await;
    let session = open_session(addr, &[]).await;
    let with_session =
        [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];

    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let reply = http(addr, "POST", &with_session, Some(&list)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let messages = reply.messages();
    let tools = messages.iter().find(|m| m["id"] == json!(2)).map(|m| m["result"]["tools"].clone());
    assert!(
        tools.is_some_and(|tools| tools.as_array().is_some_and(|t| !t.is_empty())),
        "{messages:?}"
    );

    // A bad protocol version header is a 400.
    let bad_version =
        [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "1999-01-01")];
    assert_eq!(http(addr, "POST", &bad_version, Some(&list)).await.status, 400);

    // An unknown session is a 404.
    let unknown = [
        ("Mcp-Session-Id", "00000000000000000000000000000000"),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    assert_eq!(http(addr, "POST", &unknown, Some(&list)).await.status, 404);

    // DELETE ends it with a 200 (the Python SDK's client reports anything but 200, 204
    // or 405 as a failed termination); afterwards it is unknown.
    let deleted = http(addr, "DELETE", &with_session, None).await;
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    assert_eq!(http(addr, "POST", &with_session, Some(&list)).await.status, 404);
}

#[tokio::test]
async fn progress_arrives_on_the_call_stream() {
    let (test, addr) = serve(options()).await;
    let session = open_session(addr, &[]).await;
    let headers = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    // The call prints three lines and then waits; the test ends it by deleting the
    // session, which must cancel the call and close its stream.
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "stream_lines", "arguments": {"lines": 3, "pid_file": "http-pid"},
        "_meta": {"progressToken": 42}
    }});
    let addr_for_call = addr;
    let headers_owned: Vec<(String, String)> =
        headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
    let pending = tokio::spawn(async move {
        let headers: Vec<(&str, &str)> =
            headers_owned.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        http(addr_for_call, "POST", &headers, Some(&call)).await
    });
    // Once the child runs, end the session: the call is canceled, its process
    // killed, and its stream closes.
    let pid_file = test.root().join("http-pid");
    let deadline = tokio::time::Instant::now() + mcp_support::PATIENCE;
    let pid = loop {
        if let Some(pid) = mcp_support::read_pid(&pid_file) {
            break pid;
        }
        assert!(tokio::time::Instant::now() < deadline, "the call never started");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let deleted = http(addr, "DELETE", &headers, None).await;
    assert!((200..300).contains(&deleted.status));
    let reply = pending.await.expect("call task");
    let progress: Vec<Value> =
        reply.messages().into_iter().filter(|m| m["method"] == "notifications/progress").collect();
    let text: String = progress.iter().filter_map(|m| m["params"]["message"].as_str()).collect();
    assert_eq!(text, "line-1\nline-2\nline-3\n", "{}", reply.body);
    assert!(progress.iter().all(|m| m["params"]["progressToken"] == json!(42)));
    let deadline = tokio::time::Instant::now() + mcp_support::PATIENCE;
    while mcp_support::process_alive(pid) {
        assert!(tokio::time::Instant::now() < deadline, "process {pid} survived its session");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn foreign_hosts_and_origins_are_refused() {
    let (_test, addr) = serve(options()).await;
    let body = initialize_body();
    assert_eq!(http(addr, "POST", &[("Host", "evil.example.com")], Some(&body)).await.status, 403);
    assert_eq!(
        http(addr, "POST", &[("Origin", "http://evil.example.com")], Some(&body)).await.status,
        403
    );
    let port = addr.port().to_string();
    let localhost = format!("localhost:{port}");
    let origin = format!("http://localhost:{port}");
    let ok = http(addr, "POST", &[("Host", &localhost), ("Origin", &origin)], Some(&body)).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
}

#[tokio::test]
async fn a_token_is_always_required() {
    let (_test, addr) = serve(options()).await;
    let body = initialize_body();
    let refused = http(addr, "POST", &[("Authorization", "")], Some(&body)).await;
    assert_eq!(refused.status, 401);
    assert_eq!(
        refused.headers.get("www-authenticate").map(String::as_str),
        Some("Bearer realm=\"toolgate\"")
    );
    assert!(refused.body.contains("Authorization: Bearer <token>"), "{}", refused.body);
    let wrong = http(addr, "POST", &[("Authorization", "Bearer nope")], Some(&body)).await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.headers.get("www-authenticate").is_some_and(|c| c.contains("invalid_token")));
    open_session(addr, &[("Authorization", &format!("bearer {TOKEN}"))]).await;
    // Without tokens at all, nothing gets in.
    let (_test, addr) = serve(McpOptions::default()).await;
    assert_eq!(http(addr, "POST", &[], Some(&body)).await.status, 401);
}

#[tokio::test]
async fn stateless_requests_need_no_session() {
    let (_test, addr) = serve(options()).await;
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}
    });
    let discover =
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}});
    let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "server/discover")];
    let reply = http(addr, "POST", &headers, Some(&discover)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(!reply.headers.contains_key("mcp-session-id"));
    let messages = reply.messages();
    let versions =
        messages.first().map(|m| m["result"]["supportedVersions"].clone()).unwrap_or_default();
    assert!(versions.as_array().is_some_and(|v| v.contains(&json!("2026-07-28"))), "{messages:?}");
}
