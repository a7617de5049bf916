use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use expect_test::{Expect, expect};

use super::*;

/// A fake machine in a temporary directory: a start directory, a system and a user
/// configuration directory, a home. Nothing outside it is read.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    start: PathBuf,
    system: PathBuf,
    user: PathBuf,
    home: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let start = root.join("project");
        let system = root.join("etc").join("toolgate");
        let home = root.join("home");
        let user = home.join(".config").join("toolgate");
        for d in [&start, &system, &user] {
            std::fs::create_dir_all(d).unwrap();
        }
        Fixture { _dir: dir, root, start, system, user, home }
    }

    fn options(&self) -> LoadOptions {
        LoadOptions {
            explicit: None,
            system_dir: Some(self.system.clone()),
            user_dir: Some(self.user.clone()),
            start_dir: self.start.clone(),
            home: Some(self.home.clone()),
            runtime_dir: Some(self.root.join("run")),
            state_home: Some(self.home.join(".local").join("state")),
            uid: 4242,
        }
    }

    fn system_file(&self, text: &str) -> PathBuf {
        self.write(&self.system.join("config.toml"), text)
    }

    fn user_file(&self, text: &str) -> PathBuf {
        self.write(&self.user.join("config.toml"), text)
    }

    fn write(&self, path: &Path, text: &str) -> PathBuf {
        std::fs::write(path, text).unwrap();
        path.to_owned()
    }

    fn load(&self) -> Config {
        Config::load(&self.options()).unwrap()
    }

    /// The error of loading with a user file holding `text`, with the fixture's
    /// directory shown as `$T`.
    fn user_error(&self, text: &str) -> String {
        self.user_file(text);
        self.error(&self.options())
    }

    fn error(&self, options: &LoadOptions) -> String {
        let err = Config::load(options).unwrap_err();
        err.to_string().replace(self.root.to_str().unwrap(), "$T")
    }
}

fn check_user_error(text: &str, expected: Expect) {
    let fixture = Fixture::new();
    expected.assert_eq(&fixture.user_error(text));
}

#[test]
fn defaults_with_no_files() {
    let fixture = Fixture::new();
    let config = fixture.load();
    let expected = Config {
        server: ServerConfig {
            socket: fixture.root.join("run/toolgate/toolgate.sock"),
            tcp: None,
            mcp_http: None,
            token_file: None,
            audit_log: Some(fixture.home.join(".local/state/toolgate/audit.jsonl")),
            max_connections: 1024,
            max_message_bytes: 16 * 1024 * 1024,
            shutdown_grace_ms: 5000,
            event_buffer: 1024,
            max_calls_per_session: 16,
        },
        workspace: WorkspaceConfig { roots: vec![fixture.start.clone()] },
        limits: LimitsConfig {
            default_timeout_ms: 120_000,
            max_timeout_ms: 600_000,
            max_output_bytes: 1_048_576,
            max_read_bytes: 10_485_760,
            approval_timeout_ms: 300_000,
            max_background_processes: 8,
            process_output_bytes: 8_388_608,
            session_process_output_bytes: 67_108_864,
            detached_session_ttl_ms: 600_000,
            on_timeout: crate::tools::jobs::OnTimeout::Kill,
        },
        permissions: PermissionsConfig {
            mode: "default".to_owned(),
            allow: vec![],
            ask: vec![],
            deny: vec![],
            unprotect: vec![],
        },
        hooks: HooksConfig { pre_tool_use: vec![], post_tool_use: vec![] },
        skills: SkillsConfig {
            dirs: vec![fixture.user.join("skills"), fixture.start.join(".toolgate/skills")],
            trusted: vec![],
        },
        env: EnvConfig { inherit: true, exclude: vec![], set: BTreeMap::new() },
        mcp_servers: vec![],
        audit: crate::audit::AuditSettings::default(),
        sandbox: crate::sandbox::SandboxConfig::default(),
        sources: vec![],
        warnings: vec![],
    };
    assert_eq!(config, expected);
    // The built-in limits are the ones the tools fall back to.
    let env = config.session_env("s1");
    assert_eq!(env.timeout, crate::tools::DEFAULT_TIMEOUT);
    assert_eq!(env.max_timeout, crate::tools::MAX_TIMEOUT);
    assert_eq!(env.max_output_bytes, crate::tools::DEFAULT_MAX_OUTPUT_BYTES);
    assert_eq!(env.max_read_bytes, crate::tools::DEFAULT_MAX_READ_BYTES);
    assert_eq!(env.cwd, fixture.start);
    assert_eq!(env.session_id, "s1");
}

