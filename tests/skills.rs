//! Skills end to end: command tools and `SKILL.md` folders loaded from skill
//! directories into the Registry, run through it, and reloaded when files change.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate::skills::{Skills, Skipped};
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
first = { type = "string" }
second = { type = "string" }
third = { type = "string" }
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
input_schema = { type = "object", properties = { text = { type = "string" } } }
"#,
    );
    let skills = Skills::new(setup.registry.clone());
    let report = skills.load(std::slice::from_ref(&setup.skills));
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
    Skills::new(setup.registry.clone()).load(std::slice::from_ref(&setup.skills));
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
    Skills::new(setup.registry.clone()).load(std::slice::from_ref(&setup.skills));
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
input_schema = { type = "object", properties = { who = { type = "string" } } }
"#,
    );
    Skills::new(setup.registry.clone()).load(std::slice::from_ref(&setup.skills));
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
    Skills::new(setup.registry.clone()).load(std::slice::from_ref(&setup.skills));

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
    Skills::new(setup.registry.clone()).load(std::slice::from_ref(&setup.skills));

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
    let report = skills.watch(vec![setup.skills.clone()]);
    assert_eq!(report.loaded.len(), 2, "{report:?}");
    let changes = setup.registry.subscribe_changes();
    let description =
        |name: &str| setup.registry.get(name).map(|tool| tool.definition().description.clone());

    let before = *changes.borrow();
    write_review_skill(&setup, "Second description.");
    wait_for("the edited description", || {
        description("skill__review").is_some_and(|text| text.starts_with("Second description."))
    })
    .await;
    assert!(*changes.borrow() > before, "tools_list_changed was not signalled");

    let before = *changes.borrow();
    setup.write("show_args.toml", &PRINTF_SKILL.replace("show_args", "renamed_args"));
    wait_for("the renamed tool", || {
        setup.registry.contains("renamed_args") && !setup.registry.contains("show_args")
    })
    .await;
    assert!(*changes.borrow() > before);

    std::fs::remove_dir_all(setup.skills.join("review")).unwrap();
    wait_for("the removed skill to go", || !setup.registry.contains("skill__review")).await;
    skills.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_directory_created_later_is_picked_up() {
    let setup = Setup::new();
    let later = setup.skills.join("later");
    let skills = Skills::new(setup.registry.clone());
    skills.watch(vec![later.clone()]);
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
        Skills::new(setup.registry.clone()).load(std::slice::from_ref(&setup.skills))
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
    let report = Skills::new(setup.registry.clone()).load(std::slice::from_ref(&setup.skills));

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
    let report = Skills::new(setup.registry.clone()).load(std::slice::from_ref(&setup.skills));
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
