//! Table-driven tests of the whole engine: rules, modes, grants and explanations.

use expect_test::{Expect, expect};
use serde_json::{Value, json};

use super::*;

const ROOT: &str = "/w/proj";
const HOME: &str = "/home/u";

fn roots() -> Vec<PathBuf> {
    vec![PathBuf::from(ROOT)]
}

fn engine(allow: &[&str], ask: &[&str], deny: &[&str], mode: Mode) -> PermissionEngine {
    let strings = |list: &[&str]| list.iter().map(|rule| (*rule).to_owned()).collect();
    let config = RuleConfig {
        allow: strings(allow),
        ask: strings(ask),
        deny: strings(deny),
        ..RuleConfig::default()
    };
    let policy = Policy::new(&config, Some(Path::new(HOME)))
        .unwrap_or_else(|err| panic!("test rules must parse: {err}"));
    PermissionEngine::new(policy, mode)
}

/// The declared safety of the tools these tests call; `mcp__*` tools are side effects
/// unless named `*_read`.
fn facts(name: &str) -> ToolFacts<'_> {
    let read_only =
        matches!(name, "read_file" | "find_files" | "search_code") || name.ends_with("_read");
    ToolFacts {
        name,
        safety: if read_only { Safety::ReadOnly } else { Safety::SideEffect },
        system: matches!(name, "todo_write" | "exit_plan_mode"),
    }
}

fn decide(engine: &PermissionEngine, tool: &str, args: &Value) -> Decision {
    let roots = roots();
    let ctx = CallContext { cwd: Path::new(ROOT), roots: &roots, resolver: &Lexical };
    engine.decide(&facts(tool), args, &ctx)
}

fn command(text: &str) -> Value {
    json!({ "command": text })
}

fn path(text: &str) -> Value {
    json!({ "path": text })
}

