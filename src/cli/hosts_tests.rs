use std::path::{Path, PathBuf};

use super::*;

fn fixture(parts: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts").join(parts)
}

fn places(home: PathBuf, codex_home: Option<PathBuf>, project: PathBuf) -> Places {
    Places {
        home,
        codex_home,
        project,
        managed_settings: PathBuf::from("/nonexistent/managed.json"),
    }
}

/// The line of the report that starts with `start`, and whether it is ok.
fn line<'a>(report: &'a Report, start: &str) -> &'a Finding {
    report
        .findings
        .iter()
        .find(|finding| finding.text.starts_with(start))
        .unwrap_or_else(|| panic!("no finding starts with {start:?}: {report:#?}"))
}

#[test]
fn claude_code_locked_down_across_the_user_and_project_files() {
    let dir = fixture("claude-code/locked");
    let report = check(Host::ClaudeCode, &places(dir.join("home"), None, dir.join("project")));
    assert!(report.locked_down(), "{report:#?}");
    let server = line(&report, "toolgate is an MCP server");
    assert!(server.text.contains(".mcp.json"), "{}", server.text);
    assert!(line(&report, "Bash is off").text.contains("home/.claude/settings.json"));
    assert!(line(&report, "Grep is off").text.contains("project/.claude/settings.json"));
    for tool in CLAUDE_CODE_TOOLS {
        assert!(line(&report, &format!("{tool} is off")).ok);
    }
    let text = report.render(Host::ClaudeCode);
    assert!(text.ends_with("Claude Code is locked down: its own file and shell tools are off, toolgate is its MCP server\n"), "{text}");
}

#[test]
fn claude_code_open_names_every_tool_still_on_and_the_missing_server() {
    let dir = fixture("claude-code/open");
    let report = check(Host::ClaudeCode, &places(dir.join("home"), None, dir.join("project")));
    assert!(!report.locked_down());
    // Another project's toolgate and another server do not count.
    assert!(!line(&report, "toolgate is not an MCP server").ok);
    // A scoped deny rule leaves the tool on; an allow rule is named.
    let bash = line(&report, "Bash is on, and allowed in");
    assert!(!bash.ok && bash.text.contains("settings.local.json"), "{}", bash.text);
    assert!(!line(&report, "Read is on, and allowed in").ok);
    assert!(line(&report, "Write is off").ok);
    assert!(line(&report, "Edit is off").ok);
    for tool in ["MultiEdit", "NotebookEdit", "Glob", "Grep"] {
        let finding = line(&report, &format!("{tool} is on: no settings file"));
        assert!(!finding.ok);
    }
    let text = report.render(Host::ClaudeCode);
    assert!(text.contains("FAIL  Bash is on"), "{text}");
    assert!(text.contains("ok    Write is off"), "{text}");
    assert!(text.contains("not locked down (7 of 9 findings fail)"), "{text}");
}

#[test]
fn claude_code_local_scope_of_this_project_counts_and_a_disabled_project_server_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let project = dir.path().join("project");
    std::fs::create_dir_all(home.join(".claude")).unwrap();
    std::fs::create_dir_all(project.join(".claude")).unwrap();
    let user = serde_json::json!({"projects": {project.to_str().unwrap(): {
        "mcpServers": {"gate": {"command": "toolgate", "args": ["mcp", "--root", "."]}}
    }}});
    std::fs::write(home.join(".claude.json"), user.to_string()).unwrap();
    std::fs::write(
        project.join(".mcp.json"),
        r#"{"mcpServers": {"toolgate": {"command": "toolgate", "args": ["mcp"]}}}"#,
    )
    .unwrap();
    std::fs::write(
        project.join(".claude/settings.json"),
        r#"{"disabledMcpjsonServers": ["toolgate"]}"#,
    )
    .unwrap();
    let report = check(Host::ClaudeCode, &places(home, None, project));
    let server = line(&report, "toolgate is an MCP server");
    assert!(server.ok && server.text.contains("\"gate\"") && server.text.contains("local scope"));
    assert!(!line(&report, "MCP server \"toolgate\" (toolgate mcp) in").ok);
}

#[test]
fn an_unreadable_settings_file_is_a_failure_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("project/.claude")).unwrap();
    std::fs::write(dir.path().join("project/.claude/settings.json"), "{\"permissions\": ").unwrap();
    let report =
        check(Host::ClaudeCode, &places(dir.path().join("home"), None, dir.path().join("project")));
    let finding =
        line(&report, &dir.path().join("project/.claude/settings.json").display().to_string());
    assert!(!finding.ok && finding.text.contains("not valid JSON"), "{}", finding.text);

    std::fs::create_dir_all(dir.path().join("codex")).unwrap();
    std::fs::write(dir.path().join("codex/config.toml"), "[features\n").unwrap();
    let report = check(
        Host::Codex,
        &places(
            dir.path().join("home"),
            Some(dir.path().join("codex")),
            dir.path().join("project"),
        ),
    );
    assert!(!line(&report, &dir.path().join("codex/config.toml").display().to_string()).ok);
}

