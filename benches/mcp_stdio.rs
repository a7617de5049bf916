//! Load generator for the MCP face over stdio: `tools/call` read_file of one 4 KiB
//! file, measured two ways on each server:
//! - latency: one request in flight at a time, p50/p99 of the round trip;
//! - throughput: 64 requests in flight, calls/s (with p50/p99 under that load);
//! - and, for scale, `ping` with one in flight: the protocol round trip alone, and
//!   `tools/list` with one in flight (its target: a p50 at most twice ping's).
//!
//! Servers: toolgate in-process over a duplex pipe (no process boundary, for
//! reference), `toolgate mcp` as a child process (the release binary,
//! `target/release/toolgate`, or `TOOLGATE_BIN`), the floor (this executable run as
//! the least an MCP server can be: it reads each line as JSON, reads the file and
//! answers with its text; no schema, guard, audit or anything else), and
//! `@modelcontextprotocol/server-filesystem` as a child process when `MCP_FS_SERVER`
//! holds its command (e.g. `node …/dist/index.js`; the file's directory is appended
//! as its allowed directory). Both child servers read the same file (toolgate by its
//! path relative to the root, server-filesystem's `read_text_file` by its absolute
//! path), after the same warm-up, from this one load generator. Every answer is
//! checked: a JSON-RPC error, `isError: true`, a missing answer, or text without the
//! file's first and last lines is a failure; any failure is reported loudly, the
//! ratio is not given, and the run exits with status 1.
//!
//! One command does it all, installing a pinned server-filesystem (and Node 22)
//! under `target/` and building the release binary first:
//!
//! ```sh
//! benches/mcp_compare.sh
//! ```
//!
//! Or by hand: `cargo build --release && MCP_FS_SERVER="node …/dist/index.js" cargo
//! bench --bench mcp_stdio`. Knobs (environment): `BENCH_LATENCY_CALLS` (default
//! 5000), `BENCH_CALLS` (throughput calls, default 20000), `BENCH_WARMUP_CALLS`
//! (default 2000). Without `--bench` (as under `cargo test --benches`) it makes a few
//! calls of each kind as a smoke test.
//!
//! Targets, all ratios to servers measured in the same run: at least 10×
//! server-filesystem's calls/s with 64 in flight; against the floor, at least 0.75× its
//! calls/s with 64 in flight and a p50 with one in flight at most 1.3× its p50; and a
//! `tools/list` p50 at most 2× toolgate's own `ping`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, Lines};
use toolgate::daemon::{Daemon, Settings};
use toolgate::mcp::{McpOptions, serve_stream};
use toolgate::tools::Registry;

/// Requests in flight at once for the throughput measurement.
const IN_FLIGHT: usize = 64;
/// The file every call reads, and its size.
const FILE_NAME: &str = "four_k.txt";
const FILE_BYTES: usize = 4096;
/// The longest a server may take to answer anything before the run is called broken.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// The issue's targets.
const TARGET_RATIO: f64 = 10.0;
const TARGET_FLOOR_RATE: f64 = 0.75;
const TARGET_FLOOR_P50: f64 = 1.3;
/// The argument that runs this executable as the floor server.
const FLOOR_ARG: &str = "--floor-server";

/// How many calls each measurement makes.
struct Plan {
    warmup: usize,
    latency: usize,
    throughput: usize,
}

impl Plan {
    fn from_env(smoke: bool) -> Plan {
        let count = |name: &str, default: usize| {
            std::env::var(name).ok().and_then(|n| n.parse().ok()).unwrap_or(default)
        };
        if smoke {
            return Plan { warmup: 10, latency: 20, throughput: 200 };
        }
        Plan {
            warmup: count("BENCH_WARMUP_CALLS", 2_000),
            latency: count("BENCH_LATENCY_CALLS", 5_000),
            throughput: count("BENCH_CALLS", 20_000),
        }
    }
}

