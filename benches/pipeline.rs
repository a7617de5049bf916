//! The cost of the guards, side by side in one run:
//! - `registry/trivial`: `Registry::execute` of a trivial read-only tool (the baseline);
//! - `session/trivial_100_rules`: the same call through the whole agent pipeline
//!   (events, permission with 100 rules, re-check, registry), no hooks;
//! - `registry/read_file_4k`: `Registry::execute` of read_file on a 4 KiB file;
//! - `session/read_file_4k`: the same call through a session (events buffered, as in a
//!   daemon whose client has not subscribed);
//! - `connection/read_file_4k`: the same call as a `tools/call` line handed to a
//!   daemon connection, until its response line is ready: everything the daemon does
//!   per call except the socket reads and writes;
//! - `floor/read_file_4k`: what the benchmark's floor server does per call for the same
//!   line (parse it, read the file, build and serialize a Result-shaped answer), with
//!   none of the guards: the least any server does, so the ratio of
//!   `connection/read_file_4k` to it is toolgate's own work per call against the
//!   floor's, without the sockets, the scheduler or the machine's wake-ups.
//!
//! Run with `cargo bench --bench pipeline`; compare the medians of the first two (the
//! difference is what the agent layer adds per call), and `connection` with `floor`.
//! On a noisy machine, the instructions each takes (a count that does not vary from
//! run to run) tell the same more exactly: run the bench binary under an
//! instruction-counting profiler with `--bench <name> --profile-time 2` and divide by
//! the calls it made.

#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly")]

use std::sync::Arc;

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate::agent::{NoApprover, NullSink, Session, SessionOptions};
use toolgate::daemon::events::EventHub;
use toolgate::daemon::{Daemon, Settings};
use toolgate::hooks::Hooks;
use toolgate::permission::{Mode, PermissionEngine, Policy, RuleConfig};
use toolgate::rpc::connection::Connection;
use toolgate::tools::{Call, Definition, Env, Registry, Safety, Tool, ToolContext, ToolResult};

struct Trivial(Definition);

#[async_trait]
impl Tool for Trivial {
    fn definition(&self) -> &Definition {
        &self.0
    }

    async fn execute(&self, _args: Value, _ctx: ToolContext) -> ToolResult {
        ToolResult::success("ok")
    }
}

