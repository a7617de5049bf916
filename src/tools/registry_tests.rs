use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use expect_test::expect;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::*;

/// A configurable test tool: echoes its arguments, sleeps, or panics.
struct TestTool {
    definition: Definition,
    behaviour: Behaviour,
    /// Set when the tool's own cancel token fired (proves the registry cancels it).
    saw_cancel: Arc<AtomicBool>,
    /// The token the tool was given, kept to check it after the call is gone.
    token: Arc<std::sync::Mutex<Option<CancellationToken>>>,
}

#[derive(Clone, Copy)]
enum Behaviour {
    Echo,
    SleepForever,
    Panic,
}

impl TestTool {
    fn new(name: &str, behaviour: Behaviour) -> TestTool {
        TestTool {
            definition: Definition {
                name: name.to_owned(),
                description: format!("test tool {name}"),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "count": {"type": "integer", "minimum": 0},
                        "nested": {"type": "object", "properties": {"flag": {"type": "boolean"}}}
                    },
                    "additionalProperties": false
                }),
                safety: Safety::ReadOnly,
                system: false,
                timeout: None,
                facts: Default::default(),
            },
            behaviour,
            saw_cancel: Arc::new(AtomicBool::new(false)),
            token: Arc::default(),
        }
    }

    fn system(mut self) -> TestTool {
        self.definition.system = true;
        self
    }

    fn with_timeout(mut self, timeout: Duration) -> TestTool {
        self.definition.timeout = Some(timeout);
        self
    }
}

#[async_trait]
impl Tool for TestTool {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        match self.behaviour {
            Behaviour::Echo => ToolResult::success(args.to_string())
                .with_meta("timeout_ms", ctx.timeout.as_millis() as u64),
            Behaviour::SleepForever => {
                *self.token.lock().unwrap() = Some(ctx.cancel.clone());
                ctx.cancel.cancelled().await;
                self.saw_cancel.store(true, Ordering::SeqCst);
                // Keep "working" after the cancel: the registry must not wait for us.
                std::future::pending::<()>().await;
                ToolResult::success("unreachable")
            }
            Behaviour::Panic => panic!("tool exploded"),
        }
    }
}

fn env() -> Arc<Env> {
    let dir = std::env::temp_dir();
    Arc::new(Env::for_root(dir).unwrap())
}

fn registry_with(tools: Vec<TestTool>) -> Registry {
    let registry = Registry::new();
    for tool in tools {
        registry.register(Some(Arc::new(tool))).unwrap();
    }
    registry
}

async fn run(registry: &Registry, name: &str, args: &str) -> ToolResult {
    registry.execute(&Call::new("c1", name, args), &env(), &CancellationToken::new()).await
}

#[test]
fn register_rejects_missing_blank_and_duplicate() {
    let registry = Registry::new();
    assert_eq!(registry.register(None), Err(RegisterError::Missing));
    assert_eq!(
        registry.register(Some(Arc::new(TestTool::new("  ", Behaviour::Echo)))),
        Err(RegisterError::BlankName)
    );
    registry.register(Some(Arc::new(TestTool::new("echo", Behaviour::Echo)))).unwrap();
    assert_eq!(
        registry.register(Some(Arc::new(TestTool::new("echo", Behaviour::Panic)))),
        Err(RegisterError::Duplicate("echo".to_owned()))
    );
    // The first registration is kept, not overridden.
    assert!(registry.get("echo").is_some());
    assert_eq!(registry.names(), vec!["echo".to_owned()]);
}

#[test]
fn register_rejects_an_invalid_schema() {
    let mut tool = TestTool::new("bad", Behaviour::Echo);
    tool.definition.input_schema = json!({"type": 12});
    let err = Registry::new().register(Some(Arc::new(tool))).unwrap_err();
    assert!(matches!(err, RegisterError::InvalidSchema { .. }), "{err:?}");
}

#[test]
fn register_or_replace_replaces_and_bumps_the_generation() {
    let registry = Registry::new();
    let source = ToolSource::Mcp("fx".to_owned());
    registry
        .register_or_replace(Arc::new(TestTool::new("echo", Behaviour::Echo)), source.clone())
        .unwrap();
    let changes = registry.subscribe_changes();
    let before = *changes.borrow();
    // Same definition, new implementation: replaced, but nothing visible changed.
    registry
        .register_or_replace(Arc::new(TestTool::new("echo", Behaviour::Panic)), source.clone())
        .unwrap();
    assert_eq!(*changes.borrow(), before);
    assert!(run_blocking(&registry, "echo").error_type == Some(ErrorType::InternalError));
    // A changed definition is a visible change.
    registry
        .register_or_replace(
            Arc::new(TestTool::new("echo", Behaviour::Echo).with_timeout(Duration::from_secs(3))),
            source.clone(),
        )
        .unwrap();
    assert!(*changes.borrow() > before);
    assert_eq!(registry.source("echo"), Some(source));
    assert!(registry.unregister("echo"));
    assert!(!registry.contains("echo"));
}

