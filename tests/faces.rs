//! The same checks over every face: a guarantee that holds on one way in must hold on
//! all of them. Each face is reached as its clients reach it — the real binary on a
//! Unix socket (NDJSON and WebSocket) and on stdio (`serve --stdio`), the TCP
//! transport (HTTP and WebSocket), and the MCP face (stdio and Streamable HTTP) — and
//! every row of the tables below runs on every face that has its method. The
//! authentication rows run on every face that takes a token, each as the real binary
//! serves it: the TCP transport's HTTP and WebSocket routes, the daemon's MCP
//! Streamable HTTP listener and `toolgate mcp --http`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod auth_support;
mod mcp_support;
mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use toolgate::auth::TokenSet;
use toolgate::daemon::{Daemon, Settings};
use toolgate::mcp::{McpOptions, http_router};
use toolgate::rpc::tcp::{self, TcpOptions};
use toolgate::tools::Registry;

use auth_support::{Home, NetFace, TOKENS, free_port, run_to_end, start_every_face};
use support::{dechunk, within};

const TOKEN: &str = "faces-secret-0123456789abcdef";

const PARSE_ERROR: i64 = -32700;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// A frame and the error code (or codes, for a batch: `0` is a success) it must get.
struct Check {
    name: &'static str,
    frame: Value,
    expect: &'static [i64],
}

fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn update(id: u64, params: Value) -> Value {
    request(id, "session/update", params)
}

/// Narrowing refused: a client can never widen what it has, whatever the way in.
/// Batches keep the narrowing and the attempt to widen on one connection (an HTTP
/// request is a connection of its own); a batch's elements answer in order.
fn narrowing_checks() -> Vec<Check> {
    let narrow = || update(1, json!({"allowlist": ["read_file"]}));
    vec![
        Check {
            name: "roots outside the session's",
            frame: update(1, json!({"roots": ["/"]})),
            expect: &[INVALID_PARAMS],
        },
        Check {
            name: "cwd outside the roots",
            frame: update(1, json!({"cwd": "/"})),
            expect: &[INVALID_PARAMS],
        },
        Check {
            name: "mode beyond the configured one",
            frame: update(1, json!({"mode": "bypass"})),
            expect: &[INVALID_PARAMS],
        },
        Check {
            name: "timeout above the session's",
            frame: update(1, json!({"timeout_ms": 1_000_000_000_000u64})),
            expect: &[INVALID_PARAMS],
        },
        Check {
            name: "output limit above the session's",
            frame: update(1, json!({"max_output_bytes": 1u64 << 50})),
            expect: &[INVALID_PARAMS],
        },
        Check {
            name: "read limit above the session's",
            frame: update(1, json!({"max_read_bytes": 1u64 << 50})),
            expect: &[INVALID_PARAMS],
        },
        Check {
            name: "allowlist widened",
            frame: json!([narrow(), update(2, json!({"allowlist": ["read_file", "write_file"]}))]),
            expect: &[0, INVALID_PARAMS],
        },
        Check {
            name: "allowlist emptied (every tool)",
            frame: json!([narrow(), update(2, json!({"allowlist": []}))]),
            expect: &[0, INVALID_PARAMS],
        },
        Check {
            name: "a new session outside the connection's allowlist",
            frame: json!([
                narrow(),
                request(2, "session/open", json!({"allowlist": ["write_file"]}))
            ]),
            expect: &[0, INVALID_PARAMS],
        },
        Check {
            name: "narrowing is accepted",
            frame: update(1, json!({"mode": "plan", "timeout_ms": 1000, "cwd": "."})),
            expect: &[0],
        },
    ]
}

/// What every face must answer the same way.
fn protocol_checks() -> Vec<Check> {
    vec![
        Check {
            name: "unknown method",
            frame: request(7, "no/such_method", json!({})),
            expect: &[METHOD_NOT_FOUND],
        },
        Check { name: "malformed JSON", frame: Value::Null, expect: &[PARSE_ERROR] },
    ]
}

