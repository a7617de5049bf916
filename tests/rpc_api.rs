//! The native API's typed client (`toolgate::rpc::api`) against the daemon as remote
//! agents and the CLI reach it: the real binary on its Unix socket (NDJSON), and the
//! TCP transport (WebSocket and HTTP, with a bearer token). Each test makes a call,
//! follows a subscription's events and answers an approval through the typed client.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use jsonrpsee::core::client::{Error, Subscription};
use serde_json::json;
use support::{PATIENCE, TestDaemon, within};
use tokio::net::TcpListener;
use toolgate::agent::{ApprovalDecision, ApprovalScope, Event};
use toolgate::auth::{HOW_TO_AUTHENTICATE, TokenSet};
use toolgate::daemon::{Daemon, Settings};
use toolgate::protocol::*;
use toolgate::rpc::api::{self, NativeApiClient, NoParams};
use toolgate::rpc::tcp::{self, TcpOptions};
use toolgate::tools::{Definition, Registry, Safety, Tool, ToolContext, ToolResult};

const TOKEN: &str = "rpc-api-secret-0123456789abcdef";

/// The real binary serving a temporary socket, its workspace holding `hello.txt`.
fn start() -> TestDaemon {
    TestDaemon::start_with("", |dir| {
        std::fs::write(dir.join("workspace/hello.txt"), "hello\nworld\n").unwrap();
    })
}

/// Runs until its call is canceled: a long call.
struct Hold(Definition);

impl Hold {
    fn new() -> Hold {
        Hold(Definition {
            name: "hold".to_owned(),
            description: "waits until canceled".to_owned(),
            input_schema: json!({"type": "object"}),
            safety: Safety::ReadOnly,
            system: false,
            timeout: None,
            facts: Default::default(),
        })
    }
}

#[async_trait::async_trait]
impl Tool for Hold {
    fn definition(&self) -> &Definition {
        &self.0
    }

    async fn execute(&self, _args: serde_json::Value, ctx: ToolContext) -> ToolResult {
        ctx.cancel.cancelled().await;
        ToolResult::success("released")
    }
}

/// A library daemon over a temporary root with the TCP transport; shut down on drop.
struct Tcp {
    _dir: tempfile::TempDir,
    root: PathBuf,
    addr: SocketAddr,
    daemon: Arc<Daemon>,
    serving: tokio::task::JoinHandle<()>,
}

impl Tcp {
    async fn start() -> Tcp {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("notes.txt"), "first line\nsecond line\n").unwrap();
        let registry = Registry::with_builtins();
        registry.register(Some(Arc::new(Hold::new()))).unwrap();
        let daemon = Daemon::new(Arc::new(registry), Settings::for_roots(vec![root.clone()]), None);
        let options = TcpOptions::new(TokenSet::from_pairs([("agent", TOKEN)]).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = tokio::spawn({
            let daemon = daemon.clone();
            async move {
                let _ = tcp::serve(daemon, listener, options).await;
            }
        });
        Tcp { _dir: dir, root, addr, daemon, serving }
    }

    fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    fn http_url(&self) -> String {
        format!("http://{}/rpc", self.addr)
    }
}

impl Drop for Tcp {
    fn drop(&mut self) {
        self.daemon.begin_shutdown();
        self.serving.abort();
    }
}

fn call(name: &str, arguments: serde_json::Value, call_id: &str) -> ToolsCallParams {
    ToolsCallParams::new(name, arguments).call_id(call_id)
}

/// Runs `params` while answering its permission request from `events` with `answer`;
/// returns the result and the events of the call, in order.
async fn call_answering<C: NativeApiClient>(
    client: &C,
    events: &mut Subscription<Event>,
    params: ToolsCallParams,
    answer: ApprovalDecision,
) -> (ToolsCallResult, Vec<Event>) {
    let call_id = params.call_id.clone().unwrap();
    let call = client.tools_call(params);
    tokio::pin!(call);
    let mut seen = Vec::new();
    let mut asked = false;
    let result = within(async {
        loop {
            tokio::select! {
                result = &mut call => break result.unwrap(),
                event = events.next() => {
                    let event = event.expect("the subscription is open").unwrap();
                    if event.call_id() != Some(call_id.as_str()) {
                        continue;
                    }
                    if let Event::PermissionRequest { request_id, .. } = &event {
                        asked = true;
                        let respond = PermissionRespondParams {
                            request_id: request_id.clone(),
                            decision: answer,
                            scope: ApprovalScope::Once,
                            reason: Some("answered by the test".to_owned()),
                        };
                        assert!(client.permission_respond(respond).await.unwrap().resolved);
                    }
                    seen.push(event);
                }
            }
        }
    })
    .await;
    assert!(asked, "the call was not asked about: {seen:?}");
    // The call's closing events follow its answer's events on the subscription.
    within(async {
        while !seen.iter().any(|event| matches!(event, Event::ToolCallDone { .. })) {
            let event = events.next().await.expect("the subscription is open").unwrap();
            if event.call_id() == Some(call_id.as_str()) {
                seen.push(event);
            }
        }
    })
    .await;
    (result, seen)
}