fn run_blocking(registry: &Registry, name: &str) -> ToolResult {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(registry, name, "{}"))
}

#[test]
fn register_or_replace_never_replaces_another_family() {
    let registry = registry_with(vec![TestTool::new("read_file", Behaviour::Echo)]);
    let changes = registry.subscribe_changes();
    let before = *changes.borrow();
    let err = registry
        .register_or_replace(
            Arc::new(TestTool::new("read_file", Behaviour::Panic)),
            ToolSource::Skill("/skills/read_file.toml".into()),
        )
        .unwrap_err();
    assert_eq!(
        err,
        RegisterError::Taken { name: "read_file".to_owned(), owner: ToolSource::Builtin }
    );
    assert_eq!(registry.source("read_file"), Some(ToolSource::Builtin));
    assert_eq!(*changes.borrow(), before);
}

#[test]
fn sync_adds_changes_removes_and_refuses_in_one_step() {
    let registry = registry_with(vec![TestTool::new("builtin", Behaviour::Echo)]);
    let skill = |file: &str| ToolSource::Skill(format!("/skills/{file}").into());
    let family = skill("");
    let first = registry.sync(
        &family,
        vec![
            (Arc::new(TestTool::new("a", Behaviour::Echo)) as Arc<dyn Tool>, skill("a.toml")),
            (Arc::new(TestTool::new("b", Behaviour::Echo)), skill("b.toml")),
            (Arc::new(TestTool::new("builtin", Behaviour::Panic)), skill("c.toml")),
            (Arc::new(TestTool::new("b", Behaviour::Echo)), skill("d.toml")),
            (Arc::new(TestTool::new("x", Behaviour::Echo)), ToolSource::Mcp("fx".to_owned())),
        ],
    );
    assert_eq!(first.added, vec!["a".to_owned(), "b".to_owned()]);
    let refused: Vec<&str> = first.refused.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(refused, vec!["b", "x", "builtin"]);
    assert!(matches!(first.refused[2].1, RegisterError::Taken { .. }));
    assert_eq!(registry.source("builtin"), Some(ToolSource::Builtin));
    assert_eq!(registry.source("b"), Some(skill("b.toml")));

    let changes = registry.subscribe_changes();
    let before = *changes.borrow();
    // The same set again: nothing visible changes, no notification.
    let same = registry.sync(
        &family,
        vec![
            (Arc::new(TestTool::new("a", Behaviour::Echo)) as Arc<dyn Tool>, skill("a.toml")),
            (Arc::new(TestTool::new("b", Behaviour::Echo)), skill("b.toml")),
        ],
    );
    assert!(!same.changed_anything(), "{same:?}");
    assert_eq!(*changes.borrow(), before);

    // `a` moves to another file, `b` goes away: one notification.
    let next = registry.sync(
        &family,
        vec![(Arc::new(TestTool::new("a", Behaviour::Echo)) as Arc<dyn Tool>, skill("moved.toml"))],
    );
    assert_eq!(next.changed, vec!["a".to_owned()]);
    assert_eq!(next.removed, vec!["b".to_owned()]);
    assert_eq!(*changes.borrow(), before + 1);
    assert_eq!(registry.names(), vec!["a".to_owned(), "builtin".to_owned()]);
}

#[test]
fn definitions_are_sorted_and_filtering_keeps_system_tools() {
    let registry = registry_with(vec![
        TestTool::new("zeta", Behaviour::Echo),
        TestTool::new("alpha", Behaviour::Echo),
        TestTool::new("todo", Behaviour::Echo).system(),
        TestTool::new("mid", Behaviour::Echo),
    ]);
    let names =
        |defs: Vec<Definition>| defs.into_iter().map(|def| def.name).collect::<Vec<_>>().join(",");
    expect!["alpha,mid,todo,zeta"].assert_eq(&names(registry.definitions()));
    expect!["alpha,mid,todo,zeta"].assert_eq(&names(registry.definitions_filtered(&[])));
    expect!["mid,todo,zeta"]
        .assert_eq(&names(registry.definitions_filtered(&["zeta".into(), "mid".into()])));
    expect!["todo"].assert_eq(&names(registry.definitions_filtered(&["nope".into()])));
    assert_eq!(registry.safety("alpha"), Some(Safety::ReadOnly));
    assert_eq!(registry.safety("nope"), None);
}