#[test]
fn codex_locked_down() {
    let dir = fixture("codex/locked");
    let report = check(
        Host::Codex,
        &places(dir.join("home"), Some(dir.join("codex-home")), dir.join("project")),
    );
    assert!(report.locked_down(), "{report:#?}");
    for feature in CODEX_FEATURES {
        assert!(line(&report, &format!("{feature} is off")).ok);
    }
    assert!(line(&report, "apply_patch (no switch turns it off) has every write refused").ok);
    assert!(line(&report, "toolgate is an MCP server").text.contains("toolgate mcp --root ."));
}

#[test]
fn codex_open_the_project_file_overrides_the_user_file_and_a_disabled_server_is_named() {
    let dir = fixture("codex/open");
    let report = check(
        Host::Codex,
        &places(dir.join("home"), Some(dir.join("codex-home")), dir.join("project")),
    );
    assert!(!report.locked_down());
    assert!(line(&report, "shell_tool is off").ok);
    assert!(!line(&report, "view_image is on (the default)").ok);
    let sandbox = line(&report, "sandbox_mode = \"workspace-write\"");
    assert!(!sandbox.ok && sandbox.text.contains("project/.codex/config.toml"), "{}", sandbox.text);
    assert!(line(&report, "approval_policy = \"never\"").ok);
    assert!(!line(&report, "apply_patch is on and can write").ok);
    assert!(!line(&report, "MCP server \"toolgate\"").ok, "enabled = false");
    assert!(!line(&report, "toolgate is not an MCP server").ok);
}

#[test]
fn codex_home_defaults_to_dot_codex_and_its_absence_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let report = check(Host::Codex, &places(dir.path().to_owned(), None, dir.path().join("p")));
    let finding = line(&report, "no Codex configuration file");
    assert!(!finding.ok && finding.text.contains(".codex/config.toml"), "{}", finding.text);
}

/// What `--print-config` prints, written where the host reads it, is locked down.
#[test]
fn the_printed_configuration_locks_each_host_down() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".claude")).unwrap();
    let printed = lockdown_config(Host::ClaudeCode);
    let (settings, servers) = printed
        .strip_prefix("# .claude/settings.json\n")
        .and_then(|rest| rest.split_once("# .mcp.json\n"))
        .unwrap();
    std::fs::write(project.join(".claude/settings.json"), settings).unwrap();
    std::fs::write(project.join(".mcp.json"), servers).unwrap();
    let report = check(Host::ClaudeCode, &places(home.clone(), None, project.clone()));
    assert!(report.locked_down(), "{report:#?}");

    let codex_home = dir.path().join("codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    std::fs::write(codex_home.join("config.toml"), lockdown_config(Host::Codex)).unwrap();
    let report = check(Host::Codex, &places(home, Some(codex_home), project));
    assert!(report.locked_down(), "{report:#?}");
}

#[test]
fn only_toolgate_mcp_counts_as_toolgate() {
    let server = |name: &str, command: Option<&str>, args: &[&str], url: Option<&str>| Server {
        name: name.to_owned(),
        command: command.map(str::to_owned),
        args: args.iter().map(|arg| (*arg).to_owned()).collect(),
        url: url.map(str::to_owned),
        file: PathBuf::new(),
        scope: "",
    };
    assert!(server("x", Some("/opt/bin/toolgate"), &["mcp"], None).is_toolgate());
    assert!(!server("x", Some("toolgate"), &["serve"], None).is_toolgate());
    assert!(!server("toolgate", Some("npx"), &["toolgate"], None).is_toolgate());
    assert!(!server("x", Some("not-toolgate"), &["mcp"], None).is_toolgate());
    assert!(server("toolgate", None, &[], Some("http://127.0.0.1:7811/mcp")).is_toolgate());
    assert!(rule_names("Bash(git log:*)", "Bash") && rule_names("Bash", "Bash"));
    assert!(!rule_names("BashOutput", "Bash"));
}

/// A profile file is read over the user's file when Codex is started with
/// `--profile NAME`: one that turns the shell back on is named, one that keeps the
/// lockdown is not a failure.
#[test]
fn codex_profiles_that_undo_the_lockdown_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let codex_home = dir.path().join("codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    std::fs::write(codex_home.join("config.toml"), lockdown_config(Host::Codex)).unwrap();
    std::fs::write(codex_home.join("fast.config.toml"), "model = \"small\"\n").unwrap();
    let places = places(dir.path().to_owned(), Some(codex_home.clone()), dir.path().join("p"));
    let report = check(Host::Codex, &places);
    assert!(report.locked_down(), "{report:#?}");
    assert!(line(&report, "profile fast (").ok);

    std::fs::write(
        codex_home.join("open.config.toml"),
        "sandbox_mode = \"workspace-write\"\n[features]\nshell_tool = true\n",
    )
    .unwrap();
    let report = check(Host::Codex, &places);
    assert!(!report.locked_down());
    let open = line(&report, "profile open (");
    assert!(!open.ok, "{}", open.text);
    assert!(
        open.text.contains("features.shell_tool = true")
            && open.text.contains("sandbox_mode = \"workspace-write\"")
            && open.text.ends_with("`codex --profile open` has it back"),
        "{}",
        open.text
    );
}