/// 64 lines of 64 bytes: exactly 4 KiB, with recognizable first and last lines.
fn file_text() -> String {
    let text: String = (0..64).map(|i| format!("{i:04} {}\n", "x".repeat(58))).collect();
    debug_assert_eq!(text.len(), FILE_BYTES);
    text
}

/// What a successful answer's text must contain: the file's first and last lines.
struct Expect {
    first: String,
    last: String,
}

impl Expect {
    fn new(text: &str) -> Expect {
        let mut lines = text.lines();
        Expect {
            first: lines.next().unwrap_or_default().to_owned(),
            last: lines.next_back().unwrap_or_default().to_owned(),
        }
    }
}

/// One measurement.
#[derive(Default)]
struct Phase {
    answered: usize,
    asked: usize,
    failures: usize,
    first_failure: Option<String>,
    p50: Duration,
    p99: Duration,
    per_second: f64,
}

impl Phase {
    fn fail(&mut self, why: String) {
        self.failures += 1;
        if self.first_failure.is_none() {
            self.first_failure = Some(why);
        }
    }
}

/// The answer to a `tools/call`, as much of it as is checked.
#[derive(Deserialize)]
struct Answer {
    id: Option<u64>,
    result: Option<CallResult>,
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CallResult {
    #[serde(default)]
    content: Vec<Block>,
    #[serde(default)]
    is_error: bool,
    /// A `tools/list` answer's tools: counted, not built into values (a tree of every
    /// schema would time this load generator's allocations, not the server).
    #[serde(default)]
    tools: Vec<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(default)]
    text: Option<String>,
}

/// One MCP conversation with a server, after the handshake.
struct Conn<R, W> {
    lines: Lines<BufReader<R>>,
    writer: W,
    next_id: u64,
    request_tail: String,
}

/// What a measurement asks.
#[derive(Clone, Copy)]
enum Ask<'a> {
    /// The tools/call, whose answer must carry the file.
    Call(&'a Expect),
    /// `ping`: the protocol's round trip alone, no tool.
    Ping,
    /// `tools/list`, whose answer must list tools.
    List,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> Conn<R, W> {
    async fn open(reader: R, writer: W, tool: &str, path: &str) -> Result<Self, String> {
        let mut conn = Conn {
            lines: BufReader::new(reader).lines(),
            writer,
            next_id: 1,
            // Everything of a request after its id.
            request_tail: format!(
                r#","method":"tools/call","params":{{"name":{},"arguments":{{"path":{}}}}}}}"#,
                json!(tool),
                json!(path)
            ),
        };
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "mcp_stdio bench", "version": "1"}}});
        conn.write(format!("{init}\n").as_bytes()).await?;
        loop {
            let line = conn.next_line().await?;
            if serde_json::from_str::<serde_json::Value>(&line).is_ok_and(|m| m["id"] == json!(0)) {
                break;
            }
        }
        conn.write(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n").await?;
        Ok(conn)
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.writer.write_all(bytes).await.map_err(|err| format!("the server's input: {err}"))?;
        self.writer.flush().await.map_err(|err| format!("the server's input: {err}"))
    }

    async fn next_line(&mut self) -> Result<String, String> {
        match tokio::time::timeout(STEP_TIMEOUT, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => Err("the server closed its output".to_owned()),
            Ok(Err(err)) => Err(format!("the server's output: {err}")),
            Err(_) => Err(format!("no answer within {STEP_TIMEOUT:?}")),
        }
    }

    /// `calls` calls with at most `in_flight` outstanding; new requests are written
    /// together whenever the window has room.
    async fn measure(&mut self, calls: usize, in_flight: usize, ask: Ask<'_>) -> Phase {
        let tail = match ask {
            Ask::Call(_) => self.request_tail.clone(),
            Ask::Ping => r#","method":"ping"}"#.to_owned(),
            Ask::List => r#","method":"tools/list","params":{}}"#.to_owned(),
        };
        let mut phase = Phase { asked: calls, ..Phase::default() };
        let mut started: HashMap<u64, Instant> = HashMap::with_capacity(in_flight);
        let mut latencies = Vec::with_capacity(calls);
        let mut sent = 0usize;
        let mut batch = Vec::with_capacity(in_flight * (tail.len() + 32));
        let begin = Instant::now();
        while phase.answered < calls {
            batch.clear();
            let now = Instant::now();
            while started.len() < in_flight && sent < calls {
                let id = self.next_id;
                self.next_id += 1;
                batch.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
                batch.extend_from_slice(id.to_string().as_bytes());
                batch.extend_from_slice(tail.as_bytes());
                batch.push(b'\n');
                started.insert(id, now);
                sent += 1;
            }
            if !batch.is_empty()
                && let Err(err) = self.write(&batch).await
            {
                phase.fail(err);
                break;
            }
            let line = match self.next_line().await {
                Ok(line) => line,
                Err(err) => {
                    phase.fail(err);
                    break;
                }
            };
            let answer: Answer = match serde_json::from_str(&line) {
                Ok(answer) => answer,
                Err(err) => {
                    phase.fail(format!("unreadable answer ({err}): {}", clip(&line)));
                    continue;
                }
            };
            let Some(at) = answer.id.and_then(|id| started.remove(&id)) else {
                continue; // a notification, or an answer to nothing in flight
            };
            latencies.push(at.elapsed());
            phase.answered += 1;
            if let Some(why) = check(&answer, ask) {
                phase.fail(format!("{why}: {}", clip(&line)));
            }
        }
        let elapsed = begin.elapsed();
        // Calls never answered are failures too.
        for _ in phase.answered..calls {
            phase.failures += 1;
        }
        latencies.sort();
        let pick = |q: f64| {
            latencies
                .get(((latencies.len() as f64 - 1.0) * q) as usize)
                .copied()
                .unwrap_or_default()
        };
        phase.p50 = pick(0.50);
        phase.p99 = pick(0.99);
        phase.per_second = phase.answered as f64 / elapsed.as_secs_f64();
        phase
    }
}