#[tokio::test]
async fn unknown_tool_is_reported_with_the_call_id() {
    let registry = Registry::new();
    let res = run(&registry, "nope", "{}").await;
    let json = serde_json::to_string(&res).unwrap();
    expect![[r#"{"ok":false,"tool":"nope","content":"","error_type":"unknown_tool","error":"no tool is named \"nope\" (tools/list names them)","metadata":{"call_id":"c1"}}"#]].assert_eq(&json);
}

#[tokio::test]
async fn invalid_json_is_invalid_arguments() {
    let registry = registry_with(vec![TestTool::new("echo", Behaviour::Echo)]);
    let res = run(&registry, "echo", "{\"path\": ").await;
    assert_eq!(res.error_type, Some(ErrorType::InvalidArguments));
    assert!(res.error.as_deref().unwrap().contains("not valid JSON"));
    assert_eq!(res.call_id(), Some("c1"));
}

#[tokio::test]
async fn schema_violations_name_the_json_pointer() {
    let registry = registry_with(vec![TestTool::new("echo", Behaviour::Echo)]);
    let cases = [
        (r#"{"path": 3}"#, "/path"),
        (r#"{"count": -1}"#, "/count"),
        (r#"{"nested": {"flag": "yes"}}"#, "/nested/flag"),
        (r#"{"extra": true}"#, ""),
        ("[1,2]", ""),
    ];
    for (args, pointer) in cases {
        let res = run(&registry, "echo", args).await;
        assert_eq!(res.error_type, Some(ErrorType::InvalidArguments), "{args}");
        assert_eq!(res.metadata["pointer"], json!(pointer), "{args}");
        assert_eq!(res.tool, "echo");
    }
}

#[tokio::test]
async fn a_null_for_an_optional_property_counts_as_left_out() {
    let registry = registry_with(vec![TestTool::new("echo", Behaviour::Echo)]);
    // `count` takes no null, so a null there is the property left out.
    let res = run(&registry, "echo", r#"{"path": "a", "count": null}"#).await;
    assert!(res.ok, "{res:?}");
    assert_eq!(res.content, r#"{"path":"a"}"#);
    // A null where a value is required, or inside a nested object, is still invalid.
    let res = run(&registry, "echo", r#"{"nested": {"flag": null}}"#).await;
    assert_eq!(res.error_type, Some(ErrorType::InvalidArguments), "{res:?}");
}

#[test]
fn generated_schemas_carry_no_null_types_and_keep_nulls_that_mean_something() {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Args {
        path: String,
        offset: Option<u64>,
        speed: Option<Speed>,
    }
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Speed {
        Fast,
        Slow,
    }
    let schema = super::super::schema_for::<Args>();
    let text = schema.to_string();
    assert!(!text.contains("null"), "{text}");
    assert_eq!(schema["properties"]["offset"]["type"], json!("integer"), "{text}");
    let mut absent = super::super::null_means_absent(&schema);
    absent.sort();
    assert_eq!(absent, vec!["offset".to_owned(), "speed".to_owned()]);
    // A property whose schema takes null keeps its null.
    let nullable = json!({"type": "object", "properties": {"x": {"type": ["string", "null"]}}});
    assert!(super::super::null_means_absent(&nullable).is_empty());
}

#[tokio::test]
async fn blank_arguments_count_as_an_empty_object() {
    let registry = registry_with(vec![TestTool::new("echo", Behaviour::Echo)]);
    let res = run(&registry, "echo", "  ").await;
    assert!(res.ok, "{res:?}");
    assert_eq!(res.content, "{}");
}

#[tokio::test]
async fn tool_timeout_overrides_the_env_default_and_is_clamped() {
    let registry = registry_with(vec![
        TestTool::new("echo", Behaviour::Echo).with_timeout(Duration::from_secs(7)),
    ]);
    let res = run(&registry, "echo", "{}").await;
    assert_eq!(res.metadata["timeout_ms"], json!(7000));

    let mut small = Env::for_root(std::env::temp_dir()).unwrap();
    small.max_timeout = Duration::from_secs(2);
    let res = registry
        .execute(&Call::new("c2", "echo", "{}"), &Arc::new(small), &CancellationToken::new())
        .await;
    assert_eq!(res.metadata["timeout_ms"], json!(2000));
}

#[tokio::test]
async fn timeout_and_cancel_are_distinct_and_cancel_the_tool() {
    let tool =
        TestTool::new("sleep", Behaviour::SleepForever).with_timeout(Duration::from_millis(50));
    let token = tool.token.clone();
    let registry = registry_with(vec![tool]);
    let res = run(&registry, "sleep", "{}").await;
    assert_eq!(res.error_type, Some(ErrorType::Timeout));
    assert_eq!(res.call_id(), Some("c1"));
    let token = token.lock().unwrap().clone().expect("the tool never started");
    assert!(token.is_cancelled(), "the tool's token was not canceled on timeout");

    let tool = TestTool::new("sleep2", Behaviour::SleepForever);
    let saw_cancel = tool.saw_cancel.clone();
    registry.register(Some(Arc::new(tool))).unwrap();
    let cancel = CancellationToken::new();
    let canceller = {
        let cancel = cancel.clone();
        let saw_cancel = saw_cancel.clone();
        tokio::spawn(async move {
            // Wait until the tool is running (it observes nothing yet), then cancel.
            tokio::task::yield_now().await;
            cancel.cancel();
            saw_cancel
        })
    };
    let res = registry.execute(&Call::new("c3", "sleep2", "{}"), &env(), &cancel).await;
    canceller.await.unwrap();
    assert_eq!(res.error_type, Some(ErrorType::Canceled));
    assert_eq!(res.call_id(), Some("c3"));
}

#[tokio::test]
async fn an_owned_token_is_the_tools_and_a_borrowed_one_outlives_the_call() {
    let tool =
        TestTool::new("sleep", Behaviour::SleepForever).with_timeout(Duration::from_millis(50));
    let token = tool.token.clone();
    let registry = registry_with(vec![tool, TestTool::new("echo", Behaviour::Echo)]);
    let tool_token = || token.lock().unwrap().take().expect("the tool never started");

    // A caller's token that outlives the call: the tool gets a child of it, and neither
    // a timeout nor the end of a call cancels the caller's.
    let shared = CancellationToken::new();
    let res = registry.execute(&Call::new("c1", "sleep", "{}"), &env(), &shared).await;
    assert_eq!(res.error_type, Some(ErrorType::Timeout));
    assert!(tool_token().is_cancelled(), "the tool's token was not canceled on timeout");
    assert!(!shared.is_cancelled(), "a timeout canceled the caller's token");
    let res = registry.execute(&Call::new("c2", "echo", "{}"), &env(), &shared).await;
    assert!(res.ok, "{res:?}");
    assert!(!shared.is_cancelled(), "the end of a call canceled the caller's token");

    // A token owned by the call: canceled on timeout, and at the end of a call that
    // went well.
    let owned = CancellationToken::new();
    let call = Call::new("c3", "sleep", "{}");
    let res = registry.execute_owned(&call, &env(), owned.clone(), OutputSink::discard()).await;
    assert_eq!(res.error_type, Some(ErrorType::Timeout));
    assert!(tool_token().is_cancelled() && owned.is_cancelled());
    let owned = CancellationToken::new();
    let call = Call::new("c4", "echo", "{}");
    let res = registry.execute_owned(&call, &env(), owned.clone(), OutputSink::discard()).await;
    assert!(res.ok, "{res:?}");
    assert!(owned.is_cancelled(), "the call ended and its own token was left live");
}

#[tokio::test]
async fn an_already_canceled_call_does_not_run() {
    let registry = registry_with(vec![TestTool::new("boom", Behaviour::Panic)]);
    let cancel = CancellationToken::new();
    cancel.cancel();
    let res = registry.execute(&Call::new("c1", "boom", "{}"), &env(), &cancel).await;
    assert_eq!(res.error_type, Some(ErrorType::Canceled));
}

#[tokio::test]
async fn a_panicking_tool_becomes_internal_error_and_the_registry_keeps_working() {
    let registry = registry_with(vec![
        TestTool::new("boom", Behaviour::Panic),
        TestTool::new("echo", Behaviour::Echo),
    ]);
    let res = run(&registry, "boom", "{}").await;
    assert_eq!(res.error_type, Some(ErrorType::InternalError));
    assert_eq!(res.tool, "boom");
    assert_eq!(res.call_id(), Some("c1"));
    assert!(!res.error.as_deref().unwrap_or("").contains("exploded"), "panic detail leaked");
    assert!(run(&registry, "echo", "{}").await.ok);
}

#[tokio::test]
async fn dropping_the_execute_future_cancels_the_tool() {
    let tool = TestTool::new("sleep", Behaviour::SleepForever);
    let token = tool.token.clone();
    let registry = Arc::new(registry_with(vec![tool]));
    let task = {
        let registry = registry.clone();
        tokio::spawn(async move {
            registry
                .execute(&Call::new("c1", "sleep", "{}"), &env(), &CancellationToken::new())
                .await
        })
    };
    // Wait (bounded) until the tool has started and published its token.
    let mut started = None;
    for _ in 0..1000 {
        started = token.lock().unwrap().clone();
        if started.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = started.expect("the tool never started");
    assert!(!started.is_cancelled());
    task.abort();
    let _ = task.await;
    assert!(started.is_cancelled(), "the tool's token survived the dropped call");
}

#[test]
fn builtins_register_with_unique_names() {
    let registry = Registry::with_builtins();
    expect![
        "apply_patch,edit_file,find_files,notebook_edit,process_kill,process_list,process_read,process_resize,process_write,read_file,run_command,search_code,write_file"
    ]
        .assert_eq(&registry.names().join(","));
}

#[test]
fn parsed_cost_counts_structure_outside_strings_only() {
    let small = br#"{"path":"src/main.rs","offset":1}"#;
    assert!(parsed_cost(small) <= parse_budget(small.len()));
    // Brackets, braces and commas inside strings (escaped quotes included) cost nothing.
    let quoted = br#"{"content":"[{,}] \"[{,}]\" \\"}"#;
    assert_eq!(parsed_cost(quoted), quoted.len() + OBJECT_COST + MEMBER_COST);
    // An unterminated string or a trailing escape ends the scan without a panic.
    assert!(parsed_cost(br#"{"a":"\"#) > 0);
    assert!(parsed_cost(br#"{"a":"abc"#) > 0);
    // Hundreds of thousands of tiny objects would cost far more than their text.
    let item = r#"{"content":"","status":"pending"}"#;
    let many = format!(r#"{{"todos":[{}]}}"#, vec![item; 100_000].join(","));
    assert!(parsed_cost(many.as_bytes()) > parse_budget(many.len()));
    // One large string costs about its own size.
    let big = format!(r#"{{"content":"{}"}}"#, "x[,{".repeat(1_000_000));
    assert!(parsed_cost(big.as_bytes()) <= parse_budget(big.len()));
}

#[tokio::test]
async fn arguments_over_the_memory_budget_are_refused_unparsed() {
    let registry = Registry::with_builtins();
    let item = r#"{"content":"","status":"pending"}"#;
    let text = format!(r#"{{"path":"a.txt","junk":[{}]}}"#, vec![item; 100_000].join(","));
    let env = env();
    let call = Call::new("c1", "read_file", text);
    let result = registry.execute(&call, &env, &CancellationToken::new()).await;
    assert_eq!(result.error_type, Some(ErrorType::InvalidArguments), "{result:?}");
    assert!(result.error.as_deref().unwrap_or("").contains("arguments refused"), "{result:?}");
}

#[test]
fn the_listing_is_rendered_once_and_renewed_after_a_change() {
    let registry = Registry::new();
    registry.register(Some(Arc::new(TestTool::new("b", Behaviour::Echo)))).unwrap();
    let first = registry.listing();
    assert!(Arc::ptr_eq(&first, &registry.listing()));
    assert_eq!(first.tools.len(), 1);
    let definition: Definition = serde_json::from_str(&first.tools[0].json).unwrap();
    assert_eq!(definition.name, "b");
    assert_eq!(&*first.tools[0].source_json, r#""b":"builtin""#);
    registry
        .register_or_replace(
            Arc::new(TestTool::new("a", Behaviour::Echo)),
            ToolSource::Skill("x.toml".into()),
        )
        .unwrap();
    let second = registry.listing();
    assert!(!Arc::ptr_eq(&first, &second));
    let names: Vec<&str> = second.tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn a_likely_misspelling_is_named_and_nothing_far_off() {
    let names = ["read_file", "write_file", "run_command", "process_kill"];
    assert_eq!(closest("raed_file", names.iter().copied()), Some("read_file"));
    assert_eq!(closest("run_comand", names.iter().copied()), Some("run_command"));
    assert_eq!(closest("pth", ["path", "offset"].into_iter()), Some("path"));
    assert_eq!(closest("delete_everything", names.iter().copied()), None);
    assert_eq!(closest("read_file", names.iter().copied()), None);
}
