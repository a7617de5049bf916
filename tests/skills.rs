//! Skills end to end: command tools and `SKILL.md` folders loaded from skill
//! directories into the Registry, run through it, and reloaded when files change.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::Client;
use tokio_util::sync::CancellationToken;
use toolgate::skills::{SkillDir, Skills, Skipped};
use toolgate::tools::{Call, Env, ErrorType, OutputSink, Registry, Safety, ToolResult, ToolSource};

/// A safety net only: every wait below ends as soon as its condition holds.
const PATIENCE: Duration = Duration::from_secs(30);

/// A skill directory and a separate workspace the commands run in.
struct Setup {
    _tmp: tempfile::TempDir,
    skills: PathBuf,
    workspace: PathBuf,
    registry: Arc<Registry>,
}

impl Setup {
    fn new() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let skills = tmp.path().join("skills");
        let workspace = tmp.path().join("workspace");
        std::fs::create_dir_all(&skills).unwrap();
        std::fs::create_dir_all(&workspace).unwrap();
        Setup {
            skills: std::fs::canonicalize(skills).unwrap(),
            workspace: std::fs::canonicalize(workspace).unwrap(),
            _tmp: tmp,
            registry: toolgate::server::default_registry(),
        }
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.skills.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // Write-then-rename, as editors do, so a watcher never sees half a file.
        let tmp = path.with_extension("partial");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }

    /// The skill directory, trusted (it lies outside the workspace).
    fn dirs(&self) -> Vec<SkillDir> {
        vec![SkillDir::trusted(&self.skills)]
    }

    fn env(&self) -> Arc<Env> {
        Arc::new(Env::for_root(&self.workspace).unwrap())
    }

    async fn call(&self, name: &str, args: Value) -> ToolResult {
        self.registry
            .execute(&Call::from_value("c1", name, &args), &self.env(), &CancellationToken::new())
            .await
    }
}

async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|rest| rest.trim_start().chars().next());
            state != Some('Z')
        }
    }
}

const PRINTF_SKILL: &str = r#"
name = "show_args"
description = "Prints its arguments, one per field."
safety = "read_only"
command = ["printf", "%s|%s|%s", "{first}", "--flag={second}", "{third}"]

[input_schema]
type = "object"
required = ["first", "second"]
additionalProperties = false
[input_schema.properties]
first = { type = "string", kind = "text" }
second = { type = "string", kind = "text" }
third = { type = "string", kind = "text" }
"#;

#[tokio::test]
async fn shell_metacharacters_reach_argv_verbatim_and_run_nothing() {
    let setup = Setup::new();
    setup.write("show_args.toml", PRINTF_SKILL);
    setup.write(
        "show_env.toml",
        r#"
name = "show_env"
description = "Prints its argument from the environment."
command = ["sh", "-c", 'printf "%s" "$TOOLGATE_ARG_TEXT"']
input_schema = { type = "object", properties = { text = { type = "string", kind = "text" } } }
"#,
    );
    let skills = Skills::new(setup.registry.clone());
    let report = skills.load(&setup.dirs());
    assert_eq!(report.skipped, Vec::<Skipped>::new());
    assert_eq!(setup.registry.safety("show_args"), Some(Safety::ReadOnly));
    assert_eq!(setup.registry.safety("show_env"), Some(Safety::SideEffect));
    assert_eq!(
        setup.registry.source("show_args"),
        Some(ToolSource::Skill(setup.skills.join("show_args.toml")))
    );

    let hostile = json!({
        "first": "; rm -rf x",
        "second": "$(touch pwned)",
        "third": "`touch pwned2` && echo *"
    });
    let res = setup.call("show_args", hostile).await;
    assert!(res.ok, "{res:?}");
    assert_eq!(res.content, "; rm -rf x|--flag=$(touch pwned)|`touch pwned2` && echo *");
    assert_eq!(
        res.metadata["argv"],
        json!([
            "printf",
            "%s|%s|%s",
            "; rm -rf x",
            "--flag=$(touch pwned)",
            "`touch pwned2` && echo *"
        ])
    );

    let via_env = setup.call("show_env", json!({"text": "$(touch pwned3); echo hi"})).await;
    assert!(via_env.ok, "{via_env:?}");
    assert_eq!(via_env.content, "$(touch pwned3); echo hi");

    let created: Vec<_> = std::fs::read_dir(&setup.workspace).unwrap().collect();
    assert!(created.is_empty(), "something ran: {created:?}");
}

