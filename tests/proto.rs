//! The committed JSON Schemas under `proto/` must match the wire types in the code.
//! Run with `UPDATE_PROTO=1` to rewrite them after changing a wire type on purpose.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::path::PathBuf;

use schemars::JsonSchema;
use serde_json::Value;
use toolgate::agent::Event;
use toolgate::protocol::*;
use toolgate::tools::{Definition, ToolResult};

fn schema<T: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    serde_json::to_value(generator.into_root_schema_for::<T>()).unwrap()
}

/// Every schema file: its name and content.
fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        ("session.open.params", schema::<SessionOpenParams>()),
        ("session.open.result", schema::<SessionOpenResult>()),
        ("session.update.params", schema::<SessionUpdateParams>()),
        ("session.update.result", schema::<SessionUpdateResult>()),
        ("session.close.params", schema::<SessionCloseParams>()),
        ("session.close.result", schema::<SessionCloseResult>()),
        ("tools.list.params", schema::<ToolsListParams>()),
        ("tools.list.result", schema::<ToolsListResult>()),
        ("tools.call.params", schema::<ToolsCallParams>()),
        ("tools.call.result", schema::<ToolsCallResult>()),
        ("tools.call_batch.params", schema::<ToolsCallBatchParams>()),
        ("tools.call_batch.result", schema::<ToolsCallBatchResult>()),
        ("tools.cancel.params", schema::<ToolsCancelParams>()),
        ("tools.cancel.result", schema::<ToolsCancelResult>()),
        ("tools.explain.params", schema::<ToolsExplainParams>()),
        ("tools.explain.result", schema::<ToolsExplainResult>()),
        ("events.subscribe.params", schema::<EventsSubscribeParams>()),
        ("events.subscribe.result", schema::<EventsSubscribeResult>()),
        ("events.unsubscribe.params", schema::<EventsUnsubscribeParams>()),
        ("events.notification", schema::<EventsNotification>()),
        ("event", schema::<Event>()),
        ("permission.respond.params", schema::<PermissionRespondParams>()),
        ("permission.respond.result", schema::<PermissionRespondResult>()),
        ("daemon.status.result", schema::<DaemonStatusResult>()),
        ("cancel_request.params", schema::<CancelRequestParams>()),
        ("definition", schema::<Definition>()),
        ("result", schema::<ToolResult>()),
        ("tool.run_command.input", tool_input("run_command")),
        ("tool.process_read.input", tool_input("process_read")),
        ("tool.process_write.input", tool_input("process_write")),
        ("tool.process_resize.input", tool_input("process_resize")),
        ("tool.process_kill.input", tool_input("process_kill")),
        ("tool.process_list.input", tool_input("process_list")),
    ]
}

/// A built-in tool's input schema, as `tools/list` shows it.
fn tool_input(name: &str) -> Value {
    let registry = toolgate::tools::Registry::with_builtins();
    registry.get(name).unwrap().definition().input_schema.clone()
}

#[test]
fn committed_schemas_match_the_code() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("proto");
    let update = std::env::var_os("UPDATE_PROTO").is_some();
    let mut stale = Vec::new();
    let expected: Vec<String> =
        schemas().iter().map(|(name, _)| format!("{name}.schema.json")).collect();
    for (name, schema) in schemas() {
        let path = dir.join(format!("{name}.schema.json"));
        let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        if update {
            std::fs::write(&path, &text).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    // No schema file may outlive its type.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".schema.json") && !expected.contains(&name) {
            if update {
                std::fs::remove_file(dir.join(&name)).unwrap();
            } else {
                stale.push(format!("{name} (no longer generated)"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "proto/ is out of date with the wire types: {stale:?}\nRun `UPDATE_PROTO=1 cargo test --test proto` and commit the result."
    );
}

#[test]
fn every_method_is_documented() {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("proto/README.md"))
            .unwrap();
    for name in [
        method::SESSION_OPEN,
        method::SESSION_UPDATE,
        method::SESSION_CLOSE,
        method::TOOLS_LIST,
        method::TOOLS_CALL,
        method::TOOLS_CALL_BATCH,
        method::TOOLS_CANCEL,
        method::TOOLS_EXPLAIN,
        method::EVENTS_SUBSCRIBE,
        method::EVENTS_UNSUBSCRIBE,
        method::PERMISSION_RESPOND,
        method::DAEMON_STATUS,
        method::CANCEL_REQUEST,
        method::NOTIFICATIONS_CANCELLED,
    ] {
        assert!(
            readme.contains(&format!("`{name}`")),
            "proto/README.md does not document `{name}`"
        );
    }
    for kind in [
        "tool_call_start",
        "tool_output",
        "permission_request",
        "permission_resolved",
        "tool_result",
        "tool_call_done",
        "todos_updated",
        "mode_changed",
        "tools_list_changed",
        "process_exited",
    ] {
        assert!(
            readme.contains(&format!("`{kind}`")),
            "proto/README.md does not document the `{kind}` event"
        );
    }
}
