//! The MCP face over stdio framing, driven through an in-memory duplex: the
//! handshake of both eras, the tool mapping, progress, cancellation, approvals,
//! roots, and bad input.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod mcp_support;
mod support;

use std::time::Duration;

use mcp_support::{PATIENCE, StdioClient, TestDaemon, process_alive};
use serde_json::{Value, json};
use support::{wait_for_file, wait_until_dead};
use toolgate::mcp::McpOptions;

const LATEST_LEGACY: &str = "2025-11-25";

fn modern_meta(capabilities: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"}
    })
}

#[tokio::test]
async fn initialize_negotiates_each_legacy_version() {
    let test = TestDaemon::new();
    for (asked, expected) in [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2024-11-05"),
    ] {
        let mut client = StdioClient::start(&test.daemon, McpOptions::default());
        let answer = client.initialize(asked, json!({})).await;
        assert_eq!(answer["result"]["protocolVersion"], json!(expected), "{answer}");
        assert_eq!(answer["result"]["serverInfo"]["name"], json!("toolgate"));
        assert_eq!(answer["result"]["capabilities"]["tools"]["listChanged"], json!(true));
        client.close().await;
    }
    // A version we do not know gets an answer with one we support.
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    let answer = client.initialize("1999-01-01", json!({})).await;
    let version = answer["result"]["protocolVersion"].as_str().unwrap_or("").to_owned();
    assert!(
        ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"].contains(&version.as_str()),
        "{answer}"
    );
    let pong = client.request(1, "ping", json!({})).await;
    assert_eq!(pong["result"], json!({}));
    client.close().await;
}

#[tokio::test]
async fn tools_list_maps_definitions_deterministically() {
    let test = TestDaemon::new();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({})).await;
    let first = client.request(1, "tools/list", json!({})).await;
    let second = client.request(2, "tools/list", json!({})).await;
    assert_eq!(first["result"], second["result"]);
    let tools = first["result"]["tools"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = tools.iter().filter_map(|tool| tool["name"].as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "tools are listed in name order");
    let expected = test.daemon.registry().names();
    assert_eq!(names, expected.iter().map(String::as_str).collect::<Vec<_>>());

    let touch = tools.iter().find(|tool| tool["name"] == "touch_file").cloned().unwrap_or_default();
    assert_eq!(
        touch,
        json!({
            "name": "touch_file",
            "title": "Touch file",
            "description": "writes a file",
            "inputSchema": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": false
            },
            "annotations": {"readOnlyHint": false, "destructiveHint": true},
            "_meta": {"toolgate/system": false}
        })
    );
    let stream =
        tools.iter().find(|tool| tool["name"] == "stream_lines").cloned().unwrap_or_default();
    assert_eq!(stream["annotations"], json!({"readOnlyHint": true, "destructiveHint": false}));
    client.close().await;
}

#[tokio::test]
async fn unknown_tools_and_bad_arguments() {
    let test = TestDaemon::new();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({})).await;

    let unknown = client.request(1, "tools/call", json!({"name": "nope", "arguments": {}})).await;
    assert_eq!(unknown["error"]["code"], json!(-32602), "{unknown}");
    assert_eq!(unknown["error"]["data"], json!({"error_type": "unknown_tool"}));
    // A likely misspelling is named, as on every face.
    let near =
        client.request(5, "tools/call", json!({"name": "stream_line", "arguments": {}})).await;
    let message = near["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(r#"did you mean "stream_lines"?"#), "{near}");

    let invalid = client
        .request(2, "tools/call", json!({"name": "stream_lines", "arguments": {"lines": "x"}}))
        .await;
    let result = &invalid["result"];
    assert_eq!(result["isError"], json!(true), "{invalid}");
    assert_eq!(result["structuredContent"]["error_type"], json!("invalid_arguments"));
    assert_eq!(result["structuredContent"]["ok"], json!(false));
    assert!(result["content"][0]["text"].as_str().unwrap_or("").starts_with("invalid_arguments"));
    client.close().await;
}