#[test]
fn no_directories_at_all_still_loads() {
    // `toolgate serve` on a machine with no configuration, no runtime directory and
    // no system or user directory.
    let fixture = Fixture::new();
    let options =
        LoadOptions { system_dir: None, user_dir: None, runtime_dir: None, ..fixture.options() };
    let config = Config::load(&options).unwrap();
    assert_eq!(config.server.socket, PathBuf::from("/tmp/toolgate-4242/toolgate.sock"));
    assert_eq!(config.skills.dirs, vec![fixture.start.join(".toolgate/skills")]);
    assert_eq!(config.workspace.roots, vec![fixture.start.clone()]);
}

#[test]
fn default_audit_log_needs_a_state_directory() {
    let fixture = Fixture::new();
    let options = LoadOptions { state_home: None, ..fixture.options() };
    expect!["(built-in defaults):59:1: [server] audit_log: neither $XDG_STATE_HOME nor the home directory is known; set audit_log to a path, or to false"]
        .assert_eq(&fixture.error(&options));
    fixture.user_file("[server]\naudit_log = false\n");
    assert_eq!(Config::load(&options).unwrap().server.audit_log, None);
}

#[test]
fn layers_apply_in_order() {
    let fixture = Fixture::new();
    let system = fixture.system_file(
        r#"
[limits]
default_timeout_ms = 1000
max_output_bytes = 5
[permissions]
allow = ["read_file"]
deny = ["write_file(.git/**)"]
[env.set]
FROM_SYSTEM = "1"
SHARED = "system"
"#,
    );
    let user = fixture.user_file(
        r#"
[limits]
default_timeout_ms = 2000
[permissions]
allow = ["mcp__a"]
[env.set]
SHARED = "user"
"#,
    );
    let explicit = fixture.write(
        &fixture.root.join("explicit.toml"),
        r#"
[permissions]
allow = ["mcp__b", "mcp__c"]
mode = "plan"
"#,
    );
    let options = LoadOptions { explicit: Some(explicit.clone()), ..fixture.options() };
    let config = Config::load(&options).unwrap();
    assert_eq!(config.limits.default_timeout_ms, 2000);
    assert_eq!(config.limits.max_output_bytes, 5);
    assert_eq!(config.limits.max_timeout_ms, 600_000);
    assert_eq!(
        config.permissions,
        PermissionsConfig {
            mode: "plan".to_owned(),
            allow: vec!["mcp__b".to_owned(), "mcp__c".to_owned()],
            ask: vec![],
            deny: vec!["write_file(.git/**)".to_owned()],
            unprotect: vec![],
        }
    );
    let set: Vec<(&str, &str)> =
        config.env.set.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(set, [("FROM_SYSTEM", "1"), ("SHARED", "user")]);
    assert_eq!(config.sources, vec![system, user, explicit]);
}

#[test]
fn arrays_of_tables_replace_rather_than_append() {
    let fixture = Fixture::new();
    fixture.system_file(
        "[[hooks.pre_tool_use]]\ncommand = \"system-hook\"\n[[hooks.pre_tool_use]]\ncommand = \"second\"\n",
    );
    fixture.user_file("[[hooks.pre_tool_use]]\nmatcher = \"run_command\"\ncommand = \"true\"\n");
    let config = fixture.load();
    let commands: Vec<&str> =
        config.hooks.pre_tool_use.iter().map(|hook| hook.command.as_str()).collect();
    assert_eq!(commands, ["true"]);
    assert_eq!(config.hooks.pre_tool_use[0].timeout_ms, 60_000);
    assert_eq!(config.hooks.pre_tool_use[0].on_error, crate::hooks::OnError::Allow);
}

#[test]
fn a_missing_explicit_file_is_an_error() {
    let fixture = Fixture::new();
    let options =
        LoadOptions { explicit: Some(fixture.root.join("nope.toml")), ..fixture.options() };
    expect!["$T/nope.toml: No such file or directory (os error 2)"]
        .assert_eq(&fixture.error(&options));
}

#[test]
fn a_syntax_error_names_file_line_and_column() {
    check_user_error(
        "[server]\nmax_connections = 10\nevent_buffer = = 3\n",
        expect!["$T/home/.config/toolgate/config.toml:3:16: extra `=`, expected nothing"],
    );
    check_user_error(
        "[limits]\nmax_read_bytes = 1\nmax_read_bytes = 2\n",
        expect!["$T/home/.config/toolgate/config.toml:3:1: duplicate key"],
    );
}