/// A hundred rules of the kinds users write.
fn hundred_rules() -> RuleConfig {
    let mut allow = Vec::new();
    let mut ask = Vec::new();
    let mut deny = Vec::new();
    for i in 0..40 {
        allow.push(format!("run_command(tool{i} sub:*)"));
    }
    for i in 0..30 {
        allow.push(format!("read_file(dir{i}/**)"));
    }
    for i in 0..10 {
        allow.push(format!("mcp__server{i}__*"));
    }
    for i in 0..10 {
        ask.push(format!("edit_file(secret{i}/**)"));
    }
    for i in 0..10 {
        deny.push(format!("write_file(locked{i}/**)"));
    }
    RuleConfig { allow, ask, deny, ..RuleConfig::default() }
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // 4 KiB of ordinary source-like text: 64 lines of 64 bytes.
    let line =
        format!("{}\n", "let value = compute(alpha, beta) + offset; // keep going".repeat(2));
    let text: String =
        line.chars().take(63).chain(std::iter::once('\n')).collect::<String>().repeat(64);
    std::fs::write(dir.path().join("file.txt"), text).unwrap();

    let registry = Registry::with_builtins();
    registry
        .register(Some(Arc::new(Trivial(Definition {
            name: "trivial".to_owned(),
            description: String::new(),
            input_schema: json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            safety: Safety::ReadOnly,
            system: false,
            timeout: None,
            facts: Default::default(),
        }))))
        .unwrap();
    let registry = Arc::new(registry);
    let env = Arc::new(Env::for_root(dir.path()).unwrap());
    let cancel = CancellationToken::new();
    let trivial = Call::new("1", "trivial", r#"{"n": 1}"#);
    let read = Call::new("2", "read_file", r#"{"path": "file.txt"}"#);

    let policy = Policy::new(&hundred_rules(), None).unwrap();
    let session = Session::new(
        registry.clone(),
        SessionOptions {
            id: "bench".to_owned(),
            client: "bench".to_owned(),
            env: Env::for_root(dir.path()).unwrap(),
            engine: PermissionEngine::new(policy, Mode::Default),
            mode: Mode::Default,
            allowlist: Vec::new(),
            hooks: Arc::new(Hooks::default()),
            approval_timeout: std::time::Duration::from_secs(1),
            max_concurrent_calls: 16,
            events: Arc::new(NullSink),
            approvals: Arc::new(NoApprover),
            observer: None,
            cancel: CancellationToken::new(),
        },
    );

    let read_session = Session::new(
        registry.clone(),
        SessionOptions {
            id: "bench-read".to_owned(),
            client: "bench".to_owned(),
            env: Env::for_root(dir.path()).unwrap(),
            engine: PermissionEngine::new(Policy::default(), Mode::Default),
            mode: Mode::Default,
            allowlist: Vec::new(),
            hooks: Arc::new(Hooks::default()),
            approval_timeout: std::time::Duration::from_secs(1),
            max_concurrent_calls: 16,
            events: Arc::new(EventHub::new(1024)),
            approvals: Arc::new(NoApprover),
            observer: None,
            cancel: CancellationToken::new(),
        },
    );

    let root = std::fs::canonicalize(dir.path()).unwrap();
    let daemon = runtime
        .block_on(async { Daemon::new(registry.clone(), Settings::for_roots(vec![root]), None) });
    let (outbound, mut responses) = tokio::sync::mpsc::channel(16);
    let connection =
        runtime.block_on(async { Connection::open(&daemon, "bench", outbound) }).unwrap();
    let line = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"file.txt"}}}"#;

    let mut group = c.benchmark_group("pipeline");
    group.bench_function("registry/trivial", |b| {
        b.iter(|| runtime.block_on(registry.execute(&trivial, &env, &cancel)))
    });
    group.bench_function("session/trivial_100_rules", |b| {
        b.iter(|| runtime.block_on(session.execute_one(&trivial, &cancel)))
    });
    group.bench_function("registry/read_file_4k", |b| {
        b.iter(|| runtime.block_on(registry.execute(&read, &env, &cancel)))
    });
    group.bench_function("session/read_file_4k", |b| {
        b.iter(|| runtime.block_on(read_session.execute_one(&read, &cancel)))
    });
    group.bench_function("connection/read_file_4k", |b| {
        b.iter(|| {
            runtime.block_on(async {
                connection.handle_frame(line).await;
                let response = responses.recv().await.unwrap();
                assert!(response.contains(r#""ok":true"#));
            })
        })
    });
    let floor_line = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "read_file", "arguments": {"path": dir.path().join("file.txt")}}})
    .to_string();
    group.bench_function("floor/read_file_4k", |b| {
        b.iter(|| {
            let response = floor_answer(&floor_line);
            assert!(response.ends_with(b"\n") && response.len() > 4096);
            response
        })
    });
    group.finish();
    connection.close();
}

/// The floor server's work for one request line: a JSON value parsed, the file read
/// whole, a Result-shaped answer built and serialized, as the side-by-side bench's
/// floor does it (no confinement, schema, permission, events or audit).
fn floor_answer(line: &str) -> Vec<u8> {
    let message: Value = serde_json::from_str(line).unwrap();
    let id = message["id"].clone();
    let path = message["params"]["arguments"]["path"].as_str().unwrap_or("");
    let answer = match std::fs::read_to_string(path) {
        Ok(text) => json!({"jsonrpc": "2.0", "id": id, "result": {
            "ok": true, "tool": "read_file", "content": text, "metadata": {"call_id": id}}}),
        Err(err) => json!({"jsonrpc": "2.0", "id": id, "result": {
            "ok": false, "tool": "read_file", "error_type": "io_error",
            "error": err.to_string(), "content": "", "metadata": {}}}),
    };
    let mut bytes = serde_json::to_vec(&answer).unwrap();
    bytes.push(b'\n');
    bytes
}

criterion_group!(benches, bench);
criterion_main!(benches);
