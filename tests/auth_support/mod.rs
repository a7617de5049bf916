//! The network faces of the real binary and how to reach them: a temporary home with
//! a token file, the daemon (`serve` with `[server] tcp` and `mcp_http`) and
//! `toolgate mcp --http`, and raw HTTP/1.1 exchanges. Shared by tests/auth.rs and the
//! authentication rows of tests/faces.rs.

#![allow(dead_code, unreachable_pub)]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Far above what a passing step needs: only turns a hang into a failure.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Three named tokens, each with enough entropy.
pub const TOKENS: [(&str, &str); 3] = [
    ("ci", "ci-7Hq2xLp9Vw4Zr8Nb3Kd6"),
    ("laptop", "lap-Xc5Tg1Mv8Qs2Jy7Fh4Re"),
    ("editor", "ed-9Pw3Bn6Lk2Dz8Hx5Cv1Ty"),
];

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A temporary home for one command: workspace, XDG directories, config file.
pub struct Home {
    pub dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
        std::fs::write(dir.path().join("workspace").join("hello.txt"), "hello\n").unwrap();
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        std::fs::set_permissions(dir.path().join("run"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        Home { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes the token file with `lines` and `mode`; returns its path.
    pub fn token_file(&self, lines: &str, mode: u32) -> PathBuf {
        let path = self.path().join("tokens");
        std::fs::write(&path, lines).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    pub fn config(&self, text: &str) -> PathBuf {
        let path = self.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        command.args(args);
        self.prepare(&mut command);
        command
    }

    /// The command with at most `descriptors` open files, soft and hard limit alike
    /// (the shell sets both, then becomes toolgate).
    pub fn command_with_descriptors(&self, descriptors: u32, args: &[&str]) -> Command {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit -n {descriptors} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_toolgate"))
            .args(args);
        self.prepare(&mut command);
        command
    }

    /// The environment, directory and standard streams of a command run in this home.
    fn prepare(&self, command: &mut Command) {
        let dir = self.path();
        command
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
    }

    pub fn audit_records(&self) -> Vec<Value> {
        let path = self.path().join("state").join("toolgate").join("audit.jsonl");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

/// A running `toolgate` process, killed on drop.
pub struct Running {
    pub child: Child,
}

impl Running {
    /// Starts `command` and waits until every port in `ports` accepts connections.
    pub fn start(mut command: Command, ports: &[u16]) -> Running {
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
pub fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + PATIENCE;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs a command that is expected to stop by itself; returns its output.
pub fn run_to_end(mut command: Command) -> Output {
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

pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim().eq_ignore_ascii_case(name).then(|| value.trim().to_owned())
        })
    }

    /// The JSON-RPC messages of the body: a JSON body, or the `data:` lines of an SSE
    /// stream (chunked or not).
    pub fn messages(&self) -> Vec<Value> {
        let chunked = self.header("transfer-encoding").is_some_and(|te| te.contains("chunked"));
        let body = if chunked { dechunk(&self.body) } else { self.body.clone() };
        if self.header("content-type").is_some_and(|ct| ct.starts_with("text/event-stream")) {
            body.lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str(data.trim()).ok())
                .collect()
        } else {
            serde_json::from_str(&body).into_iter().collect()
        }
    }

    /// The answer to the request with `id`.
    pub fn answer(&self, id: u64) -> Value {
        self.messages()
            .into_iter()
            .find(|message| message["id"] == json!(id))
            .unwrap_or_else(|| panic!("no answer to {id}: {} {}", self.head, self.body))
    }
}

/// The payload of a chunked body.
fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    loop {
        let Some((size, rest)) = raw.split_once("\r\n") else { return out };
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            return out;
        }
        out.push_str(&rest[..size]);
        raw = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
}

/// `toolgate mcp --mode bypass --http` on a free loopback port, its token file holding
/// `tokens` (`name`, `secret`), with `config` appended to its `[server]` section (it
/// may open other sections). Returns the port and the process.
pub fn start_mcp_http(home: &Home, tokens: &[(&str, &str)], config: &str) -> (u16, Running) {
    start_mcp_http_with(home, tokens, config, None)
}

/// [`start_mcp_http`], with at most `descriptors` open files when given.
pub fn start_mcp_http_with(
    home: &Home,
    tokens: &[(&str, &str)],
    config: &str,
    descriptors: Option<u32>,
) -> (u16, Running) {
    let lines: String =
        tokens.iter().map(|(name, secret)| format!("{name}:{secret}\n")).collect::<String>();
    let file = home.token_file(&lines, 0o600);
    let config = home.config(&format!("[server]\ntoken_file = \"{}\"\n{config}", file.display()));
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let args =
        ["mcp", "--config", config.to_str().unwrap(), "--mode", "bypass", "--http", &address];
    let command = match descriptors {
        Some(descriptors) => home.command_with_descriptors(descriptors, &args),
        None => home.command(&args),
    };
    let running = Running::start(command, &[port]);
    (port, running)
}

/// One request to `/mcp` of `port` with the bearer `secret`, in `session` if given
/// (with the protocol version header of 2025-11-25); a POST when `body` is given.
pub fn mcp_exchange(
    port: u16,
    secret: &str,
    method: &str,
    session: Option<&str>,
    body: Option<&Value>,
) -> Reply {
    let session = session
        .map(|id| format!("Mcp-Session-Id: {id}\r\nMCP-Protocol-Version: 2025-11-25\r\n"))
        .unwrap_or_default();
    let (content, body) = match body {
        Some(body) => (
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n",
            body.to_string(),
        ),
        None => ("Accept: text/event-stream\r\n", String::new()),
    };
    exchange(
        port,
        &format!(
            "{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
             Authorization: Bearer {secret}\r\n{session}{content}Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Opens an MCP session of protocol `version` with `secret`, declaring `capabilities`,
/// and completes its handshake; returns its id.
pub fn mcp_session(port: u16, secret: &str, version: &str, capabilities: Value) -> String {
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": capabilities,
        "clientInfo": {"name": "auth-test", "version": "1"}}});
    let reply = mcp_exchange(port, secret, "POST", None, Some(&initialize));
    assert_eq!(reply.status, 200, "{}", reply.body);
    let session = reply.header("mcp-session-id").unwrap();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let reply = mcp_exchange(port, secret, "POST", Some(&session), Some(&initialized));
    assert_eq!(reply.status, 202, "{}", reply.body);
    session
}

/// A `tools/call` of `name` with `arguments` as request `id`.
pub fn tools_call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
}

/// One HTTP/1.1 exchange on a fresh connection. A `101` is returned as soon as its
/// head arrives (the connection then speaks WebSocket).
pub fn exchange(port: u16, request: &str) -> Reply {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetFace {
    /// `POST /rpc` on the daemon's `tcp` listener.
    TcpHttp,
    /// `GET /ws` (a WebSocket upgrade) on the same listener.
    TcpWs,
    /// `/mcp` on the daemon's `mcp_http` listener.
    McpServe,
    /// `/mcp` of `toolgate mcp --http`.
    McpCommand,
}

impl NetFace {
    pub fn request(self, port: u16, authorization: Option<&str>) -> String {
        let auth = authorization.map(|value| format!("Authorization: {value}\r\n"));
        let auth = auth.unwrap_or_default();
        match self {
            NetFace::TcpHttp => {
                let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
                format!(
                    "POST /rpc HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{auth}\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
            }
            NetFace::TcpWs => format!(
                "GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Connection: Upgrade\r\n\
                 Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            ),
            NetFace::McpServe | NetFace::McpCommand => {
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
    pub fn admitted(self) -> u16 {
        match self {
            NetFace::TcpWs => 101,
            NetFace::TcpHttp | NetFace::McpServe | NetFace::McpCommand => 200,
        }
    }

    pub fn attempt(self, port: u16, authorization: Option<&str>) -> Reply {
        exchange(port, &self.request(port, authorization))
    }
}

/// The daemon with `tcp` and `mcp_http`, and `toolgate mcp --http`, all on one token
/// file holding three named tokens. Returns the face → port table and the processes.
pub fn start_every_face(home: &Home) -> (Vec<(NetFace, u16)>, Vec<Running>) {
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
        (NetFace::TcpHttp, tcp),
        (NetFace::TcpWs, tcp),
        (NetFace::McpServe, mcp_http),
        (NetFace::McpCommand, mcp_command),
    ];
    (faces, vec![daemon, command])
}