/// Every face that takes a bearer token.
const TOKEN_FACES: &[NetFace] =
    &[NetFace::TcpHttp, NetFace::TcpWs, NetFace::McpServe, NetFace::McpCommand];

/// What an authentication row does on a face.
enum Auth {
    /// A request with this `Authorization` header (none for `None`): let in, or
    /// refused with `401`, a Bearer challenge that invites no OAuth discovery and a
    /// body that says how to pass the token.
    Request { authorization: Option<String>, admitted: bool },
    /// The face is started with this token file (`None`: a path where no file is):
    /// it refuses to start, `check-config` refuses the same configuration, and both
    /// say `expected`.
    TokenFile { lines: Option<String>, mode: u32, expected: &'static str },
}

/// One authentication row and the faces it applies to.
struct AuthCheck {
    name: &'static str,
    auth: Auth,
    faces: &'static [NetFace],
}

/// Authentication, for every face that takes a token: no token, a wrong token, a
/// token file readable by others, a token too short to be secret, and the rest of
/// what the one token loader and header parser promise.
fn authentication_checks() -> Vec<AuthCheck> {
    let (_, secret) = TOKENS[0];
    let request = |name, authorization: Option<String>, admitted| AuthCheck {
        name,
        auth: Auth::Request { authorization, admitted },
        faces: TOKEN_FACES,
    };
    let file = |name, lines: Option<String>, mode, expected| AuthCheck {
        name,
        auth: Auth::TokenFile { lines, mode, expected },
        faces: TOKEN_FACES,
    };
    let named = format!("ci:{secret}\n");
    vec![
        request("no token", None, false),
        request("wrong token", Some("Bearer wr0ng-7Hq2xLp9Vw4Zr8Nb3Kd6".to_owned()), false),
        request("token with a character added", Some(format!("Bearer {secret}x")), false),
        request("token cut short", Some(format!("Bearer {}", &secret[..secret.len() - 1])), false),
        request("another scheme", Some(format!("Basic {secret}")), false),
        request("the token", Some(format!("Bearer {secret}")), true),
        request("the scheme in lower case", Some(format!("bearer {secret}")), true),
        request("the scheme in upper case", Some(format!("BEARER {secret}")), true),
        request("a second named token", Some(format!("Bearer {}", TOKENS[1].1)), true),
        request("a third named token", Some(format!("Bearer {}", TOKENS[2].1)), true),
        file(
            "token file readable by others",
            Some(named.clone()),
            0o644,
            "readable by other users",
        ),
        file("short token", Some("ci:abc\n".to_owned()), 0o600, "at least 16 characters"),
        file(
            "guessable token",
            Some("ci:aaaaaaaaaaaaaaaaaaaaaaaa\n".to_owned()),
            0o600,
            "guessable",
        ),
        file("token without a name", Some(format!("{secret}\n")), 0o600, "name:secret"),
        file("no token file", None, 0o600, "cannot read the token file"),
    ]
}

/// The text sent for a check (`Value::Null` stands for malformed JSON).
fn frame_text(frame: &Value) -> String {
    match frame {
        Value::Null => "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ".to_owned(),
        other => other.to_string(),
    }
}

/// The error codes of an answer (`0` for a result), one per response.
fn codes(answer: &Value) -> Vec<i64> {
    let one = |response: &Value| {
        response["http_status"].as_i64().or(response["error"]["code"].as_i64()).unwrap_or(0)
    };
    match answer {
        Value::Array(items) => items.iter().map(one).collect(),
        single => vec![one(single)],
    }
}

/// One way in.
enum Face {
    /// Newline-delimited JSON (Unix socket, stdio of `serve --stdio`).
    Lines {
        reader: BufReader<Box<dyn AsyncRead + Unpin + Send>>,
        writer: Box<dyn AsyncWrite + Unpin + Send>,
    },
    WebSocket(Box<dyn WsLike>),
    /// One HTTP POST per frame.
    Http {
        addr: SocketAddr,
        path: &'static str,
        headers: Vec<(String, String)>,
    },
}

/// A WebSocket client, whatever it runs on.
trait WsLike: Send {
    fn send(&mut self, text: String) -> futures::future::BoxFuture<'_, ()>;
    fn next_text(&mut self) -> futures::future::BoxFuture<'_, String>;
}

impl<S> WsLike for tokio_tungstenite::WebSocketStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    fn send(&mut self, text: String) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move { SinkExt::send(self, Message::text(text)).await.unwrap() })
    }

    fn next_text(&mut self) -> futures::future::BoxFuture<'_, String> {
        Box::pin(async move {
            loop {
                match self.next().await.expect("open").expect("a frame") {
                    Message::Text(text) => return text.to_string(),
                    _ => continue,
                }
            }
        })
    }
}

