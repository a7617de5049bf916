//! The audit log as the real daemon writes it: what it keeps of arguments (secrets
//! redacted, contents as size and hash), its hash chain and `toolgate audit verify`,
//! and rotation. Each test stops its daemon with SIGTERM, which flushes the log, and
//! reads it afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Client, TestDaemon, isolated_env};

/// What these tests ask of a daemon besides the common.
trait Audited {
    fn log(&self) -> PathBuf;
    /// SIGTERM, and waits for the exit: the audit log is flushed by then.
    fn stop(&mut self);
    /// `toolgate audit verify` with this daemon's configuration and environment.
    fn verify(&self, file: Option<&Path>) -> Output;
}

impl Audited for TestDaemon {
    fn log(&self) -> PathBuf {
        self.path("state/toolgate/audit.jsonl")
    }

    fn stop(&mut self) {
        assert_eq!(self.terminate(), Some(0), "the daemon failed");
    }

    fn verify(&self, file: Option<&Path>) -> Output {
        let mut command = self.command();
        command.args(["audit", "verify"]);
        if let Some(file) = file {
            command.arg(file);
        }
        command.arg("--config").arg(self.path("config.toml")).output().unwrap()
    }
}

/// One tools/call whose call id is `c` and the request id (the log names it); returns
/// the tool result.
fn call(client: &mut Client, name: &str, arguments: Value) -> Value {
    let call_id = format!("c{}", client.next_id);
    client.result("tools/call", json!({"name": name, "arguments": arguments, "call_id": call_id}))
}

const SECRETS: [&str; 6] = [
    "sk-live-4f9a8b7c6d5e4f3a2b1c",
    "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "hunter2",
    "glpat-AbCdEfGhIjKlMnOpQrSt",
    "raw-json-token-value",
    "MIIEowIBAAKCAQEA",
];