#[test]
fn a_bad_value_names_file_line_and_key() {
    check_user_error(
        "# my settings\n[limits]\n\ndefault_timeout_ms = \"x\"\n",
        expect![[
            r#"$T/home/.config/toolgate/config.toml:4:1: [limits] default_timeout_ms must be a whole number, not the text "x""#
        ]],
    );
    check_user_error(
        "[server]\nmax_connections = -3\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [server] max_connections must be a whole number, 0 or more, not the number -3"
        ],
    );
    check_user_error(
        "[server]\ntcp = \"localhost:80\"\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [server] tcp: invalid socket address syntax"
        ],
    );
    check_user_error(
        "[workspace]\nroots = [\n  \".\",\n  42,\n]\n",
        expect![
            "$T/home/.config/toolgate/config.toml:4:3: [workspace] roots #2 must be text in quotes, not the number 42"
        ],
    );
    check_user_error(
        "[server]\naudit_log = 3\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [server] audit_log must be true, false or a path, not the number 3"
        ],
    );
}

#[test]
fn a_bad_value_is_blamed_on_the_layer_that_set_it() {
    let fixture = Fixture::new();
    fixture.system_file("[limits]\nmax_read_bytes = 1\n\ndefault_timeout_ms = true\n");
    fixture.user_file("[limits]\nmax_read_bytes = 2\n");
    expect!["$T/etc/toolgate/config.toml:4:1: [limits] default_timeout_ms must be a whole number, not true"]
        .assert_eq(&fixture.error(&fixture.options()));

    // Overridden by a later layer, the bad value no longer matters.
    fixture.user_file("[limits]\ndefault_timeout_ms = 5\n");
    assert_eq!(fixture.load().limits.default_timeout_ms, 5);
}

#[test]
fn an_unknown_key_is_named_with_its_place() {
    check_user_error(
        "[limits]\nmax_read_bytes = 1\ndefault_timeout = 5\n",
        expect![
            "$T/home/.config/toolgate/config.toml:3:1: [limits] default_timeout: unknown field `default_timeout`, expected one of `default_timeout_ms`, `max_timeout_ms`, `max_output_bytes`, `max_read_bytes`, `approval_timeout_ms`, `max_background_processes`, `process_output_bytes`, `session_process_output_bytes`, `detached_session_ttl_ms`, `on_timeout`"
        ],
    );
    check_user_error(
        "\n[permission]\nmode = \"plan\"\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:2: permission: unknown field `permission`, expected one of `server`, `workspace`, `limits`, `permissions`, `hooks`, `mcp_servers`, `skills`, `env`, `audit`, `sandbox`"
        ],
    );
    check_user_error(
        "[[mcp_servers]]\nname = \"git\"\ncommand = \"uvx\"\n\n[[mcp_servers]]\nname = \"web\"\nurl = \"https://example.test/mcp\"\ntrust = true\n",
        expect![
            "$T/home/.config/toolgate/config.toml:8:1: [[mcp_servers]] #2 trust: unknown field `trust`, expected one of `name`, `command`, `args`, `env`, `cwd`, `url`, `headers`, `startup_timeout_ms`, `call_timeout_ms`, `trust_annotations`, `sandbox`, `writable`, `readable`, `network`"
        ],
    );
    check_user_error(
        "[[hooks.post_tool_use]]\ncommand = \"x\"\ntimeout = 5\n",
        expect![
            "$T/home/.config/toolgate/config.toml:3:1: [[hooks.post_tool_use]] #1 timeout: unknown field `timeout`, expected one of `matcher`, `command`, `timeout_ms`, `on_error`, `format`"
        ],
    );
}

#[test]
fn a_missing_required_key_points_at_its_table() {
    check_user_error(
        "[permissions]\nmode = \"plan\"\n\n[[mcp_servers]]\ncommand = \"uvx\"\n",
        expect!["$T/home/.config/toolgate/config.toml:4:1: mcp_servers #1: missing field `name`"],
    );
}

#[test]
fn an_unknown_mode_is_refused() {
    check_user_error(
        "[permissions]\nmode = \"yolo\"\n",
        expect![[
            r#"$T/home/.config/toolgate/config.toml:2:1: [permissions] mode: unknown mode "yolo", expected one of default, accept_edits, plan, bypass, dont_ask"#
        ]],
    );
    let fixture = Fixture::new();
    for mode in PERMISSION_MODES {
        fixture.user_file(&format!("[permissions]\nmode = \"{mode}\"\n"));
        assert_eq!(fixture.load().permissions.mode, mode);
    }
}

