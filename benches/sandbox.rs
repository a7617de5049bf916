//! What the kernel sandbox costs a command: `run_command "true"` over MCP stdio,
//! one call at a time, on two `toolgate mcp` servers that differ only in
//! `[sandbox] enabled`. Calls alternate between the two servers, so that the
//! machine's noise hits both alike; the report gives each one's p50 and p99 and the
//! difference of the p50s (the target: under 1 ms).
//!
//! `cargo bench --bench sandbox` (the binary built for benchmarks, or `TOOLGATE_BIN`).
//! With `TOOLGATE_BIN_BEFORE` naming another build (the tree before a change), a third
//! server runs that build with its sandbox on, in the same alternation, and the report
//! gives the change's cost: the difference of the two sandboxed p50s.
//! Knob: `BENCH_CALLS` (per server, default 500). Without `--bench` (as under
//! `cargo test --benches`) it makes a few calls as a smoke test. Every answer is
//! checked: a call that did not succeed fails the run.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// One `toolgate mcp` over its pipes.
struct Server {
    label: &'static str,
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    next_id: u64,
    times: Vec<Duration>,
}

impl Server {
    fn start(
        label: &'static str,
        binary: &Path,
        base: &Path,
        config: &str,
    ) -> Result<Server, String> {
        let home = base.join(label);
        let root = home.join("root");
        std::fs::create_dir_all(&root).map_err(|err| err.to_string())?;
        let config_file = home.join("config.toml");
        std::fs::write(&config_file, config).map_err(|err| err.to_string())?;
        let mut child = Command::new(binary)
            .args(["mcp", "--mode", "bypass", "--config"])
            .arg(&config_file)
            .current_dir(&root)
            .env("XDG_CONFIG_HOME", home.join("config-home"))
            .env("XDG_STATE_HOME", home.join("state"))
            .env("XDG_RUNTIME_DIR", home.join("run"))
            .env("TOOLGATE_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", binary.display()))?;
        let input = child.stdin.take().ok_or("no stdin")?;
        let output = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut server = Server { label, child, input, output, next_id: 1, times: Vec::new() };
        server.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "sandbox bench", "version": "1"}}),
        )?;
        server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        Ok(server)
    }

    fn send(&mut self, message: &Value) -> Result<(), String> {
        writeln!(self.input, "{message}").map_err(|err| format!("{}: {err}", self.label))?;
        self.input.flush().map_err(|err| format!("{}: {err}", self.label))
    }

    /// Sends a request and returns its answer's result (notifications are skipped).
    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.output.read_line(&mut line).map_err(|err| err.to_string())?;
            if read == 0 {
                return Err(format!("{} closed its output", self.label));
            }
            let message: Value = serde_json::from_str(&line).map_err(|err| err.to_string())?;
            if message["id"] == json!(id) {
                return match message.get("result") {
                    Some(result) => Ok(result.clone()),
                    None => Err(format!("{}: {message}", self.label)),
                };
            }
        }
    }

    /// One timed `run_command "true"`.
    fn run_true(&mut self) -> Result<(), String> {
        let started = Instant::now();
        let result = self.request(
            "tools/call",
            json!({"name": "run_command", "arguments": {"command": "true"}}),
        )?;
        let took = started.elapsed();
        if result["isError"] == json!(true) {
            return Err(format!("{}: run_command failed: {result}", self.label));
        }
        self.times.push(took);
        Ok(())
    }

    fn percentile(&self, share: f64) -> Duration {
        let mut times = self.times.clone();
        times.sort_unstable();
        let at = ((times.len() as f64 * share) as usize).min(times.len().saturating_sub(1));
        times.get(at).copied().unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary() -> PathBuf {
    std::env::var_os("TOOLGATE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_toolgate")))
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn run(calls: usize) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|err| err.to_string())?;
    let base = std::fs::canonicalize(dir.path()).map_err(|err| err.to_string())?;
    let binary = binary();
    let mut on = Server::start("sandbox on", &binary, &base, "")?;
    let mut off = Server::start("sandbox off", &binary, &base, "[sandbox]\nenabled = false\n")?;
    let mut before = match std::env::var_os("TOOLGATE_BIN_BEFORE") {
        Some(other) => Some(Server::start("before, on", Path::new(&other), &base, "")?),
        None => None,
    };
    let status =
        on.request("tools/call", json!({"name": "run_command", "arguments": {"command": "true"}}))?;
    let in_force = status["structuredContent"]["metadata"]["sandbox"].clone();
    println!(
        "run_command \"true\" over MCP stdio, {calls} calls each, alternating; sandbox in force: {in_force}"
    );
    for _ in 0..calls.min(20) {
        on.run_true()?;
        off.run_true()?;
        before.as_mut().map(Server::run_true).transpose()?;
    }
    on.times.clear();
    off.times.clear();
    if let Some(before) = &mut before {
        before.times.clear();
    }
    for _ in 0..calls {
        on.run_true()?;
        off.run_true()?;
        before.as_mut().map(Server::run_true).transpose()?;
    }
    for server in [Some(&on), Some(&off), before.as_ref()].into_iter().flatten() {
        println!(
            "{:<12} p50 {:>7.2} ms  p99 {:>7.2} ms",
            server.label,
            millis(server.percentile(0.5)),
            millis(server.percentile(0.99))
        );
    }
    let cost = millis(on.percentile(0.5)) - millis(off.percentile(0.5));
    println!("the sandbox adds {cost:.2} ms at p50 (target: under 1 ms)");
    if let Some(before) = &before {
        let change = millis(on.percentile(0.5)) - millis(before.percentile(0.5));
        println!("against the build before: {change:+.2} ms at p50 with the sandbox on");
    }
    Ok(())
}

fn main() -> ExitCode {
    let bench = std::env::args().any(|arg| arg == "--bench");
    let calls = if bench {
        std::env::var("BENCH_CALLS").ok().and_then(|n| n.parse().ok()).unwrap_or(500)
    } else {
        3
    };
    match run(calls) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sandbox bench failed: {err}");
            ExitCode::FAILURE
        }
    }
}
