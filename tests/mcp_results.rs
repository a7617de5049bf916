//! Long results over MCP: a client whose protocol version has `resource_link`
//! (2025-06-18 and later) gets a head and a tail of a long text and a link to the
//! whole of it, which `resources/read` returns byte for byte to the same client
//! identity only; an older client gets the whole text inline; the texts kept are
//! bounded.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod mcp_support;
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mcp_support::{PATIENCE, StdioClient};
use serde_json::{Value, json};
use support::dechunk;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolgate::admission::Limits;
use toolgate::auth::TokenSet;
use toolgate::daemon::{Daemon, Settings};
use toolgate::mcp::{McpOptions, ResultLinks, serve_http};
use toolgate::permission::Mode;
use toolgate::tools::Registry;

/// JSON-RPC: resource not found.
const RESOURCE_NOT_FOUND: i64 = -32002;
const LEGACY: &str = "2025-11-25";
const TASKS: &str = "io.modelcontextprotocol/tasks";

/// The numbers printed by the long command: about 300 KiB.
const LAST: u32 = 52_000;

fn long_command() -> Value {
    json!({"command": format!("seq 1 {LAST}")})
}

/// What `run_command` answers for [`long_command`].
fn long_text() -> String {
    let mut text: String = (1..=LAST).map(|n| format!("{n}\n")).collect();
    text.push_str("[exit code 0]");
    text
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    daemon: Arc<Daemon>,
}

/// A daemon over a temporary root that runs commands without asking.
fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let mut settings = Settings::for_roots(vec![root.clone()]);
    settings.mode = Mode::Bypass;
    let daemon = Daemon::new(Arc::new(Registry::with_builtins()), settings, None);
    Setup { _dir: dir, root, daemon }
}

async fn call(client: &mut StdioClient, id: i64, arguments: Value) -> Value {
    let answer = client
        .request(id, "tools/call", json!({"name": "run_command", "arguments": arguments}))
        .await;
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    answer["result"].clone()
}

/// The link of a linked result, after checking the result's shape.
fn link_of(result: &Value, whole: &str) -> String {
    let content = result["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{result}");
    let excerpt = content[0]["text"].as_str().unwrap();
    assert!(excerpt.len() < 20 * 1024, "a short excerpt, not {} bytes", excerpt.len());
    assert!(excerpt.starts_with("1\n2\n3\n"), "{excerpt}");
    assert!(excerpt.ends_with(&format!("{LAST}\n[exit code 0]")), "{excerpt}");
    let link = &content[1];
    assert_eq!(link["type"], json!("resource_link"), "{link}");
    assert_eq!(link["mimeType"], json!("text/plain"), "{link}");
    assert_eq!(link["size"], json!(whole.len()), "{link}");
    assert!(link["name"].as_str().is_some_and(|name| !name.is_empty()), "{link}");
    let uri = link["uri"].as_str().unwrap().to_owned();
    let id = uri.strip_prefix("toolgate://results/").unwrap();
    assert_eq!(id.len(), 32, "a 128-bit id: {uri}");
    assert!(excerpt.contains(&uri), "the excerpt names the link: {excerpt}");
    // The structured form does not repeat the long text either.
    assert_eq!(result["structuredContent"]["content"], json!(excerpt), "{result}");
    assert_eq!(result["structuredContent"]["metadata"]["full_result"]["uri"], json!(uri));
    assert_eq!(result["structuredContent"]["metadata"]["full_result"]["bytes"], json!(whole.len()));
    uri
}