#[test]
fn hooks_are_validated() {
    check_user_error(
        "[[hooks.pre_tool_use]]\nmatcher = \"run_command\"\ncommand = \"true\"\n\n[[hooks.pre_tool_use]]\nmatcher = \"(edit|write\"\ncommand = \"b\"\n",
        expect![[
            r#"$T/home/.config/toolgate/config.toml:6:1: [[hooks.pre_tool_use]] #2 matcher: "(edit|write" is not a valid regex: error: unclosed group"#
        ]],
    );
    check_user_error(
        "[[hooks.post_tool_use]]\ncommand = \"  \"\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [[hooks.post_tool_use]] #1 command: must not be empty"
        ],
    );
    check_user_error(
        "[[hooks.post_tool_use]]\ncommand = \"x\"\ntimeout_ms = 0\n",
        expect![
            "$T/home/.config/toolgate/config.toml:3:1: [[hooks.post_tool_use]] #1 timeout_ms: must be greater than zero"
        ],
    );
    check_user_error(
        "[[hooks.post_tool_use]]\ncommand = \"x\"\non_error = \"maybe\"\n",
        expect![
            r#"$T/home/.config/toolgate/config.toml:3:1: [[hooks.post_tool_use]] #1 on_error must be "allow" or "deny", not "maybe""#
        ],
    );

    check_user_error(
        "[[hooks.pre_tool_use]]\ncommand = \"true\"\n[[hooks.pre_tool_use]]\ncommand = \"~/hooks/check.sh --strict\"\n",
        expect![[
            r#"$T/home/.config/toolgate/config.toml:4:1: [[hooks.pre_tool_use]] #2 command: "~/hooks/check.sh --strict" cannot run: $T/home/hooks/check.sh does not exist"#
        ]],
    );
    check_user_error(
        "[[hooks.post_tool_use]]\ncommand = \"no-such-hook-program x\"\n[env]\nset = { PATH = \"/nonexistent\" }\n",
        expect![[
            r#"$T/home/.config/toolgate/config.toml:2:1: [[hooks.post_tool_use]] #1 command: "no-such-hook-program x" cannot run: `no-such-hook-program` is not a program in any directory of PATH (/nonexistent)"#
        ]],
    );

    let fixture = Fixture::new();
    fixture.user_file(
        "[[hooks.pre_tool_use]]\nmatcher = \"*\"\ncommand = \"~/hooks/check.sh\"\ntimeout_ms = 10000\non_error = \"deny\"\n",
    );
    let script = fixture.home.join("hooks").join("check.sh");
    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    fixture.write(&script, "#!/bin/sh\n");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // The script is the user's own: the daemon runs as its owner.
    let options = LoadOptions { uid: rustix::process::geteuid().as_raw(), ..fixture.options() };
    assert_eq!(
        Config::load(&options).unwrap().hooks.pre_tool_use,
        vec![HookConfig {
            matcher: "*".to_owned(),
            command: "~/hooks/check.sh".to_owned(),
            timeout_ms: 10_000,
            on_error: crate::hooks::OnError::Deny,
            format: crate::hooks::HookFormat::Auto,
        }]
    );
}