/// A response (or a batch of them), not a notification.
fn is_answer(value: &Value) -> bool {
    value.is_array() || (value.get("id").is_some() && value.get("method").is_none())
}

impl Face {
    async fn exchange(&mut self, text: &str) -> Value {
        match self {
            Face::Lines { reader, writer } => {
                writer.write_all(text.as_bytes()).await.unwrap();
                writer.write_all(b"\n").await.unwrap();
                writer.flush().await.unwrap();
                loop {
                    let mut line = String::new();
                    assert!(within(reader.read_line(&mut line)).await.unwrap() > 0, "closed");
                    let value: Value = serde_json::from_str(&line).unwrap();
                    if is_answer(&value) {
                        return value;
                    }
                }
            }
            Face::WebSocket(socket) => {
                within(socket.send(text.to_owned())).await;
                loop {
                    let value: Value =
                        serde_json::from_str(&within(socket.next_text()).await).unwrap();
                    if is_answer(&value) {
                        return value;
                    }
                }
            }
            Face::Http { addr, path, headers } => {
                let mut request = format!(
                    "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
                     Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                );
                for (name, value) in headers.iter() {
                    request.push_str(&format!("{name}: {value}\r\n"));
                }
                request.push_str(&format!("Content-Length: {}\r\n\r\n{text}", text.len()));
                let mut stream = within(tokio::net::TcpStream::connect(*addr)).await.unwrap();
                stream.write_all(request.as_bytes()).await.unwrap();
                let mut raw = Vec::new();
                within(stream.read_to_end(&mut raw)).await.unwrap();
                let raw = String::from_utf8_lossy(&raw).into_owned();
                let body = raw.split_once("\r\n\r\n").map_or("", |(_, body)| body);
                let body = if raw.to_ascii_lowercase().contains("transfer-encoding: chunked") {
                    dechunk(body)
                } else {
                    body.to_owned()
                };
                // Server-sent events carry the message in `data:` lines.
                let data: Vec<&str> =
                    body.lines().filter_map(|line| line.strip_prefix("data:")).collect();
                let json = if data.is_empty() { body.trim().to_owned() } else { data.join("") };
                // An answer that is not JSON-RPC at all stands as its HTTP status.
                serde_json::from_str(json.trim()).unwrap_or_else(|_| {
                    let status = raw.split_whitespace().nth(1).and_then(|code| code.parse().ok());
                    json!({"http_status": status.unwrap_or(0), "body": body})
                })
            }
        }
    }
}

/// The real binary, started for one face and killed with it.
struct Binary {
    _dir: tempfile::TempDir,
    child: tokio::process::Child,
    socket: PathBuf,
}