#[tokio::test]
async fn bad_input_is_answered_and_the_server_stays_alive() {
    let test = TestDaemon::new();
    let options = McpOptions { max_message_bytes: 4096, ..McpOptions::default() };
    let mut client = StdioClient::start(&test.daemon, options);
    client.initialize(LATEST_LEGACY, json!({})).await;

    client.send_raw("{this is not json").await;
    let parse = client.next().await;
    assert_eq!(parse["error"]["code"], json!(-32700), "{parse}");
    assert_eq!(parse["id"], Value::Null);

    client.send_raw(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":17}"#).await;
    let invalid = client.next().await;
    assert_eq!(invalid["id"], json!(5), "{invalid}");
    assert!(invalid["error"]["code"] == json!(-32600) || invalid["error"]["code"] == json!(-32602));

    let unknown = client.request(6, "no/such/method", json!({})).await;
    assert_eq!(unknown["error"]["code"], json!(-32601), "{unknown}");

    // A response to a request the server never sent, and a notification with a bad
    // request id: neither may be answered, and the server goes on.
    client.send(json!({"jsonrpc": "2.0", "id": 999, "result": {}})).await;
    client
        .send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": {"x": 1}}}))
        .await;
    let oversized = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(10_000)
    );
    client.send_raw(&oversized).await;
    let too_long = client.next().await;
    assert_eq!(too_long["error"]["code"], json!(-32600), "{too_long}");

    let pong = client.request(8, "ping", json!({})).await;
    assert_eq!(pong["result"], json!({}));
    let rest = client.close().await;
    assert!(
        rest.iter().all(|m| m.get("id") != Some(&json!(999))),
        "nothing answers a stray response: {rest:?}"
    );
}

#[tokio::test]
async fn live_output_becomes_progress_notifications() {
    let test = TestDaemon::new();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({})).await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "stream_lines",
            "arguments": {"lines": 5, "pid_file": "p1"},
            "_meta": {"progressToken": "tok-1"}
        }}))
        .await;
    // Five lines arrive as progress while the call still runs.
    let mut progress = Vec::new();
    while progress.len() < 5 {
        let message = client.until(|m| m["method"] == "notifications/progress").await;
        assert_eq!(message["params"]["progressToken"], json!("tok-1"));
        progress.push(message["params"].clone());
    }
    let values: Vec<f64> = progress.iter().filter_map(|p| p["progress"].as_f64()).collect();
    assert!(values.windows(2).all(|pair| pair[0] < pair[1]), "strictly increasing: {values:?}");
    let text: String = progress.iter().filter_map(|p| p["message"].as_str()).collect();
    assert_eq!(text, "line-1\nline-2\nline-3\nline-4\nline-5\n");

    // Then cancel it: the process dies and no response is ever sent for id 1.
    let pid = wait_for_file(&test.root().join("p1")).await.trim().parse().unwrap();
    client
        .send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "reason": "user"}}))
        .await;
    wait_until_dead(pid).await;
    let pong = client.request(2, "ping", json!({})).await;
    assert_eq!(pong["result"], json!({}));
    let rest = client.close().await;
    assert!(
        rest.iter().all(|m| m.get("id") != Some(&json!(1))),
        "no response for a canceled call: {rest:?}"
    );
}

#[tokio::test]
async fn calls_still_running_at_end_of_input_are_answered_first() {
    let test = TestDaemon::new();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({})).await;
    // Sent together and followed at once by the end of input: every call is still
    // running when the input ends, and each is answered with its result.
    let calls: String = (1..=16)
        .map(|id| {
            let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "pause", "arguments": {"ms": 300}
            }});
            format!("{call}\n")
        })
        .collect();
    client.send_raw(calls.trim_end()).await;
    client.end_input().await;
    for id in 1..=16 {
        let answer = client.response(json!(id)).await;
        assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
        assert_eq!(answer["result"]["content"][0]["text"], json!("slept"), "{answer}");
    }
    client.ended().await;
}

