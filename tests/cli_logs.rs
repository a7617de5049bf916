//! The command line as a Unix tool and the logs as a service manager sees them: a
//! closed stdout ends quietly, a missing daemon is said once with how to start one,
//! `--version` names the commit, logs carry no colour off a terminal, honour
//! `RUST_LOG`/`TOOLGATE_LOG`/`-v`/`-q`, fit the journal, keep dependency chatter out,
//! and say once what bypass mode means.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use support::TestDaemon;

/// A command of the real binary, isolated from the user's configuration and state,
/// with no logging variables inherited.
fn toolgate(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    std::fs::create_dir_all(dir.join("workspace")).unwrap();
    command
        .current_dir(dir.join("workspace"))
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir.join("config-home"))
        .env("XDG_STATE_HOME", dir.join("state"))
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .env_remove("TOOLGATE_LOG")
        .env_remove("RUST_LOG")
        .env_remove("TOOLGATE_LOG_FORMAT")
        .env_remove("JOURNAL_STREAM")
        .env_remove("NO_COLOR")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS");
    command
}

/// `toolgate mcp` that reads one MCP initialize exchange from stdin and ends at EOF;
/// returns its stderr.
fn mcp_session_stderr(configure: impl FnOnce(&mut Command)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut command = toolgate(dir.path());
    command.arg("mcp").stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    configure(&mut command);
    let mut child = command.spawn().unwrap();
    initialize_and_hang_up(&mut child);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stderr).unwrap()
}

/// Writes one MCP initialize exchange and a listing to the child's stdin, then closes
/// it: the session ends.
fn initialize_and_hang_up(child: &mut Child) {
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"log-test-client","version":"1"}}}"#,
                "\n",
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                "\n",
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
                "\n"
            )
            .as_bytes(),
        )
        .unwrap();
}

#[test]
fn logs_on_a_pipe_carry_no_colour_and_dependency_chatter_stays_out() {
    let stderr = mcp_session_stderr(|command| {
        command.arg("-v");
    });
    assert!(stderr.contains("INFO"), "toolgate's own info lines are logged:\n{stderr}");
    assert!(!stderr.contains('\x1b'), "escape bytes in logs written to a pipe:\n{stderr}");
    // rmcp logs every session's initialize parameters at info.
    assert!(!stderr.contains("log-test-client"), "dependency chatter at info:\n{stderr}");
    // ... which is there when asked for.
    let asked = mcp_session_stderr(|command| {
        command.env("RUST_LOG", "info");
    });
    assert!(asked.contains("log-test-client"), "RUST_LOG=info shows rmcp:\n{asked}");
}

/// An MCP host records a stdio server's stderr (often as errors): `toolgate mcp` on
/// stdio logs warnings alone unless asked for more with `-v` or `TOOLGATE_LOG`.
#[test]
fn mcp_over_stdio_logs_warnings_alone_unless_asked() {
    let plain = mcp_session_stderr(|command| {
        command.args(["--mode", "bypass"]);
    });
    assert!(!plain.contains("INFO"), "info lines on an MCP host's stderr:\n{plain}");
    // What needs attention is still said.
    assert!(plain.contains("WARN") && plain.contains("bypass"), "{plain}");
    let verbose = mcp_session_stderr(|command| {
        command.arg("-v");
    });
    assert!(verbose.contains("INFO"), "-v shows info:\n{verbose}");
    let asked = mcp_session_stderr(|command| {
        command.env("TOOLGATE_LOG", "info");
    });
    assert!(asked.contains("INFO"), "TOOLGATE_LOG=info shows info:\n{asked}");
}

#[test]
fn rust_log_toolgate_log_and_flags_choose_the_level() {
    let quiet = mcp_session_stderr(|command| {
        command.env("RUST_LOG", "warn");
    });
    assert!(!quiet.contains("INFO"), "RUST_LOG=warn is honoured:\n{quiet}");
    let debug = mcp_session_stderr(|command| {
        command.env("RUST_LOG", "debug");
    });
    assert!(debug.contains("DEBUG"), "RUST_LOG=debug is honoured:\n{debug}");
    // TOOLGATE_LOG wins over RUST_LOG.
    let both = mcp_session_stderr(|command| {
        command.env("RUST_LOG", "debug").env("TOOLGATE_LOG", "error");
    });
    assert!(!both.contains("INFO") && !both.contains("DEBUG"), "{both}");
    let flag_quiet = mcp_session_stderr(|command| {
        command.arg("-q");
    });
    assert!(!flag_quiet.contains("INFO"), "-q hides info:\n{flag_quiet}");
    let flag_verbose = mcp_session_stderr(|command| {
        command.arg("-v");
    });
    assert!(flag_verbose.contains("DEBUG"), "-v shows debug:\n{flag_verbose}");
    assert!(!flag_verbose.contains("log-test-client"), "-v is toolgate's debug only");
}

/// An RFC 3339 timestamp at the start of a line, as the text format writes.
fn starts_with_timestamp(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.len() > 20 && bytes[4] == b'-' && bytes[7] == b'-' && bytes[10] == b'T'
}

