//! A call that a rule or a hook sends to a person, over MCP: it is decided once, its
//! hooks and tool run once, and it leaves one audit record naming who decided, in
//! both protocol eras (elicitation during the call, and `input_required` with a
//! retry that carries the answer).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod mcp_support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mcp_support::{StdioClient, Touch};
use serde_json::{Value, json};
use toolgate::agent::{CallObserver, CallRecord};
use toolgate::daemon::{Daemon, Settings};
use toolgate::hooks::{HookConfig, Hooks, OnError};
use toolgate::mcp::McpOptions;
use toolgate::permission::{DecidedBy, Layer, Outcome};
use toolgate::tools::Registry;

const LATEST_LEGACY: &str = "2025-11-25";

#[derive(Default)]
struct Records(Mutex<Vec<CallRecord>>);

impl CallObserver for Records {
    fn call_finished(&self, record: CallRecord) {
        self.0.lock().unwrap().push(record);
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    /// One line per PreToolUse hook run.
    hook_runs: PathBuf,
    daemon: Arc<Daemon>,
    records: Arc<Records>,
}

/// A daemon whose PreToolUse hook asks for every read_file call (and counts its runs).
fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("notes.txt"), "notes\n").unwrap();
    let hook_runs = dir.path().join("hook-runs");
    let hook = HookConfig {
        matcher: "read_file".to_owned(),
        command: format!(
            r#"echo run >> '{}'; echo '{{"decision": "ask", "reason": "a hook wants a look"}}'"#,
            hook_runs.display()
        ),
        timeout_ms: 10_000,
        on_error: OnError::Allow,
        format: toolgate::hooks::HookFormat::Auto,
    };
    let mut settings = Settings::for_roots(vec![root.clone()]);
    settings.hooks = Arc::new(Hooks::new(&[hook], &[]).unwrap());
    let registry = Registry::with_builtins();
    registry.register(Some(Touch::tool())).unwrap();
    let records = Arc::new(Records::default());
    let observer: Arc<dyn CallObserver> = records.clone();
    let daemon = Daemon::new(Arc::new(registry), settings, Some(observer));
    Setup { _dir: dir, root, hook_runs, daemon, records }
}

impl Setup {
    fn hook_runs(&self) -> usize {
        std::fs::read_to_string(&self.hook_runs).map(|text| text.lines().count()).unwrap_or(0)
    }

    /// The one record of a tool's calls.
    fn only_record(&self, tool: &str) -> CallRecord {
        let records: Vec<CallRecord> =
            self.records.0.lock().unwrap().iter().filter(|r| &*r.tool == tool).cloned().collect();
        assert_eq!(records.len(), 1, "one audit record per call: {records:?}");
        records[0].clone()
    }
}

fn modern_meta(capabilities: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"}
    })
}

/// Calls a tool in the stateless era, answers the question, and returns the result.
async fn call_with_retry(client: &mut StdioClient, name: &str, arguments: Value) -> Value {
    let elicits = json!({"elicitation": {"form": {}}});
    let first = client
        .request(
            1,
            "tools/call",
            json!({"name": name, "arguments": arguments, "_meta": modern_meta(elicits.clone())}),
        )
        .await;
    assert_eq!(first["result"]["resultType"], json!("input_required"), "{first}");
    let state = first["result"]["requestState"].clone();
    let answer = json!({"action": "accept", "content": {"decision": "allow_once"}});
    client
        .request(
            2,
            "tools/call",
            json!({
                "name": name, "arguments": arguments, "requestState": state,
                "inputResponses": {"toolgate/approval": answer},
                "_meta": modern_meta(elicits)
            }),
        )
        .await
}

#[tokio::test]
async fn a_hook_that_asks_in_the_stateless_era_runs_the_call_once() {
    let test = setup();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    let second = call_with_retry(&mut client, "read_file", json!({"path": "notes.txt"})).await;
    assert_eq!(second["result"]["structuredContent"]["ok"], json!(true), "{second}");
    assert_eq!(test.hook_runs(), 1, "the hooks ran once");
    let record = test.only_record("read_file");
    assert_eq!(
        (record.decision.outcome, record.decision.decided_by, record.decision.layer),
        (Outcome::Allow, DecidedBy::Person, Some(Layer::Hook))
    );
    client.close().await;
}

#[tokio::test]
async fn a_rule_that_asks_in_the_stateless_era_is_recorded_once() {
    let test = setup();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    let second = call_with_retry(&mut client, "touch_file", json!({"path": "touched"})).await;
    assert_eq!(second["result"]["structuredContent"]["ok"], json!(true), "{second}");
    assert!(test.root.join("touched").exists());
    let record = test.only_record("touch_file");
    assert_eq!(
        (record.decision.outcome, record.decision.decided_by, record.decision.layer),
        (Outcome::Allow, DecidedBy::Person, Some(Layer::Mode))
    );
    assert!(record.decision.asked);
    client.close().await;
}

#[tokio::test]
async fn a_hook_that_asks_through_elicitation_runs_the_call_once() {
    let test = setup();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    client.initialize(LATEST_LEGACY, json!({"elicitation": {"form": {}}})).await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "read_file", "arguments": {"path": "notes.txt"}
        }}))
        .await;
    let question = client.until(|m| m["method"] == "elicitation/create").await;
    assert!(
        question["params"]["message"].as_str().unwrap_or("").contains("PreToolUse hook"),
        "{question}"
    );
    let answer = json!({"action": "accept", "content": {"decision": "deny"}});
    client.send(json!({"jsonrpc": "2.0", "id": question["id"], "result": answer})).await;
    let response = client.response(json!(1)).await;
    let result = &response["result"]["structuredContent"];
    assert_eq!(result["error_type"], json!("permission_denied"), "{response}");
    assert_eq!(test.hook_runs(), 1);
    let record = test.only_record("read_file");
    assert_eq!(
        (record.decision.outcome, record.decision.decided_by),
        (Outcome::Deny, DecidedBy::Person)
    );
    client.close().await;
}