#[tokio::test]
async fn a_call_that_waits_does_not_hold_up_the_calls_behind_it() {
    let test = TestDaemon::new();
    std::fs::write(test.root().join("notes.txt"), "first line\nlast line\n").expect("write");
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({})).await;
    // One write: a call that waits a minute, then reads (answered without a wait of
    // their own) and a call refused for its arguments.
    let call = |id: i64, name: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": arguments}})
        .to_string()
    };
    let mut lines = vec![call(1, "pause", json!({"ms": 60_000}))];
    lines.extend((2..=32).map(|id| call(id, "read_file", json!({"path": "notes.txt"}))));
    lines.push(call(33, "read_file", json!({})));
    client.send_raw(&lines.join("\n")).await;

    // Everything behind the pause is answered while it still runs, each call once.
    let mut answered = std::collections::BTreeMap::new();
    while answered.len() < 32 {
        let message = client.next().await;
        let Some(id) = message["id"].as_i64() else { continue };
        assert!(answered.insert(id, message).is_none(), "call {id} answered twice");
    }
    assert!(!answered.contains_key(&1), "the pause is still running: {answered:?}");
    for id in 2..=32 {
        let result = &answered[&id]["result"];
        assert_eq!(result["isError"], json!(false), "{result}");
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("first line") && text.contains("last line"), "{text}");
    }
    let refused = &answered[&33]["result"];
    assert_eq!(refused["isError"], json!(true), "{refused}");
    assert_eq!(refused["structuredContent"]["error_type"], json!("invalid_arguments"), "{refused}");

    // Canceled, the pause ends without an answer, and the conversation goes on.
    client
        .send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}))
        .await;
    let pong = client.request(34, "ping", json!({})).await;
    assert_eq!(pong["result"], json!({}));
    let deadline = std::time::Instant::now() + PATIENCE;
    while test.daemon.calls_in_flight() > 0 {
        assert!(std::time::Instant::now() < deadline, "the canceled pause still runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rest = client.close().await;
    assert!(rest.iter().all(|m| m.get("id") != Some(&json!(1))), "no answer for id 1: {rest:?}");
}

#[tokio::test]
async fn a_client_that_disconnects_mid_call_leaves_nothing_running() {
    let test = TestDaemon::new();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({})).await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "stream_lines", "arguments": {"lines": 1, "pid_file": "p2"}
        }}))
        .await;
    let pid = wait_for_file(&test.root().join("p2")).await.trim().parse().unwrap();
    assert!(process_alive(pid));
    client.close().await;
    // The disconnect cancels the call: its process dies and the call is gone (bounded
    // wait: the cancellation is delivered asynchronously).
    wait_until_dead(pid).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while test.daemon.calls_in_flight() > 0 {
        assert!(std::time::Instant::now() < deadline, "the call outlived its client");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn approvals_go_through_elicitation() {
    let test = TestDaemon::new();
    for (answer, expect_ok) in [
        (json!({"action": "accept", "content": {"decision": "allow_once"}}), true),
        (json!({"action": "accept", "content": {"decision": "deny"}}), false),
        (json!({"action": "decline"}), false),
    ] {
        let mut client = StdioClient::start(&test.daemon, McpOptions::default());
        client.initialize(LATEST_LEGACY, json!({"elicitation": {"form": {}}})).await;
        let file = format!("f-{}", expect_ok);
        let _ = std::fs::remove_file(test.root().join(&file));
        client
            .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "touch_file", "arguments": {"path": file}
            }}))
            .await;
        let question = client.until(|m| m["method"] == "elicitation/create").await;
        let schema = &question["params"]["requestedSchema"];
        assert_eq!(
            schema["properties"]["decision"]["enum"],
            json!(["allow_once", "allow_session", "deny"])
        );
        assert!(question["params"]["message"].as_str().unwrap_or("").contains("touch_file"));
        client.send(json!({"jsonrpc": "2.0", "id": question["id"], "result": answer})).await;
        let response = client.response(json!(1)).await;
        let result = &response["result"]["structuredContent"];
        assert_eq!(result["ok"], json!(expect_ok), "{response}");
        assert_eq!(test.root().join(&file).exists(), expect_ok);
        if !expect_ok {
            assert_eq!(result["error_type"], json!("permission_denied"));
        }
        client.close().await;
    }
}

#[tokio::test]
async fn without_elicitation_an_asking_call_is_denied_with_a_remedy() {
    let test = TestDaemon::new();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({})).await;
    let response = client
        .request(1, "tools/call", json!({"name": "touch_file", "arguments": {"path": "never"}}))
        .await;
    let result = &response["result"]["structuredContent"];
    assert_eq!(result["error_type"], json!("permission_denied"), "{response}");
    let message = result["error"].as_str().unwrap_or("");
    assert!(message.contains("does not support elicitation"), "{message}");
    assert!(message.contains("--mode"), "{message}");
    assert!(!test.root().join("never").exists());
    client.close().await;
}

#[tokio::test]
async fn client_roots_narrow_the_session() {
    let test = TestDaemon::new();
    let sub = test.root().join("sub");
    std::fs::create_dir(&sub).expect("mkdir");
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({"roots": {"listChanged": false}})).await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "stream_lines", "arguments": {"lines": 0, "pid_file": "where"}
        }}))
        .await;
    let ask = client.until(|m| m["method"] == "roots/list").await;
    client
        .send(json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": [
            {"uri": format!("file://{}", sub.display())},
            {"uri": "file:///etc"}
        ]}}))
        .await;
    // The session's cwd is now the narrowed root: the pid file lands in sub/.
    let pid = wait_for_file(&sub.join("where")).await.trim().parse().unwrap();
    assert!(!test.root().join("where").exists());
    client.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})).await;
    wait_until_dead(pid).await;
    client.close().await;
}