#[test]
fn mcp_servers_are_validated() {
    let cases = [
        (
            "[[mcp_servers]]\nname = \"git\"\ncommand = \"uvx\"\nurl = \"http://127.0.0.1:1/mcp\"\n",
            expect![
                "$T/home/.config/toolgate/config.toml:4:1: [[mcp_servers]] #1 url: set either command (stdio) or url (Streamable HTTP), not both"
            ],
        ),
        (
            "[[mcp_servers]]\nname = \"git\"\nargs = [\"x\"]\n",
            expect![
                "$T/home/.config/toolgate/config.toml:1:1: mcp_servers #1: set either command (stdio) or url (Streamable HTTP)"
            ],
        ),
        (
            "[[mcp_servers]]\nname = \"my server\"\ncommand = \"x\"\n",
            expect![[
                r#"$T/home/.config/toolgate/config.toml:2:1: [[mcp_servers]] #1 name: "my server" is not a valid server name: use letters, digits, `_` and `-`"#
            ]],
        ),
        (
            "[[mcp_servers]]\nname = \"\"\ncommand = \"x\"\n",
            expect![[
                r#"$T/home/.config/toolgate/config.toml:2:1: [[mcp_servers]] #1 name: "" is not a valid server name: use letters, digits, `_` and `-`"#
            ]],
        ),
        (
            "[[mcp_servers]]\nname = \"git\"\ncommand = \"x\"\n[[mcp_servers]]\nname = \"git\"\nurl = \"https://h/mcp\"\n",
            expect![[
                r#"$T/home/.config/toolgate/config.toml:5:1: [[mcp_servers]] #2 name: another server is already named "git""#
            ]],
        ),
        (
            "[[mcp_servers]]\nname = \"git\"\ncommand = \"x\"\nheaders = { A = \"b\" }\n",
            expect![
                "$T/home/.config/toolgate/config.toml:4:1: [[mcp_servers]] #1 headers: headers apply to a url server; a stdio server takes env"
            ],
        ),
        (
            "[[mcp_servers]]\nname = \"web\"\nurl = \"https://h/mcp\"\nenv = { A = \"b\" }\n",
            expect![
                "$T/home/.config/toolgate/config.toml:4:1: [[mcp_servers]] #1 env: env applies to a stdio server (command); a url server takes headers"
            ],
        ),
        (
            "[[mcp_servers]]\nname = \"web\"\nurl = \"ftp://h/mcp\"\n",
            expect![[
                r#"$T/home/.config/toolgate/config.toml:3:1: [[mcp_servers]] #1 url: "ftp://h/mcp" is not an http:// or https:// URL"#
            ]],
        ),
        (
            "[[mcp_servers]]\nname = \"web\"\nurl = \"https://h/mcp\"\ncall_timeout_ms = 700000\n",
            expect![
                "$T/home/.config/toolgate/config.toml:4:1: [[mcp_servers]] #1 call_timeout_ms: 700000 is more than [limits] max_timeout_ms (600000)"
            ],
        ),
        (
            "[[mcp_servers]]\nname = \"web\"\nurl = \"https://h/mcp\"\nstartup_timeout_ms = 0\n",
            expect![
                "$T/home/.config/toolgate/config.toml:4:1: [[mcp_servers]] #1 startup_timeout_ms: must be greater than zero"
            ],
        ),
    ];
    for (text, expected) in cases {
        check_user_error(text, expected);
    }
}

#[test]
fn mcp_servers_load_with_their_transport() {
    let fixture = Fixture::new();
    fixture.user_file(
        r#"
[[mcp_servers]]
name = "git"
command = "uvx"
args = ["mcp-server-git"]
env = { GIT_DIR = ".git" }
cwd = "~/src"

[[mcp_servers]]
name = "web-search_2"
url = "https://example.test/mcp"
headers = { Authorization = "Bearer x" }
trust_annotations = true
call_timeout_ms = 5000
"#,
    );
    let config = fixture.load();
    let servers = &config.mcp_servers;
    assert_eq!(servers.len(), 2);
    let home_src = fixture.home.join("src");
    assert_eq!(
        servers[0].transport(),
        McpTransport::Stdio {
            command: "uvx",
            args: &["mcp-server-git".to_owned()],
            env: &BTreeMap::from([("GIT_DIR".to_owned(), ".git".to_owned())]),
            cwd: Some(home_src.as_path()),
        }
    );
    assert!(!servers[0].trust_annotations);
    assert_eq!(servers[0].startup_timeout(), Duration::from_secs(30));
    assert_eq!(servers[0].call_timeout(), None);
    assert_eq!(
        servers[1].transport(),
        McpTransport::StreamableHttp {
            url: "https://example.test/mcp",
            headers: &BTreeMap::from([("Authorization".to_owned(), "Bearer x".to_owned())]),
        }
    );
    assert!(servers[1].trust_annotations);
    assert_eq!(servers[1].call_timeout(), Some(Duration::from_secs(5)));
}

#[test]
fn roots_resolve_against_the_start_directory() {
    let fixture = Fixture::new();
    std::fs::create_dir_all(fixture.start.join("sub")).unwrap();
    std::fs::create_dir_all(fixture.home.join("proj")).unwrap();
    let elsewhere = fixture.root.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, fixture.start.join("link")).unwrap();
    fixture.user_file(&format!(
        "[workspace]\nroots = [\".\", \"sub\", \"./sub/../sub\", \"~/proj\", {:?}, \"link\"]\n",
        elsewhere.to_str().unwrap()
    ));
    let config = fixture.load();
    assert_eq!(
        config.workspace.roots,
        vec![
            fixture.start.clone(),
            fixture.start.join("sub"),
            fixture.home.join("proj"),
            elsewhere
        ]
    );
    assert_eq!(config.session_env("s").cwd, fixture.start);
    assert_eq!(config.session_env("s").roots, config.workspace.roots);
}

