//! How the client commands show their answers to a person. Every function turns the
//! daemon's JSON answer into text (no I/O), so the renderings are tested as they are.
//!
//! The convention: a person at a terminal reads text; a script gets the daemon's JSON,
//! either with `--json` or whenever stdout is not a terminal. Colour is used only when
//! stdout is a terminal and `NO_COLOR` is unset or empty.

use std::fmt::Write as _;
use std::io::IsTerminal;

use serde_json::Value;

/// How a command prints its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The daemon's JSON, pretty-printed.
    Json,
    /// Text for a person; `color` adds ANSI colours.
    Human { color: bool },
}

impl Output {
    /// JSON when asked for or when stdout is not a terminal; text otherwise.
    pub fn choose(json: bool) -> Output {
        let terminal = std::io::stdout().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
        Output::decide(json, terminal, no_color)
    }

    pub fn decide(json: bool, terminal: bool, no_color: bool) -> Output {
        if json || !terminal { Output::Json } else { Output::Human { color: !no_color } }
    }
}

/// ANSI colours, or nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Style {
    pub(crate) color: bool,
}

impl Style {
    fn paint(self, code: &str, text: &str) -> String {
        if self.color { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
    }

    fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }

    fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }

    fn red(self, text: &str) -> String {
        self.paint("31", text)
    }

    fn green(self, text: &str) -> String {
        self.paint("32", text)
    }

    fn yellow(self, text: &str) -> String {
        self.paint("33", text)
    }
}

/// What to write to stdout and to stderr.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rendered {
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// A tool's result. `streamed`: its output was already shown live, so only how it
/// ended is left to say.
pub(crate) fn call_result(result: &Value, streamed: bool, style: Style) -> Rendered {
    let mut out = Rendered::default();
    let ok = result["ok"].as_bool() == Some(true);
    let content = result["content"].as_str().unwrap_or("");
    if streamed {
        out.stderr.push_str(&style.dim(&ending(result)));
        out.stderr.push('\n');
    } else if !content.is_empty() {
        out.stdout.push_str(content);
        if !content.ends_with('\n') {
            out.stdout.push('\n');
        }
    }
    if let Some(attachments) = result["attachments"].as_array().filter(|list| !list.is_empty()) {
        let kinds: Vec<&str> =
            attachments.iter().map(|item| item["type"].as_str().unwrap_or("content")).collect();
        let _ = writeln!(
            out.stderr,
            "{}",
            style.dim(&format!("[{} not shown here; use --json]", kinds.join(", ")))
        );
    }
    if !ok {
        let code = result["error_type"].as_str().unwrap_or("error");
        let message = result["error"].as_str().unwrap_or("the call failed");
        let tool = result["tool"].as_str().unwrap_or("the tool");
        let _ = writeln!(out.stderr, "{} {message}", style.red(&format!("{tool}: {code}:")));
    }
    out
}

/// How a call whose output was streamed ended, in one bracketed line.
fn ending(result: &Value) -> String {
    let meta = &result["metadata"];
    if let Some(code) = meta["exit_code"].as_i64() {
        format!("[exit code {code}]")
    } else if let Some(signal) = meta["signal"].as_i64() {
        format!("[killed by signal {signal}]")
    } else if result["ok"].as_bool() == Some(true) {
        "[done]".to_owned()
    } else {
        format!("[{}]", result["error_type"].as_str().unwrap_or("failed"))
    }
}