#[test]
fn under_the_journal_lines_carry_a_priority_and_no_timestamp() {
    let text = mcp_session_stderr(|command| {
        command.arg("-v");
    });
    let first = text.lines().next().unwrap_or_default();
    assert!(starts_with_timestamp(first), "the text format has timestamps: {first}");

    // Detected the way systemd says: JOURNAL_STREAM names stderr's device and inode.
    let (mut reader, writer) = std::io::pipe().unwrap();
    let stat = rustix::fs::fstat(&writer).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut child = toolgate(dir.path())
        .args(["mcp", "-v", "--mode", "bypass"])
        .env("JOURNAL_STREAM", format!("{}:{}", stat.st_dev, stat.st_ino))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(writer)
        .spawn()
        .unwrap();
    initialize_and_hang_up(&mut child);
    let mut journal = String::new();
    reader.read_to_string(&mut journal).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!journal.is_empty());
    for line in journal.lines() {
        assert!(line.starts_with('<'), "no priority: {line}");
        assert!(!starts_with_timestamp(&line[3..]), "a timestamp under the journal: {line}");
        assert!(!line.contains('\x1b'), "{line}");
    }
    assert!(journal.lines().any(|line| line.starts_with("<6>")), "{journal}");
    // Bypass mode is said once, at warning priority, with what it means.
    let bypass: Vec<&str> = journal.lines().filter(|line| line.contains("bypass")).collect();
    assert_eq!(bypass.len(), 1, "{journal}");
    assert!(bypass[0].starts_with("<4>"), "{}", bypass[0]);
    assert!(bypass[0].contains("without asking"), "{}", bypass[0]);
    // Root is said once too, when the tests run as root (as CI does).
    let root: Vec<&str> = journal.lines().filter(|line| line.contains("running as root")).collect();
    if rustix::process::geteuid().is_root() {
        assert_eq!(root.len(), 1, "{journal}");
        assert!(root[0].starts_with("<4>"), "{}", root[0]);
    } else {
        eprintln!("not running as root: the root warning is checked only for its absence");
        assert!(root.is_empty(), "{journal}");
    }

    // The same stream variable with stderr elsewhere is not the journal.
    let elsewhere = mcp_session_stderr(|command| {
        command.arg("-v").env("JOURNAL_STREAM", "1:2");
    });
    assert!(!elsewhere.starts_with('<'), "{elsewhere}");
}

#[test]
fn json_logs_on_request() {
    let json = mcp_session_stderr(|command| {
        command.args(["-v", "--log-format", "json"]);
    });
    assert!(!json.is_empty());
    for line in json.lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(value["level"].is_string(), "{line}");
    }
    let by_variable = mcp_session_stderr(|command| {
        command.arg("-v").env("TOOLGATE_LOG_FORMAT", "json");
    });
    assert!(by_variable.lines().all(|line| line.starts_with('{')), "{by_variable}");
}

#[test]
fn version_names_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let output = toolgate(dir.path()).arg("--version").output().unwrap();
    assert!(output.status.success());
    let version = String::from_utf8(output.stdout).unwrap();
    let expected_prefix = format!("toolgate {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(version.starts_with(&expected_prefix), "{version}");
    let commit = version.trim_end().trim_start_matches(&expected_prefix).trim_end_matches(')');
    // From a checkout, the commit git names; from a tarball, `unknown`.
    let git = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match git {
        Ok(git) if git.status.success() && std::env::var_os("TOOLGATE_BUILD_COMMIT").is_none() => {
            assert_eq!(commit, String::from_utf8(git.stdout).unwrap().trim());
        }
        _ => {
            eprintln!("not a git checkout here: checking the shape only");
            assert!(!commit.is_empty(), "{version}");
        }
    }
}

#[test]
fn no_daemon_is_said_once_with_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody-listens.sock");
    for args in [&["list"][..], &["status"], &["call", "read_file", "{}"]] {
        let output = toolgate(dir.path()).args(args).arg("--socket").arg(&socket).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&socket.display().to_string()), "{stderr}");
        assert!(stderr.contains("toolgate serve"), "{stderr}");
        assert_eq!(stderr.matches("No such file or directory").count(), 1, "{stderr}");
    }
}

/// Runs `args` with stdout a pipe whose reader is already gone: every write fails
/// with EPIPE, as when `head -1` has exited.
fn with_closed_stdout(mut command: Command) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    command.stdout(writer).stderr(Stdio::piped()).output().unwrap()
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let mut check = toolgate(dir.path());
    check.arg("check-config");
    let output = with_closed_stdout(check);
    assert_eq!(output.status.code(), Some(141), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");

    let daemon = TestDaemon::start("");
    for args in [&["list"][..], &["list", "--json"], &["status"]] {
        let mut list = toolgate(daemon.dir.path());
        list.args(args).arg("--socket").arg(&daemon.socket);
        let output = with_closed_stdout(list);
        assert_eq!(output.status.code(), Some(141), "{args:?}: {output:?}");
        assert_eq!(String::from_utf8_lossy(&output.stderr), "", "{args:?}");
    }
}

#[test]
fn help_documents_the_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let output = toolgate(dir.path()).arg("--help").output().unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    for needle in ["Exit status:", "  0 ", "  1 ", "  2 ", "  141 ", "RUST_LOG", "TOOLGATE_LOG"] {
        assert!(help.contains(needle), "{needle:?} missing from --help:\n{help}");
    }
}