/// Why an answer is not a successful read of the file, if it is not.
fn check(answer: &Answer, ask: Ask<'_>) -> Option<&'static str> {
    if answer.error.is_some() {
        return Some("JSON-RPC error");
    }
    let Some(result) = &answer.result else { return Some("no result") };
    if let Ask::List = ask {
        return result.tools.is_empty().then_some("no tools listed");
    }
    let Ask::Call(expect) = ask else { return None };
    if result.is_error {
        return Some("isError");
    }
    let text = result.content.first().and_then(|block| block.text.as_deref()).unwrap_or("");
    if !text.contains(&expect.first) || !text.contains(&expect.last) {
        return Some("the text is not the file's");
    }
    None
}

fn clip(line: &str) -> String {
    line.chars().take(300).collect()
}

/// A server measured: warm-up, then latency, then throughput, on one conversation.
struct Measured {
    label: &'static str,
    latency: Phase,
    throughput: Phase,
    /// `ping` with one in flight: the protocol's floor, without any tool.
    ping: Phase,
    /// `tools/list` with one in flight.
    list: Phase,
}

impl Measured {
    fn failures(&self) -> usize {
        self.latency.failures + self.throughput.failures + self.ping.failures + self.list.failures
    }
}

async fn measure_conn<R, W>(
    label: &'static str,
    reader: R,
    writer: W,
    tool: &str,
    path: &str,
    plan: &Plan,
    expect: &Expect,
) -> Result<Measured, String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut conn = Conn::open(reader, writer, tool, path).await?;
    let warmup = conn.measure(plan.warmup, IN_FLIGHT, Ask::Call(expect)).await;
    if warmup.failures > 0 {
        return Err(format!(
            "{} of {} warm-up calls failed; first: {}",
            warmup.failures,
            warmup.asked,
            warmup.first_failure.unwrap_or_default()
        ));
    }
    let latency = conn.measure(plan.latency, 1, Ask::Call(expect)).await;
    let throughput = conn.measure(plan.throughput, IN_FLIGHT, Ask::Call(expect)).await;
    let ping = conn.measure(plan.latency, 1, Ask::Ping).await;
    let list = conn.measure(plan.latency, 1, Ask::List).await;
    Ok(Measured { label, latency, throughput, ping, list })
}