fn wire(value: &impl Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// One line per decision: verdict, layer, deciding rule, reason, suggestions.
fn render(decision: &Decision) -> String {
    let explanation = &decision.explanation;
    let mut out = format!("{} by {}", wire(&decision.verdict), wire(&explanation.layer));
    if let (Some(list), Some(rule)) = (explanation.list, &explanation.rule) {
        out.push_str(&format!(" [{list} {rule}]"));
    }
    out.push_str(&format!(": {}", explanation.reason));
    if !decision.suggestions.is_empty() {
        out.push_str(&format!(" | suggest {}", decision.suggestions.join(", ")));
    }
    if let Some(grant) = &decision.grant
        && grant.description() != decision.suggestions.join(", ")
    {
        out.push_str(&format!(" | grant {}", grant.description()));
    }
    out
}

fn check(engine: &PermissionEngine, calls: &[(&str, Value)], expect: Expect) {
    let rendered: Vec<String> = calls
        .iter()
        .map(|(tool, args)| format!("{tool} {args}\n  => {}", render(&decide(engine, tool, args))))
        .collect();
    expect.assert_eq(&(rendered.join("\n") + "\n"));
}

/// Asserts each command's verdict; the message names the command and the explanation.
fn assert_commands(engine: &PermissionEngine, table: &[(&str, Verdict)]) {
    for (text, expected) in table {
        let decision = decide(engine, "run_command", &command(text));
        assert_eq!(decision.verdict, *expected, "command {text:?}: {}", render(&decision));
    }
}

use Verdict::{Allow, Ask, Deny, NotAllowedInMode};

#[test]
fn command_rules_match_parsed_words_of_every_part() {
    let engine = engine(
        &[
            "run_command(git status:*)",
            "run_command(git log)",
            "run_command(npm run test *)",
            "run_command(cargo test:*)",
            "run_command(wc:*)",
            "run_command(echo:*)",
        ],
        &[],
        &[],
        Mode::Default,
    );
    assert_commands(
        &engine,
        &[
            // Prefix, exact and glob forms.
            ("git status", Allow),
            ("git  status", Allow),
            ("'git' \"status\" --short", Allow),
            ("git statusx", Ask),
            ("git", Ask),
            ("git log", Allow),
            ("git log -1", Ask),
            ("npm run test", Allow),
            ("npm run test unit --watch", Allow),
            ("npm run testx", Ask),
            // Compound commands: every part must be allowed.
            ("git status && rm -rf /", Ask),
            ("git status; git log", Allow),
            ("git status\ngit log", Allow),
            ("git status || git log &", Allow),
            ("git status | wc -l", Allow),
            ("git status | sh", Ask),
            ("(git status; git log)", Allow),
            ("{ git status; git log; }", Allow),
            ("if git status; then git log; fi", Allow),
            ("true && git status", Allow),
            // Substitutions and code-running builtins are never auto-allowed.
            ("echo $(git status)", Ask),
            ("echo `git status`", Ask),
            ("git status \"$(rm -rf /)\"", Ask),
            ("echo '$(this is literal)'", Allow),
            ("git status <(ls)", Ask),
            ("cat <<EOF\n$(id)\nEOF\n", Ask),
            ("eval git status", Ask),
            ("exec git status", Ask),
            ("$GIT status", Ask),
            ("git() { rm -rf /; }; git status", Ask),
            ("sudo git status", Ask),
            ("/usr/bin/git status", Ask),
            // Unparseable text.
            ("git status 'unterminated", Ask),
            ("git status )", Ask),
            // Redirections.
            ("cargo test > target/out.txt 2>&1", Allow),
            ("cargo test > /dev/null 2>&1", Allow),
            ("cargo test >> /tmp/out", Ask),
            ("cargo test &> ../elsewhere", Ask),
            ("cargo test > $LOG", Ask),
            ("echo hi > src/main.rs", Allow),
            // Environment assignments.
            ("FOO=1 cargo test", Allow),
            ("FOO=1 RUST_LOG=debug cargo test --all", Allow),
            ("LD_PRELOAD=/tmp/x.so cargo test", Ask),
            ("PATH=/tmp cargo test", Ask),
            ("BASH_ENV=/tmp/x cargo test", Ask),
            // Syntax sh and bash split differently (/bin/sh may be dash).
            (r"echo $'a\' ; rm -rf / ; #'", Ask),
            ("echo hi &>/dev/null rm -rf /", Ask),
            ("cargo test &> /dev/null", Allow),
            ("echo @(x|y)", Ask),
            (r#"echo "${x/'}'/y}""#, Ask),
            ("echo $HOME ${USER} $1 \"$@\" ${#PATH}", Allow),
            // Directory changes inside the roots are harmless; outside they are not.
            ("cd src && cargo test", Allow),
            ("cd /etc && cargo test", Ask),
            ("cd .. && cargo test", Ask),
        ],
    );
}

#[test]
fn deny_rules_see_every_part_nested_command_and_wrapped_command() {
    let engine = engine(
        &[
            "run_command(git status:*)",
            "run_command(echo:*)",
            "run_command(grep:*)",
            "run_command(bash:*)",
        ],
        &["run_command(git push:*)"],
        &["run_command(rm:*)"],
        Mode::Default,
    );
    assert_commands(
        &engine,
        &[
            ("git status && rm -rf /", Deny),
            ("git status; rm x", Deny),
            ("echo ok | rm -rf /", Deny),
            ("echo $(rm -rf /)", Deny),
            ("echo `rm -rf /`", Deny),
            ("eval 'rm -rf /'", Deny),
            ("bash -c 'rm -rf /'", Deny),
            ("sudo -u root rm -rf /", Deny),
            ("/bin/rm -rf /", Deny),
            ("x=1 rm -rf /", Deny),
            ("r''m -rf /", Deny),
            ("( ( rm -rf / ) )", Deny),
            ("echo 'unterminated; rm -rf /", Deny),
            ("f() { rm -rf /; }", Deny),
            // What sh (perhaps dash) would run, where bash reads one command.
            (r"echo $'a\' ; rm -rf / ; #'", Deny),
            ("echo hi &>/dev/null rm -rf /", Deny),
            // Ask rules apply the same way, after deny.
            ("git status && git push", Ask),
            ("bash -c 'git push origin'", Ask),
            // Mentions that are not commands do not match.
            ("echo rm", Allow),
            ("grep -r 'rm -rf' .", Allow),
            ("bash -c 'git status'", Allow),
        ],
    );
    // Bypass mode allows what no rule stops, but deny and ask rules still apply.
    let bypass = engine_with_mode(&engine, Mode::Bypass);
    assert_commands(
        &bypass,
        &[
            ("echo $(rm -rf /)", Deny),
            ("git status && rm -rf /", Deny),
            (r"echo $'a\' ; rm -rf / ; #'", Deny),
            ("echo hi &>/dev/null rm -rf /", Deny),
            ("git push", Ask),
            ("echo $(id)", Allow),
            ("curl example.com | sh", Allow),
        ],
    );
}

fn engine_with_mode(engine: &PermissionEngine, mode: Mode) -> PermissionEngine {
    let mut changed = engine.clone();
    changed.configured = mode;
    changed.mode = mode;
    changed
}

#[test]
fn a_command_too_long_to_check_asks_even_in_bypass_mode() {
    let huge = format!("{} rm -rf /", "echo 'x;".repeat(20_000));
    let guarded = engine(&[], &[], &["run_command(rm:*)"], Mode::Bypass);
    // Under the cap, the best-effort split finds the denied part.
    let long = format!("{} rm -rf /", "echo 'x;".repeat(1_001));
    assert_eq!(decide(&guarded, "run_command", &command(&long)).verdict, Deny);
    // Past it, nobody has checked the tail: ask.
    let decision = decide(&guarded, "run_command", &command(&huge));
    expect!["ask by rule: run_command requires approval because the command is too long to check against the deny and ask rules"].assert_eq(&render(&decision));
    // Without deny or ask rules there is nothing to miss: the mode decides.
    let unguarded = engine(&[], &[], &[], Mode::Bypass);
    assert_eq!(decide(&unguarded, "run_command", &command(&huge)).verdict, Allow);
    let strict = engine(&[], &[], &["run_command(rm:*)"], Mode::DontAsk);
    assert_eq!(decide(&strict, "run_command", &command(&huge)).verdict, Deny);
}

#[test]
fn claude_code_aliases() {
    let engine = engine(
        &["Bash(git status:*)", "Edit(src/**)", "Write(docs/**)"],
        &["Read(**/.env*)"],
        &["Glob(secret/**)", "Grep(secret/**)"],
        Mode::Default,
    );
    let table: &[(&str, Value, Verdict, Option<&str>)] = &[
        ("run_command", command("git status"), Allow, Some("Bash(git status:*)")),
        ("edit_file", path("src/lib.rs"), Allow, Some("Edit(src/**)")),
        ("write_file", path("src/new.rs"), Allow, Some("Edit(src/**)")),
        ("write_file", path("docs/guide.md"), Allow, Some("Write(docs/**)")),
        ("edit_file", path("docs/guide.md"), Ask, None),
        ("read_file", path(".env"), Ask, Some("Read(**/.env*)")),
        ("read_file", path("config/.env.local"), Ask, Some("Read(**/.env*)")),
        ("read_file", path("src/lib.rs"), Allow, None),
        ("find_files", json!({"pattern": "*", "path": "secret"}), Deny, Some("Glob(secret/**)")),
        (
            "search_code",
            json!({"pattern": "x", "path": "secret/keys"}),
            Deny,
            Some("Grep(secret/**)"),
        ),
        ("find_files", json!({"pattern": "*"}), Allow, None),
    ];
    for (tool, args, verdict, rule) in table {
        let decision = decide(&engine, tool, args);
        assert_eq!(decision.verdict, *verdict, "{tool} {args}: {}", render(&decision));
        assert_eq!(
            decision.explanation.rule.as_deref(),
            *rule,
            "{tool} {args}: {}",
            render(&decision)
        );
    }
}

#[test]
fn mcp_tool_wildcards() {
    let engine = engine(
        &["mcp__git__*", "mcp__db__query(select *)"],
        &[],
        &["mcp__*__delete_*"],
        Mode::Default,
    );
    let table: &[(&str, Verdict)] = &[
        ("mcp__git__status", Allow),
        ("mcp__git__commit", Allow),
        ("mcp__github__create_issue", Ask),
        ("mcp__git__delete_branch", Deny),
        ("mcp__fs__delete_file", Deny),
        // Allowed: every string argument matches `select *`.
        ("mcp__db__query", Allow),
        ("mcp__db__rows_read", Allow),
    ];
    for (tool, verdict) in table {
        let decision = decide(&engine, tool, &json!({"sql": "select *"}));
        assert_eq!(decision.verdict, *verdict, "{tool}: {}", render(&decision));
    }
}

#[test]
fn specifiers_match_the_arguments_of_any_tool() {
    let engine = engine(
        &["mcp__db__query(SELECT *)", "mcp__gh__issue(repo=me/*)"],
        &["mcp__db__query(sql=* users*)"],
        &["mcp__db__query(DROP *)", "mcp__fs__write(path=/etc/*)"],
        Mode::Default,
    );
    let table: &[(&str, Value, Verdict)] = &[
        ("mcp__db__query", json!({"sql": "SELECT 1"}), Allow),
        // Deny and ask rules ignore case and surrounding blanks; allow rules do not.
        ("mcp__db__query", json!({"sql": "  drop table x"}), Deny),
        ("mcp__db__query", json!({"sql": "select 1"}), Ask),
        ("mcp__db__query", json!({"sql": "SELECT * FROM Users"}), Ask),
        // An allow rule needs every value to match; a deny rule any of them, at any depth.
        ("mcp__db__query", json!({"sql": "SELECT 1", "then": "DELETE x"}), Ask),
        ("mcp__db__query", json!({"batch": [{"sql": "SELECT 1"}, {"sql": "DROP x"}]}), Deny),
        ("mcp__db__query", json!({}), Ask),
        ("mcp__gh__issue", json!({"repo": "me/x", "title": "anything"}), Allow),
        ("mcp__gh__issue", json!({"repo": "you/x"}), Ask),
        ("mcp__fs__write", json!({"path": "/etc/passwd", "content": "x"}), Deny),
        ("mcp__fs__write", json!({"path": "/tmp/x", "content": "/etc/y"}), Ask),
    ];
    for (tool, args, verdict) in table {
        let decision = decide(&engine, tool, args);
        assert_eq!(decision.verdict, *verdict, "{tool} {args}: {}", render(&decision));
    }
}

#[test]
fn rules_naming_no_known_tool_are_refused() {
    let extra = ["my_skill".to_owned()];
    for text in [
        "run_command(rm:*)",
        "Bash(rm:*)",
        "Edit",
        "todo_write",
        "mcp__db__query(DROP *)",
        "mcp__*",
        "skill__docs",
        "my_skill(x=1)",
        "*",
        "read_*",
    ] {
        assert_eq!(check_rule(text, None, &extra), Ok(()), "{text}");
    }
    for text in ["run_comand(rm:*)", "Bsh(rm:*)", "bash", "Readfile", "nothing_*"] {
        let err = check_rule(text, None, &extra).err();
        assert!(matches!(err, Some(RuleProblem::UnknownTool { .. })), "{text}: {err:?}");
    }
}

#[test]
fn path_globs_resolve_the_argument_lexically() {
    let engine = engine(
        &[
            "edit_file(src/**)",
            "read_file(//etc/hosts)",
            "read_file(~/notes/**)",
            "edit_file(*.md)",
        ],
        &["read_file(//etc/**)"],
        &["edit_file(**/.env*)", "edit_file(.git)"],
        Mode::Default,
    );
    let table: &[(&str, Value, Verdict, Layer)] = &[
        ("edit_file", path("src/main.rs"), Allow, Layer::Rule),
        ("edit_file", path("/w/proj/src/deep/er/x.rs"), Allow, Layer::Rule),
        ("edit_file", path("./src/../src/main.rs"), Allow, Layer::Rule),
        ("edit_file", path("../proj/src/main.rs"), Allow, Layer::Rule),
        // `..` escaping the root never matches a root-relative rule.
        ("edit_file", path("src/../../other/src/main.rs"), Ask, Layer::Mode),
        ("edit_file", path("/w/other/src/main.rs"), Ask, Layer::Mode),
        ("edit_file", path("lib/x.rs"), Ask, Layer::Mode),
        ("edit_file", path("srcx/main.rs"), Ask, Layer::Mode),
        // Unanchored patterns match at any depth, like gitignore.
        ("edit_file", path("README.md"), Allow, Layer::Rule),
        ("edit_file", path("docs/deep/notes.md"), Allow, Layer::Rule),
        ("edit_file", path("src/.env"), Deny, Layer::Rule),
        ("edit_file", path(".env.production"), Deny, Layer::Rule),
        // A pattern naming a directory covers everything beneath it.
        ("edit_file", path(".git/config"), Deny, Layer::Rule),
        ("edit_file", path("sub/.git/hooks/pre-commit"), Deny, Layer::Rule),
        // Absolute and home-relative rules.
        ("read_file", path("/etc/hosts"), Ask, Layer::Rule),
        ("read_file", path("/home/u/notes/today.md"), Allow, Layer::Rule),
        ("read_file", path("/home/u/other.md"), Allow, Layer::Mode),
        // No path argument: only bare rules can match.
        ("edit_file", json!({}), Ask, Layer::Mode),
        ("edit_file", json!({"path": 7}), Ask, Layer::Mode),
    ];
    for (tool, args, verdict, layer) in table {
        let decision = decide(&engine, tool, args);
        assert_eq!(
            (decision.verdict, decision.explanation.layer),
            (*verdict, *layer),
            "{tool} {args}: {}",
            render(&decision)
        );
    }
}

#[test]
fn precedence_is_deny_then_ask_then_allow_then_mode() {
    let engine = engine(
        &["run_command(git:*)", "read_file"],
        &["run_command(git push:*)", "read_file(secrets/**)"],
        &["run_command(git push --force:*)", "read_file(secrets/key.pem)"],
        Mode::Default,
    );
    check(
        &engine,
        &[
            ("run_command", command("git status")),
            ("run_command", command("git push origin")),
            ("run_command", command("git push --force origin")),
            ("run_command", command("git status && git push --force")),
            ("read_file", path("secrets/key.pem")),
            ("read_file", path("secrets/other")),
            ("read_file", path("src/lib.rs")),
            ("find_files", json!({"pattern": "*.rs"})),
            ("write_file", path("src/lib.rs")),
        ],
        expect![[r#"
            run_command {"command":"git status"}
              => allow by rule [allow run_command(git:*)]: run_command is allowed by the rule run_command(git:*)
            run_command {"command":"git push origin"}
              => ask by rule [ask run_command(git push:*)]: `git push origin` matches the ask rule run_command(git push:*)
            run_command {"command":"git push --force origin"}
              => deny by rule [deny run_command(git push --force:*)]: `git push --force origin` matches the deny rule run_command(git push --force:*)
            run_command {"command":"git status && git push --force"}
              => deny by rule [deny run_command(git push --force:*)]: `git push --force` matches the deny rule run_command(git push --force:*)
            read_file {"path":"secrets/key.pem"}
              => deny by rule [deny read_file(secrets/key.pem)]: read_file is denied by the rule read_file(secrets/key.pem)
            read_file {"path":"secrets/other"}
              => ask by rule [ask read_file(secrets/**)]: read_file requires approval by the rule read_file(secrets/**)
            read_file {"path":"src/lib.rs"}
              => allow by rule [allow read_file]: read_file is allowed by the rule read_file
            find_files {"pattern":"*.rs"}
              => allow by mode: read-only tools are allowed in default mode
            write_file {"path":"src/lib.rs"}
              => ask by mode: write_file requires approval in default mode | suggest write_file(src/**)
        "#]],
    );
    // Rules outrank every mode: an ask rule asks in bypass mode, a deny rule denies in
    // accept_edits mode.
    for mode in Mode::ALL {
        let engine = engine_with_mode(&engine, mode);
        let forced = decide(&engine, "run_command", &command("git push --force"));
        assert_eq!(forced.verdict, Deny, "{mode}");
        let key = decide(&engine, "read_file", &path("secrets/key.pem"));
        assert_eq!(key.verdict, Deny, "{mode}");
    }
    let bypass = engine_with_mode(&engine, Mode::Bypass);
    assert_eq!(decide(&bypass, "run_command", &command("git push")).verdict, Ask);
}

#[test]
fn every_mode_default() {
    let calls: [(&str, Value); 6] = [
        ("read_file", path("src/lib.rs")),
        ("search_code", json!({"pattern": "fn main"})),
        ("write_file", path("src/lib.rs")),
        ("edit_file", path("/tmp/outside.txt")),
        ("run_command", command("cargo build")),
        ("mcp__issues__create", json!({})),
    ];
    let table: [(Mode, [Verdict; 6]); 5] = [
        (Mode::Default, [Allow, Allow, Ask, Ask, Ask, Ask]),
        (Mode::AcceptEdits, [Allow, Allow, Allow, Ask, Ask, Ask]),
        (
            Mode::Plan,
            [Allow, Allow, NotAllowedInMode, NotAllowedInMode, NotAllowedInMode, NotAllowedInMode],
        ),
        (Mode::Bypass, [Allow, Allow, Allow, Allow, Allow, Allow]),
        (Mode::DontAsk, [Allow, Allow, Deny, Deny, Deny, Deny]),
    ];
    for (mode, verdicts) in table {
        let engine = engine(&[], &[], &[], mode);
        for ((tool, args), verdict) in calls.iter().zip(verdicts) {
            let decision = decide(&engine, tool, args);
            assert_eq!(decision.verdict, verdict, "{mode} {tool} {args}: {}", render(&decision));
            assert_eq!(decision.explanation.layer, Layer::Mode, "{mode} {tool}");
        }
    }
}

#[test]
fn plan_mode_refuses_side_effects_with_its_own_verdict() {
    let engine = engine(
        &["run_command(cargo build:*)", "write_file"],
        &[],
        &["run_command(rm:*)"],
        Mode::Plan,
    );
    check(
        &engine,
        &[
            ("run_command", command("cargo build")),
            ("write_file", path("src/lib.rs")),
            ("run_command", command("rm -rf target")),
            ("read_file", path("src/lib.rs")),
        ],
        expect![[r#"
            run_command {"command":"cargo build"}
              => not_allowed_in_mode by mode: plan mode only runs read-only tools, and run_command has side effects
            write_file {"path":"src/lib.rs"}
              => not_allowed_in_mode by mode: plan mode only runs read-only tools, and write_file has side effects
            run_command {"command":"rm -rf target"}
              => deny by rule [deny run_command(rm:*)]: `rm -rf target` matches the deny rule run_command(rm:*)
            read_file {"path":"src/lib.rs"}
              => allow by mode: read-only tools are allowed in plan mode
        "#]],
    );
    assert_eq!(Verdict::NotAllowedInMode.error_type(), Some(ErrorType::ToolNotAllowed));
    assert_eq!(Verdict::Deny.error_type(), Some(ErrorType::PermissionDenied));
    assert_eq!(Verdict::Ask.error_type(), None);
    assert_eq!(Verdict::Allow.error_type(), None);
}

#[test]
fn system_tools_are_always_allowed() {
    for mode in Mode::ALL {
        let engine = engine(&[], &["*"], &["*", "todo_write"], mode);
        for tool in ["todo_write", "exit_plan_mode"] {
            let decision = decide(&engine, tool, &json!({}));
            assert_eq!(decision.verdict, Allow, "{mode} {tool}: {}", render(&decision));
            assert_eq!(decision.explanation.layer, Layer::System, "{mode} {tool}");
        }
        // The same rules refuse any ordinary tool.
        assert_eq!(decide(&engine, "read_file", &path("a")).verdict, Deny, "{mode}");
    }
}

#[test]
fn session_grants() {
    let mut engine = engine(
        &["run_command(cargo build:*)"],
        &["run_command(cargo publish:*)"],
        &["run_command(cargo yank:*)"],
        Mode::Default,
    );
    let before = engine.clone();

    let asked = decide(&engine, "run_command", &command("cargo test --all"));
    assert_eq!(asked.verdict, Ask);
    assert_eq!(asked.suggestions, ["run_command(cargo test:*)"]);
    engine.add_session_rule(&asked.suggestions[0]).unwrap_or_else(|err| panic!("{err}"));
    engine.add_session_rule("run_command(cargo test:*)").unwrap_or_else(|err| panic!("{err}"));
    engine.add_session_rule("Edit(src/**)").unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(engine.session_rules(), ["run_command(cargo test:*)", "Edit(src/**)"]);

    check(
        &engine,
        &[
            ("run_command", command("cargo test --all")),
            ("run_command", command("cargo build && cargo test")),
            ("write_file", path("src/new.rs")),
            ("write_file", path("tests/new.rs")),
        ],
        expect![[r#"
            run_command {"command":"cargo test --all"}
              => allow by session_grant [allow run_command(cargo test:*)]: run_command is allowed by the session grant run_command(cargo test:*)
            run_command {"command":"cargo build && cargo test"}
              => allow by session_grant [allow run_command(cargo build:*)]: every part of the command is allowed, by run_command(cargo build:*), run_command(cargo test:*)
            write_file {"path":"src/new.rs"}
              => allow by session_grant [allow Edit(src/**)]: write_file is allowed by the session grant Edit(src/**)
            write_file {"path":"tests/new.rs"}
              => ask by mode: write_file requires approval in default mode | suggest write_file(tests/**)
        "#]],
    );
    // Grants belong to one engine value: a clone taken before is unaffected.
    assert_eq!(decide(&before, "run_command", &command("cargo test")).verdict, Ask);
    // A grant never overrides an ask or deny rule.
    engine.add_session_rule("run_command(cargo:*)").unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(decide(&engine, "run_command", &command("cargo publish")).verdict, Ask);
    assert_eq!(decide(&engine, "run_command", &command("cargo yank")).verdict, Deny);
    // A bad grant names itself and no list.
    let err = engine.add_session_rule("run_command(").err();
    expect![[r#"Some("invalid permission rule \"run_command(\": the specifier has no closing parenthesis at the end")"#]]
        .assert_eq(&format!("{:?}", err.map(|err| err.to_string())));
    // A reload replaces the configured rules and keeps the grants.
    let config =
        RuleConfig { deny: vec!["run_command(cargo build:*)".to_owned()], ..RuleConfig::default() };
    let policy = Policy::new(&config, None).unwrap_or_else(|err| panic!("{err}"));
    engine.reload(policy, Mode::Default);
    assert_eq!(decide(&engine, "run_command", &command("cargo build")).verdict, Deny);
    assert_eq!(decide(&engine, "run_command", &command("cargo test")).verdict, Allow);
}

#[test]
fn dont_ask_turns_ask_into_deny_naming_a_rule() {
    let engine =
        engine(&["run_command(cargo build:*)"], &["read_file(**/.env*)"], &[], Mode::DontAsk);
    check(
        &engine,
        &[
            ("run_command", command("cargo test --all")),
            ("run_command", command("cargo fmt && cargo build && cargo test")),
            ("run_command", command("echo $(whoami)")),
            ("run_command", command("cargo build --release")),
            ("read_file", path(".env")),
            ("edit_file", path("src/lib.rs")),
            ("mcp__issues__create", json!({})),
        ],
        expect![[r#"
            run_command {"command":"cargo test --all"}
              => deny by mode: run_command requires approval because no allow rule covers `cargo test --all`; dont_ask mode never asks (add an allow rule such as run_command(cargo test:*)) | suggest run_command(cargo test:*)
            run_command {"command":"cargo fmt && cargo build && cargo test"}
              => deny by mode: run_command requires approval because no allow rule covers `cargo fmt` and `cargo test`; dont_ask mode never asks (add the allow rules run_command(cargo fmt:*), run_command(cargo test:*)) | suggest run_command(cargo fmt:*), run_command(cargo test:*)
            run_command {"command":"echo $(whoami)"}
              => deny by mode: run_command requires approval because it contains a command substitution; it runs `whoami`; dont_ask mode never asks
            run_command {"command":"cargo build --release"}
              => allow by rule [allow run_command(cargo build:*)]: run_command is allowed by the rule run_command(cargo build:*)
            read_file {"path":".env"}
              => deny by rule [ask read_file(**/.env*)]: read_file requires approval by the rule read_file(**/.env*); dont_ask mode never asks
            edit_file {"path":"src/lib.rs"}
              => deny by mode: edit_file requires approval; dont_ask mode never asks (add an allow rule such as edit_file(src/**)) | suggest edit_file(src/**)
            mcp__issues__create {}
              => deny by mode: mcp__issues__create requires approval; dont_ask mode never asks (add an allow rule such as mcp__issues__create) | suggest mcp__issues__create
        "#]],
    );
    // The same conversion serves a caller with nobody to ask.
    let default = engine_with_mode(&engine, Mode::Default);
    let refused = decide(&default, "run_command", &command("cargo test"))
        .refuse_unasked("no approver is connected");
    expect![[r#"deny by mode: run_command requires approval in default mode because no allow rule covers `cargo test`; no approver is connected (add an allow rule such as run_command(cargo test:*)) | suggest run_command(cargo test:*)"#]]
        .assert_eq(&render(&refused));
    // Verdicts other than ask are left alone.
    let allowed = decide(&default, "read_file", &path("a.rs"));
    assert_eq!(allowed.clone().refuse_unasked("nobody"), allowed);
}

#[test]
fn explanations_name_the_deciding_layer_and_rule() {
    let engine = engine(
        &["run_command(git status:*)", "run_command(git log:*)", "mcp__git__*"],
        &["mcp__git__push"],
        &["edit_file(.git/**)"],
        Mode::AcceptEdits,
    );
    check(
        &engine,
        &[
            ("todo_write", json!({"todos": []})),
            ("run_command", command("git status; git log -3")),
            ("run_command", command("git status > /etc/motd")),
            ("run_command", command("make")),
            ("edit_file", path(".git/config")),
            ("edit_file", path("src/lib.rs")),
            ("edit_file", path("/etc/motd")),
            ("mcp__git__push", json!({})),
            ("mcp__git__fetch", json!({})),
        ],
        expect![[r#"
            todo_write {"todos":[]}
              => allow by system: todo_write is a system tool; permission rules and modes do not apply to it
            run_command {"command":"git status; git log -3"}
              => allow by rule [allow run_command(git status:*)]: every part of the command is allowed, by run_command(git status:*), run_command(git log:*)
            run_command {"command":"git status > /etc/motd"}
              => ask by mode: run_command requires approval in accept_edits mode because it redirects output to /etc/motd, outside the roots | grant this exact command: git status > /etc/motd
            run_command {"command":"make"}
              => ask by mode: run_command requires approval in accept_edits mode because no allow rule covers `make` | suggest run_command(make:*)
            edit_file {"path":".git/config"}
              => deny by rule [deny edit_file(.git/**)]: edit_file is denied by the rule edit_file(.git/**)
            edit_file {"path":"src/lib.rs"}
              => allow by mode: accept_edits mode allows file edits inside the roots
            edit_file {"path":"/etc/motd"}
              => ask by mode: edit_file requires approval in accept_edits mode | suggest edit_file(//etc/**)
            mcp__git__push {}
              => ask by rule [ask mcp__git__push]: mcp__git__push requires approval by the rule mcp__git__push
            mcp__git__fetch {}
              => allow by rule [allow mcp__git__*]: mcp__git__fetch is allowed by the rule mcp__git__*
        "#]],
    );
}

#[test]
fn decisions_serialize_for_the_wire() {
    let engine = engine(&[], &[], &["run_command(rm:*)"], Mode::Default);
    let denied = decide(&engine, "run_command", &command("rm -rf /"));
    expect![[r#"{"verdict":"deny","explanation":{"layer":"rule","rule":"run_command(rm:*)","list":"deny","reason":"`rm -rf /` matches the deny rule run_command(rm:*)"}}"#]]
        .assert_eq(&serde_json::to_string(&denied).unwrap_or_default());
    let asked = decide(&engine, "write_file", &path("a.txt"));
    expect![[r#"{"verdict":"ask","explanation":{"layer":"mode","reason":"write_file requires approval in default mode"},"suggestions":["write_file(/a.txt)"]}"#]]
        .assert_eq(&serde_json::to_string(&asked).unwrap_or_default());
    let back: Decision = serde_json::from_str(&serde_json::to_string(&asked).unwrap_or_default())
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(back, Decision { grant: None, ..asked });
}

#[test]
fn reasons_never_carry_hidden_characters() {
    let engine = engine(&["run_command(git status:*)"], &[], &["run_command(rm:*)"], Mode::Default);
    for text in [
        "rm -rf '\u{1b}[2J'",
        "git status > '/tmp/\u{1b}c\u{202e}'",
        "ls '\u{9b}'; git status",
        "echo $(printf '\r')",
    ] {
        let decision = decide(&engine, "run_command", &command(text));
        let reason = &decision.explanation.reason;
        assert!(!reason.contains(display::is_hidden), "{text:?}: {reason:?}");
    }
    // Nor when a call nobody can approve is refused naming the rule to add.
    let refused = decide(&engine, "write_file", &path("a\u{1b}cb.txt")).refuse_unasked("nobody");
    assert_eq!(refused.verdict, Deny);
    let reason = &refused.explanation.reason;
    assert!(!reason.contains(display::is_hidden) && reason.contains("\\x1bc"), "{reason:?}");
}

#[test]
fn a_session_grant_without_a_safe_rule_is_the_exact_call() {
    let mut engine = engine(&[], &["run_command(git push:*)"], &[], Mode::Default);
    let text = "echo today is $(date +%A)";
    let asked = decide(&engine, "run_command", &command(text));
    assert!(asked.suggestions.is_empty());
    let grant = asked.grant.unwrap_or_else(|| panic!("a grant is offered"));
    assert_eq!(grant.description(), "this exact command: echo today is $(date +%A)");
    engine.add_session_grant(&grant).unwrap_or_else(|err| panic!("{err}"));
    check(
        &engine,
        &[
            ("run_command", command(text)),
            ("run_command", json!({"command": text, "timeout_ms": 5000})),
            ("run_command", json!({"command": text, "cwd": "sub"})),
            ("run_command", command("echo today is $(id)")),
            ("run_command", command("curl x | sh")),
        ],
        expect![[r#"
            run_command {"command":"echo today is $(date +%A)"}
              => allow by session_grant [allow (this exact call, allowed for the session)]: run_command is allowed by the session grant (this exact call, allowed for the session)
            run_command {"command":"echo today is $(date +%A)","timeout_ms":5000}
              => allow by session_grant [allow (this exact call, allowed for the session)]: run_command is allowed by the session grant (this exact call, allowed for the session)
            run_command {"command":"echo today is $(date +%A)","cwd":"sub"}
              => ask by mode: run_command requires approval in default mode because it contains a command substitution; it runs `date +%A` | grant this exact command: echo today is $(date +%A)
            run_command {"command":"echo today is $(id)"}
              => ask by mode: run_command requires approval in default mode because it contains a command substitution; it runs `id` | grant this exact command: echo today is $(id)
            run_command {"command":"curl x | sh"}
              => ask by mode: run_command requires approval in default mode because no allow rule covers `curl x` and `sh` | grant this exact command: curl x | sh
        "#]],
    );
    // An ask rule asks whatever was granted, so no grant is offered for its calls.
    let asked = decide(&engine, "run_command", &command("git push"));
    assert_eq!(asked.verdict, Ask);
    assert_eq!(asked.grant, None);
    // A tool with no arguments to describe: the grant is these arguments exactly.
    let asked = decide(&engine, "write_file", &json!({"content": "x"}));
    let grant = asked.grant.unwrap_or_else(|| panic!("a grant is offered"));
    engine.add_session_grant(&grant).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(decide(&engine, "write_file", &json!({"content": "x"})).verdict, Allow);
    assert_eq!(decide(&engine, "write_file", &json!({"content": "y"})).verdict, Ask);
}

#[test]
fn suggestions_allow_the_call_once_granted() {
    let table: &[(&str, Value, &[&str])] = &[
        ("run_command", command("cargo test --all"), &["run_command(cargo test:*)"]),
        ("run_command", command("ls -la"), &["run_command(ls:*)"]),
        ("run_command", command("./build.sh release"), &["run_command(./build.sh release:*)"]),
        (
            "run_command",
            command("git add . && git commit -m 'x y'"),
            &["run_command(git add:*)", "run_command(git commit:*)"],
        ),
        ("run_command", command("echo \"a b\" | tee 'out file'"), &["run_command(tee:*)"]),
        ("run_command", command("cd src && make all"), &["run_command(make all:*)"]),
        ("run_command", command("echo $(id)"), &[]),
        ("run_command", command("PATH=/x make"), &[]),
        ("edit_file", path("src/a/b.rs"), &["edit_file(src/a/**)"]),
        ("edit_file", path("README.md"), &["edit_file(/README.md)"]),
        ("write_file", path("/tmp/x/y.txt"), &["write_file(//tmp/x/**)"]),
        ("write_file", path("weird[1]/f*.txt"), &["write_file(weird[[]1[]]/**)"]),
        ("mcp__issues__create", json!({}), &["mcp__issues__create"]),
    ];
    for (tool, args, expected) in table {
        let mut engine = engine(&[], &[], &[], Mode::Default);
        let roots = roots();
        let ctx = CallContext { cwd: Path::new(ROOT), roots: &roots, resolver: &Lexical };
        let suggestions = engine.suggestions(&facts(tool), args, &ctx);
        assert_eq!(suggestions, *expected, "{tool} {args}");
        if expected.is_empty() {
            continue;
        }
        for suggestion in &suggestions {
            engine.add_session_rule(suggestion).unwrap_or_else(|err| panic!("{suggestion}: {err}"));
        }
        let decision = decide(&engine, tool, args);
        assert_eq!(
            decision.verdict,
            Allow,
            "{tool} {args} after {suggestions:?}: {}",
            render(&decision)
        );
        assert_eq!(decision.explanation.layer, Layer::SessionGrant, "{tool} {args}");
    }
    // Nothing to suggest for a call that is already allowed or asks by an ask rule.
    let engine = engine(&[], &["run_command(make:*)"], &[], Mode::Default);
    assert_eq!(decide(&engine, "run_command", &command("make")).suggestions, Vec::<String>::new());
    assert_eq!(decide(&engine, "read_file", &path("a")).suggestions, Vec::<String>::new());
}

#[test]
fn run_command_cwd_argument_moves_the_start_directory() {
    let engine = engine(&["run_command(cargo test:*)"], &[], &[], Mode::Default);
    let table: &[(Value, Verdict)] = &[
        (json!({"command": "cargo test > ../out.txt", "cwd": "crates/core"}), Allow),
        (json!({"command": "cargo test > ../out.txt"}), Ask),
        (json!({"command": "cargo test > out.txt", "cwd": "/tmp"}), Ask),
        (json!({"cwd": "src"}), Ask),
    ];
    for (args, verdict) in table {
        let decision = decide(&engine, "run_command", args);
        assert_eq!(decision.verdict, *verdict, "{args}: {}", render(&decision));
    }
}

#[test]
fn modes_parse_print_and_order() {
    for mode in Mode::ALL {
        assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
        assert_eq!(serde_json::to_value(mode).ok(), Some(Value::String(mode.to_string())));
    }
    let claude: &[(&str, Mode)] = &[
        ("acceptEdits", Mode::AcceptEdits),
        ("bypassPermissions", Mode::Bypass),
        ("dontAsk", Mode::DontAsk),
    ];
    for (text, mode) in claude {
        assert_eq!(text.parse::<Mode>(), Ok(*mode));
        assert_eq!(serde_json::from_value::<Mode>(json!(text)).ok(), Some(*mode));
    }
    expect![[r#"Err(ParseModeError("yolo"))"#]].assert_eq(&format!("{:?}", "yolo".parse::<Mode>()));
    expect![[r#"unknown permission mode "yolo"; expected one of default, accept_edits, plan, bypass, dont_ask"#]]
        .assert_eq(&ParseModeError("yolo".to_owned()).to_string());

    // restrict(configured, requested) for every pair; rows are the configured mode.
    use Mode::{AcceptEdits as E, Bypass as B, Default as D, DontAsk as N, Plan as P};
    let order = [D, E, P, B, N];
    let expected: [[Mode; 5]; 5] = [
        // requested: default, accept_edits, plan, bypass, dont_ask
        [D, D, P, D, N], // configured default
        [D, E, P, E, N], // configured accept_edits
        [P, P, P, P, P], // configured plan
        [D, E, P, B, N], // configured bypass
        [N, N, P, N, N], // configured dont_ask
    ];
    for (row, configured) in order.iter().enumerate() {
        for (col, requested) in order.iter().enumerate() {
            assert_eq!(
                Mode::restrict(*configured, *requested),
                expected[row][col],
                "configured {configured}, requested {requested}"
            );
        }
    }
}

#[test]
fn a_requested_mode_never_widens_the_configured_one() {
    let calls: [(&str, Value); 5] = [
        ("read_file", path("src/lib.rs")),
        ("read_file", path(".env")),
        ("write_file", path("src/lib.rs")),
        ("run_command", command("cargo build")),
        ("run_command", command("make")),
    ];
    for configured in Mode::ALL {
        let base = engine(&["run_command(cargo build:*)"], &["read_file(.env)"], &[], configured);
        for requested in Mode::ALL {
            let mut session = base.clone();
            let effective = session.set_mode(requested);
            assert_eq!(effective, Mode::restrict(configured, requested));
            for (tool, args) in &calls {
                let under_session = decide(&session, tool, args).verdict;
                let under_configured = decide(&base, tool, args).verdict;
                assert!(
                    under_session.strictness() <= under_configured.strictness(),
                    "configured {configured}, requested {requested}, {tool} {args}: \
                     {under_session:?} is wider than {under_configured:?}"
                );
            }
        }
    }
    // Plan requested under a dont_ask ceiling: no side effects and no asking.
    let mut session = engine(&[], &["read_file(.env)"], &[], Mode::DontAsk);
    assert_eq!(session.set_mode(Mode::Plan), Mode::Plan);
    assert_eq!(decide(&session, "read_file", &path(".env")).verdict, Deny);
    assert_eq!(decide(&session, "write_file", &path("a")).verdict, NotAllowedInMode);
    assert_eq!(decide(&session, "read_file", &path("a")).verdict, Allow);
}

#[test]
fn bad_configured_rules_name_rule_and_list() {
    let config = RuleConfig {
        allow: vec!["run_command(git status:*)".to_owned()],
        ask: vec![],
        deny: vec!["edit_file(src/[)".to_owned()],
        ..RuleConfig::default()
    };
    let err = Policy::new(&config, None).err().map(|err| err.to_string());
    expect![[r#"Some("invalid deny rule \"edit_file(src/[)\": the path glob is invalid: unclosed character class; missing ']'")"#]]
        .assert_eq(&format!("{err:?}"));
    let config =
        RuleConfig { ask: vec!["read_file(~/.ssh/**)".to_owned()], ..RuleConfig::default() };
    let err = Policy::new(&config, None).err();
    assert_eq!(
        err.map(|err| (err.list, err.problem)),
        Some((Some(RuleList::Ask), RuleProblem::NoHome))
    );
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever the model writes, deciding never panics and returns an explanation.
        #[test]
        fn deciding_any_command_never_panics(text in "[ -~\n]{0,80}") {
            let engine = engine(
                &["run_command(echo:*)"],
                &["run_command(git push:*)"],
                &["run_command(rm:*)"],
                Mode::Default,
            );
            let decision = decide(&engine, "run_command", &command(&text));
            prop_assert!(!decision.explanation.reason.is_empty());
        }

        /// Text inserted into an allowed command can never hide a later `rm` from a deny
        /// rule: it either parses (and the parser sees `rm`) or does not (and the
        /// best-effort split sees it). `#` and `<` are left out: a comment or a
        /// here-document really does stop `rm` from running.
        #[test]
        fn a_denied_part_is_found_whatever_precedes_it(noise in "[a-z0-9 '\"$(){};|&*?=~./\\\\`>@!+-]{0,24}") {
            let engine = engine(&["run_command(echo:*)"], &[], &["run_command(rm:*)"], Mode::Bypass);
            let text = format!("echo {noise} && rm -rf /");
            let decision = decide(&engine, "run_command", &command(&text));
            prop_assert_eq!(decision.verdict, Deny, "{} => {}", text, render(&decision));
        }
    }
}

#[test]
fn an_empty_policy_leaves_decisions_to_the_mode_and_reload_recaps_it() {
    let mut engine = PermissionEngine::new(Policy::default(), Mode::Bypass);
    assert_eq!(decide(&engine, "run_command", &command("make")).verdict, Allow);
    assert_eq!(engine.set_mode(Mode::AcceptEdits), Mode::AcceptEdits);
    assert_eq!(decide(&engine, "run_command", &command("make")).verdict, Ask);
    assert_eq!(decide(&engine, "edit_file", &path("src/lib.rs")).verdict, Allow);
    // A reload with a stricter configured mode caps the session's mode.
    engine.reload(Policy::default(), Mode::Plan);
    assert_eq!((engine.mode(), engine.configured_mode()), (Mode::Plan, Mode::Plan));
    assert_eq!(decide(&engine, "edit_file", &path("src/lib.rs")).verdict, NotAllowedInMode);
    assert_eq!(engine.set_mode(Mode::Bypass), Mode::Plan);
}

#[test]
fn process_write_input_is_judged_as_a_command_line() {
    let write = |input: &str| json!({ "id": "p1", "input": input });
    // No rule of its own: the input decides, as run_command would.
    let plain = engine(&["run_command(git status)"], &[], &["run_command(rm:*)"], Mode::Default);
    assert_eq!(decide(&plain, "process_write", &write("git status\n")).verdict, Verdict::Allow);
    assert_eq!(decide(&plain, "process_write", &write("1+1\n")).verdict, Verdict::Ask);
    assert_eq!(decide(&plain, "process_write", &write("rm -rf x\n")).verdict, Verdict::Deny);
    let bypass = engine_with_mode(&plain, Mode::Bypass);
    assert_eq!(decide(&bypass, "process_write", &write("1+1\n")).verdict, Verdict::Allow);
    assert_eq!(decide(&bypass, "process_write", &write("rm -rf x\n")).verdict, Verdict::Deny);
    let plan = engine_with_mode(&plain, Mode::Plan);
    assert_eq!(
        decide(&plan, "process_write", &write("git status\n")).verdict,
        Verdict::NotAllowedInMode
    );
    // An allow rule of its own lets any input through, but a deny or ask rule on the
    // input as a command still wins.
    let trusting = engine(
        &["process_write"],
        &["run_command(git push:*)"],
        &["run_command(rm:*)"],
        Mode::Default,
    );
    assert_eq!(decide(&trusting, "process_write", &write("1+1\n")).verdict, Verdict::Allow);
    assert_eq!(decide(&trusting, "process_write", &write("git push\n")).verdict, Verdict::Ask);
    assert_eq!(decide(&trusting, "process_write", &write("rm -rf x\n")).verdict, Verdict::Deny);
    let denying = engine(&["run_command"], &[], &["process_write"], Mode::Bypass);
    assert_eq!(decide(&denying, "process_write", &write("ls\n")).verdict, Verdict::Deny);
}

#[test]
fn a_sandbox_widening_always_needs_a_person() {
    let widened =
        json!({"command": "cargo build", "sandbox": {"writable": ["/tmp"], "network": true}});
    let empty = json!({"command": "cargo build", "sandbox": {"writable": []}});
    for mode in Mode::ALL {
        let allowed = engine(&["run_command", "run_command(cargo build:*)"], &[], &[], mode);
        let decision = decide(&allowed, "run_command", &widened);
        let expected = match mode {
            Mode::Plan => Verdict::NotAllowedInMode,
            Mode::DontAsk => Verdict::Deny,
            _ => Verdict::Ask,
        };
        assert_eq!(decision.verdict, expected, "{mode}: {}", render(&decision));
        assert!(decision.grant.is_none(), "{mode}: a session grant would cover the widening");
        assert!(decision.suggestions.is_empty(), "{mode}: no rule can vouch for it");
        if mode != Mode::Plan {
            assert!(
                decision
                    .explanation
                    .reason
                    .contains("write beneath /tmp, open network connections"),
                "{mode}: {}",
                render(&decision)
            );
        }
        // Asking for nothing is no widening: the rule decides as usual.
        assert_eq!(
            decide(&allowed, "run_command", &empty).verdict,
            if mode == Mode::Plan { Verdict::NotAllowedInMode } else { Verdict::Allow },
            "{mode}"
        );
        // A deny rule still refuses.
        let denied = engine(&[], &[], &["run_command(cargo:*)"], mode);
        assert_eq!(decide(&denied, "run_command", &widened).verdict, Verdict::Deny, "{mode}");
    }
}

#[test]
fn built_in_protections_hold_whatever_the_lists_say() {
    use Verdict::*;
    let edits = ["sub/.git/config", ".git/hooks/pre-commit", "a/b/.git", ".git"];
    for mode in [Mode::AcceptEdits, Mode::Bypass] {
        // A configuration with lists of its own, and an allow rule for every edit.
        let protected = engine(&["Edit", "Edit(**)"], &[], &["run_command(rm:*)"], mode);
        for target in edits {
            for tool in ["write_file", "edit_file", "notebook_edit"] {
                let decision = decide(&protected, tool, &path(target));
                assert_eq!(decision.verdict, Deny, "{mode} {tool} {target}: {}", render(&decision));
            }
        }
        let patch = json!({"patch": format!(
            "*** Begin Patch\n*** Add File: ok.txt\n+x\n*** Update File: sub/.git/config\n-a\n+b\n*** End Patch"
        )});
        assert_eq!(decide(&protected, "apply_patch", &patch).verdict, Deny, "{mode}");
        // Names that only look like git's are not protected.
        for target in ["sub/.github/workflows/ci.yml", "sub/.gitignore", "sub/git/config"] {
            assert_eq!(decide(&protected, "write_file", &path(target)).verdict, Allow, "{target}");
        }
    }
    check(
        &engine(&[], &[], &[], Mode::Bypass),
        &[("write_file", path("sub/.git/config"))],
        expect![[r#"
            write_file {"path":"sub/.git/config"}
              => deny by rule [deny Edit(**/.git/**)]: write_file is denied by the rule Edit(**/.git/**), a built-in protection (git: git's own files at any depth, a `.git` file included: a repository's configuration or hooks name commands git runs (core.fsmonitor, core.pager, hooks)) that only [permissions] unprotect = ["git"] turns off
        "#]],
    );
    // The empty policy has them too.
    let bare = PermissionEngine::new(Policy::default(), Mode::Bypass);
    assert_eq!(decide(&bare, "write_file", &path("sub/.git/config")).verdict, Deny);

    // Only the named switch turns one off.
    let config = RuleConfig { unprotect: vec!["git".to_owned()], ..RuleConfig::default() };
    let policy = Policy::new(&config, None).unwrap_or_else(|err| panic!("{err}"));
    let unprotected = PermissionEngine::new(policy, Mode::AcceptEdits);
    for target in edits {
        assert_eq!(decide(&unprotected, "write_file", &path(target)).verdict, Allow, "{target}");
    }
    let config = RuleConfig { unprotect: vec!["gti".to_owned()], ..RuleConfig::default() };
    let err = Policy::new(&config, None).err().map(|err| err.problem);
    assert!(matches!(err, Some(RuleProblem::UnknownProtection { .. })), "{err:?}");
}

#[test]
fn command_rules_see_through_git_global_options_and_wrappers() {
    use Verdict::*;
    let engine = engine(
        &["run_command(git status:*)", "run_command(git log:*)"],
        &["run_command(git commit:*)"],
        &["run_command(git push:*)"],
        Mode::Bypass,
    );
    assert_commands(
        &engine,
        &[
            ("git push", Deny),
            // Global options before the subcommand, in every spelling git takes.
            ("git -C . push", Deny),
            ("git -C sub -C . push origin main", Deny),
            ("git --no-pager push", Deny),
            ("git -P push", Deny),
            ("git -p push", Deny),
            ("git --paginate push", Deny),
            ("git -c k=v push", Deny),
            ("git -c core.sshCommand=ssh push", Deny),
            ("git --config-env=k=ENV push", Deny),
            ("git --config-env k=ENV push", Deny),
            ("git --git-dir=.git push", Deny),
            ("git --git-dir .git push", Deny),
            ("git --work-tree . push", Deny),
            ("git --work-tree=. push", Deny),
            ("git --exec-path=/usr/lib/git-core push", Deny),
            ("git --namespace ns push", Deny),
            ("git --namespace=ns push", Deny),
            ("git --bare push", Deny),
            ("git --literal-pathspecs push", Deny),
            ("git --glob-pathspecs --icase-pathspecs push", Deny),
            ("git --noglob-pathspecs push", Deny),
            ("git --no-replace-objects --no-optional-locks push", Deny),
            ("git --no-lazy-fetch --no-advice push", Deny),
            ("git --attr-source HEAD push", Deny),
            ("git --super-prefix=x/ push", Deny),
            // An option git may learn later, with or without a value of its own.
            ("git --some-new-option push", Deny),
            ("git --some-new-option value push", Deny),
            // A word only known at run time where an option would be.
            ("git $OPTS push", Deny),
            ("/usr/bin/git -C . push", Deny),
            // Wrappers, with their own options, and several of them.
            ("env -i VAR=x git push", Deny),
            ("env -i VAR=x git -C . push", Deny),
            ("nice -n 5 git push", Deny),
            ("timeout 10 git push", Deny),
            ("timeout -s KILL 10 git --no-pager push", Deny),
            ("nohup git push", Deny),
            ("time git push", Deny),
            ("time -p git push", Deny),
            ("stdbuf -oL git push", Deny),
            ("sudo -u me nice -n 5 git -C . push", Deny),
            ("command git push", Deny),
            ("bash -c 'git -C . push'", Deny),
            ("echo $(git --no-pager push)", Deny),
            // Ask rules the same way.
            ("git -C . commit -m x", Ask),
            ("nice git --no-pager commit", Ask),
            // Not a push: an option's value, or an argument after the subcommand.
            ("git -C push status", Allow),
            ("git -c push=1 status", Allow),
            ("git log push", Allow),
            ("git status --porcelain push", Allow),
        ],
    );
    // Allow rules stay as strict as they were: the words as written must match.
    let strict = engine_with_mode(&engine, Mode::Default);
    assert_commands(
        &strict,
        &[
            ("git status", Allow),
            ("git -C . status", Ask),
            ("git --no-pager log", Ask),
            ("nice git status", Ask),
            ("env git status", Ask),
        ],
    );
}

#[test]
fn command_rules_see_what_a_git_alias_or_env_split_runs() {
    use Verdict::*;
    let engine = engine(&[], &[], &["run_command(git push:*)", "run_command(rm:*)"], Mode::Bypass);
    assert_commands(
        &engine,
        &[
            ("git -c alias.p=push p", Deny),
            ("git -c alias.p='push --force' p origin", Deny),
            ("git -C . -c alias.p='!git push' p", Deny),
            ("git -c alias.x='!rm -rf /' x", Deny),
            ("env -S 'git push' origin", Deny),
            ("env -S'git -C . push'", Deny),
            ("env --split-string='rm -rf /'", Deny),
            // An alias that is not the subcommand runs nothing.
            ("git -c alias.p=push status", Allow),
        ],
    );
}

#[test]
fn killing_the_sessions_own_process_asks_nobody_but_rules_still_decide() {
    let roots = roots();
    let ctx = CallContext { cwd: Path::new(ROOT), roots: &roots, resolver: &Lexical };
    let kill = |engine: &PermissionEngine, started_here: bool| {
        let decision = engine.decide_process_kill(
            &facts("process_kill"),
            &json!({"id": "p1"}),
            &ctx,
            started_here,
        );
        (decision.verdict, decision.explanation.layer)
    };
    for mode in [Mode::Default, Mode::DontAsk] {
        let plain = engine(&[], &[], &[], mode);
        assert_eq!(kill(&plain, true), (Verdict::Allow, Layer::Mode), "{mode}");
        // Nothing to approve: the call goes on to fail as not found.
        assert_eq!(kill(&plain, false), (Verdict::Allow, Layer::Mode), "{mode}");
    }
    let denied = engine(&[], &[], &["process_kill"], Mode::Default);
    assert_eq!(kill(&denied, true), (Verdict::Deny, Layer::Rule));
    assert_eq!(kill(&denied, false), (Verdict::Deny, Layer::Rule));
    let asked = engine(&[], &["process_kill"], &[], Mode::Default);
    assert_eq!(kill(&asked, true), (Verdict::Ask, Layer::Rule));
    let plan = engine(&[], &[], &[], Mode::Plan);
    assert_eq!(kill(&plan, true).0, Verdict::NotAllowedInMode);
    // Without the session's word, the mode asks as before.
    assert_eq!(
        decide(&engine(&[], &[], &[], Mode::Default), "process_kill", &json!({"id": "p1"})).verdict,
        Verdict::Ask
    );
}

/// The file layer applies `read_file`'s rules to every read and `edit_file`'s and
/// `write_file`'s (Claude Code's `Read`, `Edit`, `Write`) to every write, as the tools'
/// facts declare; the rules of the other file tools bind their own calls only. Of two
/// binding rules, the one configured first is named, whichever tool it is written for.
#[test]
fn the_file_layer_binds_the_rules_of_the_tools_that_stand_for_an_access() {
    use crate::tools::fs::{AccessKind, PathRules, RuleEffect};
    let sorted = |access| {
        let mut tools = access_tools(access).to_vec();
        tools.sort_unstable();
        tools
    };
    assert_eq!(sorted(AccessKind::Read), ["read_file"]);
    assert_eq!(sorted(AccessKind::Write), ["edit_file", "write_file"]);

    let strings = |list: &[&str]| list.iter().map(|rule| (*rule).to_owned()).collect();
    let config = RuleConfig {
        deny: strings(&[
            "write_file(secret/**)",
            "edit_file(secret/**)",
            "notebook_edit(notes/**)",
            "apply_patch(patches/**)",
            "find_files(private/**)",
        ]),
        ..RuleConfig::default()
    };
    let policy = Policy::new(&config, Some(Path::new(HOME))).unwrap();
    let roots = roots();
    let hit = |access, path: &str| {
        policy
            .binding_rule(access, &Path::new(ROOT).join(path), &roots)
            .map(|hit| (hit.effect == RuleEffect::Deny, hit.rule))
    };
    assert_eq!(hit(AccessKind::Write, "secret/x"), Some((true, "write_file(secret/**)".into())));
    assert_eq!(hit(AccessKind::Read, "secret/x"), None);
    for path in ["notes/a.ipynb", "patches/a.txt", "private/a.txt"] {
        assert_eq!(hit(AccessKind::Write, path), None, "{path}");
        assert_eq!(hit(AccessKind::Read, path), None, "{path}");
    }
}
