//! Authentication over every network face of the real binary: the native TCP
//! transport (`POST /rpc` and `GET /ws`), MCP Streamable HTTP served by the daemon
//! (`[server] mcp_http`) and by `toolgate mcp --http`. One table of checks runs over
//! all of them: no token, a wrong token, a lowercase scheme, several named tokens;
//! token files that are readable by others, short or guessable stop every command
//! that would serve them, `check-config` included.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Far above what a passing step needs: only turns a hang into a failure.
const PATIENCE: Duration = Duration::from_secs(30);

/// Three named tokens, each with enough entropy.
const TOKENS: [(&str, &str); 3] = [
    ("ci", "ci-7Hq2xLp9Vw4Zr8Nb3Kd6"),
    ("laptop", "lap-Xc5Tg1Mv8Qs2Jy7Fh4Re"),
    ("editor", "ed-9Pw3Bn6Lk2Dz8Hx5Cv1Ty"),
];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A temporary home for one command: workspace, XDG directories, config file.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
        std::fs::write(dir.path().join("workspace").join("hello.txt"), "hello\n").unwrap();
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        std::fs::set_permissions(dir.path().join("run"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        Home { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes the token file with `lines` and `mode`; returns its path.
    fn token_file(&self, lines: &str, mode: u32) -> PathBuf {
        let path = self.path().join("tokens");
        std::fs::write(&path, lines).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn config(&self, text: &str) -> PathBuf {
        let path = self.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn command(&self, args: &[&str]) -> Command {
        let dir = self.path();
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        command
            .args(args)
            .current_dir(dir.join("workspace"))
            .env("HOME", dir)
            .env("XDG_CONFIG_HOME", dir.join("config-home"))
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env("TOOLGATE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    }

    fn audit_records(&self) -> Vec<Value> {
        let path = self.path().join("state").join("toolgate").join("audit.jsonl");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

/// A running `toolgate` process, killed on drop.
struct Running {
    child: Child,
}

impl Running {
    /// Starts `command` and waits until every port in `ports` accepts connections.
    fn start(mut command: Command, ports: &[u16]) -> Running {
        let mut child = command.spawn().unwrap();
        let deadline = Instant::now() + PATIENCE;
        for port in ports {
            while TcpStream::connect(("127.0.0.1", *port)).is_err() {
                if let Some(status) = child.try_wait().unwrap() {
                    let mut stderr = String::new();
                    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
                    panic!("toolgate exited with {status} before listening: {stderr}");
                }
                assert!(Instant::now() < deadline, "port {port} never came up");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Running { child }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until `path` exists.
fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + PATIENCE;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs a command that is expected to stop by itself; returns its output.
fn run_to_end(mut command: Command) -> Output {
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "the command kept running (it should have refused to start): {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim().eq_ignore_ascii_case(name).then(|| value.trim().to_owned())
        })
    }
}

/// One HTTP/1.1 exchange on a fresh connection. A `101` is returned as soon as its
/// head arrives (the connection then speaks WebSocket).
fn exchange(port: u16, request: &str) -> Reply {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = stream.read(&mut buffer).unwrap_or(0);
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buffer[..n]);
        if raw.starts_with(b"HTTP/1.1 101") && raw.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    Reply { status, head: head.to_owned(), body: body.to_owned() }
}

/// The network faces, each with the request that proves a client got in.
#[derive(Clone, Copy, Debug)]
enum Face {
    /// `POST /rpc` on the daemon's `tcp` listener.
    TcpHttp,
    /// `GET /ws` (a WebSocket upgrade) on the same listener.
    TcpWs,
    /// `/mcp` on the daemon's `mcp_http` listener.
    McpServe,
    /// `/mcp` of `toolgate mcp --http`.
    McpCommand,
}

impl Face {
    fn request(self, port: u16, authorization: Option<&str>) -> String {
        let auth = authorization.map(|value| format!("Authorization: {value}\r\n"));
        let auth = auth.unwrap_or_default();
        match self {
            Face::TcpHttp => {
                let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
                format!(
                    "POST /rpc HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{auth}\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
            }
            Face::TcpWs => format!(
                "GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Connection: Upgrade\r\n\
                 Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            ),
            Face::McpServe | Face::McpCommand => {
                let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "auth-test", "version": "1"}
                }})
                .to_string();
                format!(
                    "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{auth}\
                     Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                )
            }
        }
    }

    /// The status of a request that got in.
    fn admitted(self) -> u16 {
        match self {
            Face::TcpWs => 101,
            Face::TcpHttp | Face::McpServe | Face::McpCommand => 200,
        }
    }

    fn attempt(self, port: u16, authorization: Option<&str>) -> Reply {
        exchange(port, &self.request(port, authorization))
    }
}

/// The daemon with `tcp` and `mcp_http`, and `toolgate mcp --http`, all on one token
/// file holding three named tokens. Returns the face → port table and the processes.
fn start_every_face(home: &Home) -> (Vec<(Face, u16)>, Vec<Running>) {
    let lines: String =
        TOKENS.iter().map(|(name, secret)| format!("{name}:{secret}\n")).collect::<String>();
    let tokens = home.token_file(&format!("# who may connect\n{lines}"), 0o600);
    let (tcp, mcp_http, mcp_command) = (free_port(), free_port(), free_port());
    let config = home.config(&format!(
        "[server]\ntcp = \"127.0.0.1:{tcp}\"\nmcp_http = \"127.0.0.1:{mcp_http}\"\n\
         token_file = \"{}\"\n",
        tokens.display()
    ));
    let config = config.to_str().unwrap().to_owned();
    let socket = home.path().join("run").join("toolgate").join("toolgate.sock");
    let serve = home.command(&["serve", "--config", &config, "--socket", socket.to_str().unwrap()]);
    let daemon = Running::start(serve, &[tcp, mcp_http]);
    let address = format!("127.0.0.1:{mcp_command}");
    let mcp = home.command(&["mcp", "--config", &config, "--http", &address]);
    let command = Running::start(mcp, &[mcp_command]);
    let faces = vec![
        (Face::TcpHttp, tcp),
        (Face::TcpWs, tcp),
        (Face::McpServe, mcp_http),
        (Face::McpCommand, mcp_command),
    ];
    (faces, vec![daemon, command])
}

#[test]
fn every_face_checks_the_bearer_token_the_same_way() {
    let home = Home::new();
    let (faces, _running) = start_every_face(&home);
    let (_, secret) = TOKENS[0];
    let wrong = "wr0ng-7Hq2xLp9Vw4Zr8Nb3Kd6";
    // (what is sent, whether it gets in)
    let table: Vec<(String, bool)> = vec![
        (String::new(), false),
        (format!("Bearer {wrong}"), false),
        (format!("Bearer {secret}x"), false),
        (format!("Basic {secret}"), false),
        (format!("Bearer {}", &secret[..secret.len() - 1]), false),
        (format!("Bearer {secret}"), true),
        (format!("bearer {secret}"), true),
        (format!("BEARER {secret}"), true),
        (format!("Bearer {}", TOKENS[1].1), true),
        (format!("Bearer {}", TOKENS[2].1), true),
    ];
    for (face, port) in &faces {
        for (authorization, admitted) in &table {
            let header = (!authorization.is_empty()).then_some(authorization.as_str());
            let reply = face.attempt(*port, header);
            if *admitted {
                assert_eq!(
                    reply.status,
                    face.admitted(),
                    "{face:?} with {authorization:?}: {}{}",
                    reply.head,
                    reply.body
                );
            } else {
                assert_eq!(reply.status, 401, "{face:?} with {authorization:?}: {}", reply.head);
                let challenge = reply.header("www-authenticate").unwrap_or_default();
                assert!(challenge.starts_with("Bearer"), "{face:?}: {challenge:?}");
                // Nothing invites an OAuth discovery: toolgate runs no authorization
                // server, and says how to pass the token instead.
                assert!(!challenge.contains("resource_metadata"), "{face:?}: {challenge:?}");
                assert!(
                    reply.body.contains("Authorization: Bearer"),
                    "{face:?}: the 401 body should say how to pass the token: {:?}",
                    reply.body
                );
            }
        }
    }
}

#[test]
fn mcp_http_publishes_no_oauth_metadata() {
    let home = Home::new();
    let (faces, _running) = start_every_face(&home);
    for (face, port) in faces {
        if !matches!(face, Face::McpServe | Face::McpCommand) {
            continue;
        }
        for path in [
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-authorization-server",
            "/.well-known/openid-configuration",
        ] {
            let reply = exchange(
                port,
                &format!(
                    "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
                ),
            );
            assert_eq!(reply.status, 404, "{face:?} {path}: {}", reply.head);
        }
    }
}

/// Initializes an MCP session with `secret` and reads `hello.txt` through it.
fn mcp_read_file(port: u16, secret: &str) {
    let auth = format!("Authorization: Bearer {secret}\r\n");
    let post = |session: Option<&str>, body: Value| {
        let body = body.to_string();
        let session = session
            .map(|id| format!("Mcp-Session-Id: {id}\r\nMCP-Protocol-Version: 2025-11-25\r\n"));
        exchange(
            port,
            &format!(
                "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{auth}{}\
                 Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                session.unwrap_or_default(),
                body.len()
            ),
        )
    };
    let reply = post(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "auth-test", "version": "1"}}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    let session = reply.header("mcp-session-id").unwrap();
    let reply =
        post(Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    assert_eq!(reply.status, 202, "{}", reply.body);
    let reply = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "read_file", "arguments": {"path": "hello.txt"}}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("hello"), "{}", reply.body);
}

#[test]
fn the_token_name_identifies_the_client_in_the_audit_log() {
    let home = Home::new();
    let (faces, running) = start_every_face(&home);
    let tcp = faces.iter().find(|(face, _)| matches!(face, Face::TcpHttp)).unwrap().1;
    let mcp = faces.iter().find(|(face, _)| matches!(face, Face::McpServe)).unwrap().1;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "read_file", "arguments": {"path": "hello.txt"}}})
    .to_string();
    let reply = exchange(
        tcp,
        &format!(
            "POST /rpc HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            TOKENS[1].1,
            body.len()
        ),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    mcp_read_file(mcp, TOKENS[2].1);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let clients: Vec<String> = home
            .audit_records()
            .iter()
            .map(|record| record["client"].as_str().unwrap_or_default().to_owned())
            .collect();
        if clients.contains(&"token:laptop".to_owned())
            && clients.contains(&"token:editor".to_owned())
        {
            break;
        }
        assert!(Instant::now() < deadline, "audit clients: {clients:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(running);
}

/// A token file that must stop `serve`, `mcp --http` and `check-config` alike.
fn assert_refused_everywhere(home: &Home, tokens: &Path, expected: &str) {
    let (tcp, mcp_http) = (free_port(), free_port());
    let config = home.config(&format!(
        "[server]\ntcp = \"127.0.0.1:{tcp}\"\nmcp_http = \"127.0.0.1:{mcp_http}\"\n\
         token_file = \"{}\"\n",
        tokens.display()
    ));
    let config = config.to_str().unwrap().to_owned();
    let socket = home.path().join("run").join("toolgate").join("refused.sock");
    let address = format!("127.0.0.1:{}", free_port());
    let commands = [
        home.command(&["serve", "--config", &config, "--socket", socket.to_str().unwrap()]),
        home.command(&["mcp", "--config", &config, "--http", &address]),
        home.command(&["check-config", "--config", &config]),
    ];
    for command in commands {
        let shown = format!("{:?}", command.get_args().collect::<Vec<_>>());
        let output = run_to_end(command);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{shown} accepted the token file: {stderr}");
        assert!(stderr.contains(expected), "{shown}: expected {expected:?} in {stderr:?}");
    }
}

#[test]
fn weak_or_exposed_token_files_are_refused_by_every_command() {
    let home = Home::new();
    let good = format!("ci:{}\n", TOKENS[0].1);
    let readable = home.token_file(&good, 0o644);
    assert_refused_everywhere(&home, &readable, "readable by other users");
    let short = home.token_file("ci:abc\n", 0o600);
    assert_refused_everywhere(&home, &short, "at least 16 characters");
    let guessable = home.token_file("ci:aaaaaaaaaaaaaaaaaaaaaaaa\n", 0o600);
    assert_refused_everywhere(&home, &guessable, "guessable");
    let unnamed = home.token_file(&format!("{}\n", TOKENS[0].1), 0o600);
    assert_refused_everywhere(&home, &unnamed, "name:secret");
    let missing = home.path().join("no-such-tokens");
    assert_refused_everywhere(&home, &missing, "cannot read the token file");
}

#[test]
fn mcp_http_without_a_token_file_generates_a_private_token() {
    let home = Home::new();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let config = home.config("");
    let mut command =
        home.command(&["mcp", "--config", config.to_str().unwrap(), "--http", &address]);
    command.stderr(Stdio::piped());
    let mut running = Running::start(command, &[port]);
    let dir = home.path().join("run").join("toolgate");
    // The port accepts connections once bound, a moment before the token is written.
    let expected = dir.join(format!("mcp-http-{port}.tokens"));
    wait_for_file(&expected);
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().contains("mcp")))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let lines: Vec<&str> = text.lines().filter(|line| !line.starts_with('#')).collect();
    assert_eq!(lines.len(), 1, "{text}");
    let (name, secret) = lines[0].split_once(':').unwrap();
    assert_eq!(name, "mcp");
    assert!(secret.len() >= 32, "{secret}");

    assert_eq!(Face::McpCommand.attempt(port, None).status, 401);
    let reply = Face::McpCommand.attempt(port, Some(&format!("Bearer {secret}")));
    assert_eq!(reply.status, 200, "{}", reply.body);

    // The user is told where the token is and how to send it (never the secret).
    let _ = running.child.kill();
    let _ = running.child.wait();
    let mut stderr = String::new();
    running.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(stderr.contains(&files[0].display().to_string()), "{stderr}");
    assert!(stderr.contains("Authorization: Bearer"), "{stderr}");
    assert!(!stderr.contains(secret), "the secret reached the log: {stderr}");
}

#[test]
fn mcp_http_beyond_loopback_needs_a_token_file() {
    let home = Home::new();
    let config = home.config("");
    let address = format!("0.0.0.0:{}", free_port());
    let output = run_to_end(home.command(&[
        "mcp",
        "--config",
        config.to_str().unwrap(),
        "--http",
        &address,
    ]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("token_file"), "{stderr}");
    // Nothing was generated for an address that is refused.
    let generated = home.path().join("run").join("toolgate");
    assert!(!generated.exists() || std::fs::read_dir(&generated).unwrap().next().is_none());
}

#[test]
fn the_daemons_mcp_http_without_a_token_file_generates_one_too() {
    let home = Home::new();
    let port = free_port();
    let config = home.config(&format!("[server]\nmcp_http = \"127.0.0.1:{port}\"\n"));
    let socket = home.path().join("run").join("toolgate").join("toolgate.sock");
    let serve = home.command(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ]);
    let _daemon = Running::start(serve, &[port]);
    let path = home.path().join("run").join("toolgate").join(format!("mcp-http-{port}.tokens"));
    wait_for_file(&path);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&path).unwrap();
    let secret = text.lines().find_map(|line| line.strip_prefix("mcp:")).unwrap();
    assert_eq!(Face::McpServe.attempt(port, None).status, 401);
    let reply = Face::McpServe.attempt(port, Some(&format!("Bearer {secret}")));
    assert_eq!(reply.status, 200, "{}", reply.body);
}