/// A server run as a child process, and what it is asked.
struct ChildServer {
    label: &'static str,
    command: Vec<String>,
    env: Vec<(&'static str, PathBuf)>,
    tool: &'static str,
    path: String,
}

/// Starts the server in `cwd` and measures it.
async fn measure_child(
    server: &ChildServer,
    cwd: &Path,
    plan: &Plan,
    expect: &Expect,
) -> Result<Measured, String> {
    let (program, args) = server.command.split_first().ok_or("empty command")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(cwd)
        .envs(server.env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| format!("cannot start {program}: {err}"))?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let measured =
        measure_conn(server.label, stdout, stdin, server.tool, &server.path, plan, expect).await;
    let _ = child.kill().await;
    measured
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn report(measured: &Measured) {
    for (what, phase) in [
        ("1 in flight", &measured.latency),
        ("64 in flight", &measured.throughput),
        ("ping, 1 in f.", &measured.ping),
        ("list, 1 in f.", &measured.list),
    ] {
        println!(
            "{:<34} {what:<13} p50 {:>8.1} µs  p99 {:>8.1} µs  {:>9.0} calls/s  {} calls{}",
            measured.label,
            micros(phase.p50),
            micros(phase.p99),
            phase.per_second,
            phase.asked,
            if phase.failures == 0 {
                String::new()
            } else {
                format!(
                    "  !!! {} FAILED (first: {})",
                    phase.failures,
                    phase.first_failure.as_deref().unwrap_or("?")
                )
            }
        );
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// The floor: an MCP server over stdio that does the least one can. Each line is read
/// as JSON; `initialize`, `ping` and `tools/list` get the shortest valid answers, a
/// `tools/call` reads the file its `path` names (relative to the working directory)
/// and answers with its text. Answers go out when no more input is waiting.
fn serve_floor() -> ExitCode {
    use std::io::{BufRead, Write};
    let mut input = std::io::BufReader::with_capacity(1 << 16, std::io::stdin());
    let mut output = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut line = Vec::with_capacity(4096);
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return ExitCode::SUCCESS,
            Ok(_) => {}
        }
        let Ok(message) = serde_json::from_slice::<serde_json::Value>(&line) else { continue };
        let Some(id) = message.get("id") else { continue };
        let params = &message["params"];
        let answer = |result| json!({"jsonrpc": "2.0", "id": id, "result": result});
        let answer = match message["method"].as_str().unwrap_or_default() {
            "initialize" => answer(json!({
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "floor", "version": "1"}
            })),
            "ping" => answer(json!({})),
            "tools/list" => answer(json!({"tools": [{
                "name": "read_file",
                "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}
            }]})),
            "tools/call" => {
                let path = params["arguments"]["path"].as_str().unwrap_or_default();
                answer(match std::fs::read_to_string(path) {
                    Ok(text) => json!({"content": [{"type": "text", "text": text}]}),
                    Err(err) => json!({
                        "content": [{"type": "text", "text": err.to_string()}],
                        "isError": true
                    }),
                })
            }
            _ => json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {"code": -32601, "message": "method not found"}
            }),
        };
        if serde_json::to_writer(&mut output, &answer).is_err() || output.write_all(b"\n").is_err()
        {
            return ExitCode::FAILURE;
        }
        if input.buffer().is_empty() && output.flush().is_err() {
            return ExitCode::FAILURE;
        }
    }
}