#[test]
fn secrets_and_contents_stay_out_of_the_audit_log() {
    let mut daemon =
        TestDaemon::start("[permissions]\nmode = \"bypass\"\ndeny = [\"write_file(big.bin)\"]\n");
    let mut client = daemon.connect();
    let run = json!({"command": format!("API_TOKEN={} true", SECRETS[0])});
    assert_eq!(call(&mut client, "run_command", run)["ok"], json!(true));
    let echo = json!({"command": format!("echo {} >/dev/null", SECRETS[1])});
    assert_eq!(call(&mut client, "run_command", echo)["ok"], json!(true));
    let content = format!(
        "db:\n  password={}\n  gitlab: {}\n-----BEGIN RSA PRIVATE KEY-----\n{}\n-----END RSA PRIVATE KEY-----\n",
        SECRETS[2], SECRETS[3], SECRETS[5]
    );
    let written =
        call(&mut client, "write_file", json!({"path": "settings.yml", "content": content}));
    assert_eq!(written["ok"], json!(true), "{written}");
    // Arguments that are not valid JSON still have their token removed.
    let raw = format!("{{\"command\": \"true\", \"token\": \"{}\"", SECRETS[4]);
    assert_eq!(call(&mut client, "run_command", Value::String(raw))["ok"], json!(false));
    // A denied 8 MB write, and 12 MB of junk that is not even JSON.
    let big = "B".repeat(8 * 1024 * 1024);
    let denied = call(&mut client, "write_file", json!({"path": "big.bin", "content": big}));
    assert_eq!(denied["ok"], json!(false), "{denied}");
    let junk = "{".repeat(12 * 1024 * 1024);
    assert_eq!(call(&mut client, "read_file", Value::String(junk))["ok"], json!(false));
    daemon.stop();

    let text = std::fs::read_to_string(daemon.log()).unwrap();
    for secret in SECRETS {
        assert!(!text.contains(secret), "{secret} is in the audit log:\n{text}");
    }
    assert!(text.len() < 16 * 1024, "the audit log holds {} bytes", text.len());
    let records: Vec<Value> =
        text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(records.len(), 6, "{text}");
    assert_eq!(records[0]["arguments"]["command"], json!("API_TOKEN=[redacted] true"));
    assert_eq!(records[1]["arguments"]["command"], json!("echo [redacted] >/dev/null"));
    let sha = |text: &str| {
        let output = Command::new("sha256sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                child.stdin.take().unwrap().write_all(text.as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        String::from_utf8(output.stdout).unwrap().split(' ').next().unwrap().to_owned()
    };
    assert_eq!(
        records[2]["arguments"]["content"],
        json!(format!("[{} bytes, sha256:{}]", content.len(), sha(&content)))
    );
    assert_eq!(records[2]["arguments"]["path"], json!("settings.yml"));
    let raw_recorded = records[3]["arguments"].as_str().unwrap();
    assert!(raw_recorded.contains("\"token\": [redacted]"), "{raw_recorded}");
    assert_eq!(records[4]["decision"]["outcome"], json!("deny"), "{}", records[4]);
    let big_recorded = records[4]["arguments"]["content"].as_str().unwrap();
    assert!(big_recorded.starts_with("[8388608 bytes, sha256:"), "{big_recorded}");
    let junk_recorded = records[5]["arguments"].as_str().unwrap();
    assert!(junk_recorded.starts_with("[12582912 bytes, sha256:"), "{junk_recorded}");

    let verified = daemon.verify(None);
    let stdout = String::from_utf8_lossy(&verified.stdout);
    assert_eq!(
        verified.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    assert!(stdout.contains("ok: 6 records in 1 file,"), "{stdout}");
}

/// What `run_command "sed -i '/marker/d' audit.jsonl"` did: erase its own record.
/// Whoever edits the file, verification names where.
#[test]
fn verify_names_the_record_after_an_erased_one() {
    let mut daemon = TestDaemon::start("[permissions]\nmode = \"bypass\"\n");
    let mut client = daemon.connect();
    for step in ["first", "marker", "last"] {
        let result = call(&mut client, "run_command", json!({"command": format!("echo {step}")}));
        assert_eq!(result["ok"], json!(true), "{result}");
    }
    daemon.stop();
    let log = daemon.log();
    let intact = daemon.verify(Some(&log));
    assert_eq!(intact.status.code(), Some(0), "{}", String::from_utf8_lossy(&intact.stdout));

    let status = Command::new("sed").arg("-i").arg("/marker/d").arg(&log).status().unwrap();
    assert!(status.success());
    let broken = daemon.verify(Some(&log));
    let stdout = String::from_utf8_lossy(&broken.stdout);
    assert_eq!(broken.status.code(), Some(1), "{stdout}");
    let expected = format!("broken: {}:2: record (call \"c3\"", log.display());
    assert!(stdout.starts_with(&expected), "{stdout}");
}

/// Erasing the newest record while the daemon runs: the daemon's next record still
/// links to the erased one, so the gap shows.
#[test]
fn erasing_the_newest_record_under_a_running_daemon_shows() {
    let mut daemon = TestDaemon::start("[permissions]\nmode = \"bypass\"\n");
    let mut client = daemon.connect();
    for step in ["zero", "one"] {
        let result = call(&mut client, "run_command", json!({"command": format!("echo {step}")}));
        assert_eq!(result["ok"], json!(true), "{result}");
    }
    let log = daemon.log();
    // The record is written within milliseconds of the call; wait for it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("echo one") {
        assert!(Instant::now() < deadline, "no audit record appeared");
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = Command::new("sed").arg("-i").arg("/echo one/d").arg(&log).status().unwrap();
    assert!(status.success());
    let result = call(&mut client, "run_command", json!({"command": "echo two"}));
    assert_eq!(result["ok"], json!(true), "{result}");
    daemon.stop();
    let broken = daemon.verify(Some(&log));
    let stdout = String::from_utf8_lossy(&broken.stdout);
    assert_eq!(broken.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains(":2: record (call \"c3\""), "{stdout}");
}

#[test]
fn the_log_rotates_by_size_and_verify_walks_every_file() {
    let mut daemon = TestDaemon::start(
        "[permissions]\nmode = \"bypass\"\n\n[audit]\nmax_file_bytes = 4096\nkeep_files = 2\n",
    );
    let mut client = daemon.connect();
    for idx in 0..40 {
        let result = call(
            &mut client,
            "read_file",
            json!({"path": format!("missing-{idx}-{}", "x".repeat(300))}),
        );
        assert_eq!(result["ok"], json!(false));
    }
    daemon.stop();
    let log = daemon.log();
    let rotated = |n: usize| PathBuf::from(format!("{}.{n}", log.display()));
    assert!(rotated(1).exists() && rotated(2).exists(), "the log was not rotated");
    assert!(!rotated(3).exists(), "more rotated files kept than keep_files");
    for file in [log.clone(), rotated(1), rotated(2)] {
        assert!(std::fs::metadata(&file).unwrap().len() <= 4096, "{} is too big", file.display());
    }
    let verified = daemon.verify(None);
    let stdout = String::from_utf8_lossy(&verified.stdout);
    assert_eq!(verified.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("in 3 files"), "{stdout}");
    assert!(stdout.contains("rotated away"), "{stdout}");
}

/// A rotated file removed from the middle of the rotation is a gap in the chain:
/// verification names the missing file and fails, instead of checking what is left as
/// though the log began after the gap.
#[test]
fn a_rotated_file_missing_between_kept_ones_breaks_the_chain() {
    let mut daemon = TestDaemon::start(
        "[permissions]\nmode = \"bypass\"\n\n[audit]\nmax_file_bytes = 4096\nkeep_files = 3\n",
    );
    let mut client = daemon.connect();
    for idx in 0..60 {
        let result = call(
            &mut client,
            "read_file",
            json!({"path": format!("missing-{idx}-{}", "x".repeat(300))}),
        );
        assert_eq!(result["ok"], json!(false));
    }
    daemon.stop();
    let log = daemon.log();
    let rotated = |n: usize| PathBuf::from(format!("{}.{n}", log.display()));
    assert!((1..=3).all(|n| rotated(n).exists()), "the log was not rotated three times");
    let intact = daemon.verify(None);
    let stdout = String::from_utf8_lossy(&intact.stdout);
    assert_eq!(intact.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("in 4 files"), "{stdout}");

    for n in [1, 2] {
        let kept = std::fs::read(rotated(n)).unwrap();
        std::fs::remove_file(rotated(n)).unwrap();
        let broken = daemon.verify(None);
        let stdout = String::from_utf8_lossy(&broken.stdout);
        assert_eq!(broken.status.code(), Some(1), "without {n}: {stdout}");
        let expected = format!("broken: {}: missing", rotated(n).display());
        assert!(stdout.starts_with(&expected), "without {n}: {stdout}");
        assert!(stdout.contains(&rotated(n + 1).display().to_string()), "without {n}: {stdout}");
        std::fs::write(rotated(n), kept).unwrap();
    }
    let restored = daemon.verify(None);
    assert_eq!(restored.status.code(), Some(0), "{}", String::from_utf8_lossy(&restored.stdout));
}

#[test]
fn audit_settings_are_checked_with_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[audit]\nmax_file_bytes = 100\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("check-config")
        .arg("--config")
        .arg(&config)
        .current_dir(dir.path().join("workspace"))
        .envs(isolated_env(dir.path()))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(":2:1: [audit] max_file_bytes: must be at least 4096"), "{stderr}");

    std::fs::write(&config, "[server]\naudit_log = false\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["audit", "verify", "--config"])
        .arg(&config)
        .current_dir(dir.path().join("workspace"))
        .envs(isolated_env(dir.path()))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("the audit log is turned off"), "{stderr}");
}