/// `daemon/status` as a short table.
pub(crate) fn status(status: &Value, style: Style) -> String {
    let mut out = String::new();
    let row = |out: &mut String, key: &str, value: String| {
        let _ = writeln!(out, "{} {value}", style.bold(&format!("{key:<10}")));
    };
    row(
        &mut out,
        "daemon",
        format!(
            "toolgate {}, pid {}, up {}",
            status["version"].as_str().unwrap_or("?"),
            status["pid"],
            duration(status["uptime_ms"].as_u64().unwrap_or(0))
        ),
    );
    row(
        &mut out,
        "clients",
        format!(
            "{} connections, {} sessions, {} calls in flight",
            status["connections"], status["sessions"], status["calls_in_flight"]
        ),
    );
    for listener in status["listeners"].as_array().into_iter().flatten() {
        let mut line = format!(
            "{} {}",
            listener["kind"].as_str().unwrap_or("?"),
            listener["address"].as_str().unwrap_or("?")
        );
        if listener["inherited"].as_bool() == Some(true) {
            line.push_str(" (from the service manager)");
        }
        row(&mut out, "listening", line);
    }
    if let Some(roots) = status["roots"].as_array() {
        let roots: Vec<&str> = roots.iter().filter_map(Value::as_str).collect();
        let shown = if roots.is_empty() { "none".to_owned() } else { roots.join(", ") };
        row(&mut out, "roots", shown);
    }
    if let Some(mode) = status["mode"].as_str() {
        row(&mut out, "mode", mode.to_owned());
    }
    row(&mut out, "tools", format!("{}", status["tools"]));
    if let Some(dropped) = status["audit_records_dropped"].as_u64().filter(|&n| n > 0) {
        row(&mut out, "audit", style.red(&format!("{dropped} records dropped")));
    }
    sandbox_rows(&status["sandbox"], style, &mut |key, value| row(&mut out, key, value));
    for upstream in status["upstreams"].as_array().into_iter().flatten() {
        let state = upstream["state"].as_str().unwrap_or("?");
        let painted = match state {
            "running" | "ready" => style.green(state),
            "failed" => style.red(state),
            _ => style.yellow(state),
        };
        let mut line = format!(
            "{:<16} {painted} {} tools, {} restarts",
            upstream["name"].as_str().unwrap_or("?"),
            upstream["tools"],
            upstream["restarts"]
        );
        if let Some(reason) = upstream["reason"].as_str() {
            let _ = write!(line, " ({reason})");
        }
        row(&mut out, "upstream", line);
    }
    out
}