#[test]
fn a_missing_root_is_an_error_naming_it() {
    check_user_error(
        "[workspace]\nroots = [\n  \".\",\n  \"gone\",\n]\n",
        expect![
            "$T/home/.config/toolgate/config.toml:4:3: [workspace] roots #2: workspace root $T/project/gone does not exist: No such file or directory (os error 2)"
        ],
    );
    check_user_error(
        "[workspace]\nroots = []\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [workspace] roots: at least one root is required"
        ],
    );
    let fixture = Fixture::new();
    fixture.write(&fixture.start.join("file"), "");
    expect!["$T/home/.config/toolgate/config.toml:2:10: [workspace] roots #1: workspace root $T/project/file is not a directory"]
        .assert_eq(&fixture.user_error("[workspace]\nroots = [\"file\"]\n"));
}

#[test]
fn tilde_is_expanded() {
    let fixture = Fixture::new();
    fixture.user_file(
        r#"
[server]
socket = "~/sock/toolgate.sock"
token_file = "~/.config/toolgate/token"
audit_log = "~"
[skills]
dirs = ["~/skills", "rel/skills", "/abs/skills"]
"#,
    );
    let config = fixture.load();
    assert_eq!(config.server.socket, fixture.home.join("sock/toolgate.sock"));
    assert_eq!(config.server.token_file, Some(fixture.home.join(".config/toolgate/token")));
    assert_eq!(config.server.audit_log, Some(fixture.home.clone()));
    assert_eq!(
        config.skills.dirs,
        vec![fixture.home.join("skills"), fixture.start.join("rel/skills"), "/abs/skills".into()]
    );

    check_user_error(
        "[server]\ntoken_file = \"~root/token\"\n",
        expect![[
            r#"$T/home/.config/toolgate/config.toml:2:1: [server] token_file: only `~` and `~/` are expanded, not "~root/token""#
        ]],
    );
    let fixture = Fixture::new();
    fixture.user_file("[server]\ntoken_file = \"~/token\"\n");
    let options = LoadOptions { home: None, ..fixture.options() };
    expect![[r#"$T/home/.config/toolgate/config.toml:2:1: [server] token_file: cannot expand `~` in "~/token": the home directory is unknown"#]]
        .assert_eq(&fixture.error(&options));
}

#[test]
fn audit_log_can_be_turned_off() {
    let fixture = Fixture::new();
    for off in ["false", "\"\""] {
        fixture.user_file(&format!("[server]\naudit_log = {off}\n"));
        assert_eq!(fixture.load().server.audit_log, None, "{off}");
    }
    fixture.user_file("[server]\naudit_log = \"logs/audit.jsonl\"\n");
    assert_eq!(fixture.load().server.audit_log, Some(fixture.start.join("logs/audit.jsonl")));
}

#[test]
fn limits_are_validated() {
    check_user_error(
        "[limits]\ndefault_timeout_ms = 700000\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [limits] default_timeout_ms: default_timeout_ms (700000) is more than max_timeout_ms (600000)"
        ],
    );
    // The key set last is the one blamed.
    check_user_error(
        "[limits]\nmax_timeout_ms = 1000\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [limits] max_timeout_ms: default_timeout_ms (120000) is more than max_timeout_ms (1000)"
        ],
    );
    check_user_error(
        "[limits]\nmax_read_bytes = 0\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [limits] max_read_bytes: must be greater than zero"
        ],
    );
    check_user_error(
        "[server]\nmax_calls_per_session = 0\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [server] max_calls_per_session: must be greater than zero"
        ],
    );
    check_user_error(
        "[permissions]\ndeny = [\"read_file\", \" \"]\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:22: [permissions] deny #2: a rule must not be empty"
        ],
    );
    check_user_error(
        "[env]\nexclude = [\"\"]\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:12: [env] exclude #1: an empty pattern would exclude every variable"
        ],
    );
    check_user_error(
        "[env.set]\n\"A=B\" = \"x\"\n",
        expect![[
            r#"$T/home/.config/toolgate/config.toml:2:1: [env.set] A=B: "A=B" is not a valid environment variable name"#
        ]],
    );
}

#[test]
fn a_listener_beyond_loopback_needs_a_token() {
    check_user_error(
        "[server]\nmcp_http = \"0.0.0.0:7811\"\n",
        expect![
            "$T/home/.config/toolgate/config.toml:2:1: [server] mcp_http: 0.0.0.0:7811 is reachable beyond this machine; set [server] token_file so that clients must present a bearer token"
        ],
    );
    check_user_error(
        "[server]\ntcp = \"127.0.0.1:7810\"\nmcp_http = \"127.0.0.1:7810\"\n",
        expect![
            "$T/home/.config/toolgate/config.toml:3:1: [server] mcp_http: 127.0.0.1:7810 is also the tcp address; the two endpoints need their own"
        ],
    );
    let fixture = Fixture::new();
    fixture.user_file(
        "[server]\ntcp = \"[::1]:7810\"\nmcp_http = \"0.0.0.0:7811\"\ntoken_file = \"/etc/toolgate/token\"\n",
    );
    let server = fixture.load().server;
    assert_eq!(server.tcp, Some("[::1]:7810".parse::<SocketAddr>().unwrap()));
    assert_eq!(server.mcp_http, Some("0.0.0.0:7811".parse::<SocketAddr>().unwrap()));
}