impl Binary {
    fn command(dir: &std::path::Path) -> tokio::process::Command {
        let workspace = dir.join("workspace");
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::write(dir.join("config.toml"), "").unwrap();
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"));
        command
            .current_dir(&workspace)
            .env("HOME", dir)
            .env("XDG_CONFIG_HOME", dir.join("config-home"))
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env("TOOLGATE_LOG", "error")
            .stderr(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// `toolgate serve --socket`, once it listens.
    async fn socket() -> Binary {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run").join("toolgate.sock");
        let child = Binary::command(dir.path())
            .args(["serve", "--socket"])
            .arg(&socket)
            .arg("--config")
            .arg(dir.path().join("config.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        within(async {
            while tokio::net::UnixStream::connect(&socket).await.is_err() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        Binary { _dir: dir, child, socket }
    }

    /// `toolgate serve --stdio`, spoken to on its pipes.
    fn stdio() -> (Binary, Face) {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Binary::command(dir.path())
            .args(["serve", "--stdio", "--config"])
            .arg(dir.path().join("config.toml"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let face =
            Face::Lines { reader: BufReader::new(Box::new(stdout)), writer: Box::new(stdin) };
        (Binary { _dir: dir, child, socket: PathBuf::new() }, face)
    }

    async fn stop(mut self) {
        self.child.start_kill().unwrap();
        within(self.child.wait()).await.unwrap();
    }
}

/// A library daemon over a temporary root (for the TCP and MCP HTTP listeners).
struct Library {
    _dir: tempfile::TempDir,
    daemon: Arc<Daemon>,
    addr: SocketAddr,
}

impl Library {
    async fn tcp() -> Library {
        Library::start(|daemon, listener| {
            let options = TcpOptions::new(TokenSet::from_pairs([("faces", TOKEN)]).unwrap());
            tokio::spawn(async move {
                let _ = tcp::serve(daemon, listener, options).await;
            });
        })
        .await
    }

    async fn mcp_http() -> Library {
        Library::start(|daemon, listener| {
            let options = McpOptions {
                tokens: TokenSet::from_pairs([("faces", TOKEN)]).unwrap(),
                ..McpOptions::default()
            };
            let router = http_router(daemon.clone(), options);
            let shutdown = daemon.shutdown_token().clone();
            tokio::spawn(async move {
                let _ = axum::serve(listener, router)
                    .with_graceful_shutdown(async move { shutdown.cancelled().await })
                    .await;
            });
        })
        .await
    }

    async fn start(serve: impl FnOnce(Arc<Daemon>, tokio::net::TcpListener)) -> Library {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let registry = Registry::with_builtins();
        let daemon = Daemon::new(Arc::new(registry), Settings::for_roots(vec![root]), None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        serve(daemon.clone(), listener);
        Library { _dir: dir, daemon, addr }
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        self.daemon.begin_shutdown();
    }
}

/// Runs checks on a face (a fresh connection per check, from `connect`); the
/// failures, named.
async fn run<F, Fut>(face: &str, checks: &[Check], mut connect: F) -> Vec<String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Face>,
{
    let mut failures = Vec::new();
    for check in checks {
        let mut connection = connect().await;
        let answer = connection.exchange(&frame_text(&check.frame)).await;
        if codes(&answer) != check.expect {
            failures
                .push(format!("{face}: {}: expected {:?}, got {answer}", check.name, check.expect));
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_native_face_refuses_the_same_things() {
    let mut checks = narrowing_checks();
    checks.extend(protocol_checks());
    let mut failures = Vec::new();

    let binary = Binary::socket().await;
    let socket = binary.socket.clone();
    failures.extend(
        run("unix ndjson", &checks, || async {
            let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
            let (read, write) = tokio::io::split(stream);
            Face::Lines { reader: BufReader::new(Box::new(read)), writer: Box::new(write) }
        })
        .await,
    );
    failures.extend(
        run("unix websocket", &checks, || async {
            let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
            let (ws, _) = tokio_tungstenite::client_async("ws://localhost/", stream).await.unwrap();
            Face::WebSocket(Box::new(ws))
        })
        .await,
    );
    binary.stop().await;

    // `serve --stdio` serves one connection per process.
    let mut stdio_failures = Vec::new();
    for check in &checks {
        let (binary, mut face) = Binary::stdio();
        let answer = face.exchange(&frame_text(&check.frame)).await;
        if codes(&answer) != check.expect {
            stdio_failures
                .push(format!("stdio: {}: expected {:?}, got {answer}", check.name, check.expect));
        }
        drop(face);
        binary.stop().await;
    }
    failures.extend(stdio_failures);

    let tcp = Library::tcp().await;
    let addr = tcp.addr;
    let bearer = vec![("Authorization".to_owned(), format!("Bearer {TOKEN}"))];
    failures.extend(
        run("tcp http", &checks, || {
            let headers = bearer.clone();
            async move { Face::Http { addr, path: "/rpc", headers } }
        })
        .await,
    );
    failures.extend(
        run("tcp websocket", &checks, || async move {
            let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
            let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
            Face::WebSocket(Box::new(ws))
        })
        .await,
    );
    drop(tcp);

    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_face_that_takes_a_token_authenticates_the_same_way() {
    let checks = authentication_checks();
    let mut failures = Vec::new();

    // Requests: the daemon (TCP transport and MCP HTTP) and `toolgate mcp --http`,
    // all on one token file of three named tokens.
    let home = Home::new();
    let (ports, running) = start_every_face(&home);
    for check in &checks {
        let Auth::Request { authorization, admitted } = &check.auth else { continue };
        for face in check.faces {
            let Some(&(_, port)) = ports.iter().find(|(running, _)| running == face) else {
                failures.push(format!("{face:?}: not started"));
                continue;
            };
            let reply = face.attempt(port, authorization.as_deref());
            let name = check.name;
            if *admitted {
                if reply.status != face.admitted() {
                    failures.push(format!("{face:?}: {name}: {}{}", reply.head, reply.body));
                }
                continue;
            }
            let challenge = reply.header("www-authenticate").unwrap_or_default();
            if reply.status != 401 || !challenge.starts_with("Bearer") {
                failures
                    .push(format!("{face:?}: {name}: expected a 401 challenge: {}", reply.head));
            }
            // Nothing invites an OAuth discovery (toolgate runs no authorization
            // server); a bearer token that is wrong is said to be invalid.
            let bearer = authorization
                .as_deref()
                .is_some_and(|value| value.to_ascii_lowercase().starts_with("bearer "));
            if challenge.contains("resource_metadata")
                || challenge.contains("error=\"invalid_token\"") != bearer
            {
                failures.push(format!("{face:?}: {name}: challenge {challenge:?}"));
            }
            if !reply.body.contains("Authorization: Bearer") {
                failures
                    .push(format!("{face:?}: {name}: the body does not say how: {}", reply.body));
            }
        }
    }
    drop(running);

    // Token files: each face refuses to start on a weak or exposed one, and so does
    // `check-config` on the same configuration.
    for check in &checks {
        let Auth::TokenFile { lines, mode, expected } = &check.auth else { continue };
        let home = Home::new();
        let tokens = match lines {
            Some(lines) => home.token_file(lines, *mode),
            None => home.path().join("no-such-tokens"),
        };
        for face in check.faces {
            for (shown, command) in refusing_commands(&home, *face, &tokens) {
                let output = run_to_end(command);
                let stderr = String::from_utf8_lossy(&output.stderr);
                if output.status.success() || !stderr.contains(expected) {
                    failures.push(format!(
                        "{face:?}: {}: {shown} should refuse with {expected:?}: {stderr}",
                        check.name
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The commands that serve `face` with `tokens` (and `check-config` for the
/// daemon's faces), each shown by its arguments.
fn refusing_commands(
    home: &Home,
    face: NetFace,
    tokens: &std::path::Path,
) -> Vec<(String, std::process::Command)> {
    let address = format!("127.0.0.1:{}", free_port());
    let key = match face {
        NetFace::TcpHttp | NetFace::TcpWs => "tcp",
        NetFace::McpServe => "mcp_http",
        NetFace::McpCommand => "",
    };
    let listener = if key.is_empty() { String::new() } else { format!("{key} = \"{address}\"\n") };
    let config =
        home.config(&format!("[server]\n{listener}token_file = \"{}\"\n", tokens.display()));
    let config = config.to_str().unwrap().to_owned();
    let socket = home.path().join("run").join("toolgate").join("refused.sock");
    let commands = match face {
        NetFace::McpCommand => {
            vec![home.command(&["mcp", "--config", &config, "--http", &address])]
        }
        _ => vec![
            home.command(&["serve", "--config", &config, "--socket", socket.to_str().unwrap()]),
            home.command(&["check-config", "--config", &config]),
        ],
    };
    commands
        .into_iter()
        .map(|command| (format!("{:?}", command.get_args().collect::<Vec<_>>()), command))
        .collect()
}

#[tokio::test]
async fn every_mcp_face_answers_protocol_errors_the_same_way() {
    let checks = protocol_checks();
    let mut failures = Vec::new();

    // MCP stdio: the handshake first, then each check.
    let test = mcp_support::TestDaemon::new();
    for check in &checks {
        let mut client = mcp_support::StdioClient::start(&test.daemon, McpOptions::default());
        client.initialize("2025-11-25", json!({})).await;
        client.send_raw(&frame_text(&check.frame)).await;
        let answer = client.until(is_answer).await;
        if codes(&answer) != check.expect {
            failures.push(format!(
                "mcp stdio: {}: expected {:?}, got {answer}",
                check.name, check.expect
            ));
        }
        client.close().await;
    }

    // MCP Streamable HTTP: a session per check.
    let http = Library::mcp_http().await;
    for check in &checks {
        let bearer = vec![("Authorization".to_owned(), format!("Bearer {TOKEN}"))];
        let mut face = Face::Http { addr: http.addr, path: "/mcp", headers: bearer };
        let initialize = request(
            1,
            "initialize",
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "faces", "version": "1"}
            }),
        );
        let session = mcp_http_session(http.addr, &initialize).await;
        if let Face::Http { headers, .. } = &mut face {
            headers.push(("Mcp-Session-Id".to_owned(), session));
            headers.push(("MCP-Protocol-Version".to_owned(), "2025-11-25".to_owned()));
        }
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let _ = face_post_status(&face, &initialized.to_string()).await;
        let answer = face.exchange(&frame_text(&check.frame)).await;
        if codes(&answer) != check.expect {
            failures.push(format!(
                "mcp http: {}: expected {:?}, got {answer}",
                check.name, check.expect
            ));
        }
        // Streamable HTTP answers a body it cannot accept with 400 (the JSON-RPC error
        // in the body, as checked above).
        if check.expect == [PARSE_ERROR]
            && face_post_status(&face, &frame_text(&check.frame)).await
                != "HTTP/1.1 400 Bad Request"
        {
            failures.push(format!("mcp http: {}: not answered 400", check.name));
        }
    }
    drop(http);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Opens a Streamable HTTP session; its id.
async fn mcp_http_session(addr: SocketAddr, initialize: &Value) -> String {
    let body = initialize.to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Authorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = within(tokio::net::TcpStream::connect(addr)).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    within(stream.read_to_end(&mut raw)).await.unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    raw.lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id").then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session id: {raw}"))
}

/// Posts a notification on a face's session; the HTTP status line.
async fn face_post_status(face: &Face, text: &str) -> String {
    let Face::Http { addr, path, headers } = face else { return String::new() };
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{text}", text.len()));
    let mut stream = within(tokio::net::TcpStream::connect(*addr)).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    within(stream.read_to_end(&mut raw)).await.unwrap();
    String::from_utf8_lossy(&raw).lines().next().unwrap_or("").to_owned()
}