/// The sandbox's rows of `status`: what is in force, what commands read and write
/// beyond their roots, what never, and the limits that do not hold.
fn sandbox_rows(sandbox: &Value, style: Style, row: &mut dyn FnMut(&str, String)) {
    let Some(summary) = sandbox["summary"].as_str() else {
        return;
    };
    let summary = summary.strip_prefix("sandbox: ").unwrap_or(summary);
    let enforced = sandbox["enabled"].as_bool() == Some(true)
        && sandbox["landlock_abi"].as_u64().is_some_and(|abi| abi > 0);
    let state = if enforced { style.green("enforced") } else { style.red("not enforced") };
    row("sandbox", format!("{state}: {summary}"));
    let paths = |parts: &Value| -> String {
        let listed: Vec<&str> = parts
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|part| part["paths"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        listed.join(", ")
    };
    let grants = &sandbox["grants"];
    if grants.is_object() {
        row("  reads", paths(&grants["read"]));
        row("  writes", paths(&grants["write"]));
        let secrets: Vec<&str> = grants["never"]["secrets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let never = match secrets.len() {
            0 => "toolgate's own files (no secret location of the list exists here)".to_owned(),
            _ => format!("{}, and toolgate's own files", secrets.join(", ")),
        };
        row("  never", never);
    }
    for limit in sandbox["unenforced_limits"].as_array().into_iter().flatten() {
        row("  limit", style.red(&format!("{} (not enforced)", limit.as_str().unwrap_or("?"))));
    }
}

/// `1h 2m 3s` for a number of milliseconds.
fn duration(ms: u64) -> String {
    let seconds = ms / 1000;
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if hours > 0 {
        format!("{hours}h {minutes}m {seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m {seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// `tools/explain`: the verdict, then one sentence per layer that was consulted.
pub(crate) fn explain(name: &str, answer: &Value, style: Style) -> String {
    let decision = answer["decision"].as_str().unwrap_or("?");
    let painted = match decision {
        "allow" => style.green(decision),
        "ask" => style.yellow(decision),
        _ => style.red(decision),
    };
    let mut out = format!("{}: {painted}\n", style.bold(name));
    let layers: Vec<&Value> = match answer["layers"].as_array() {
        Some(layers) if !layers.is_empty() => layers.iter().collect(),
        _ => answer.get("explanation").into_iter().collect(),
    };
    if layers.is_empty() && decision == "unknown_tool" {
        let _ = writeln!(out, "  no tool of that name is registered");
    }
    for layer in layers {
        let mut line = layer["reason"].as_str().unwrap_or("").to_owned();
        if let Some(rule) = layer["rule"].as_str() {
            let list = layer["list"].as_str().map(|list| format!("{list} ")).unwrap_or_default();
            let _ = write!(line, " ({list}rule {rule})");
        }
        let label = format!("{:<13}", layer["layer"].as_str().unwrap_or("?"));
        let _ = writeln!(out, "  {} {line}", style.dim(&label));
    }
    out
}

/// `tools/list` as one row per tool: its name, its safety (`system` for a control-plane
/// tool: rules and modes do not apply to it) and the first line of its description,
/// wrapped to `width` columns under itself.
pub(crate) fn list(result: &Value, width: usize, style: Style) -> String {
    const NAME: usize = 16;
    const SAFETY: usize = 12;
    let indent = NAME + 1 + SAFETY + 1;
    let mut out = String::new();
    for tool in result["tools"].as_array().into_iter().flatten() {
        let name = tool["name"].as_str().unwrap_or("?");
        let safety = if tool["system"].as_bool() == Some(true) {
            "system"
        } else {
            tool["safety"].as_str().unwrap_or("?")
        };
        let description = tool["description"].as_str().unwrap_or("").lines().next().unwrap_or("");
        let lines = wrap(description, width.saturating_sub(indent).max(20));
        let first = lines.first().map_or("", String::as_str);
        let head = format!("{} {safety:<SAFETY$} {first}", style.bold(&format!("{name:<NAME$}")));
        let _ = writeln!(out, "{}", head.trim_end());
        for line in lines.iter().skip(1) {
            let _ = writeln!(out, "{:indent$}{line}", "");
        }
    }
    out
}

/// `text` in lines of at most `width` characters, broken between words (a word longer
/// than that stands alone on its line).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let needed = line.chars().count() + usize::from(!line.is_empty()) + word.chars().count();
        if !line.is_empty() && needed > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use expect_test::expect;
    use serde_json::json;

    use super::*;

    const PLAIN: Style = Style { color: false };

    fn both(rendered: &Rendered) -> String {
        format!("--- stdout\n{}--- stderr\n{}", rendered.stdout, rendered.stderr)
    }

    #[test]
    fn the_output_is_json_unless_a_person_reads_it() {
        assert_eq!(Output::decide(true, true, false), Output::Json);
        assert_eq!(Output::decide(false, false, false), Output::Json);
        assert_eq!(Output::decide(false, true, false), Output::Human { color: true });
        assert_eq!(Output::decide(false, true, true), Output::Human { color: false });
    }

    #[test]
    fn read_file_prints_the_numbered_lines_as_text() {
        let result = json!({
            "ok": true, "tool": "read_file",
            "content": "     1\tfn main() {\n     2\t    println!(\"hi\");\n     3\t}\n",
            "metadata": {"call_id": "1", "lines": 3}
        });
        expect![[r#"
            --- stdout
                 1	fn main() {
                 2	    println!("hi");
                 3	}
            --- stderr
        "#]]
        .assert_eq(&both(&call_result(&result, false, PLAIN)));
    }

    #[test]
    fn a_streamed_command_ends_with_its_exit_status() {
        let result = json!({
            "ok": false, "tool": "run_command", "content": "boom\n[exit code 3]",
            "error_type": "command_failed", "error": "the command exited with code 3",
            "metadata": {"call_id": "1", "exit_code": 3}
        });
        expect![[r#"
            --- stdout
            --- stderr
            [exit code 3]
            run_command: command_failed: the command exited with code 3
        "#]]
        .assert_eq(&both(&call_result(&result, true, PLAIN)));
        expect![[r#"
            --- stdout
            boom
            [exit code 3]
            --- stderr
            run_command: command_failed: the command exited with code 3
        "#]]
        .assert_eq(&both(&call_result(&result, false, PLAIN)));
    }

    #[test]
    fn a_refusal_is_one_line_on_stderr_in_red_on_a_terminal() {
        let result = json!({
            "ok": false, "tool": "read_file", "content": "",
            "error_type": "access_denied", "error": "/etc/passwd is outside the session roots",
            "metadata": {"call_id": "1"}
        });
        expect![[r#"
            --- stdout
            --- stderr
            ESC[31mread_file: access_denied:ESC[0m /etc/passwd is outside the session roots
        "#]]
        .assert_eq(
            &both(&call_result(&result, false, Style { color: true })).replace('\x1b', "ESC"),
        );
    }

    #[test]
    fn attachments_are_mentioned_not_dumped() {
        let result = json!({
            "ok": true, "tool": "read_file", "content": "an image, 3 bytes",
            "attachments": [{"type": "image", "mime_type": "image/png", "data": "AAAA"}],
            "metadata": {}
        });
        expect![[r#"
            --- stdout
            an image, 3 bytes
            --- stderr
            [image not shown here; use --json]
        "#]]
        .assert_eq(&both(&call_result(&result, false, PLAIN)));
    }

    #[test]
    fn status_is_a_short_table() {
        let answer = json!({
            "version": "0.1.0", "pid": 4242, "uptime_ms": 3_723_000u64, "connections": 2,
            "sessions": 3, "calls_in_flight": 1, "tools": 8,
            "roots": ["/home/u/project", "/srv/data"], "mode": "accept_edits",
            "listeners": [
                {"kind": "unix", "address": "/run/user/1000/toolgate/toolgate.sock"},
                {"kind": "tcp", "address": "127.0.0.1:7777", "inherited": true}
            ],
            "sandbox": {
                "enabled": true, "landlock_abi": 7,
                "summary": "sandbox: landlock v7; containment: supervisor (no delegation)",
                "unenforced_limits": ["[sandbox] max_memory_mb = 100: no per-call cgroups"],
                "grants": {
                    "read": [{"paths": ["/usr", "/etc"], "why": "system"},
                             {"paths": ["/home/u"], "why": "home"}],
                    "write": [{"paths": ["the session's roots"], "why": "workspace"},
                              {"paths": ["/home/u/.cache"], "why": "caches"}],
                    "never": {"secrets": ["/home/u/.ssh"], "why": "secrets"}
                }
            },
            "upstreams": [
                {"name": "git", "state": "running", "restarts": 0, "tools": 5},
                {"name": "docs", "state": "failed", "reason": "connection refused", "restarts": 4, "tools": 0}
            ]
        });
        expect![[r#"
            daemon     toolgate 0.1.0, pid 4242, up 1h 2m 3s
            clients    2 connections, 3 sessions, 1 calls in flight
            listening  unix /run/user/1000/toolgate/toolgate.sock
            listening  tcp 127.0.0.1:7777 (from the service manager)
            roots      /home/u/project, /srv/data
            mode       accept_edits
            tools      8
            sandbox    enforced: landlock v7; containment: supervisor (no delegation)
              reads    /usr, /etc, /home/u
              writes   the session's roots, /home/u/.cache
              never    /home/u/.ssh, and toolgate's own files
              limit    [sandbox] max_memory_mb = 100: no per-call cgroups (not enforced)
            upstream   git              running 5 tools, 0 restarts
            upstream   docs             failed 0 tools, 4 restarts (connection refused)
        "#]]
        .assert_eq(&status(&answer, PLAIN));
    }

    #[test]
    fn status_names_lost_audit_records_when_there_are_any() {
        let mut answer = json!({
            "version": "0.1.0", "pid": 4242, "uptime_ms": 1000u64, "connections": 1,
            "sessions": 1, "calls_in_flight": 0, "tools": 8, "audit_records_dropped": 0
        });
        assert!(!status(&answer, PLAIN).contains("audit"));
        answer["audit_records_dropped"] = json!(7);
        expect![[r#"
            daemon     toolgate 0.1.0, pid 4242, up 1s
            clients    1 connections, 1 sessions, 0 calls in flight
            tools      8
            audit      7 records dropped
        "#]]
        .assert_eq(&status(&answer, PLAIN));
    }

    #[test]
    fn explain_says_one_sentence_per_layer() {
        let answer = json!({
            "decision": "deny",
            "explanation": {"layer": "confinement", "reason": "/etc/passwd resolves outside the session roots"},
            "layers": [
                {"layer": "allowlist", "reason": "read_file is available in this session"},
                {"layer": "mode", "reason": "read_file is read-only; default mode allows it"},
                {"layer": "confinement", "reason": "/etc/passwd resolves outside the session roots"}
            ]
        });
        expect![[r#"
            read_file: deny
              allowlist     read_file is available in this session
              mode          read_file is read-only; default mode allows it
              confinement   /etc/passwd resolves outside the session roots
        "#]]
        .assert_eq(&explain("read_file", &answer, PLAIN));
        let ruled = json!({
            "decision": "ask",
            "explanation": {"layer": "rule", "rule": "run_command(git push:*)", "list": "ask",
                            "reason": "an ask rule matches"}
        });
        expect![[r#"
            run_command: ask
              rule          an ask rule matches (ask rule run_command(git push:*))
        "#]]
        .assert_eq(&explain("run_command", &ruled, PLAIN));
        expect![[r#"
            nope: unknown_tool
              no tool of that name is registered
        "#]]
        .assert_eq(&explain("nope", &json!({"decision": "unknown_tool"}), PLAIN));
    }

    #[test]
    fn list_wraps_descriptions_and_names_system_tools() {
        let result = json!({"tools": [
            {"name": "read_file", "safety": "read_only",
             "description": "Reads a file, with numbered lines and honest truncation.\nMore."},
            {"name": "todo_write", "safety": "read_only", "system": true, "description": "Tasks."}
        ]});
        expect![[r#"
            read_file        read_only    Reads a file, with numbered
                                          lines and honest truncation.
            todo_write       system       Tasks.
        "#]]
        .assert_eq(&list(&result, 60, PLAIN));
    }
}
