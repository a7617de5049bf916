//! When the sandbox says no: a command that fails on a path the sandbox denies gets a
//! result naming it (inferred from its error output, and labelled so) with the
//! widening to ask for; the same command with that widening (`run_command`'s `sandbox`
//! argument) is put to a person in every mode, bypass included, runs with the path
//! writable for that call only when the person allows it, and is refused unasked in
//! `dont_ask` mode. Against the real `toolgate serve` on a temporary socket.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::path::PathBuf;

use serde_json::{Value, json};
use support::{Client, TestDaemon};

fn marker() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{}-{nanos}", std::process::id())
}

fn run(client: &mut Client, arguments: Value) -> u64 {
    client.send("tools/call", json!({"name": "run_command", "arguments": arguments}))
}

/// Removes a directory the test made, whatever happens.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a command to its answer.
fn call(client: &mut Client, arguments: Value) -> Value {
    let id = run(client, arguments);
    client.response(id)
}

#[test]
fn a_denied_write_is_named_and_a_person_can_widen_that_call_only() {
    let daemon = TestDaemon::start("[permissions]\nmode = \"bypass\"\n");
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    let probe = call(&mut client, json!({"command": "true"}));
    let in_force = probe["result"]["metadata"]["sandbox"].as_str().unwrap_or_default().to_owned();
    if !in_force.starts_with("landlock") {
        eprintln!("skipped: no Landlock sandbox in force here ({in_force:?})");
        return;
    }
    // Outside the roots and away from the daemon's own files (which live in /tmp
    // here, and would keep /tmp itself from being widened as a whole).
    let outside = PathBuf::from(format!("/var/tmp/toolgate-escalation-{}", marker()));
    std::fs::create_dir(&outside).unwrap();
    let _cleanup = RemoveOnDrop(outside.clone());
    let target = outside.join("x");
    let command = format!("echo x > {}", target.display());
    let ask = json!({"writable": [outside.display().to_string()]});

    // The sandbox says no, and the result says what and how to ask.
    let denied = call(&mut client, json!({"command": command}));
    let result = &denied["result"];
    assert_eq!(result["ok"], false, "{denied}");
    assert!(!target.exists());
    let named = &result["metadata"]["sandbox_denied"];
    assert_eq!(named["source"], "inferred from the command's error output", "{denied}");
    assert_eq!(named["denied"][0]["path"], target.display().to_string(), "{denied}");
    assert_eq!(named["denied"][0]["access"], "write", "{denied}");
    let content = result["content"].as_str().unwrap();
    assert!(content.contains(&format!("\"sandbox\": {ask}")), "{content}");

    // Asking for the widening asks a person, even in bypass mode; a "no" runs nothing.
    let widened = json!({"command": command, "sandbox": ask});
    let id = run(&mut client, widened.clone());
    let request = client.event(|event| event["type"] == "permission_request");
    let reason = request["explanation"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("leave its sandbox") && reason.contains("/var/tmp"), "{request}");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "deny"}),
    );
    let refused = client.response(id);
    assert_eq!(refused["result"]["error_type"], "permission_denied", "{refused}");
    assert!(!target.exists());

    // A "yes" runs it with /tmp writable for this call.
    let id = run(&mut client, widened);
    let request = client.event(|event| event["type"] == "permission_request");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "allow", "scope": "once"}),
    );
    let allowed = client.response(id);
    assert_eq!(allowed["result"]["ok"], true, "{allowed}");
    assert!(target.exists());
    let granted = &allowed["result"]["metadata"]["sandbox_profile"]["write"];
    assert!(granted.as_array().unwrap().contains(&ask["writable"][0]), "{allowed}");
    std::fs::remove_file(&target).unwrap();

    // For that call only: the next one without the widening is confined again.
    let again = call(&mut client, json!({"command": command}));
    assert_eq!(again["result"]["ok"], false, "{again}");
    assert!(!target.exists());
}

#[test]
fn a_widening_is_refused_unasked_in_dont_ask_mode_and_never_covered_by_rules() {
    let daemon =
        TestDaemon::start("[permissions]\nmode = \"dont_ask\"\nallow = [\"run_command\"]\n");
    let mut client = daemon.connect();
    let target = PathBuf::from(format!("/tmp/toolgate-escalation-{}", marker()));
    let response = call(
        &mut client,
        json!({"command": format!("echo x > {}", target.display()),
               "sandbox": {"writable": ["/tmp"], "network": true}}),
    );
    assert_eq!(response["result"]["error_type"], "permission_denied", "{response}");
    let error = response["result"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("leave its sandbox"), "{response}");
    assert!(!target.exists());
    // The rule still lets the command itself run.
    let plain = call(&mut client, json!({"command": "true"}));
    assert_eq!(plain["result"]["ok"], true, "{plain}");
}

#[test]
fn a_widening_names_absolute_paths_only() {
    let daemon = TestDaemon::start("[permissions]\nmode = \"bypass\"\n");
    let mut client = daemon.connect();
    client.result("events/subscribe", json!({}));
    let id = run(&mut client, json!({"command": "true", "sandbox": {"writable": ["rel"]}}));
    let request = client.event(|event| event["type"] == "permission_request");
    client.result(
        "permission/respond",
        json!({"request_id": request["request_id"], "decision": "allow", "scope": "once"}),
    );
    let response = client.response(id);
    assert_eq!(response["result"]["error_type"], "invalid_arguments", "{response}");
}