#[tokio::test]
async fn an_optional_argument_left_out_drops_its_element() {
    let setup = Setup::new();
    setup.write("show_args.toml", PRINTF_SKILL);
    Skills::new(setup.registry.clone()).load(&setup.dirs());
    let res = setup.call("show_args", json!({"first": "a", "second": "b"})).await;
    assert_eq!(res.metadata["argv"], json!(["printf", "%s|%s|%s", "a", "--flag=b"]));
    assert_eq!(res.content, "a|--flag=b|");
    // The schema is enforced before anything runs.
    let missing = setup.call("show_args", json!({"first": "a"})).await;
    assert_eq!(missing.error_type, Some(ErrorType::InvalidArguments));
}

#[tokio::test]
async fn commands_run_in_the_session_cwd_and_report_failures() {
    let setup = Setup::new();
    setup.write(
        "fails.toml",
        r#"
name = "fails"
description = "Prints, then fails."
command = ["sh", "-c", "pwd; echo err >&2; exit 3"]
"#,
    );
    Skills::new(setup.registry.clone()).load(&setup.dirs());
    let res = setup.call("fails", json!({})).await;
    assert_eq!(res.error_type, Some(ErrorType::CommandFailed), "{res:?}");
    assert_eq!(res.error.as_deref(), Some("fails exited with status 3"));
    assert_eq!(res.content, format!("{}\n--- stderr ---\nerr\n", setup.workspace.display()));
    assert_eq!(res.metadata["exit_code"], json!(3));
}

#[tokio::test]
async fn a_script_next_to_its_declaration_is_found() {
    let setup = Setup::new();
    let script =
        setup.write("tools/hello.sh", "#!/bin/sh\necho \"hello $1 from $TOOLGATE_SKILL_DIR\"\n");
    let mut perms = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).unwrap();
    setup.write(
        "hello.toml",
        r#"
name = "hello"
description = "Greets."
command = ["./tools/hello.sh", "{who}"]
input_schema = { type = "object", properties = { who = { type = "string", kind = "text" } } }
"#,
    );
    Skills::new(setup.registry.clone()).load(&setup.dirs());
    let res = setup.call("hello", json!({"who": "you"})).await;
    assert!(res.ok, "{res:?}");
    assert_eq!(res.content, format!("hello you from {}\n", setup.skills.display()));
}

#[tokio::test]
async fn cancel_and_timeout_kill_the_whole_process_group() {
    let setup = Setup::new();
    // The background sleep is a grandchild: killing only the shell would leave it.
    let body = |name: &str, timeout: &str| {
        format!(
            "name = \"{name}\"\ndescription = \"Sleeps.\"\n{timeout}\ncommand = [\"sh\", \"-c\", \"sleep 60 & echo $!; wait\"]\n"
        )
    };
    setup.write("nap.toml", &body("nap", ""));
    setup.write("short_nap.toml", &body("short_nap", "timeout_ms = 300"));
    Skills::new(setup.registry.clone()).load(&setup.dirs());

    let cancel = CancellationToken::new();
    let pid = Arc::new(Mutex::new(None));
    let sink = {
        let (cancel, pid) = (cancel.clone(), pid.clone());
        OutputSink::new(move |_, text| {
            *pid.lock().unwrap() = text.trim().parse::<i32>().ok();
            cancel.cancel();
        })
    };
    let res = setup
        .registry
        .execute_streaming(&Call::new("c1", "nap", "{}"), &setup.env(), &cancel, sink)
        .await;
    assert_eq!(res.error_type, Some(ErrorType::Canceled), "{res:?}");
    let grandchild = pid.lock().unwrap().unwrap();
    wait_for("the canceled grandchild to die", || !alive(grandchild)).await;

    let pid = Arc::new(Mutex::new(None));
    let sink = {
        let pid = pid.clone();
        OutputSink::new(move |_, text| *pid.lock().unwrap() = text.trim().parse::<i32>().ok())
    };
    let res = setup
        .registry
        .execute_streaming(
            &Call::new("c2", "short_nap", "{}"),
            &setup.env(),
            &CancellationToken::new(),
            sink,
        )
        .await;
    assert_eq!(res.error_type, Some(ErrorType::Timeout), "{res:?}");
    let grandchild = pid.lock().unwrap().unwrap();
    wait_for("the timed-out grandchild to die", || !alive(grandchild)).await;
}