#[test]
fn env_policy_keeps_secrets_and_service_manager_variables_out() {
    let fixture = Fixture::new();
    fixture.user_file("[env]\nexclude = [\"AWS_\"]\nset = { CI = \"1\", LANG = \"C.UTF-8\" }\n");
    let policy = fixture.load().env_policy();
    assert!(policy.inherit);
    for name in ["GITHUB_TOKEN", "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_FDNAMES", "WATCHDOG_USEC"] {
        assert!(!policy.inherits(name), "{name}");
    }
    assert!(!policy.inherits("aws_region"));
    assert!(policy.inherits("PATH"));
    assert_eq!(
        policy.set,
        vec![("CI".to_owned(), "1".to_owned()), ("LANG".to_owned(), "C.UTF-8".to_owned())]
    );

    fixture.user_file("[env]\ninherit = false\n");
    assert!(!fixture.load().env_policy().inherits("PATH"));
}

#[test]
fn the_dump_loads_back_to_the_same_configuration() {
    let fixture = Fixture::new();
    std::fs::create_dir_all(fixture.start.join("sub")).unwrap();
    fixture.user_file(
        r#"
[server]
tcp = "127.0.0.1:7810"
token_file = "~/token"
audit_log = false
[workspace]
roots = [".", "sub"]
[permissions]
mode = "accept_edits"
allow = ["run_command(git status:*)"]
[[hooks.pre_tool_use]]
matcher = "run_command"
command = "true"
[[mcp_servers]]
name = "git"
command = "uvx"
args = ["mcp-server-git"]
[[mcp_servers]]
name = "web"
url = "http://127.0.0.1:9/mcp"
[env]
set = { CI = "1" }
"#,
    );
    let config = fixture.load();
    let dump = config.to_toml_string().unwrap();
    let replay = Fixture::new();
    let path = replay.write(&replay.root.join("dump.toml"), &dump);
    let options =
        LoadOptions { explicit: Some(path), system_dir: None, user_dir: None, ..replay.options() };
    let reloaded = Config::load(&options).unwrap();
    assert_eq!(Config { sources: vec![], ..reloaded }, Config { sources: vec![], ..config });
}

#[test]
fn the_dump_hides_secret_looking_values() {
    let fixture = Fixture::new();
    fixture.user_file(
        r#"
[env]
set = { API_TOKEN = "t0ps3cret", CI = "1" }
[[mcp_servers]]
name = "web"
url = "https://h/mcp"
headers = { Authorization = "Bearer abc", Accept = "text/event-stream" }
"#,
    );
    let dump = fixture.load().to_toml_string().unwrap();
    assert!(!dump.contains("t0ps3cret") && !dump.contains("Bearer abc"), "{dump}");
    let table: toml::Table = toml::from_str(&dump).unwrap();
    assert_eq!(table["env"]["set"]["API_TOKEN"].as_str(), Some("[redacted]"));
    assert_eq!(table["env"]["set"]["CI"].as_str(), Some("1"));
    assert_eq!(table["mcp_servers"][0]["headers"]["Accept"].as_str(), Some("text/event-stream"));
}

#[test]
fn every_key_is_documented_in_the_defaults() {
    // Every key a full configuration has appears in default.toml, set or commented
    // out, under its own section.
    let fixture = Fixture::new();
    fixture.user_file(
        "[server]\ntcp = \"127.0.0.1:1\"\nmcp_http = \"127.0.0.1:2\"\ntoken_file = \"/t\"\n",
    );
    let dump = fixture.load().to_toml_string().unwrap();
    let table: toml::Table = toml::from_str(&dump).unwrap();
    let mut section = String::new();
    let mut documented = std::collections::HashSet::new();
    for line in DEFAULT_TOML.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
        } else if let Some((key, _)) = line.trim_start_matches("# ").split_once(" = ")
            && !key.contains(' ')
        {
            documented.insert(format!("{section}.{key}"));
        }
    }
    for (name, value) in &table {
        match value {
            toml::Value::Table(keys) => {
                for key in keys.keys() {
                    let full = format!("{name}.{key}");
                    assert!(documented.contains(&full), "{full} is not in default.toml");
                }
            }
            _ => assert!(documented.contains(&format!(".{name}")), "{name} is not in default.toml"),
        }
    }
}