fn main() -> ExitCode {
    if std::env::args().any(|arg| arg == FLOOR_ARG) {
        return serve_floor();
    }
    let smoke = !std::env::args().any(|arg| arg == "--bench");
    let plan = Plan::from_env(smoke);
    let Ok(dir) = tempfile::tempdir() else { return ExitCode::FAILURE };
    let Ok(base) = std::fs::canonicalize(dir.path()) else { return ExitCode::FAILURE };
    // The root holds the file and nothing else; toolgate's configuration and state
    // live beside it, so that no user configuration (hooks, rules) takes part.
    let root = base.join("root");
    let xdg_config = base.join("config");
    let xdg_state = base.join("state");
    for dir in [&root, &xdg_config, &xdg_state] {
        if std::fs::create_dir_all(dir).is_err() {
            return ExitCode::FAILURE;
        }
    }
    let text = file_text();
    let file = root.join(FILE_NAME);
    if std::fs::write(&file, &text).is_err() {
        return ExitCode::FAILURE;
    }
    let expect = Expect::new(&text);

    println!(
        "MCP stdio: tools/call read_file of a {FILE_BYTES}-byte file; {} warm-up calls, then \
         {} calls with 1 in flight, then {} calls with {IN_FLIGHT} in flight",
        plan.warmup, plan.latency, plan.throughput
    );
    println!(
        "cores: {}; load average at start: {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        loadavg()
    );

    let mut measured: Vec<Measured> = Vec::new();
    let mut broken: Vec<String> = Vec::new();

    // In process, over a duplex pipe: the server on a runtime of its own (as the real
    // binary has), the load generator on this thread.
    let Ok(server_rt) = tokio::runtime::Builder::new_multi_thread().enable_all().build() else {
        return ExitCode::FAILURE;
    };
    let Ok(client_rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return ExitCode::FAILURE;
    };
    let (client, server) = tokio::io::duplex(1 << 20);
    let serving = {
        let _entered = server_rt.enter();
        let daemon = Daemon::new(
            Arc::new(Registry::with_builtins()),
            Settings::for_roots(vec![root.clone()]),
            None,
        );
        let (server_read, server_write) = tokio::io::split(server);
        server_rt.spawn(serve_stream(daemon, McpOptions::default(), server_read, server_write))
    };
    let (client_read, client_write) = tokio::io::split(client);
    match client_rt.block_on(measure_conn(
        "toolgate (in-process, duplex)",
        client_read,
        client_write,
        "read_file",
        FILE_NAME,
        &plan,
        &expect,
    )) {
        Ok(result) => measured.push(result),
        Err(err) => broken.push(format!("toolgate (in-process): {err}")),
    }
    serving.abort();
    drop(server_rt);

    // Measures a child server: its place among the results, or why it has none.
    let measure = |server: &ChildServer,
                   name: &str,
                   measured: &mut Vec<Measured>,
                   broken: &mut Vec<String>| {
        match client_rt.block_on(measure_child(server, &root, &plan, &expect)) {
            Ok(result) => {
                measured.push(result);
                Some(measured.len() - 1)
            }
            Err(err) => {
                broken.push(format!("{name}: {err}"));
                None
            }
        }
    };

    // The real binary.
    let binary = std::env::var_os("TOOLGATE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/toolgate"));
    let mut ours = None;
    if binary.exists() {
        let server = ChildServer {
            label: "toolgate mcp (child, stdio)",
            command: vec![
                binary.display().to_string(),
                "mcp".into(),
                "--root".into(),
                root.display().to_string(),
            ],
            env: vec![
                ("XDG_CONFIG_HOME", xdg_config.clone()),
                ("XDG_STATE_HOME", xdg_state.clone()),
            ],
            tool: "read_file",
            path: FILE_NAME.to_owned(),
        };
        ours = measure(&server, "toolgate mcp", &mut measured, &mut broken);
    } else {
        println!("skipped toolgate mcp: no {} (cargo build --release)", binary.display());
    }

    // The floor: this executable, serving the least an MCP server can.
    let mut floor = None;
    match std::env::current_exe() {
        Ok(exe) => {
            let server = ChildServer {
                label: "floor (child, stdio)",
                command: vec![exe.display().to_string(), FLOOR_ARG.into()],
                env: Vec::new(),
                tool: "read_file",
                path: FILE_NAME.to_owned(),
            };
            floor = measure(&server, "floor", &mut measured, &mut broken);
        }
        Err(err) => broken.push(format!("floor: this executable's path: {err}")),
    }

    let mut theirs = None;
    match std::env::var("MCP_FS_SERVER") {
        Ok(command) => {
            let mut command: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
            command.push(root.display().to_string());
            let server = ChildServer {
                label: "server-filesystem (child, stdio)",
                command,
                env: Vec::new(),
                tool: "read_text_file",
                path: file.display().to_string(),
            };
            theirs = measure(&server, "server-filesystem", &mut measured, &mut broken);
        }
        Err(_) => println!(
            "skipped server-filesystem: set MCP_FS_SERVER=\"node …/dist/index.js\" (or run \
             benches/mcp_compare.sh)"
        ),
    }

    println!();
    for result in &measured {
        report(result);
    }
    println!("load average at end: {}", loadavg());

    let failures: usize = measured.iter().map(Measured::failures).sum();
    if failures > 0 || !broken.is_empty() {
        println!();
        println!("!!! THIS RUN IS NOT VALID");
        if failures > 0 {
            println!("!!! {failures} calls failed (see the rows marked FAILED)");
        }
        for why in &broken {
            println!("!!! {why}");
        }
        println!("!!! no ratio is given for a run with failures");
        return ExitCode::FAILURE;
    }

    if smoke {
        println!("a smoke run (every server answered); no target is judged without --bench");
        return ExitCode::SUCCESS;
    }
    if let Some(ours) = ours.map(|i| &measured[i]) {
        println!("toolgate p50 with 1 in flight: {:.1} µs", micros(ours.latency.p50));
        println!(
            "toolgate tools/list p50: {:.1} µs, {:.2}x its ping's {:.1} µs (target ≤ 2x: {})",
            micros(ours.list.p50),
            ours.list.p50.as_secs_f64() / ours.ping.p50.as_secs_f64().max(1e-9),
            micros(ours.ping.p50),
            verdict(ours.list.p50 <= ours.ping.p50 * 2)
        );
        if let Some(floor) = floor.map(|i| &measured[i]) {
            let rate = ours.throughput.per_second / floor.throughput.per_second;
            println!(
                "calls/s with {IN_FLIGHT} in flight, toolgate / floor: {:.0} / {:.0} = \
                 {rate:.2}x (target ≥ {TARGET_FLOOR_RATE}x: {})",
                ours.throughput.per_second,
                floor.throughput.per_second,
                verdict(rate >= TARGET_FLOOR_RATE)
            );
            let p50 = ours.latency.p50.as_secs_f64() / floor.latency.p50.as_secs_f64().max(1e-9);
            println!(
                "p50 with 1 in flight, toolgate / floor: {:.1} / {:.1} µs = {p50:.2}x \
                 (target ≤ {TARGET_FLOOR_P50}x: {})",
                micros(ours.latency.p50),
                micros(floor.latency.p50),
                verdict(p50 <= TARGET_FLOOR_P50)
            );
        }
        if let Some(theirs) = theirs.map(|i| &measured[i]) {
            let ratio = ours.throughput.per_second / theirs.throughput.per_second;
            println!(
                "calls/s with {IN_FLIGHT} in flight, toolgate / server-filesystem: {:.0} / {:.0} \
                 = {ratio:.1}x (target ≥ {TARGET_RATIO}x: {})",
                ours.throughput.per_second,
                theirs.throughput.per_second,
                verdict(ratio >= TARGET_RATIO)
            );
            println!(
                "p50 with 1 in flight, server-filesystem: {:.1} µs ({:.1}x toolgate's)",
                micros(theirs.latency.p50),
                theirs.latency.p50.as_secs_f64() / ours.latency.p50.as_secs_f64().max(1e-9)
            );
        }
    }
    ExitCode::SUCCESS
}
