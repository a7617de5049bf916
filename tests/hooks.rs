//! End-to-end tests of command hooks: real `/bin/sh` processes running small scripts
//! written into a temporary directory, driven through the public `Hooks` API.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test setup fails its test by panicking"
)]

mod support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use support::wait_for_file;
use tokio_util::sync::CancellationToken;
use toolgate::hooks::{
    HookConfig, HookEvent, HookFailure, HookFormat, HookRunError, HookVerdict, Hooks, OnError,
    PostOutcome, PreOutcome, ToolCallInput,
};
use toolgate::tools::{Env, ErrorType, ToolResult};

/// Safety net around every hook run: far above anything a passing test needs, so it
/// only turns a hang into a failure.
const SAFETY_TIMEOUT: Duration = Duration::from_secs(60);

struct Fixture {
    _dir: tempfile::TempDir,
    /// Canonical path of the temporary directory; the session cwd and the scripts' home.
    root: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        Fixture { _dir: dir, root }
    }

    /// Writes an executable script and returns a command that runs it.
    fn script(&self, name: &str, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = self.root.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        format!("'{}'", path.display())
    }

    fn hook(&self, name: &str, body: &str) -> HookConfig {
        HookConfig {
            matcher: String::new(),
            command: self.script(name, body),
            timeout_ms: 30_000,
            on_error: OnError::Allow,
            format: HookFormat::Auto,
        }
    }

    fn call(&self, tool: &str) -> ToolCallInput {
        let mut env = Env::for_root(&self.root).unwrap();
        env.session_id = "s1".to_owned();
        ToolCallInput::new(&env, "c1", tool, json!({"path": "src/main.rs"}))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

/// The hooks' environment: only what a shell needs to find `sleep`, `cat` and friends.
fn hook_env() -> Vec<(String, String)> {
    vec![("PATH".to_owned(), std::env::var("PATH").unwrap())]
}

async fn run_pre(pre: &[HookConfig], call: &ToolCallInput) -> PreOutcome {
    let hooks = Hooks::new(pre, &[]).unwrap();
    let cancel = CancellationToken::new();
    tokio::time::timeout(SAFETY_TIMEOUT, hooks.run_pre(call, &hook_env(), &cancel)).await.unwrap()
}

async fn run_post(post: &[HookConfig], call: &ToolCallInput, result: &ToolResult) -> PostOutcome {
    let hooks = Hooks::new(&[], post).unwrap();
    let cancel = CancellationToken::new();
    tokio::time::timeout(SAFETY_TIMEOUT, hooks.run_post(call, result, &hook_env(), &cancel))
        .await
        .unwrap()
}

fn outcome(verdict: HookVerdict, reason: Option<&str>) -> PreOutcome {
    PreOutcome {
        verdict,
        reason: reason.map(str::to_owned),
        updated_input: None,
        errors: Vec::new(),
        hook_count: 1,
    }
}

/// Whether `pid` is a live (not zombie) `sleep` process.
fn sleep_alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    if matches!(state, Some('Z' | 'X') | None) {
        return false;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmdline.starts_with(b"sleep\0")
}

/// A background `sleep` writes its pid (the shell's `$!`) as soon as it is forked,
/// before it has become `sleep`: waits until it has.
async fn wait_until_sleeping(pid: i32) -> bool {
    wait_until_sleep_alive_is(pid, true).await
}

/// SIGKILL is delivered asynchronously: waits until the process is gone.
async fn wait_until_dead(pid: i32) -> bool {
    wait_until_sleep_alive_is(pid, false).await
}

/// Polls until [`sleep_alive`] says `alive` of `pid`, bounded by the safety timeout.
async fn wait_until_sleep_alive_is(pid: i32, alive: bool) -> bool {
    let give_up = tokio::time::Instant::now() + SAFETY_TIMEOUT;
    while tokio::time::Instant::now() < give_up {
        if sleep_alive(pid) == alive {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn exit_zero_continues_and_plain_stdout_is_ignored() {
    let fx = Fixture::new();
    let hook = fx.hook("log.sh", "echo 'checked src/main.rs, all good'\nexit 0");
    let res = run_pre(&[hook], &fx.call("read_file")).await;
    assert_eq!(res, outcome(HookVerdict::Continue, None));
    assert!(!res.refuses());
}

#[tokio::test]
async fn exit_zero_json_decisions() {
    let fx = Fixture::new();
    let cases = [
        (
            r#"{"decision": "deny", "reason": "secrets live there"}"#,
            HookVerdict::Deny,
            Some("secrets live there"),
        ),
        (
            r#"{"decision": "ask", "reason": "double-check this"}"#,
            HookVerdict::Ask,
            Some("double-check this"),
        ),
        (
            r#"{"decision": "allow", "reason": "known safe"}"#,
            HookVerdict::Allow,
            Some("known safe"),
        ),
        (r#"{"decision": "allow"}"#, HookVerdict::Allow, None),
        (r#"{"decision": "approve", "reason": "legacy"}"#, HookVerdict::Allow, Some("legacy")),
        (r#"{"decision": "block", "reason": "legacy no"}"#, HookVerdict::Deny, Some("legacy no")),
        (r#"{"decision": "deny"}"#, HookVerdict::Deny, Some("denied by hook")),
        (r#"{"suppressOutput": true}"#, HookVerdict::Continue, None),
        (
            r#"{"continue": false, "stopReason": "out of budget"}"#,
            HookVerdict::Block,
            Some("out of budget"),
        ),
    ];
    for (idx, (stdout, verdict, reason)) in cases.into_iter().enumerate() {
        let hook = fx.hook(&format!("decide{idx}.sh"), &format!("cat >/dev/null\necho '{stdout}'"));
        let res = run_pre(&[hook], &fx.call("read_file")).await;
        assert_eq!(res.verdict, verdict, "{stdout}");
        assert!(res.errors.is_empty(), "{stdout}: {:?}", res.errors);
        match reason {
            Some(reason) => assert!(
                res.reason.as_deref().is_some_and(|r| r.starts_with(reason)),
                "{stdout}: {:?}",
                res.reason
            ),
            None => assert_eq!(res.reason, None, "{stdout}"),
        }
    }
}

#[tokio::test]
async fn hook_specific_output_form() {
    let fx = Fixture::new();
    let hook = fx.hook(
        "specific.sh",
        r#"cat <<'EOF'
{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
  "permissionDecisionReason": "writes to vendor/ are not allowed"}}
EOF"#,
    );
    let res = run_pre(&[hook], &fx.call("write_file")).await;
    assert_eq!(res, outcome(HookVerdict::Deny, Some("writes to vendor/ are not allowed")));

    let hook = fx.hook(
        "specific_ask.sh",
        r#"echo '{"hookSpecificOutput": {"permissionDecision": "ask", "updatedInput": {"path": "b.rs"}}}'"#,
    );
    let res = run_pre(&[hook], &fx.call("write_file")).await;
    assert_eq!(
        res,
        PreOutcome {
            updated_input: Some(json!({"path": "b.rs"})),
            ..outcome(HookVerdict::Ask, None)
        }
    );
}

#[tokio::test]
async fn updated_input_is_returned_and_the_last_hook_wins() {
    let fx = Fixture::new();
    let first = fx.hook("first.sh", r#"echo '{"updated_input": {"path": "first.rs"}}'"#);
    let res = run_pre(std::slice::from_ref(&first), &fx.call("read_file")).await;
    assert_eq!(
        res,
        PreOutcome {
            updated_input: Some(json!({"path": "first.rs"})),
            ..outcome(HookVerdict::Continue, None)
        }
    );

    let second = fx.hook(
        "second.sh",
        r#"echo '{"decision": "allow", "hookSpecificOutput": {"updatedInput": {"path": "second.rs"}}}'"#,
    );
    let silent = fx.hook("silent.sh", "exit 0");
    let res = run_pre(&[first, second, silent], &fx.call("read_file")).await;
    assert_eq!(
        res,
        PreOutcome {
            verdict: HookVerdict::Allow,
            reason: None,
            updated_input: Some(json!({"path": "second.rs"})),
            errors: Vec::new(),
            hook_count: 3,
        }
    );
}

#[tokio::test]
async fn exit_two_blocks_with_stderr_as_reason() {
    let fx = Fixture::new();
    let hook = fx.hook(
        "block.sh",
        "echo 'ignored stdout'\necho '  rm -rf is not allowed here  ' >&2\nexit 2",
    );
    let res = run_pre(&[hook], &fx.call("run_command")).await;
    assert_eq!(res, outcome(HookVerdict::Block, Some("rm -rf is not allowed here")));
    assert!(res.refuses());
}

#[tokio::test]
async fn other_exit_codes_are_errors_treated_per_on_error() {
    let fx = Fixture::new();
    let mut hook = fx.hook("broken.sh", "echo 'lint.py: not found' >&2\nexit 1");
    let command = hook.command.clone();
    let error = |on_error| HookRunError {
        event: HookEvent::PreToolUse,
        index: 0,
        command: command.clone(),
        on_error,
        failure: HookFailure::ExitStatus { code: 1, stderr: "lint.py: not found".to_owned() },
    };

    let res = run_pre(std::slice::from_ref(&hook), &fx.call("read_file")).await;
    assert_eq!(
        res,
        PreOutcome { errors: vec![error(OnError::Allow)], ..outcome(HookVerdict::Continue, None) }
    );

    hook.on_error = OnError::Deny;
    let res = run_pre(&[hook], &fx.call("read_file")).await;
    assert_eq!(res.verdict, HookVerdict::Block);
    assert_eq!(res.errors, vec![error(OnError::Deny)]);
    let reason = res.reason.unwrap();
    assert!(reason.contains("exited with status 1: lint.py: not found"), "{reason}");
    assert!(reason.contains("fails closed"), "{reason}");
}

#[tokio::test]
async fn a_hook_that_cannot_start_is_not_a_deny() {
    let fx = Fixture::new();
    let hook = fx.hook("never.sh", "echo ran > \"$0.ran\"");
    let mut call = fx.call("read_file");
    let gone = fx.path("gone");
    std::fs::create_dir(&gone).unwrap();
    std::fs::remove_dir(&gone).unwrap();
    call.cwd = gone;

    let res = run_pre(std::slice::from_ref(&hook), &call).await;
    assert_eq!(res.verdict, HookVerdict::Continue);
    assert_eq!(res.reason, None);
    assert_eq!(res.errors.len(), 1);
    assert!(
        matches!(res.errors[0].failure, HookFailure::NotStarted(_)),
        "{:?}",
        res.errors[0].failure
    );
    assert!(!fx.path("never.sh.ran").exists());

    let closed = HookConfig { on_error: OnError::Deny, ..hook };
    let res = run_pre(&[closed], &call).await;
    assert_eq!(res.verdict, HookVerdict::Block);
    assert_ne!(res.verdict, HookVerdict::Deny);
    assert!(matches!(res.errors[0].failure, HookFailure::NotStarted(_)));
    assert_eq!(res.errors[0].on_error, OnError::Deny);
    let reason = res.reason.unwrap();
    assert!(reason.contains("could not be started"), "{reason}");
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let fx = Fixture::new();
    let pid_file = fx.path("pid");
    let mut hook = fx.hook(
        "slow.sh",
        &format!(
            "sleep 1000 &\necho $! > '{0}.tmp' && mv '{0}.tmp' '{0}'\nwait",
            pid_file.display()
        ),
    );
    // The hook never finishes on its own. It must have written its child's pid before
    // the deadline for the check to mean anything; should a loaded machine be slower
    // than that, the run is repeated with a longer deadline instead of failing.
    for timeout_ms in [1_000, 4_000, 16_000] {
        hook.timeout_ms = timeout_ms;
        let res = run_pre(std::slice::from_ref(&hook), &fx.call("read_file")).await;
        assert_eq!(res.verdict, HookVerdict::Continue);
        assert_eq!(
            res.errors,
            vec![HookRunError {
                event: HookEvent::PreToolUse,
                index: 0,
                command: hook.command.clone(),
                on_error: OnError::Allow,
                failure: HookFailure::TimedOut { timeout_ms },
            }]
        );
        assert_eq!(res.errors[0].failure.to_string(), format!("timed out after {timeout_ms} ms"));
        let Ok(pid) = std::fs::read_to_string(&pid_file) else {
            continue;
        };
        let pid: i32 = pid.trim().parse().unwrap();
        assert!(wait_until_dead(pid).await, "background child {pid} outlived its hook");
        return;
    }
    panic!("the hook never got to write its child's pid");
}

#[tokio::test]
async fn cancellation_kills_the_whole_process_group() {
    let fx = Fixture::new();
    let pid_file = fx.path("pid");
    let hook = HookConfig {
        on_error: OnError::Deny,
        ..fx.hook(
            "wait.sh",
            &format!(
                "sleep 1000 &\necho $! > '{0}.tmp' && mv '{0}.tmp' '{0}'\nwait",
                pid_file.display()
            ),
        )
    };
    let hooks = Hooks::new(&[hook], &[]).unwrap();
    let cancel = CancellationToken::new();
    let call = fx.call("read_file");
    let env = hook_env();
    let run = hooks.run_pre(&call, &env, &cancel);
    let canceller = async {
        let pid: i32 = wait_for_file(&pid_file).await.trim().parse().unwrap();
        assert!(wait_until_sleeping(pid).await, "the probe must see the running child");
        cancel.cancel();
        pid
    };
    let (res, pid) =
        tokio::time::timeout(SAFETY_TIMEOUT, async { tokio::join!(run, canceller) }).await.unwrap();
    assert_eq!(res.verdict, HookVerdict::Block);
    assert_eq!(res.errors.len(), 1);
    assert_eq!(res.errors[0].failure, HookFailure::Canceled);
    assert!(wait_until_dead(pid).await, "background child {pid} outlived its hook");
}

#[tokio::test]
async fn background_leftovers_are_killed_when_the_hook_exits() {
    let fx = Fixture::new();
    let pid_file = fx.path("pid");
    let mut hook = fx.hook(
        "leaves.sh",
        &format!(
            "sleep 1000 &\necho $! > '{}'\necho '{{\"decision\": \"allow\"}}'",
            pid_file.display()
        ),
    );
    // The leftover keeps stdout open; without the group kill the run would last this long.
    hook.timeout_ms = 600_000;
    let res = run_pre(&[hook], &fx.call("read_file")).await;
    assert_eq!(res, outcome(HookVerdict::Allow, None));
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert!(wait_until_dead(pid).await, "background child {pid} outlived its hook");
}

#[tokio::test]
async fn matcher_selects_tools() {
    let fx = Fixture::new();
    let marker = |name: &str| format!("cat >/dev/null\ntouch '{}'", fx.path(name).display());
    let writes =
        HookConfig { matcher: "write_file|edit_file".to_owned(), ..fx.hook("w.sh", &marker("w")) };
    let reads = HookConfig { matcher: "read_.*".to_owned(), ..fx.hook("r.sh", &marker("r")) };
    let every = HookConfig { matcher: "*".to_owned(), ..fx.hook("all.sh", &marker("all")) };
    let pre = [writes, reads, every];

    let res = run_pre(&pre, &fx.call("read_file")).await;
    assert_eq!(res.hook_count, 2);
    assert!(fx.path("r").exists() && fx.path("all").exists());
    assert!(!fx.path("w").exists());

    std::fs::remove_file(fx.path("all")).unwrap();
    let res = run_pre(&pre[..2], &fx.call("run_command")).await;
    assert_eq!(res, PreOutcome { hook_count: 0, ..outcome(HookVerdict::Continue, None) });
    assert!(!fx.path("w").exists() && !fx.path("all").exists());

    let res = run_pre(&pre, &fx.call("edit_file")).await;
    assert_eq!(res.hook_count, 2);
    assert!(fx.path("w").exists());
}

/// Each hook waits for the other's marker file before answering, so the run can only
/// finish if both processes are alive at the same time; run one after the other, the
/// first would time out and its error would show in the outcome.
#[tokio::test]
async fn matching_hooks_run_concurrently_and_deny_from_either_wins() {
    for deny_first in [true, false] {
        let fx = Fixture::new();
        let rendezvous = |me: &str, other: &str, answer: &str| {
            format!(
                "cat >/dev/null\ntouch '{me}'\nwhile [ ! -e '{other}' ]; do sleep 0.01; done\necho '{answer}'",
                me = fx.path(me).display(),
                other = fx.path(other).display(),
            )
        };
        let deny = r#"{"decision": "deny", "reason": "one says no"}"#;
        let allow = r#"{"decision": "allow", "reason": "two says yes"}"#;
        let (first, second) = if deny_first { (deny, allow) } else { (allow, deny) };
        let pre = [
            fx.hook("one.sh", &rendezvous("one", "two", first)),
            fx.hook("two.sh", &rendezvous("two", "one", second)),
        ];
        let res = run_pre(&pre, &fx.call("read_file")).await;
        assert_eq!(
            res,
            PreOutcome { hook_count: 2, ..outcome(HookVerdict::Deny, Some("one says no")) },
            "deny_first = {deny_first}"
        );
    }
}

#[tokio::test]
async fn stdin_carries_every_field() {
    let fx = Fixture::new();
    let dump = |name: &str| {
        format!(
            "cat > '{0}.json'\nprintf '%s' \"$TOOLGATE_HOOK_EVENT\" > '{0}.event'\nprintf '%s|%s' \"$PWD\" \"${{HOME-unset}}\" > '{0}.env'",
            fx.path(name).display()
        )
    };
    let call = fx.call("read_file").with_permission_mode("accept_edits");
    let result =
        ToolResult::success("fn main() {}").with_meta("call_id", "c1").stamp("read_file", "c1");

    let hooks =
        Hooks::new(&[fx.hook("pre.sh", &dump("pre"))], &[fx.hook("post.sh", &dump("post"))])
            .unwrap();
    let cancel = CancellationToken::new();
    let env = hook_env();
    let pre =
        tokio::time::timeout(SAFETY_TIMEOUT, hooks.run_pre(&call, &env, &cancel)).await.unwrap();
    assert_eq!(pre.errors, Vec::new());
    let post = tokio::time::timeout(SAFETY_TIMEOUT, hooks.run_post(&call, &result, &env, &cancel))
        .await
        .unwrap();
    assert_eq!(post, PostOutcome { hook_count: 1, ..PostOutcome::none() });

    let read_json = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(fx.path(name)).unwrap()).unwrap()
    };
    let cwd = fx.root.display().to_string();
    assert_eq!(
        read_json("pre.json"),
        json!({
            "hook_event_name": "PreToolUse",
            "session_id": "s1",
            "cwd": cwd,
            "tool_name": "read_file",
            "tool_input": {"path": "src/main.rs"},
            "call_id": "c1",
            "permission_mode": "accept_edits",
        })
    );
    assert_eq!(
        read_json("post.json"),
        json!({
            "hook_event_name": "PostToolUse",
            "session_id": "s1",
            "cwd": cwd,
            "tool_name": "read_file",
            "tool_input": {"path": "src/main.rs"},
            "call_id": "c1",
            "permission_mode": "accept_edits",
            "tool_result": {
                "ok": true,
                "tool": "read_file",
                "content": "fn main() {}",
                "metadata": {"call_id": "c1"},
            },
        })
    );
    let read = |name: &str| std::fs::read_to_string(fx.path(name)).unwrap();
    assert_eq!(read("pre.event"), "PreToolUse");
    assert_eq!(read("post.event"), "PostToolUse");
    // The hook runs in the session cwd with exactly the given environment: the test
    // process's HOME is not inherited.
    assert_eq!(read("pre.env"), format!("{cwd}|unset"));

    // The wire payload round-trips through the typed input structs.
    let typed: toolgate::hooks::PostToolUseInput =
        serde_json::from_value(read_json("post.json")).unwrap();
    assert_eq!(typed.call, call);
    assert_eq!(typed.tool_result, result);
    assert_eq!(typed.hook_event_name, HookEvent::PostToolUse);
}

#[tokio::test]
async fn post_hooks_only_add_feedback() {
    let fx = Fixture::new();
    let call = fx.call("write_file");
    let result =
        ToolResult::failure(ErrorType::StaleFile, "changed on disk").stamp("write_file", "c1");

    let res = run_post(&[fx.hook("ok.sh", "echo done")], &call, &result).await;
    assert_eq!(res, PostOutcome { hook_count: 1, ..PostOutcome::none() });

    let exit2 = fx.hook("fmt.sh", "echo 'rustfmt: 3 files need formatting' >&2\nexit 2");
    let block = fx.hook(
        "block.sh",
        r#"echo '{"decision": "block", "reason": "tests fail now", "hookSpecificOutput": {"additionalContext": "see ci.log"}}'"#,
    );
    let res = run_post(&[exit2, block], &call, &result).await;
    assert_eq!(
        res,
        PostOutcome {
            feedback: Some(
                "rustfmt: 3 files need formatting\ntests fail now\nsee ci.log".to_owned()
            ),
            errors: Vec::new(),
            hook_count: 2,
        }
    );

    let open = fx.hook("crash_open.sh", "exit 3");
    let closed = HookConfig { on_error: OnError::Deny, ..fx.hook("crash_closed.sh", "exit 4") };
    let res = run_post(&[open, closed], &call, &result).await;
    assert_eq!(res.hook_count, 2);
    assert_eq!(
        res.errors.iter().map(|e| (e.index, e.on_error, e.failure.clone())).collect::<Vec<_>>(),
        vec![
            (0, OnError::Allow, HookFailure::ExitStatus { code: 3, stderr: String::new() }),
            (1, OnError::Deny, HookFailure::ExitStatus { code: 4, stderr: String::new() }),
        ]
    );
    let feedback = res.feedback.unwrap();
    assert!(feedback.contains("exited with status 4"), "{feedback}");
    assert!(!feedback.contains("status 3"), "{feedback}");
}

#[tokio::test]
async fn invalid_json_answer_is_an_error() {
    let fx = Fixture::new();
    let hook = HookConfig {
        on_error: OnError::Deny,
        ..fx.hook("bad.sh", r#"echo '{"decision": "perhaps"}'"#)
    };
    let res = run_pre(&[hook], &fx.call("read_file")).await;
    assert_eq!(res.verdict, HookVerdict::Block);
    assert!(
        matches!(&res.errors[0].failure, HookFailure::InvalidOutput(msg) if msg.contains("perhaps")),
        "{:?}",
        res.errors
    );
}

#[tokio::test]
async fn large_output_and_unread_large_input_do_not_stall() {
    let fx = Fixture::new();
    // 1 MiB of stdout is read and discarded beyond the cap; the JSON answer is lost with
    // it, so this is plain output and the call continues.
    let chatty = fx.hook(
        "chatty.sh",
        "head -c 1048576 /dev/zero | tr '\\0' 'x'\necho '{\"decision\":\"deny\"}'",
    );
    let res = run_pre(&[chatty], &fx.call("read_file")).await;
    assert_eq!(res, outcome(HookVerdict::Continue, None));

    // A JSON answer cut at the cap is not silently read as plain output.
    let long_answer = HookConfig {
        on_error: OnError::Deny,
        ..fx.hook(
            "long.sh",
            "printf '{\"decision\": \"deny\", \"reason\": \"'\nhead -c 1048576 /dev/zero | tr '\\0' 'x'\necho '\"}'",
        )
    };
    let res = run_pre(&[long_answer], &fx.call("read_file")).await;
    assert_eq!(res.verdict, HookVerdict::Block);
    assert!(
        matches!(&res.errors[0].failure, HookFailure::InvalidOutput(msg) if msg.contains("longer than")),
        "{:?}",
        res.errors
    );

    // A 2 MiB result the hook never reads: writing it fails with a broken pipe once the
    // hook exits, and the answer still counts.
    let big = ToolResult::success("y".repeat(2 * 1024 * 1024)).stamp("read_file", "c1");
    let deaf = fx.hook("deaf.sh", "echo 'too big to read' >&2\nexit 2");
    let res = run_post(&[deaf], &fx.call("read_file"), &big).await;
    assert_eq!(res.feedback.as_deref(), Some("too big to read"));
}

// --- Claude Code hook scripts, run as they are written for Claude Code --------------

/// The interpreter behind `python3`, so a script's `#!` line works whatever the hooks'
/// environment finds on `PATH`.
fn python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

impl Fixture {
    /// Writes an executable script with its own `#!` line and returns a command that
    /// runs it.
    fn program(&self, name: &str, text: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = self.root.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        format!("'{}'", path.display())
    }

    fn claude_hook(&self, matcher: &str, name: &str, text: &str) -> HookConfig {
        HookConfig {
            matcher: matcher.to_owned(),
            command: self.program(name, text),
            timeout_ms: 30_000,
            on_error: OnError::Allow,
            format: HookFormat::Auto,
        }
    }

    fn call_with(&self, tool: &str, input: Value) -> ToolCallInput {
        let mut env = Env::for_root(&self.root).unwrap();
        env.session_id = "s1".to_owned();
        ToolCallInput::new(&env, "c1", tool, input)
    }
}

/// A PreToolUse script as Claude Code's documentation writes them: reads the event
/// from stdin and blocks dangerous Bash commands with exit status 2.
const PYTHON_BASH_GUARD: &str = r#"
import json
import sys

data = json.load(sys.stdin)
if data.get("tool_name") == "Bash":
    command = data.get("tool_input", {}).get("command", "")
    if "rm -rf" in command:
        print("Blocked: rm -rf is not allowed", file=sys.stderr)
        sys.exit(2)
sys.exit(0)
"#;

/// An Edit|Write guard reading `tool_input.file_path`, answering with Claude Code's
/// `hookSpecificOutput` JSON.
const PYTHON_PATH_GUARD: &str = r#"
import json
import sys

data = json.load(sys.stdin)
path = data["tool_input"].get("file_path", "")
if path.endswith(".env") or "/.git/" in path:
    print(json.dumps({
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": "protected file: " + path,
        }
    }))
sys.exit(0)
"#;

#[tokio::test]
async fn claude_code_matchers_select_the_tools_they_stand_for() {
    let fx = Fixture::new();
    let bash = HookConfig { matcher: "Bash".to_owned(), ..fx.hook("b.sh", "exit 0") };
    let edits = HookConfig { matcher: "Edit|Write".to_owned(), ..fx.hook("e.sh", "exit 0") };
    let reads = HookConfig { matcher: "Read|Grep|Glob".to_owned(), ..fx.hook("r.sh", "exit 0") };
    let cases: [(&HookConfig, &[&str], &[&str]); 3] = [
        (&bash, &["run_command", "Bash"], &["read_file", "write_file", "edit_file"]),
        (&edits, &["write_file", "edit_file"], &["run_command", "read_file"]),
        (&reads, &["read_file", "search_code", "find_files"], &["run_command", "write_file"]),
    ];
    for (hook, matching, other) in cases {
        let hooks = Hooks::new(std::slice::from_ref(hook), std::slice::from_ref(hook)).unwrap();
        for tool in matching {
            assert!(
                hooks.has_pre(tool) && hooks.has_post(tool),
                "{} should match {tool}",
                hook.matcher
            );
        }
        for tool in other {
            assert!(!hooks.has_pre(tool), "{} should not match {tool}", hook.matcher);
        }
    }
}

#[tokio::test]
async fn a_python_bash_guard_blocks_run_command() {
    let fx = Fixture::new();
    let script = format!("#!{}\n{PYTHON_BASH_GUARD}", python());
    let hook = fx.claude_hook("Bash", "bash_guard.py", &script);
    let blocked = run_pre(
        std::slice::from_ref(&hook),
        &fx.call_with("run_command", json!({"command": "rm -rf build"})),
    )
    .await;
    assert_eq!(blocked, outcome(HookVerdict::Block, Some("Blocked: rm -rf is not allowed")));
    let fine = run_pre(&[hook], &fx.call_with("run_command", json!({"command": "ls -la"}))).await;
    assert_eq!(fine, outcome(HookVerdict::Continue, None));
}

#[tokio::test]
async fn a_jq_bash_blocker_blocks_run_command() {
    if std::process::Command::new("jq").arg("--version").output().is_err() {
        println!("skipped: jq is not installed (the Python guards cover the same input)");
        return;
    }
    let fx = Fixture::new();
    // The shape of Claude Code's documented Bash validators.
    let script = r#"#!/bin/bash
input=$(cat)
tool=$(echo "$input" | jq -r '.tool_name')
command=$(echo "$input" | jq -r '.tool_input.command // empty')
if [ "$tool" = "Bash" ] && echo "$command" | grep -qE '(^|[;&| ])(rm|dd|mkfs)( |$)'; then
  echo "Blocked dangerous command: $command" >&2
  exit 2
fi
exit 0
"#;
    let hook = fx.claude_hook("Bash", "jq_guard.sh", script);
    let blocked = run_pre(
        std::slice::from_ref(&hook),
        &fx.call_with("run_command", json!({"command": "rm -rf /"})),
    )
    .await;
    assert_eq!(blocked, outcome(HookVerdict::Block, Some("Blocked dangerous command: rm -rf /")));
    let fine =
        run_pre(&[hook], &fx.call_with("run_command", json!({"command": "git status"}))).await;
    assert_eq!(fine, outcome(HookVerdict::Continue, None));
}

#[tokio::test]
async fn an_edit_write_guard_reads_file_path() {
    let fx = Fixture::new();
    let script = format!("#!{}\n{PYTHON_PATH_GUARD}", python());
    let hook = fx.claude_hook("Edit|Write", "path_guard.py", &script);
    let env_file = fx.path(".env").display().to_string();
    for tool in ["write_file", "edit_file"] {
        let input = json!({"path": env_file, "content": "x", "old_string": "a", "new_string": "b"});
        let denied = run_pre(std::slice::from_ref(&hook), &fx.call_with(tool, input)).await;
        let reason = format!("protected file: {env_file}");
        assert_eq!(denied, outcome(HookVerdict::Deny, Some(&reason)), "{tool}");
    }
    let fine = run_pre(
        std::slice::from_ref(&hook),
        &fx.call_with("write_file", json!({"path": "src/lib.rs", "content": "x"})),
    )
    .await;
    assert_eq!(fine, outcome(HookVerdict::Continue, None));
    // Not a tool the matcher stands for: the hook does not run at all.
    let hooks = Hooks::new(&[hook], &[]).unwrap();
    assert!(!hooks.has_pre("read_file"));
}

#[tokio::test]
async fn claude_format_input_and_updated_input_use_claude_code_names() {
    let fx = Fixture::new();
    let seen = fx.path("seen.json");
    // Records its input, then rewrites the path the way a Claude Code hook would.
    let script = format!(
        "#!{}\nimport json, sys\ndata = json.load(sys.stdin)\nopen({:?}, 'w').write(json.dumps(data))\nprint(json.dumps({{'hookSpecificOutput': {{'hookEventName': 'PreToolUse', 'permissionDecision': 'allow', 'updatedInput': {{'file_path': 'safe.txt', 'content': data['tool_input']['content']}}}}}}))\n",
        python(),
        seen.display().to_string(),
    );
    let hook = HookConfig {
        format: HookFormat::Claude,
        matcher: "*".to_owned(),
        ..fx.claude_hook("", "rewrite.py", &script)
    };
    let call = fx
        .call_with("write_file", json!({"path": "notes.txt", "content": "hi"}))
        .with_permission_mode("accept_edits");
    let res = run_pre(&[hook], &call).await;
    assert_eq!(res.verdict, HookVerdict::Allow);
    assert_eq!(res.updated_input, Some(json!({"path": "safe.txt", "content": "hi"})));
    let input: Value = serde_json::from_str(&std::fs::read_to_string(&seen).unwrap()).unwrap();
    assert_eq!(input["hook_event_name"], "PreToolUse");
    assert_eq!(input["tool_name"], "Write");
    assert_eq!(input["tool_input"], json!({"file_path": "notes.txt", "content": "hi"}));
    assert_eq!(input["permission_mode"], "acceptEdits");
    assert_eq!(input["session_id"], "s1");

    // A hook written for toolgate's names keeps them.
    let native = fx.path("native.json");
    let hook = HookConfig {
        matcher: "write_file".to_owned(),
        ..fx.hook("native.sh", &format!("cat > '{}'", native.display()))
    };
    run_pre(&[hook], &call).await;
    let input: Value = serde_json::from_str(&std::fs::read_to_string(&native).unwrap()).unwrap();
    assert_eq!(input["tool_name"], "write_file");
    assert_eq!(input["tool_input"], json!({"path": "notes.txt", "content": "hi"}));
}

/// A Claude Code `NotebookEdit` hook sees `notebook_edit` under Claude Code's name and
/// field names (`notebook_path`, `new_source`, `edit_mode`), and its `updatedInput` in
/// those names comes back in the tool's own.
#[tokio::test]
async fn a_notebook_edit_hook_reads_claude_code_names() {
    let fx = Fixture::new();
    let seen = fx.path("seen.json");
    let script = format!(
        "#!{}\nimport json, sys\ndata = json.load(sys.stdin)\nopen({:?}, 'w').write(json.dumps(data))\nupdated = dict(data['tool_input'], notebook_path='safe.ipynb')\nprint(json.dumps({{'hookSpecificOutput': {{'hookEventName': 'PreToolUse', 'permissionDecision': 'allow', 'updatedInput': updated}}}}))\n",
        python(),
        seen.display().to_string(),
    );
    let hook = fx.claude_hook("NotebookEdit", "notebook.py", &script);
    let call = fx.call_with(
        "notebook_edit",
        json!({"path": "a.ipynb", "cell_id": "c1", "source": "x = 1", "action": "replace"}),
    );
    let res = run_pre(&[hook], &call).await;
    assert_eq!(res.verdict, HookVerdict::Allow, "{res:?}");
    assert_eq!(
        res.updated_input,
        Some(
            json!({"path": "safe.ipynb", "cell_id": "c1", "source": "x = 1", "action": "replace"})
        )
    );
    let input: Value = serde_json::from_str(&std::fs::read_to_string(&seen).unwrap()).unwrap();
    assert_eq!(input["tool_name"], "NotebookEdit");
    assert_eq!(
        input["tool_input"],
        json!({"notebook_path": "a.ipynb", "cell_id": "c1", "new_source": "x = 1", "edit_mode": "replace"})
    );
}

#[tokio::test]
async fn a_claude_post_hook_gets_the_tool_response() {
    let fx = Fixture::new();
    let seen = fx.path("post.json");
    let hook = HookConfig {
        matcher: "Bash".to_owned(),
        ..fx.hook("post.sh", &format!("cat > '{}'", seen.display()))
    };
    let call = fx.call_with("run_command", json!({"command": "ls", "timeout_ms": 5000}));
    run_post(&[hook], &call, &ToolResult::success("a\nb\n")).await;
    let input: Value = serde_json::from_str(&std::fs::read_to_string(&seen).unwrap()).unwrap();
    assert_eq!(input["hook_event_name"], "PostToolUse");
    assert_eq!(input["tool_name"], "Bash");
    assert_eq!(input["tool_input"], json!({"command": "ls", "timeout": 5000}));
    assert_eq!(input["tool_response"]["content"], "a\nb\n");
}

/// The real daemon with a Claude Code `Bash` hook configured: the hook fires for
/// `run_command` and its exit status 2 blocks the command, even in bypass mode.
#[test]
fn a_claude_code_bash_hook_blocks_run_command_in_the_daemon() {
    use std::io::{BufRead, Write};
    let fx = Fixture::new();
    let workspace = fx.path("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let script = format!("#!{}\n{PYTHON_BASH_GUARD}", python());
    let hook = fx.program("bash_guard.py", &script);
    let config = fx.path("config.toml");
    std::fs::write(
        &config,
        format!(
            "[workspace]\nroots = [{:?}]\n\n[permissions]\nmode = \"bypass\"\n\n[[hooks.pre_tool_use]]\nmatcher = \"Bash\"\ncommand = {hook:?}\n",
            workspace.display().to_string()
        ),
    )
    .unwrap();
    let socket = fx.path("run/toolgate.sock");
    let _daemon = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--socket"])
            .arg(&socket)
            .arg("--config")
            .arg(&config)
            .current_dir(&workspace)
            .env("XDG_CONFIG_HOME", fx.path("config-home"))
            .env("XDG_STATE_HOME", fx.path("state-home"))
            .env("XDG_RUNTIME_DIR", fx.path("run"))
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env("TOOLGATE_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (blocked, allowed) = {
        let deadline = std::time::Instant::now() + SAFETY_TIMEOUT;
        let stream = loop {
            if let Ok(stream) = std::os::unix::net::UnixStream::connect(&socket) {
                break stream;
            }
            assert!(std::time::Instant::now() < deadline, "the daemon did not listen");
            std::thread::sleep(Duration::from_millis(20));
        };
        stream.set_read_timeout(Some(SAFETY_TIMEOUT)).unwrap();
        let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut call = |id: u64, command: &str| {
            let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "run_command", "arguments": {"command": command}}});
            writer.write_all(format!("{request}\n").as_bytes()).unwrap();
            loop {
                let mut line = String::new();
                assert!(
                    reader.read_line(&mut line).unwrap() > 0,
                    "the daemon closed the connection"
                );
                let message: Value = serde_json::from_str(&line).unwrap();
                if message["id"] == id {
                    return message["result"].clone();
                }
            }
        };
        let blocked = call(1, "rm -rf victim; touch ran");
        let allowed = call(2, "touch fine");
        (blocked, allowed)
    };
    assert_eq!(blocked["error_type"], "hook_blocked", "{blocked}");
    assert!(blocked["error"].as_str().unwrap().contains("Blocked: rm -rf"), "{blocked}");
    assert!(!workspace.join("ran").exists(), "the blocked command ran");
    assert_eq!(allowed["ok"], true, "{allowed}");
    assert!(workspace.join("fine").exists());
}

/// A child process killed (and reaped) when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