fn types(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|event| serde_json::to_value(event).unwrap()["type"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_typed_client_calls_subscribes_and_answers_on_the_unix_socket() {
    let binary = start();
    let client = api::connect_unix(&binary.socket).await.unwrap();

    let status = within(client.daemon_status(NoParams {})).await.unwrap();
    assert_eq!(i64::from(status.pid), i64::from(binary.pid()));
    let listed = within(client.tools_list(ToolsListParams::default())).await.unwrap();
    assert!(listed.tools.iter().any(|tool| tool.name == "read_file"), "{listed:?}");
    assert_eq!(listed.sources.get("read_file").map(String::as_str), Some("builtin"));

    // A named session, as the CLI opens one.
    let opened = SessionOpenParams { name: Some("typed".to_owned()), ..Default::default() };
    let session = within(client.session_open(opened)).await.unwrap();
    let in_session = |mut params: ToolsCallParams| {
        params.session_id = Some(session.session_id.clone());
        params
    };

    let read = in_session(call("read_file", json!({"path": "hello.txt"}), "read-1"));
    let result = within(client.tools_call(read)).await.unwrap();
    assert!(result.ok, "{result:?}");
    assert!(result.content.contains("world"), "{result:?}");

    // A write asks in the default mode: the typed client sees the question on its
    // subscription and answers it.
    let subscribe = EventsSubscribeParams { session_id: Some(session.session_id.clone()) };
    let mut events = within(client.subscribe_events(subscribe)).await.unwrap();
    let write = in_session(call(
        "write_file",
        json!({"path": "typed.txt", "content": "from the typed client\n"}),
        "write-1",
    ));
    let (result, seen) = call_answering(&client, &mut events, write, ApprovalDecision::Allow).await;
    assert!(result.ok, "{result:?}");
    assert_eq!(
        std::fs::read_to_string(binary.workspace().join("typed.txt")).unwrap(),
        "from the typed client\n"
    );
    let seen = types(&seen);
    for expected in ["tool_call_start", "permission_request", "permission_resolved", "tool_result"]
    {
        assert!(seen.iter().any(|kind| kind == expected), "no {expected} in {seen:?}");
    }

    // A denial comes back as the call's result, through the same client.
    let denied =
        in_session(call("write_file", json!({"path": "denied.txt", "content": "no\n"}), "write-2"));
    let (result, _) = call_answering(&client, &mut events, denied, ApprovalDecision::Deny).await;
    assert!(!result.ok, "{result:?}");
    assert!(!binary.workspace().join("denied.txt").exists());

    // Closing the subscription is `events/unsubscribe` with its id, which the daemon
    // reads; a second close of the same id finds nothing.
    let id = match events.kind() {
        jsonrpsee::core::client::SubscriptionKind::Subscription(id) => {
            serde_json::to_value(id).unwrap().as_str().unwrap().to_owned()
        }
        other => panic!("not a subscription: {other:?}"),
    };
    within(events.unsubscribe()).await.unwrap();
    let again = EventsUnsubscribeParams { subscription: id };
    assert!(!within(client.events_unsubscribe(again)).await.unwrap());

    // Errors of the daemon are typed JSON-RPC errors.
    let unknown = SessionCloseParams { session_id: "no-such-session".to_owned() };
    let closed = within(client.session_close(unknown)).await.unwrap();
    assert!(!closed.closed);
    let widen = SessionUpdateParams { roots: Some(vec!["/".to_owned()]), ..Default::default() };
    match within(client.session_update(widen)).await {
        Err(Error::Call(error)) => assert_eq!(error.code(), -32602, "{error:?}"),
        other => panic!("widening was not refused: {other:?}"),
    }
}

#[tokio::test]
async fn the_typed_client_calls_subscribes_and_answers_over_tcp_websocket() {
    let server = Tcp::start().await;
    let client = within(api::connect_ws(&server.ws_url(), TOKEN)).await.unwrap();

    let read = call("read_file", json!({"path": "notes.txt"}), "read-1");
    let result = within(client.tools_call(read)).await.unwrap();
    assert!(result.ok, "{result:?}");
    assert!(result.content.contains("second line"), "{result:?}");

    let mut events =
        within(client.subscribe_events(EventsSubscribeParams::default())).await.unwrap();
    let write = call("write_file", json!({"path": "remote.txt", "content": "remote\n"}), "w-1");
    let (result, seen) = call_answering(&client, &mut events, write, ApprovalDecision::Allow).await;
    assert!(result.ok, "{result:?}");
    assert_eq!(std::fs::read_to_string(server.root.join("remote.txt")).unwrap(), "remote\n");
    assert!(types(&seen).iter().any(|kind| kind == "permission_request"), "{seen:?}");

    // A batch: one model turn, results in call order.
    let batch = ToolsCallBatchParams {
        calls: vec![
            BatchCall {
                id: "b1".to_owned(),
                name: "read_file".to_owned(),
                arguments: json!({"path": "notes.txt"}),
            },
            BatchCall {
                id: "b2".to_owned(),
                name: "no_such_tool".to_owned(),
                arguments: json!({}),
            },
        ],
        session_id: None,
    };
    let results = within(client.tools_call_batch(batch)).await.unwrap().results;
    assert_eq!(results.len(), 2);
    assert!(results[0].ok && !results[1].ok, "{results:?}");

    let explain = ToolsExplainParams {
        name: "write_file".to_owned(),
        arguments: json!({"path": "x.txt", "content": ""}),
        session_id: None,
    };
    assert_eq!(within(client.tools_explain(explain)).await.unwrap().decision, "ask");

    // Going away cancels what the connection still runs, and closes its sessions.
    drop(events);
    drop(client);
    within(async {
        while server.daemon.connection_count() != 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn the_typed_client_calls_over_tcp_http_and_needs_the_token() {
    let server = Tcp::start().await;
    let client = api::connect_http(&server.http_url(), TOKEN).unwrap();
    let listed = within(client.tools_list(ToolsListParams::default())).await.unwrap();
    assert!(listed.tools.iter().any(|tool| tool.name == "read_file"), "{listed:?}");
    let read = call("read_file", json!({"path": "notes.txt"}), "read-1");
    let result = within(client.tools_call(read)).await.unwrap();
    assert!(result.ok, "{result:?}");
    let status = within(client.daemon_status(NoParams {})).await.unwrap();
    assert_eq!(status.pid, std::process::id());

    // No events over plain HTTP.
    assert!(within(client.subscribe_events(EventsSubscribeParams::default())).await.is_err());

    // A wrong token gets nothing, on either route.
    let wrong = api::connect_http(&server.http_url(), "wrong-secret-0123456789abcdef").unwrap();
    let refused = within(wrong.tools_list(ToolsListParams::default())).await;
    assert!(matches!(refused, Err(Error::Transport(_))), "{refused:?}");
    let refused = within(api::connect_ws(&server.ws_url(), "wrong-secret-0123456789abcdef")).await;
    assert!(refused.is_err(), "a WebSocket with a wrong token was accepted");
}

/// The README's Rust example (section "Talking to the daemon"), compiled as it is
/// written there: [`the_readme_rust_example_is_the_one_compiled_here`] compares the text.
async fn readme_rust_example() -> Result<(), Box<dyn std::error::Error>> {
    // README example begins.
    use serde_json::json;
    use toolgate::protocol::{SessionOpenParams, ToolsCallParams};
    use toolgate::rpc::api::{self, NativeApiClient};

    let client = api::connect_ws("ws://127.0.0.1:7810/ws", "SECRET").await?;
    let session = client.session_open(SessionOpenParams::default()).await?;
    let call = ToolsCallParams::new("read_file", json!({"path": "README.md"}));
    let result = client.tools_call(call.session(&session.session_id)).await?;
    println!("{}", result.content);
    // README example ends.
    Ok(())
}

/// The text of the first fenced block of `language` after `heading` in `markdown`.
fn fenced_block(markdown: &str, heading: &str, language: &str) -> String {
    let section = &markdown[markdown.find(heading).expect("the heading is there")..];
    let fence = format!("```{language}\n");
    let start = section.find(&fence).expect("the section has such a block") + fence.len();
    let end = start + section[start..].find("```").expect("the block is closed");
    section[start..end].to_owned()
}

#[test]
fn the_readme_rust_example_is_the_one_compiled_here() {
    // Referenced, so that it is compiled (and type-checked) with this file.
    let _compiled = readme_rust_example;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = fenced_block(&readme, "## Talking to the daemon", "rust");
    let source = std::fs::read_to_string(root.join("tests").join("rpc_api.rs")).unwrap();
    let begin = source.find("// README example begins.\n").unwrap();
    let begin = begin + source[begin..].find('\n').unwrap() + 1;
    let end = begin + source[begin..].find("    // README example ends.").unwrap();
    let compiled: String = source[begin..end]
        .lines()
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
        .collect();
    assert_eq!(
        block, compiled,
        "README.md's Rust example differs from the one compiled in tests/rpc_api.rs"
    );
}

/// `cargo tree` of this package (offline, on the committed lock) with `features`: each
/// package of the normal dependencies once, by name, with its enabled features.
fn dependency_tree(features: &[&str]) -> std::collections::BTreeMap<String, Vec<String>> {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p} {f}"])
        .args(features)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut packages = std::collections::BTreeMap::new();
    for line in String::from_utf8(output.stdout).unwrap().lines() {
        // "hyper v1.12.0 client,http1" or "serde_derive v1.0.229 (proc-macro) " ...
        let mut words = line.split_whitespace();
        let name = words.next().unwrap().to_owned();
        let _version = words.next();
        let features: Vec<String> = words
            .filter(|word| !word.starts_with('('))
            .flat_map(|word| word.split(','))
            .map(str::to_owned)
            .collect();
        packages.entry(name).or_insert(features);
    }
    packages.remove("toolgate");
    packages
}

#[test]
fn the_client_feature_builds_the_typed_client_without_the_daemon() {
    // Crates only the daemon needs; the default build must have each (which also checks
    // that they are spelled as cargo names them).
    let daemon_only = [
        "rmcp",
        "landlock",
        "seccompiler",
        "axum",
        "tower-http",
        "dashmap",
        "jsonschema",
        "tokio-tungstenite",
        "clap",
        "notify",
        "nix",
        "io-uring",
        "ignore",
        "brush-parser",
        "tracing-subscriber",
        "reqwest",
    ];
    let full = dependency_tree(&[]);
    for name in daemon_only {
        assert!(full.contains_key(name), "the default build has no {name}");
    }
    assert!(full["hyper"].iter().any(|feature| feature == "server"), "{:?}", full["hyper"]);

    let client = dependency_tree(&["--no-default-features", "--features", "client"]);
    for name in daemon_only {
        assert!(!client.contains_key(name), "the client-only build pulls in {name}");
    }
    for name in ["jsonrpsee-core", "jsonrpsee-http-client", "serde_json", "tokio"] {
        assert!(client.contains_key(name), "the client-only build has no {name}");
    }
    // HTTP without its server half, tokio without the process and signal machinery.
    assert!(!client["hyper"].iter().any(|feature| feature == "server"), "{:?}", client["hyper"]);
    for feature in ["process", "signal", "fs"] {
        assert!(!client["tokio"].iter().any(|f| f == feature), "tokio/{feature} is enabled");
    }
    // 114 crates when this was written, against 276 for the default build.
    assert!(client.len() <= 130, "{} crates: {:?}", client.len(), client.keys());
    assert!(client.len() * 2 < full.len(), "{} of {} crates", client.len(), full.len());
}

#[tokio::test]
async fn a_refused_token_brings_the_daemons_advice_into_the_clients_error() {
    let server = Tcp::start().await;
    for (token, reason) in [
        ("wrong-secret-0123456789abcdef", "The bearer token is not valid."),
        ("", "This endpoint needs a bearer token."),
    ] {
        // The daemon's 401 body: the reason, then how to pass the token.
        let refused = within(api::connect_ws(&server.ws_url(), token)).await.unwrap_err();
        let text = refused.to_string();
        assert!(matches!(refused, Error::Transport(_)), "{refused:?}");
        assert!(text.contains("401"), "{text}");
        assert!(text.contains(reason), "{text}");
        assert!(text.contains(HOW_TO_AUTHENTICATE), "{text}");

        let client = api::connect_http(&server.http_url(), token).unwrap();
        let refused = within(client.tools_list(ToolsListParams::default())).await.unwrap_err();
        let text = refused.to_string();
        assert!(matches!(refused, Error::Transport(_)), "{refused:?}");
        assert!(text.contains("401"), "{text}");
        assert!(text.contains(reason), "{text}");
        assert!(text.contains(HOW_TO_AUTHENTICATE), "{text}");
    }
    // With the right token, the same clients go through.
    let client = api::connect_http(&server.http_url(), TOKEN).unwrap();
    assert!(within(client.tools_list(ToolsListParams::default())).await.is_ok());
    assert!(within(api::connect_ws(&server.ws_url(), TOKEN)).await.is_ok());
}

/// A Python with the `websockets` package: a virtual environment under `target/`,
/// made (and the package installed from the package index) on first use. `Err` says
/// why there is none.
fn python_with_websockets() -> Result<PathBuf, String> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target").join("python-websockets");
    let python = venv.join("bin").join("python");
    let has_websockets = || {
        Command::new(&python)
            .args(["-c", "import websockets.sync.client"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if has_websockets() {
        return Ok(python);
    }
    let run = |command: &mut Command| -> Result<(), String> {
        let output = command.stdin(Stdio::null()).output().map_err(|err| format!("{err}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!("{:?}: {}", command, String::from_utf8_lossy(&output.stderr).trim()))
        }
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin").join("pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "websockets",
    ]))?;
    if has_websockets() { Ok(python) } else { Err("websockets does not import".to_owned()) }
}

/// The README's Python block for remote agents (the one on `websockets`).
fn readme_websocket_example() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = &readme[readme.find("## Talking to the daemon").unwrap()..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |end| end + 3)];
    section
        .split("```python\n")
        .skip(1)
        .map(|block| &block[..block.find("```").unwrap()])
        .find(|block| block.contains("websockets.sync.client"))
        .expect("the section has a Python WebSocket example")
        .to_owned()
}

#[tokio::test]
async fn the_readme_websocket_agent_answers_the_approval_and_stops_at_its_result() {
    let python = match python_with_websockets() {
        Ok(python) => python,
        Err(why) => {
            eprintln!("SKIPPED: no Python with the websockets package: {why}");
            println!("SKIPPED: no Python with the websockets package: {why}");
            return;
        }
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("ci:{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // `cargo test` in the example runs this stand-in, found first in the daemon's PATH.
    let bin = dir.path().join("workspace").join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("cargo"), "#!/bin/sh\necho \"stand-in cargo: $*\"\n").unwrap();
    std::fs::set_permissions(
        bin.join("cargo"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let config =
        format!("[server]\ntcp = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"\n", tokens.display());
    std::fs::write(dir.path().join("config.toml"), &config).unwrap();
    let binary = TestDaemon::start_in_env(dir, &[("PATH", &path)]);
    within(async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    let example = readme_websocket_example();
    for placeholder in ["ws://127.0.0.1:7810/ws", "Bearer SECRET"] {
        assert!(example.contains(placeholder), "no {placeholder} in the example:\n{example}");
    }
    let script = example
        .replace("ws://127.0.0.1:7810/ws", &format!("ws://127.0.0.1:{port}/ws"))
        .replace("Bearer SECRET", &format!("Bearer {TOKEN}"));
    let mut agent = Command::new(python)
        .arg("-c")
        .arg(&script)
        .current_dir(binary.dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The person's answer to the approval the example asks for.
    std::io::Write::write_all(&mut agent.stdin.take().unwrap(), b"y\n").unwrap();
    let pid = agent.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(agent.wait_with_output()));
    let output = match finished.recv_timeout(PATIENCE) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("the example did not end on its call's result");
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\nstdout:\n{stdout}\nstderr:\n{stderr}", output.status);
    // It showed the request to the person, the live output, and the result (whose
    // content holds the output again).
    assert!(stdout.contains("run_command"), "{stdout}");
    assert!(stdout.contains("cargo test"), "{stdout}");
    assert!(stdout.matches("stand-in cargo: test").count() >= 2, "{stdout}");
    drop(binary);
}

#[test]
fn the_cli_speaks_through_the_typed_client() {
    // `toolgate call` on the Unix socket: the CLI's own path, end to end.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let binary = start();
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["call", "read_file", r#"{"path": "hello.txt"}"#, "--json", "--socket"])
        .arg(&binary.socket)
        .env("HOME", binary.dir.path())
        .env("XDG_CONFIG_HOME", binary.dir.path().join("config-home"))
        .env("XDG_RUNTIME_DIR", binary.dir.path().join("run"))
        .env_remove("TOOLGATE_SESSION")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result["ok"], true, "{result}");
    assert!(result["content"].as_str().unwrap().contains("world"), "{result}");
    // The typed answer printed is the daemon's answer, field for field.
    let direct = runtime.block_on(async {
        let client = api::connect_unix(&binary.socket).await.unwrap();
        let read = call("read_file", json!({"path": "hello.txt"}), "direct");
        serde_json::to_value(within(client.tools_call(read)).await.unwrap()).unwrap()
    });
    let keys = |value: &serde_json::Value| {
        value.as_object().unwrap().keys().cloned().collect::<Vec<String>>()
    };
    assert_eq!(keys(&result), keys(&direct));
    drop(binary);
}

type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next text message of a raw WebSocket, as JSON.
async fn next(socket: &mut WsStream) -> serde_json::Value {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        if let Message::Text(text) = within(socket.next()).await.unwrap().unwrap() {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

/// `$/cancelRequest` names a request by its JSON-RPC id, over WebSocket: the call it
/// started ends canceled, and its answer still comes.
#[tokio::test]
async fn a_request_is_canceled_by_its_id() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let server = Tcp::start().await;
    let mut request = server.ws_url().into_client_request().unwrap();
    let bearer = format!("Bearer {TOKEN}").parse().unwrap();
    request.headers_mut().insert("authorization", bearer);
    let (mut socket, _) = within(tokio_tungstenite::connect_async(request)).await.unwrap();
    let send = |value: serde_json::Value| Message::text(value.to_string());
    socket
        .send(send(json!({"jsonrpc": "2.0", "id": 1, "method": "events/subscribe"})))
        .await
        .unwrap();
    let subscribed = next(&mut socket).await;
    assert!(subscribed["result"].as_str().unwrap().starts_with("sub-"), "{subscribed}");
    let call = json!({"jsonrpc": "2.0", "id": "long", "method": "tools/call",
                          "params": {"name": "hold", "arguments": {}}});
    socket.send(send(call)).await.unwrap();
    // The call has started (its first event names the request id as its call id)
    // before it is canceled.
    loop {
        let message = next(&mut socket).await;
        if message["params"]["result"]["type"] == "tool_call_start" {
            assert_eq!(message["params"]["result"]["call_id"], "long");
            break;
        }
    }
    let cancel = json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": "long"}});
    socket.send(send(cancel)).await.unwrap();
    let answer = loop {
        let message = next(&mut socket).await;
        if message["id"] == "long" {
            break message;
        }
    };
    // Only its cancel token ends the hold.
    assert_eq!(answer["result"]["content"], "released", "{answer}");
}

/// The same typed client on any NDJSON stream: `toolgate serve --stdio`'s pipes.
#[tokio::test]
async fn the_typed_client_speaks_to_serve_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("hello.txt"), "over pipes\n").unwrap();
    std::fs::write(dir.path().join("config.toml"), "").unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--stdio", "--config"])
        .arg(dir.path().join("config.toml"))
        .current_dir(&workspace)
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path().join("config-home"))
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .env("TOOLGATE_LOG", "error")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let client = api::ndjson_client(stdout, stdin);
    let read = call("read_file", json!({"path": "hello.txt"}), "stdio-1");
    let result = within(client.tools_call(read)).await.unwrap();
    assert!(result.ok, "{result:?}");
    assert!(result.content.contains("over pipes"), "{result:?}");
    let cancel = ToolsCancelParams { call_id: "none".to_owned(), session_id: None };
    assert_eq!(within(client.tools_cancel(cancel)).await.unwrap().canceled, 0);
    drop(client);
    child.start_kill().unwrap();
    within(child.wait()).await.unwrap();
}