#[tokio::test]
async fn a_long_result_is_a_link_that_reads_back_whole() {
    let test = setup();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    let init = client.initialize(LEGACY, json!({})).await;
    assert!(init["result"]["capabilities"]["resources"].is_object(), "{init}");

    let whole = long_text();
    assert!(whole.len() > 290 * 1024, "{}", whole.len());
    let result = call(&mut client, 1, long_command()).await;
    assert!(result.to_string().len() < 40 * 1024, "the answer stays small");
    let uri = link_of(&result, &whole);

    let read = client.request(2, "resources/read", json!({"uri": uri})).await;
    let contents = read["result"]["contents"].as_array().expect("contents");
    assert_eq!(contents.len(), 1, "{read}");
    assert_eq!(contents[0]["uri"], json!(uri));
    assert_eq!(contents[0]["mimeType"], json!("text/plain"));
    assert!(contents[0]["text"].as_str() == Some(whole.as_str()), "the whole text, byte for byte");

    // A short result stays inline, without a link.
    let short = call(&mut client, 3, json!({"command": "echo short"})).await;
    assert_eq!(short["content"], json!([{"type": "text", "text": "short\n[exit code 0]"}]));

    // Kept results are reached by their links, not listed; an unknown one is not found.
    let listed = client.request(4, "resources/list", json!({})).await;
    assert_eq!(listed["result"]["resources"], json!([]), "{listed}");
    let unknown = format!("toolgate://results/{}", "0".repeat(32));
    let missing = client.request(5, "resources/read", json!({"uri": unknown})).await;
    assert_eq!(missing["error"]["code"], json!(RESOURCE_NOT_FOUND), "{missing}");

    // Another conversation is another client: it cannot read this one's results.
    let mut other = StdioClient::start(&test.daemon, McpOptions::default());
    other.initialize(LEGACY, json!({})).await;
    let foreign = other.request(1, "resources/read", json!({"uri": uri})).await;
    assert_eq!(foreign["error"]["code"], json!(RESOURCE_NOT_FOUND), "{foreign}");
    other.close().await;
    client.close().await;
}

#[tokio::test]
async fn an_older_protocol_gets_the_whole_text_inline() {
    let test = setup();
    let whole = long_text();
    for version in ["2025-03-26", "2024-11-05"] {
        let mut client = StdioClient::start(&test.daemon, McpOptions::default());
        client.initialize(version, json!({})).await;
        let result = call(&mut client, 1, long_command()).await;
        assert_eq!(result["content"].as_array().map(Vec::len), Some(1), "{version}");
        assert!(result["content"][0]["text"].as_str() == Some(whole.as_str()), "{version}");
        assert!(result["structuredContent"]["content"].as_str() == Some(whole.as_str()));
        assert!(result["structuredContent"]["metadata"].get("full_result").is_none());
        client.close().await;
    }
}

#[tokio::test]
async fn the_kept_results_are_bounded() {
    let test = setup();
    let result_links = ResultLinks { max_kept: 2, ..ResultLinks::default() };
    let mut client =
        StdioClient::start(&test.daemon, McpOptions { result_links, ..McpOptions::default() });
    client.initialize(LEGACY, json!({})).await;
    let whole = long_text();
    let mut uris = Vec::new();
    for id in 1..=3 {
        let result = call(&mut client, id, long_command()).await;
        uris.push(link_of(&result, &whole));
    }
    let oldest = client.request(10, "resources/read", json!({"uri": uris[0]})).await;
    assert_eq!(oldest["error"]["code"], json!(RESOURCE_NOT_FOUND), "the oldest is forgotten");
    for (id, uri) in (11..).zip(&uris[1..]) {
        let read = client.request(id, "resources/read", json!({"uri": uri})).await;
        assert!(read["result"]["contents"][0]["text"].as_str() == Some(whole.as_str()));
    }
    client.close().await;
}