/// The first call of a conversation asks the client for its roots while holding the
/// session's opening; canceling that call lets the next one open the session at once
/// instead of after the roots/list timeout (10 s).
#[tokio::test]
async fn a_canceled_first_call_does_not_hold_the_session_open_for_the_roots_timeout() {
    let test = TestDaemon::new();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({"roots": {"listChanged": false}})).await;
    let call = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "read_file", "arguments": {"path": "README.md"}
        }})
    };
    client.send(call(1)).await;
    let first = client.until(|m| m["method"] == "roots/list").await;
    client
        .send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}))
        .await;
    client.send(call(2)).await;
    // Well under the 10 s the first ask would otherwise hold the opening for.
    let second = tokio::time::timeout(
        std::time::Duration::from_secs(7),
        client.until(|m| m["method"] == "roots/list"),
    )
    .await
    .expect("the second call waited for the first one's roots/list to time out");
    assert_ne!(first["id"], second["id"]);
    client.send(json!({"jsonrpc": "2.0", "id": second["id"], "result": {"roots": []}})).await;
    let answer = client.until(|m| m["id"] == 2).await;
    assert!(answer.get("result").is_some(), "{answer}");
    client.close().await;
}

#[tokio::test]
async fn the_stateless_era_discovers_and_asks_with_input_required() {
    let test = TestDaemon::new();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    let discover =
        client.request(1, "server/discover", json!({"_meta": modern_meta(json!({}))})).await;
    let versions = discover["result"]["supportedVersions"].as_array().cloned().unwrap_or_default();
    for version in ["2026-07-28", "2025-11-25", "2024-11-05"] {
        assert!(versions.contains(&json!(version)), "{discover}");
    }

    let list = client.request(2, "tools/list", json!({"_meta": modern_meta(json!({}))})).await;
    assert_eq!(list["result"]["resultType"], json!("complete"), "{list}");

    let elicits = json!({"elicitation": {"form": {}}});
    let first = client
        .request(
            3,
            "tools/call",
            json!({
                "name": "touch_file", "arguments": {"path": "modern"},
                "_meta": modern_meta(elicits.clone())
            }),
        )
        .await;
    assert_eq!(first["result"]["resultType"], json!("input_required"), "{first}");
    let state = first["result"]["requestState"].clone();
    let question = &first["result"]["inputRequests"]["toolgate/approval"];
    assert_eq!(question["method"], json!("elicitation/create"));
    assert!(!test.root().join("modern").exists(), "nothing ran before the answer");

    // A forged state is refused.
    let forged = client
        .request(4, "tools/call", json!({
            "name": "touch_file", "arguments": {"path": "modern"},
            "requestState": "0000", "inputResponses": {"toolgate/approval": {"action": "accept", "content": {"decision": "allow_once"}}},
            "_meta": modern_meta(elicits.clone())
        }))
        .await;
    assert_eq!(forged["error"]["code"], json!(-32602), "{forged}");

    let second = client
        .request(5, "tools/call", json!({
            "name": "touch_file", "arguments": {"path": "modern"},
            "requestState": state,
            "inputResponses": {"toolgate/approval": {"action": "accept", "content": {"decision": "allow_once"}}},
            "_meta": modern_meta(elicits.clone())
        }))
        .await;
    assert_eq!(second["result"]["structuredContent"]["ok"], json!(true), "{second}");
    assert!(test.root().join("modern").exists());

    // The same state cannot be replayed.
    let replay = client
        .request(6, "tools/call", json!({
            "name": "touch_file", "arguments": {"path": "modern"},
            "requestState": state,
            "inputResponses": {"toolgate/approval": {"action": "accept", "content": {"decision": "allow_once"}}},
            "_meta": modern_meta(elicits)
        }))
        .await;
    assert_eq!(replay["error"]["code"], json!(-32602), "{replay}");
    client.close().await;
}

/// `toolgate mcp` started on pipes, as MCP hosts start it, with a root holding
/// `hello.txt`. Its answers are read on a thread of their own, so that a silent
/// server fails the test instead of hanging it.
struct PipedServer {
    _dir: tempfile::TempDir,
    child: std::process::Child,
    requests: std::io::PipeWriter,
    answers: std::sync::mpsc::Receiver<String>,
    /// Copies of the child's ends: they share its open file descriptions, flags included.
    stdin_probe: std::io::PipeReader,
    stdout_probe: std::io::PipeWriter,
}

impl PipedServer {
    fn start(extra_args: &[&str]) -> PipedServer {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};

        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let root = std::fs::canonicalize(root).unwrap();
        std::fs::write(root.join("hello.txt"), "hello over a pipe\n").unwrap();

