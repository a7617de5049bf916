//! Load generator for the MCP face over stdio framing: `tools/call read_file` of a
//! 4 KiB file with 64 requests in flight; prints p50/p99 latency and calls/s.
//!
//! Targets: toolgate in-process over a duplex pipe, `toolgate mcp` as a child process
//! when it is built in release mode (`cargo build --release`), and `@modelcontextprotocol/server-filesystem` when
//! `MCP_FS_SERVER="node /path/to/dist/index.js"` is set; then the ratio is printed.
//!
//! Run: `cargo bench --bench mcp_stdio` (BENCH_CALLS=N to change the count).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use toolgate::daemon::{Daemon, Settings};
use toolgate::mcp::{McpOptions, serve_stream};
use toolgate::tools::Registry;

/// Requests in flight at once.
const IN_FLIGHT: usize = 64;

struct Stats {
    p50: Duration,
    p99: Duration,
    per_second: f64,
    ok: bool,
}

async fn drive<R, W>(reader: R, mut writer: W, tool: &str, path: &str, calls: usize) -> Stats
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let mut lines = BufReader::new(reader).lines();
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}});
    send(&mut writer, &init).await;
    wait_for(&mut lines, 0).await;
    send(&mut writer, &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;

    let mut started: HashMap<u64, Instant> = HashMap::new();
    let mut latencies = Vec::with_capacity(calls);
    let mut next_id = 1u64;
    let mut ok = true;
    let begin = Instant::now();
    while latencies.len() < calls {
        while started.len() < IN_FLIGHT && (next_id as usize) <= calls {
            let call = json!({"jsonrpc": "2.0", "id": next_id, "method": "tools/call",
                "params": {"name": tool, "arguments": {"path": path}}});
            started.insert(next_id, Instant::now());
            send(&mut writer, &call).await;
            next_id += 1;
        }
        let Ok(Some(line)) = lines.next_line().await else { break };
        let Ok(message) = serde_json::from_str::<Value>(&line) else { continue };
        if let Some(id) = message.get("id").and_then(Value::as_u64)
            && let Some(at) = started.remove(&id)
        {
            latencies.push(at.elapsed());
            ok &= message["result"]["isError"] == json!(false);
        }
    }
    let elapsed = begin.elapsed();
    latencies.sort();
    let pick = |q: f64| {
        latencies.get(((latencies.len() as f64 - 1.0) * q) as usize).copied().unwrap_or_default()
    };
    Stats {
        p50: pick(0.50),
        p99: pick(0.99),
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        ok,
    }
}

async fn send<W: AsyncWrite + Unpin>(writer: &mut W, message: &Value) {
    let mut line = message.to_string();
    line.push('\n');
    if writer.write_all(line.as_bytes()).await.is_err() {
        eprintln!("the server closed its input");
    }
    let _ = writer.flush().await;
}

async fn wait_for<R: AsyncRead + Unpin>(lines: &mut tokio::io::Lines<BufReader<R>>, id: u64) {
    while let Ok(Some(line)) = lines.next_line().await {
        if serde_json::from_str::<Value>(&line).is_ok_and(|m| m["id"] == json!(id)) {
            return;
        }
    }
}

fn report(label: &str, stats: &Stats) {
    println!(
        "{label:<40} p50 {:>8.1} µs  p99 {:>8.1} µs  {:>9.0} calls/s{}",
        stats.p50.as_secs_f64() * 1e6,
        stats.p99.as_secs_f64() * 1e6,
        stats.per_second,
        if stats.ok { "" } else { "  (calls returned errors: read_file not built here?)" }
    );
}

async fn child(command: &[String], calls: usize, tool: &str, path: &str) -> Option<Stats> {
    let (program, args) = command.split_first()?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()?;
    let stdin = child.stdin.take()?;
    let stdout = child.stdout.take()?;
    let stats = drive(stdout, stdin, tool, path, calls).await;
    let _ = child.kill().await;
    Some(stats)
}

#[tokio::main]
async fn main() {
    let calls: usize =
        std::env::var("BENCH_CALLS").ok().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let Ok(dir) = tempfile::tempdir() else { return };
    let Ok(root) = std::fs::canonicalize(dir.path()) else { return };
    let file = root.join("four_k.txt");
    let text: String = (0..64).map(|i| format!("{i:04} {}\n", "x".repeat(58))).collect();
    if std::fs::write(&file, &text[..4096.min(text.len())]).is_err() {
        return;
    }

    // In-process over a duplex pipe.
    let daemon = Daemon::new(
        Arc::new(Registry::with_builtins()),
        Settings::for_roots(vec![root.clone()]),
        None,
    );
    let (client, server) = tokio::io::duplex(1 << 20);
    let (server_read, server_write) = tokio::io::split(server);
    let serving =
        tokio::spawn(serve_stream(daemon, McpOptions::default(), server_read, server_write));
    let (client_read, client_write) = tokio::io::split(client);
    let inproc = drive(client_read, client_write, "read_file", "four_k.txt", calls).await;
    report("toolgate (in-process, duplex)", &inproc);
    serving.abort();

    // The real binary (`cargo bench` builds it in release mode alongside the bench).
    let binary = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/toolgate");
    let mut ours = None;
    if binary.exists() {
        let command = vec![
            binary.display().to_string(),
            "mcp".into(),
            "--root".into(),
            root.display().to_string(),
        ];
        ours = child(&command, calls, "read_file", "four_k.txt").await;
        if let Some(stats) = &ours {
            report("toolgate (child process, stdio)", stats);
        }
    } else {
        println!("skipped the child-process run: build it with cargo build --release");
    }

    match std::env::var("MCP_FS_SERVER") {
        Ok(command) => {
            let mut command: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
            command.push(root.display().to_string());
            let path = file.display().to_string();
            if let Some(theirs) = child(&command, calls.min(5_000), "read_text_file", &path).await {
                report("server-filesystem (child process, stdio)", &theirs);
                let ours = ours.as_ref().unwrap_or(&inproc);
                println!(
                    "calls/s ratio toolgate / server-filesystem: {:.1}x",
                    ours.per_second / theirs.per_second
                );
            }
        }
        Err(_) => println!("skipped server-filesystem: set MCP_FS_SERVER=\"node …/dist/index.js\""),
    }
}