#[test]
fn key_paths_render_for_humans() {
    let key = |s: &str| Seg::Key(s.to_owned());
    let cases = [
        (vec![key("limits"), key("max_read_bytes")], "[limits] max_read_bytes"),
        (vec![key("env"), key("set"), key("A")], "[env.set] A"),
        (vec![key("workspace"), key("roots"), Seg::Index(0)], "[workspace] roots #1"),
        (vec![key("mcp_servers"), Seg::Index(2), key("env"), key("K")], "[[mcp_servers]] #3 env.K"),
        (
            vec![key("mcp_servers"), Seg::Index(0), key("args"), Seg::Index(1)],
            "[[mcp_servers]] #1 args #2",
        ),
        (vec![key("mcp_servers"), Seg::Index(0)], "mcp_servers #1"),
        (vec![key("bogus")], "bogus"),
        (vec![], ""),
    ];
    for (path, expected) in cases {
        assert_eq!(render_key(&path), expected);
    }
}

#[test]
fn line_and_column_count_characters() {
    let text = "a = 1\nété = 2\n";
    assert_eq!(line_column(text, 0), (1, 1));
    assert_eq!(line_column(text, 6), (2, 1));
    assert_eq!(line_column(text, text.find('=').unwrap()), (1, 3));
    let second_eq = text.rfind('=').unwrap();
    assert_eq!(line_column(text, second_eq), (2, 5));
    assert_eq!(line_column(text, text.len() + 10), (3, 1));
}

#[test]
fn from_process_reads_only_absolute_xdg_directories() {
    // The real process: whatever its environment, the options are well formed.
    let options = LoadOptions::from_process(None).unwrap();
    assert_eq!(options.system_dir, Some(PathBuf::from("/etc/toolgate")));
    assert!(options.start_dir.is_absolute());
    for dir in [&options.user_dir, &options.runtime_dir, &options.state_home, &options.home]
        .into_iter()
        .flatten()
    {
        assert!(dir.is_absolute(), "{}", dir.display());
    }
    assert_eq!(options.uid, rustix::process::getuid().as_raw());
}

#[test]
fn rules_naming_no_tool_are_located_errors() {
    let fixture = Fixture::new();
    fixture.user_file("[permissions]\ndeny = [\n  \"Bash(rm:*)\",\n  \"run_comand(rm:*)\",\n]\n");
    let err = Config::load(&fixture.options()).err().map(|err| err.to_string()).unwrap_or_default();
    assert!(err.contains("config.toml:4:3: [permissions] deny #2: invalid rule"), "{err}");
    assert!(err.contains("\"run_comand\""), "{err}");
}

#[test]
fn trusted_files_follow_openssh() {
    use std::os::unix::fs::PermissionsExt;
    let fixture = Fixture::new();
    let uid = rustix::process::geteuid().as_raw();
    let dir = fixture.root.join("trust");
    std::fs::create_dir(&dir).unwrap();
    let file = fixture.write(&dir.join("config.toml"), "");
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let check = || check_trusted(&file, uid).err().map(|err| err.to_string());
    chmod(&dir, 0o755);
    chmod(&file, 0o644);
    assert_eq!(check(), None);
    chmod(&file, 0o646);
    let err = check().unwrap_or_default();
    assert!(err.contains("writable by every user (mode 0646)"), "{err}");
    assert!(err.contains(&format!("run `chmod go-w {}`", file.display())), "{err}");
    chmod(&file, 0o600);
    chmod(&dir, 0o775);
    let err = check().unwrap_or_default();
    assert!(err.contains(&format!("the directory {} on its path", dir.display())), "{err}");
    // A sticky directory owned by root, such as /tmp, is fine.
    chmod(&dir, 0o755);
    if uid == 0 {
        chmod(&dir, 0o1777);
        assert_eq!(check(), None);
        chmod(&dir, 0o755);
        // Another owner, for a daemon running as root.
        std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
        let err = check().unwrap_or_default();
        assert!(err.contains("is owned by uid 65534, not by root or uid 0"), "{err}");
    }
    // The same file is another user's for a daemon running as someone else.
    if uid != 12345 {
        let err = check_trusted(&file, 12345).err().map(|err| err.to_string()).unwrap_or_default();
        assert!(err.contains("owned by uid"), "{err}");
    }
}