        let (stdin_read, requests) = std::io::pipe().unwrap();
        let (stdout_read, stdout_write) = std::io::pipe().unwrap();
        let stdin_probe = stdin_read.try_clone().unwrap();
        let stdout_probe = stdout_write.try_clone().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .arg("mcp")
            .arg("--root")
            .arg(&root)
            .args(extra_args)
            .current_dir(&root)
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .env("XDG_STATE_HOME", dir.path().join("state"))
            .env("TOOLGATE_LOG", "warn")
            .stdin(stdin_read)
            .stdout(stdout_write)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (sender, answers) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout_read).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        let mut server =
            PipedServer { _dir: dir, child, requests, answers, stdin_probe, stdout_probe };
        server.send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": LATEST_LEGACY, "capabilities": {},
            "clientInfo": {"name": "pipes", "version": "1"}}}));
        server.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server
    }

    fn send(&mut self, message: Value) {
        use std::io::Write;
        self.requests.write_all(format!("{message}\n").as_bytes()).unwrap();
    }

    /// Calls `tool` and returns the answer.
    fn call(&mut self, id: i64, tool: &str, arguments: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}}));
        loop {
            let line = self.answers.recv_timeout(PATIENCE).expect("no answer from toolgate mcp");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    /// Ends its input and waits for it to exit.
    fn end(mut self) -> std::process::ExitStatus {
        drop(self.requests);
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("toolgate mcp did not exit at end of input");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn blocking(fd: &dyn std::os::fd::AsFd) -> bool {
    !rustix::fs::fcntl_getfl(fd.as_fd()).unwrap().contains(rustix::fs::OFlags::NONBLOCK)
}

/// The real binary on pipes (as MCP hosts start it): it drives them non-blocking
/// while it serves, answers, and on end of input leaves their flags as it found
/// them (the open file descriptions may be shared with other processes).
#[test]
fn the_binary_serves_pipes_and_leaves_their_flags_as_found() {
    let mut server = PipedServer::start(&[]);
    let (stdin_probe, stdout_probe) =
        (server.stdin_probe.try_clone().unwrap(), server.stdout_probe.try_clone().unwrap());
    let answer = server.call(2, "read_file", json!({"path": "hello.txt"}));
    assert_eq!(answer["result"]["structuredContent"]["ok"], json!(true), "{answer}");
    assert!(
        answer["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("hello over a pipe")),
        "{answer}"
    );
    // While it serves, the pipes are non-blocking.
    assert!(!blocking(&stdin_probe) && !blocking(&stdout_probe));

    let status = server.end();
    assert!(status.success(), "{status}");
    assert!(blocking(&stdin_probe), "stdin was left non-blocking");
    assert!(blocking(&stdout_probe), "stdout was left non-blocking");
}

/// The scheduling policy in a `/proc/.../stat` line (its 41st field).
fn policy_in_stat(stat: &str) -> u32 {
    let after_name = &stat[stat.rfind(')').expect("a stat line") + 1..];
    after_name.split_whitespace().nth(41 - 3).expect("a policy field").parse().unwrap()
}

const SCHED_OTHER: u32 = 0;
const SCHED_BATCH: u32 = 3;

/// On its host's pipes, every thread of the server is `SCHED_BATCH`: a thread that
/// wakes waits for the host to sleep (or use up its slice) instead of taking the
/// processor from it in the middle of its work. The commands it runs do not keep
/// that: they start with the policy every process starts with.
#[test]
fn on_pipes_the_server_yields_to_its_host_and_its_commands_schedule_as_usual() {
    let mut server = PipedServer::start(&["--mode", "bypass"]);
    let answer = server.call(1, "read_file", json!({"path": "hello.txt"}));
    assert_eq!(answer["result"]["structuredContent"]["ok"], json!(true), "{answer}");
    let tasks = format!("/proc/{}/task", server.child.id());
    let mut threads = 0;
    for task in std::fs::read_dir(&tasks).unwrap() {
        let Ok(stat) = std::fs::read_to_string(task.unwrap().path().join("stat")) else {
            continue; // a thread that just ended
        };
        threads += 1;
        assert_eq!(policy_in_stat(&stat), SCHED_BATCH, "{stat}");
    }
    assert!(threads > 1, "only {threads} thread(s) in {tasks}");

    let answer = server.call(2, "run_command", json!({"command": "cat /proc/self/stat"}));
    let result = &answer["result"]["structuredContent"];
    assert_eq!(result["ok"], json!(true), "{answer}");
    let stat = result["content"].as_str().unwrap();
    assert_eq!(policy_in_stat(stat.lines().next().unwrap()), SCHED_OTHER, "{stat}");

    let status = server.end();
    assert!(status.success(), "{status}");
}