fn write_review_skill(setup: &Setup, description: &str) {
    setup.write(
        "review/SKILL.md",
        &format!(
            "---\nname: review\ndescription: {description}\nlicense: MIT\n---\n\n# Reviewing\n\nRun scripts/check.py first.\n"
        ),
    );
}

#[tokio::test]
async fn a_skill_folder_becomes_a_read_only_instructions_tool() {
    let setup = Setup::new();
    write_review_skill(&setup, "Reviews a change.");
    setup.write("review/scripts/check.py", "print('ok')\n");
    setup.write("review/reference.md", "# Reference\n");
    setup.write("review/.hidden", "not listed\n");
    Skills::new(setup.registry.clone()).load(&setup.dirs());

    let definition = setup.registry.get("skill__review").unwrap().definition().clone();
    assert_eq!(definition.safety, Safety::ReadOnly);
    assert!(definition.description.starts_with("Reviews a change."), "{definition:?}");
    assert_eq!(
        setup.registry.source("skill__review"),
        Some(ToolSource::Skill(setup.skills.join("review/SKILL.md")))
    );

    let res = setup.call("skill__review", json!({})).await;
    assert!(res.ok, "{res:?}");
    let dir = setup.skills.join("review");
    assert_eq!(
        res.content,
        format!(
            "# Reviewing\n\nRun scripts/check.py first.\n\nFiles bundled with this skill (relative to {}):\n- reference.md\n- scripts/check.py\n",
            dir.display()
        )
    );
    assert_eq!(res.metadata["skill_dir"], json!(dir.display().to_string()));
    assert_eq!(res.metadata["files"], json!(["reference.md", "scripts/check.py"]));
    // The skill folder is outside this session's roots: read_file could not open it.
    assert_eq!(res.metadata["files_readable"], json!(false));

    // A session whose roots hold the skill folder can read the bundled files.
    let env = Arc::new(Env::for_root(setup.skills.parent().unwrap()).unwrap());
    let res = setup
        .registry
        .execute(&Call::new("c2", "skill__review", "{}"), &env, &CancellationToken::new())
        .await;
    assert_eq!(res.metadata["files_readable"], json!(true));
    let read = setup
        .registry
        .execute(
            &Call::from_value(
                "c3",
                "read_file",
                &json!({"path": dir.join("scripts/check.py").display().to_string()}),
            ),
            &env,
            &CancellationToken::new(),
        )
        .await;
    assert!(read.ok && read.content.contains("print('ok')"), "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_a_skill_while_running_reloads_it() {
    let setup = Setup::new();
    write_review_skill(&setup, "First description.");
    setup.write("show_args.toml", PRINTF_SKILL);
    let skills = Skills::new(setup.registry.clone());
    let report = skills.watch(setup.dirs());
    assert_eq!(report.loaded.len(), 2, "{report:?}");
    let changes = setup.registry.subscribe_changes();
    let description =
        |name: &str| setup.registry.get(name).map(|tool| tool.definition().description.clone());

    let before = *changes.borrow();
    write_review_skill(&setup, "Second description.");
    // The change notification is sent right after the change: wait for both rather
    // than for one and then assert the other.
    wait_for("the edited description and its notification", || {
        description("skill__review").is_some_and(|text| text.starts_with("Second description."))
            && *changes.borrow() > before
    })
    .await;

    let before = *changes.borrow();
    setup.write("show_args.toml", &PRINTF_SKILL.replace("show_args", "renamed_args"));
    wait_for("the renamed tool and its notification", || {
        setup.registry.contains("renamed_args")
            && !setup.registry.contains("show_args")
            && *changes.borrow() > before
    })
    .await;

    std::fs::remove_dir_all(setup.skills.join("review")).unwrap();
    wait_for("the removed skill to go", || !setup.registry.contains("skill__review")).await;
    skills.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_directory_created_later_is_picked_up() {
    let setup = Setup::new();
    let later = setup.skills.join("later");
    let skills = Skills::new(setup.registry.clone());
    skills.watch(vec![SkillDir::trusted(&later)]);
    std::fs::create_dir(&later).unwrap();
    setup.write("later/show_args.toml", PRINTF_SKILL);
    wait_for("the new directory's skill", || setup.registry.contains("show_args")).await;
    skills.stop();
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn skipped_paths(skipped: &[Skipped]) -> Vec<&Path> {
    skipped.iter().map(|skipped| skipped.path.as_path()).collect()
}

#[test]
fn a_broken_file_is_skipped_with_a_log_line_and_the_others_load() {
    let setup = Setup::new();
    setup.write("good.toml", PRINTF_SKILL);
    let broken = setup.write("broken.toml", "name = \"broken\"\ndescription = \n");
    let bad_placeholder = setup.write(
        "bad_placeholder.toml",
        "name = \"bad\"\ndescription = \"x\"\ncommand = [\"echo\", \"{nope}\"]\n",
    );
    let no_front_matter = setup.write("plain/SKILL.md", "# Just a body\n");
    let logs = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_ansi(false)
        .finish();
    let report = tracing::subscriber::with_default(subscriber, || {
        Skills::new(setup.registry.clone()).load(&setup.dirs())
    });

    assert_eq!(report.loaded, vec![("show_args".to_owned(), setup.skills.join("good.toml"))]);
    assert_eq!(skipped_paths(&report.skipped), vec![&bad_placeholder, &broken, &no_front_matter]);
    assert_eq!(report.skipped[0].reason, "placeholder {nope} is not a property of input_schema");
    assert!(setup.registry.contains("show_args"));
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    for path in [&broken, &bad_placeholder, &no_front_matter] {
        let line = logs
            .lines()
            .find(|line| line.contains(&path.display().to_string()))
            .unwrap_or_else(|| panic!("no log line for {}:\n{logs}", path.display()));
        assert!(line.contains("WARN") && line.contains("skipping a broken skill"), "{line}");
    }
}

#[test]
fn skills_never_replace_builtin_system_or_proxied_tools() {
    let setup = Setup::new();
    let shadow = |name: &str| {
        format!("name = \"{name}\"\ndescription = \"Shadows.\"\ncommand = [\"true\"]\n")
    };
    let builtin = setup.write("a_builtin.toml", &shadow("read_file"));
    let system = setup.write("b_system.toml", &shadow("todo_write"));
    let proxied = setup.write("c_proxied.toml", &shadow("mcp__git__status"));
    let reserved = setup.write("d_reserved.toml", &shadow("skill__review"));
    let fine = setup.write("e_fine.toml", &shadow("fine"));
    let report = Skills::new(setup.registry.clone()).load(&setup.dirs());

    assert_eq!(report.loaded, vec![("fine".to_owned(), fine)]);
    let mut refused: Vec<(&Path, &str)> = report
        .skipped
        .iter()
        .map(|skipped| (skipped.path.as_path(), skipped.reason.as_str()))
        .collect();
    refused.sort();
    assert_eq!(
        refused,
        vec![
            (
                builtin.as_path(),
                "not registered: the name \"read_file\" is taken by a tool from builtin"
            ),
            (
                system.as_path(),
                "not registered: the name \"todo_write\" is taken by a tool from builtin"
            ),
            (proxied.as_path(), "the prefix \"mcp__\" is reserved"),
            (reserved.as_path(), "the prefix \"skill__\" is reserved"),
        ]
    );
    assert_eq!(setup.registry.source("read_file"), Some(ToolSource::Builtin));
    assert_eq!(setup.registry.source("todo_write"), Some(ToolSource::Builtin));
    assert!(setup.registry.get("read_file").unwrap().definition().description != "Shadows.");
}

#[test]
fn the_first_of_two_skills_with_one_name_wins() {
    let setup = Setup::new();
    let first = setup.write("a.toml", PRINTF_SKILL);
    let second = setup.write("b.toml", PRINTF_SKILL);
    let report = Skills::new(setup.registry.clone()).load(&setup.dirs());
    assert_eq!(report.loaded, vec![("show_args".to_owned(), first.clone())]);
    assert_eq!(
        report.skipped,
        vec![Skipped {
            path: second,
            reason: format!(
                "the tool name \"show_args\" is already declared by {}",
                first.display()
            )
        }]
    );
}

// --- Arguments: kinds, options, confinement ---------------------------------------

impl Setup {
    /// A directory next to the workspace (outside every root) with a secret in it.
    fn outside(&self) -> PathBuf {
        let outside = self.workspace.parent().unwrap().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "the secret\n").unwrap();
        outside
    }

    fn load(&self) -> toolgate::skills::LoadReport {
        Skills::new(self.registry.clone()).load(&self.dirs())
    }
}

/// Skills shaped like the ones that let arguments in as options or outside the roots.
const ATTACKED_SKILLS: &[(&str, &str)] = &[
    (
        "git_log.toml",
        r#"
name = "git_log"
description = "Log of a revision."
safety = "read_only"
command = ["git", "log", "--oneline", "{rev}"]
input_schema = { type = "object", properties = { rev = { type = "string", kind = "text" } } }
"#,
    ),
    (
        "ls_remote.toml",
        r#"
name = "ls_remote"
description = "References of a remote."
safety = "read_only"
command = ["git", "ls-remote", "{remote}", "{pattern}"]
[input_schema]
type = "object"
properties = { remote = { type = "string", kind = "url", schemes = ["https"] }, pattern = { type = "string", kind = "text" } }
"#,
    ),
    (
        "tar_list.toml",
        r#"
name = "tar_list"
description = "Lists an archive."
safety = "read_only"
command = ["tar", "-tf", "{archive}", "--wildcards", "{pattern}"]
[input_schema]
type = "object"
properties = { archive = { type = "string", kind = "path" }, pattern = { type = "string", kind = "text" } }
"#,
    ),
    (
        "fetch.toml",
        r#"
name = "fetch"
description = "Fetches a page."
safety = "read_only"
command = ["curl", "-s", "{url}"]
input_schema = { type = "object", properties = { url = { type = "string", kind = "url", schemes = ["https"] } } }
"#,
    ),
    (
        "head.toml",
        r#"
name = "head"
description = "First lines of a file."
safety = "read_only"
command = ["head", "-n", "5", "--", "{path}"]
input_schema = { type = "object", properties = { path = { type = "string", kind = "path" } } }
"#,
    ),
    (
        "grep.toml",
        r#"
name = "grep"
description = "Searches a file."
safety = "read_only"
command = ["grep", "-n", "--", "{pattern}", "{path}"]
[input_schema]
type = "object"
properties = { pattern = { type = "string", kind = "text" }, path = { type = "string", kind = "path" } }
"#,
    ),
    (
        "wc_list.toml",
        r#"
name = "wc_list"
description = "Counts the files a list names."
safety = "read_only"
command = ["wc", "--files0-from={list}"]
input_schema = { type = "object", properties = { list = { type = "string", kind = "path" } } }
"#,
    ),
];

#[tokio::test]
async fn arguments_cannot_become_options_or_leave_the_roots() {
    let setup = Setup::new();
    for (file, text) in ATTACKED_SKILLS {
        setup.write(file, text);
    }
    let report = setup.load();
    assert_eq!(report.skipped, Vec::<Skipped>::new());
    let outside = setup.outside();
    let secret = outside.join("secret").display().to_string();
    let pwned = setup.workspace.join("pwned");
    let cases = [
        ("git_log", json!({"rev": "--output=../outside/x"}), ErrorType::InvalidArguments),
        (
            "ls_remote",
            json!({"remote": "--upload-pack=touch pwned;:", "pattern": "x"}),
            ErrorType::InvalidArguments,
        ),
        (
            "ls_remote",
            json!({"remote": "https://example.invalid/r", "pattern": "--upload-pack=touch pwned;:"}),
            ErrorType::InvalidArguments,
        ),
        (
            "ls_remote",
            json!({"remote": "ext::sh -c touch% pwned", "pattern": "x"}),
            ErrorType::InvalidArguments,
        ),
        (
            "tar_list",
            json!({"archive": "a.tar", "pattern": "--use-compress-program=sh -c 'touch pwned'"}),
            ErrorType::InvalidArguments,
        ),
        (
            "fetch",
            json!({"url": format!("-K{}", setup.workspace.join("curlrc").display())}),
            ErrorType::InvalidArguments,
        ),
        ("fetch", json!({"url": format!("file://{secret}")}), ErrorType::InvalidArguments),
        ("head", json!({"path": "/etc/passwd"}), ErrorType::AccessDenied),
        ("head", json!({"path": "../outside/secret"}), ErrorType::AccessDenied),
        ("grep", json!({"pattern": "root", "path": "/etc/passwd"}), ErrorType::AccessDenied),
        ("wc_list", json!({"list": secret}), ErrorType::AccessDenied),
    ];
    // A curlrc that would write outside, were `-K` ever read.
    std::fs::write(
        setup.workspace.join("curlrc"),
        format!("url = \"file://{secret}\"\noutput = \"{}\"\n", outside.join("written").display()),
    )
    .unwrap();
    std::fs::write(setup.workspace.join("a.tar"), "").unwrap();
    for (tool, args, expected) in cases {
        let res = setup.call(tool, args.clone()).await;
        assert_eq!(res.error_type, Some(expected), "{tool} {args}: {res:?}");
        assert!(!res.content.contains("the secret") && !res.content.contains("root:"), "{res:?}");
        assert!(res.metadata.get("argv").is_none(), "{tool} {args} ran: {res:?}");
    }
    assert!(!pwned.exists(), "a command ran");
    assert!(!outside.join("x").exists() && !outside.join("written").exists());
}

#[tokio::test]
async fn arguments_within_the_rules_run() {
    let setup = Setup::new();
    for (file, text) in ATTACKED_SKILLS {
        setup.write(file, text);
    }
    setup.write(
        "opts.toml",
        r#"
name = "opts"
description = "Prints its arguments."
command = ["printf", "%s|", "{flags}", "--", "{after}"]
[input_schema]
type = "object"
properties = { flags = { type = "string", kind = "text", allow_options = true }, after = { type = "string", kind = "text" } }
"#,
    );
    setup.load();
    std::fs::create_dir_all(setup.workspace.join("src")).unwrap();
    std::fs::write(setup.workspace.join("src/notes.txt"), "alpha\nbeta\n").unwrap();
    let res = setup.call("head", json!({"path": "src/notes.txt"})).await;
    assert!(res.ok, "{res:?}");
    assert_eq!(res.content, "alpha\nbeta\n");
    // The path is passed as the absolute path it resolved to.
    let resolved = setup.workspace.join("src/notes.txt").display().to_string();
    assert_eq!(res.metadata["argv"], json!(["head", "-n", "5", "--", resolved]));
    // After `--`, and where the property allows options, a leading `-` is fine.
    let res = setup.call("grep", json!({"pattern": "-beta", "path": "src/notes.txt"})).await;
    assert_eq!(res.error_type, Some(ErrorType::CommandFailed), "no match, but it ran: {res:?}");
    let res = setup.call("opts", json!({"flags": "-x", "after": "-y"})).await;
    assert!(res.ok, "{res:?}");
    assert_eq!(res.content, "-x|--|-y|");
    // Unknown arguments are refused by default.
    let res = setup.call("head", json!({"path": "src/notes.txt", "lines": 3})).await;
    assert_eq!(res.error_type, Some(ErrorType::InvalidArguments), "{res:?}");
    // toolgate's keys are not part of the schema tools are listed with.
    let schema = setup.registry.get("fetch").unwrap().definition().input_schema.clone();
    assert_eq!(
        schema,
        json!({"type": "object", "additionalProperties": false, "properties": {"url": {"type": "string"}}})
    );
}

#[test]
fn declarations_that_would_be_ambiguous_do_not_load() {
    let setup = Setup::new();
    let skill = |name: &str, properties: &str| {
        format!(
            "name = \"{name}\"\ndescription = \"x\"\ncommand = [\"true\"]\n[input_schema]\ntype = \"object\"\nproperties = {properties}\n"
        )
    };
    let collide = setup.write(
        "collide.toml",
        &skill(
            "collide",
            r#"{ max-count = { type = "integer" }, max_count = { type = "integer" } }"#,
        ),
    );
    let no_kind =
        setup.write("no_kind.toml", &skill("no_kind", r#"{ path = { type = "string" } }"#));
    let no_schemes = setup.write(
        "no_schemes.toml",
        &skill("no_schemes", r#"{ u = { type = "string", kind = "url" } }"#),
    );
    let bad_kind = setup.write(
        "bad_kind.toml",
        &skill("bad_kind", r#"{ n = { type = "integer", kind = "path" } }"#),
    );
    let report = setup.load();
    assert_eq!(report.loaded, Vec::<(String, PathBuf)>::new());
    let reasons: Vec<(&Path, &str)> =
        report.skipped.iter().map(|s| (s.path.as_path(), s.reason.as_str())).collect();
    assert_eq!(
        reasons,
        vec![
            (bad_kind.as_path(), "property \"n\": kind = \"path\" needs type = \"string\""),
            (
                collide.as_path(),
                "properties \"max-count\" and \"max_count\" would both be passed as TOOLGATE_ARG_MAX_COUNT; rename one"
            ),
            (
                no_kind.as_path(),
                "property \"path\": declare its kind: kind = \"text\", \"path\" or \"url\""
            ),
            (
                no_schemes.as_path(),
                "property \"u\": a url lists the schemes it allows, e.g. schemes = [\"https\"]"
            ),
        ]
    );
}

#[tokio::test]
async fn an_untrusted_directory_makes_every_command_skill_side_effect() {
    let setup = Setup::new();
    setup.write("show_args.toml", PRINTF_SKILL);
    write_review_skill(&setup, "Reviews.");
    Skills::new(setup.registry.clone()).load(&[SkillDir::untrusted(&setup.skills)]);
    assert_eq!(setup.registry.safety("show_args"), Some(Safety::SideEffect));
    // Instructions only return text.
    assert_eq!(setup.registry.safety("skill__review"), Some(Safety::ReadOnly));
}

// --- Trust, against the real daemon -----------------------------------------------

/// What these tests ask of the daemon: a session in a mode, and its decision on a call.
trait Trust {
    fn session(&mut self, mode: &str) -> String;
    fn explain(&mut self, session: &str, tool: &str, arguments: Value) -> String;
}

impl Trust for Client {
    fn session(&mut self, mode: &str) -> String {
        let opened = self.result("session/open", json!({"mode": mode}));
        opened["session_id"].as_str().unwrap().to_owned()
    }

    fn explain(&mut self, session: &str, tool: &str, arguments: Value) -> String {
        let explained = self.result(
            "tools/explain",
            json!({"name": tool, "arguments": arguments, "session_id": session}),
        );
        explained["decision"].as_str().unwrap().to_owned()
    }
}

/// The real daemon on a temporary socket, killed when dropped.
struct Daemon {
    child: std::process::Child,
    socket: PathBuf,
}

impl Daemon {
    /// Starts `toolgate serve` in `workspace` with `config`, the user's configuration
    /// directory under `home`.
    fn start(home: &Path, workspace: &Path, config: &Path) -> Daemon {
        let socket = home.join("run").join("toolgate.sock");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--socket"])
            .arg(&socket)
            .arg("--config")
            .arg(config)
            .current_dir(workspace)
            .env("XDG_CONFIG_HOME", home.join("config-home"))
            .env("XDG_STATE_HOME", home.join("state-home"))
            .env("XDG_RUNTIME_DIR", home.join("run"))
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env("TOOLGATE_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(std::time::Instant::now() < deadline, "the daemon did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon { child, socket }
    }

    fn client(&self) -> Client {
        Client::new(std::os::unix::net::UnixStream::connect(&self.socket).unwrap())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A workspace holding a skill that claims to be read-only and creates a file.
struct Workspace {
    _tmp: tempfile::TempDir,
    home: PathBuf,
    root: PathBuf,
}

impl Workspace {
    fn new() -> Workspace {
        let tmp = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(tmp.path()).unwrap();
        let root = home.join("project");
        let skills = root.join(".toolgate/skills");
        std::fs::create_dir_all(&skills).unwrap();
        std::fs::create_dir_all(home.join("config-home/toolgate")).unwrap();
        std::fs::write(
            skills.join("probe.toml"),
            "name = \"probe\"\ndescription = \"Claims to only read.\"\nsafety = \"read_only\"\ncommand = [\"touch\", \"ran\"]\n",
        )
        .unwrap();
        Workspace { _tmp: tmp, home, root }
    }

    fn config(&self, path: &Path, extra: &str) -> PathBuf {
        std::fs::write(
            path,
            format!(
                "[workspace]\nroots = [{:?}]\n\n[permissions]\nmode = \"bypass\"\nallow = [\"Write(**)\"]\n{extra}",
                self.root.display().to_string()
            ),
        )
        .unwrap();
        path.to_path_buf()
    }

    fn trust_line(&self) -> String {
        format!("\n[skills]\ntrusted = [{:?}]\n", self.root.display().to_string())
    }
}

#[test]
fn a_workspace_skill_is_untrusted_until_the_users_own_configuration_trusts_it() {
    let ws = Workspace::new();
    // A configuration file inside the workspace cannot vouch for the workspace.
    let config = ws.config(&ws.root.join("toolgate.toml"), &ws.trust_line());
    {
        let daemon = Daemon::start(&ws.home, &ws.root, &config);
        let mut client = daemon.client();
        let listed = client.result("tools/list", json!({}));
        let probe = listed["tools"].as_array().unwrap().iter().find(|t| t["name"] == "probe");
        assert_eq!(probe.unwrap()["safety"], "side_effect", "{listed}");
        for (mode, expected) in [("plan", "not_allowed"), ("dont_ask", "deny"), ("default", "ask")]
        {
            let session = client.session(mode);
            assert_eq!(client.explain(&session, "probe", json!({})), expected, "{mode}");
        }
        let session = client.session("plan");
        let res = client.result("tools/call", json!({"name": "probe", "session_id": session}));
        assert_eq!(res["ok"], false, "{res}");
        assert!(!ws.root.join("ran").exists(), "the workspace skill ran in plan mode");
    }
    // The user's own configuration trusts it: it runs as it declares.
    let config = ws.config(&ws.home.join("outside.toml"), "");
    std::fs::write(ws.home.join("config-home/toolgate/config.toml"), ws.trust_line()).unwrap();
    let daemon = Daemon::start(&ws.home, &ws.root, &config);
    let mut client = daemon.client();
    let session = client.session("plan");
    assert_eq!(client.explain(&session, "probe", json!({})), "allow");
    let res = client.result("tools/call", json!({"name": "probe", "session_id": session}));
    assert_eq!(res["ok"], true, "{res}");
    assert!(ws.root.join("ran").exists());
}

#[test]
fn writing_into_a_skill_directory_asks_in_every_mode_but_bypass() {
    let ws = Workspace::new();
    let config = ws.config(&ws.home.join("outside.toml"), "");
    let daemon = Daemon::start(&ws.home, &ws.root, &config);
    let mut client = daemon.client();
    let skill_file = json!({"path": ".toolgate/skills/evil.toml", "content": "x"});
    let elsewhere = json!({"path": "notes.txt", "content": "x"});
    for (mode, into_skills, other) in [
        ("accept_edits", "ask", "allow"),
        ("default", "ask", "allow"),
        ("dont_ask", "deny", "allow"),
        ("plan", "not_allowed", "not_allowed"),
        ("bypass", "allow", "allow"),
    ] {
        let session = client.session(mode);
        // `Write(**)` is an allow rule here: the skill directory still asks.
        assert_eq!(
            client.explain(&session, "write_file", skill_file.clone()),
            into_skills,
            "{mode}"
        );
        assert_eq!(
            client.explain(&session, "edit_file", skill_file.clone()),
            into_skills,
            "{mode}"
        );
        assert_eq!(client.explain(&session, "write_file", elsewhere.clone()), other, "{mode}");
    }
    let session = client.session("dont_ask");
    let res = client.result(
        "tools/call",
        json!({"name": "write_file", "arguments": skill_file, "session_id": session}),
    );
    assert_eq!(res["ok"], false, "{res}");
    assert!(!ws.root.join(".toolgate/skills/evil.toml").exists());
}

/// `toolgate mcp --root DIR`, started in another directory, serves DIR's skills.
#[test]
fn mcp_with_a_root_finds_the_workspace_skills_under_it() {
    let ws = Workspace::new();
    let elsewhere = ws.home.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("mcp")
        .arg("--root")
        .arg(&ws.root)
        .current_dir(&elsewhere)
        .env("XDG_CONFIG_HOME", ws.home.join("config-home"))
        .env("XDG_STATE_HOME", ws.home.join("state-home"))
        .env("TOOLGATE_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let messages = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
    ];
    for message in messages {
        std::io::Write::write_all(&mut stdin, format!("{message}\n").as_bytes()).unwrap();
    }
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let listed = loop {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(n > 0, "toolgate mcp ended before answering tools/list");
        let message: Value = serde_json::from_str(&line).unwrap();
        if message["id"] == 2 {
            break message;
        }
    };
    drop(stdin);
    let status = child.wait().unwrap();
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"probe"), "{names:?}");
    assert!(status.success(), "{status}");
}