#[tokio::test]
async fn a_task_result_is_linked_too() {
    let test = setup();
    let options = McpOptions { task_after: Duration::ZERO, ..McpOptions::default() };
    let mut client = StdioClient::start(&test.daemon, options);
    client.initialize(LEGACY, json!({"extensions": {TASKS: {}}})).await;
    // The command waits for a file the test creates once the call is a task.
    let command = format!("while [ ! -e go ]; do sleep 0.01; done; seq 1 {LAST}");
    let created = client
        .request(1, "tools/call", json!({"name": "run_command", "arguments": {"command": command}}))
        .await;
    let task_id = created["result"]["taskId"].clone();
    assert!(task_id.is_string(), "{created}");
    std::fs::write(test.root.join("go"), "").unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut id = 1;
    let settled = loop {
        id += 1;
        let answer = client.request(id, "tasks/get", json!({"taskId": task_id})).await;
        if answer["result"]["status"] == json!("completed") {
            break answer["result"].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "the task never completed: {answer}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let whole = long_text();
    let uri = link_of(&settled["result"], &whole);
    let read = client.request(id + 1, "resources/read", json!({"uri": uri})).await;
    assert!(read["result"]["contents"][0]["text"].as_str() == Some(whole.as_str()));
    client.close().await;
}

// ---- HTTP: results belong to the token that got them ----

const ALICE: &str = "mcp-alice-7Hq2xLp9Vw4Zr8Nb3Kd6";
const BOB: &str = "mcp-bob-Qm4Tz8Rk2Jw6Yp1Lc5Hx9";

struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Reply {
    /// The one JSON-RPC response of the body, whether plain JSON or SSE `data:` lines.
    fn response(&self) -> Value {
        let messages: Vec<Value> = if self
            .headers
            .get("content-type")
            .is_some_and(|ct| ct.starts_with("text/event-stream"))
        {
            self.body
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str(data.trim()).ok())
                .collect()
        } else {
            serde_json::from_str(&self.body).into_iter().collect()
        };
        messages.into_iter().find(|m| m.get("id").is_some()).expect("a response")
    }
}

async fn post(addr: SocketAddr, token: &str, session: Option<&str>, body: &Value) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = body.to_string();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nConnection: close\r\nHost: {addr}\r\n\
         Authorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n"
    );
    if let Some(session) = session {
        request
            .push_str(&format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: {LEGACY}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw))
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

/// Opens a session as `token` and completes the handshake; returns its id.
async fn open_session(addr: SocketAddr, token: &str) -> String {
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY,
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}
    }});
    let reply = post(addr, token, None, &initialize).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let session = reply.headers.get("mcp-session-id").cloned().unwrap_or_default();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let reply = post(addr, token, Some(&session), &initialized).await;
    assert_eq!(reply.status, 202, "{}", reply.body);
    session
}

#[tokio::test]
async fn another_token_cannot_read_a_result() {
    let test = setup();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tokens = TokenSet::from_pairs([("alice", ALICE), ("bob", BOB)]).expect("valid tokens");
    let options = McpOptions { tokens, ..McpOptions::default() };
    let shutdown = test.daemon.shutdown_token().clone();
    let server =
        tokio::spawn(serve_http(test.daemon.clone(), listener, options, Limits::new(64), shutdown));

    let alice = open_session(addr, ALICE).await;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_command", "arguments": long_command()}});
    let answer = post(addr, ALICE, Some(&alice), &call).await.response();
    let whole = long_text();
    let uri = link_of(&answer["result"], &whole);
    let read =
        json!({"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": uri}});

    // Bob, in a session of his own, is told it does not exist.
    let bob = open_session(addr, BOB).await;
    let foreign = post(addr, BOB, Some(&bob), &read).await.response();
    assert_eq!(foreign["error"]["code"], json!(RESOURCE_NOT_FOUND), "{foreign}");
    // Alice reads it, from another session of hers too.
    let again = open_session(addr, ALICE).await;
    let own = post(addr, ALICE, Some(&again), &read).await.response();
    assert!(own["result"]["contents"][0]["text"].as_str() == Some(whole.as_str()), "{}", own);

    test.daemon.shutdown_token().cancel();
    let _ = tokio::time::timeout(PATIENCE, server).await;
}
