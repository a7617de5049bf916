//! `toolgate doctor --host`: whether an MCP host's own file and shell tools are off and
//! toolgate is its MCP server, read from the host's settings files for the current
//! user and project; and the settings that make it so (`--print-config`).
//!
//! Every key read here is one the host documents (or lists in its own `features list`):
//! Claude Code's `permissions.deny` in `settings.json` (a bare tool name takes the tool
//! away), its MCP servers in `~/.claude.json` and `.mcp.json`; Codex's `[features]`
//! `shell_tool` and `view_image`, `sandbox_mode`, `approval_policy` and `[mcp_servers]`
//! in `config.toml` and its profiles (`NAME.config.toml`). Nothing is written.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The hosts `doctor` knows how to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    ClaudeCode,
    Codex,
}

/// One line of the report: a fact about the host's configuration, and whether it is
/// what locking the host down needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub ok: bool,
    pub text: String,
}

/// What `doctor` found; locked down when every finding is ok.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    fn ok(&mut self, text: impl Into<String>) {
        self.findings.push(Finding { ok: true, text: text.into() });
    }

    fn fail(&mut self, text: impl Into<String>) {
        self.findings.push(Finding { ok: false, text: text.into() });
    }

    /// Whether toolgate is the host's only way to files and commands.
    pub fn locked_down(&self) -> bool {
        self.findings.iter().all(|finding| finding.ok)
    }

    /// One line per finding (`ok` or `FAIL`), then the verdict.
    pub fn render(&self, host: Host) -> String {
        let mut out = String::new();
        for finding in &self.findings {
            out.push_str(if finding.ok { "ok    " } else { "FAIL  " });
            out.push_str(&finding.text);
            out.push('\n');
        }
        let failed = self.findings.iter().filter(|finding| !finding.ok).count();
        if failed == 0 {
            out.push_str(&format!(
                "{} is locked down: its own file and shell tools are off, toolgate is its MCP server\n",
                host.name()
            ));
        } else {
            out.push_str(&format!(
                "{} is not locked down ({failed} of {} findings fail); `toolgate doctor --host {} \
                 --print-config` prints the settings that lock it down\n",
                host.name(),
                self.findings.len(),
                host.flag()
            ));
        }
        out
    }
}

impl Host {
    /// As people write it.
    pub fn name(self) -> &'static str {
        match self {
            Host::ClaudeCode => "Claude Code",
            Host::Codex => "Codex",
        }
    }

    /// As `--host` takes it.
    pub fn flag(self) -> &'static str {
        match self {
            Host::ClaudeCode => "claude-code",
            Host::Codex => "codex",
        }
    }
}

/// Where a host's files are looked for: the user's home (and Codex's home), and the
/// project (the directory the host is started in).
#[derive(Clone, Debug)]
pub struct Places {
    pub home: PathBuf,
    /// `$CODEX_HOME`, when set; else `~/.codex`.
    pub codex_home: Option<PathBuf>,
    pub project: PathBuf,
    /// Claude Code's managed settings (`/etc/claude-code/managed-settings.json`).
    pub managed_settings: PathBuf,
}

impl Places {
    /// The places of this process: `$HOME`, `$CODEX_HOME`, the project given (else the
    /// current directory).
    pub fn of_this_process(project: Option<PathBuf>) -> std::io::Result<Places> {
        let home = std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "HOME is not set"))?;
        let project = match project {
            Some(project) => std::path::absolute(project)?,
            None => std::env::current_dir()?,
        };
        Ok(Places {
            home: PathBuf::from(home),
            codex_home: std::env::var_os("CODEX_HOME")
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from),
            project,
            managed_settings: PathBuf::from("/etc/claude-code/managed-settings.json"),
        })
    }
}

/// Reads the host's files and reports.
pub fn check(host: Host, places: &Places) -> Report {
    match host {
        Host::ClaudeCode => check_claude_code(places),
        Host::Codex => check_codex(places),
    }
}

/// The settings that lock the host down, as the host's own files take them.
pub fn lockdown_config(host: Host) -> String {
    match host {
        Host::ClaudeCode => {
            let settings = serde_json::json!({
                "permissions": { "deny": CLAUDE_CODE_TOOLS },
                "enabledMcpjsonServers": ["toolgate"],
            });
            let servers = serde_json::json!({
                "mcpServers": { "toolgate": {
                    "command": "toolgate",
                    "args": ["mcp", "--root", ".", "--mode", "accept_edits"],
                }}
            });
            format!(
                "# .claude/settings.json\n{}\n# .mcp.json\n{}\n",
                pretty(&settings),
                pretty(&servers)
            )
        }
        Host::Codex => CODEX_LOCKDOWN.to_owned(),
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

// --- Claude Code -----------------------------------------------------------------------

/// Claude Code's built-in tools that read or write files or run commands. A bare name in
/// `permissions.deny` removes the tool from the model's context (`MultiEdit` is the
/// name older releases gave the multi-edit tool).
pub const CLAUDE_CODE_TOOLS: &[&str] =
    &["Bash", "Read", "Edit", "MultiEdit", "Write", "NotebookEdit", "Glob", "Grep"];

fn check_claude_code(places: &Places) -> Report {
    let mut report = Report::default();
    let settings_files = [
        places.managed_settings.clone(),
        places.home.join(".claude/settings.json"),
        places.project.join(".claude/settings.json"),
        places.project.join(".claude/settings.local.json"),
    ];
    let mut settings = Vec::new();
    for path in &settings_files {
        match read_json(path) {
            Ok(Some(value)) => settings.push((path.clone(), value)),
            Ok(None) => {}
            Err(err) => report.fail(err),
        }
    }

    // toolgate among the MCP servers: user and local scope in ~/.claude.json, project
    // scope in .mcp.json.
    let mut servers = Vec::new();
    let user_file = places.home.join(".claude.json");
    match read_json(&user_file) {
        Ok(Some(value)) => {
            collect_json_servers(&value["mcpServers"], &user_file, "user scope", &mut servers);
            if let Some(projects) = value["projects"].as_object() {
                for (dir, project) in projects {
                    if same_dir(Path::new(dir), &places.project) {
                        collect_json_servers(
                            &project["mcpServers"],
                            &user_file,
                            "local scope, this project",
                            &mut servers,
                        );
                    }
                }
            }
        }
        Ok(None) => {}
        Err(err) => report.fail(err),
    }
    let project_file = places.project.join(".mcp.json");
    match read_json(&project_file) {
        Ok(Some(value)) => {
            let mut found = Vec::new();
            collect_json_servers(&value["mcpServers"], &project_file, "project scope", &mut found);
            for server in found {
                if string_in(&settings, "disabledMcpjsonServers", &server.name) {
                    report.fail(format!(
                        "{} in {} is turned off by disabledMcpjsonServers",
                        server.describe(),
                        project_file.display()
                    ));
                } else {
                    servers.push(server);
                }
            }
        }
        Ok(None) => {}
        Err(err) => report.fail(err),
    }
    report_servers(&mut report, &servers, "claude mcp add toolgate -- toolgate mcp --root .");

    for tool in CLAUDE_CODE_TOOLS {
        let denied_in = settings.iter().find(|(_, value)| {
            value["permissions"]["deny"]
                .as_array()
                .is_some_and(|rules| rules.iter().any(|rule| rule.as_str() == Some(tool)))
        });
        match denied_in {
            Some((path, _)) => report.ok(format!("{tool} is off: denied in {}", path.display())),
            None => {
                let allowed = settings.iter().find(|(_, value)| {
                    value["permissions"]["allow"].as_array().is_some_and(|rules| {
                        rules.iter().filter_map(Value::as_str).any(|rule| rule_names(rule, tool))
                    })
                });
                match allowed {
                    Some((path, _)) => report.fail(format!(
                        "{tool} is on, and allowed in {}: add \"{tool}\" to permissions.deny",
                        path.display()
                    )),
                    None => report.fail(format!(
                        "{tool} is on: no settings file has \"{tool}\" in permissions.deny"
                    )),
                }
            }
        }
    }
    report
}

/// Whether a permission rule names the tool: `Bash` or `Bash(...)`.
fn rule_names(rule: &str, tool: &str) -> bool {
    rule == tool || rule.strip_prefix(tool).is_some_and(|rest| rest.starts_with('('))
}

/// Whether any settings file lists `name` in its array `key`.
fn string_in(settings: &[(PathBuf, Value)], key: &str, name: &str) -> bool {
    settings.iter().any(|(_, value)| {
        value[key].as_array().is_some_and(|names| names.iter().any(|n| n.as_str() == Some(name)))
    })
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
}

// --- Codex -----------------------------------------------------------------------------

/// Codex's feature flags (`codex features list`) for its built-in tools that run
/// commands or read files, each on by default: `shell_tool` (off, Codex offers no shell
/// tool of any kind: `unified_exec` only chooses which one it offers), `view_image`
/// (reads an image file from disk).
pub const CODEX_FEATURES: &[&str] = &["shell_tool", "view_image"];

const CODEX_LOCKDOWN: &str = r#"# ~/.codex/config.toml (or $CODEX_HOME/config.toml)
# Codex's own tools that run commands or read files: off.
# Its apply_patch tool has no switch; in a read-only sandbox with approval_policy
# "never", every write it tries is refused.
sandbox_mode = "read-only"
approval_policy = "never"

[features]
shell_tool = false
view_image = false

[mcp_servers.toolgate]
command = "toolgate"
args = ["mcp", "--root", ".", "--mode", "default"]
"#;

fn check_codex(places: &Places) -> Report {
    let mut report = Report::default();
    let codex_home = places.codex_home.clone().unwrap_or_else(|| places.home.join(".codex"));
    // The user's file, then the project's (loaded by Codex for a trusted project; it
    // overrides the user's).
    let files = [codex_home.join("config.toml"), places.project.join(".codex/config.toml")];
    let mut layers = Vec::new();
    for path in &files {
        match read_toml(path) {
            Ok(Some(table)) => layers.push((path.clone(), table)),
            Ok(None) => {}
            Err(err) => report.fail(err),
        }
    }
    if layers.is_empty() {
        report.fail(format!("no Codex configuration file: {} does not exist", files[0].display()));
    }

    let mut servers = Vec::new();
    for (path, table) in &layers {
        let Some(entries) = table.get("mcp_servers").and_then(toml::Value::as_table) else {
            continue;
        };
        for (name, entry) in entries {
            let server = Server {
                name: name.clone(),
                command: entry.get("command").and_then(toml::Value::as_str).map(str::to_owned),
                args: entry
                    .get("args")
                    .and_then(toml::Value::as_array)
                    .map(|args| {
                        args.iter().filter_map(toml::Value::as_str).map(str::to_owned).collect()
                    })
                    .unwrap_or_default(),
                url: entry.get("url").and_then(toml::Value::as_str).map(str::to_owned),
                file: path.clone(),
                scope: "",
            };
            if !server.is_toolgate() {
                continue;
            }
            if entry.get("enabled").and_then(toml::Value::as_bool) == Some(false) {
                report.fail(format!(
                    "{} in {} is turned off (enabled = false)",
                    server.describe(),
                    path.display()
                ));
                continue;
            }
            servers.push(server);
        }
    }
    report_servers(&mut report, &servers, "codex mcp add toolgate -- toolgate mcp --root .");

    for feature in CODEX_FEATURES {
        match last_setting(&layers, &["features", feature]) {
            Some((path, toml::Value::Boolean(false))) => report
                .ok(format!("{feature} is off: features.{feature} = false in {}", path.display())),
            Some((path, value)) => report.fail(format!(
                "{feature} is on: features.{feature} = {value} in {}",
                path.display()
            )),
            None => report.fail(format!(
                "{feature} is on (the default): no file sets features.{feature} = false"
            )),
        }
    }
    // apply_patch cannot be turned off; a read-only sandbox without approvals refuses
    // its writes (and any command's).
    let mut refused = true;
    for (key, wanted) in [("sandbox_mode", "read-only"), ("approval_policy", "never")] {
        match last_setting(&layers, &[key]) {
            Some((path, toml::Value::String(value))) if value == wanted => {
                report.ok(format!("{key} = \"{wanted}\" in {}", path.display()))
            }
            Some((path, value)) => {
                refused = false;
                report.fail(format!("{key} = {value} in {}, not \"{wanted}\"", path.display()))
            }
            None => {
                refused = false;
                report.fail(format!("{key} is not set (\"{wanted}\" is needed)"))
            }
        }
    }
    if refused {
        report.ok(
            "apply_patch (no switch turns it off) has every write refused by the read-only sandbox",
        );
    } else {
        report.fail(
            "apply_patch is on and can write: no switch turns it off, and only \
             sandbox_mode = \"read-only\" with approval_policy = \"never\" refuses its writes",
        );
    }
    check_codex_profiles(&codex_home, &mut report);
    report
}

/// A profile (`$CODEX_HOME/NAME.config.toml`, chosen with `codex --profile NAME`) is
/// read over the user's file: one that turns a tool back on, or loosens the sandbox
/// or the approvals, is a way around the lockdown for every session started with it.
fn check_codex_profiles(codex_home: &Path, report: &mut Report) {
    let Ok(entries) = std::fs::read_dir(codex_home) else {
        return;
    };
    let mut profiles: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let file = entry.file_name().into_string().ok()?;
            let name = file.strip_suffix(".config.toml")?.to_owned();
            (!name.is_empty()).then(|| (name, entry.path()))
        })
        .collect();
    profiles.sort();
    for (name, path) in profiles {
        let table = match read_toml(&path) {
            Ok(Some(table)) => table,
            Ok(None) => continue,
            Err(err) => {
                report.fail(err);
                continue;
            }
        };
        let layer = [(path.clone(), table)];
        let mut loosened = Vec::new();
        for feature in CODEX_FEATURES {
            if let Some((_, value)) = last_setting(&layer, &["features", feature])
                && value.as_bool() != Some(false)
            {
                loosened.push(format!("features.{feature} = {value}"));
            }
        }
        for (key, wanted) in [("sandbox_mode", "read-only"), ("approval_policy", "never")] {
            if let Some((_, value)) = last_setting(&layer, &[key])
                && value.as_str() != Some(wanted)
            {
                loosened.push(format!("{key} = {value}"));
            }
        }
        if loosened.is_empty() {
            report.ok(format!("profile {name} ({}) keeps the lockdown", path.display()));
        } else {
            report.fail(format!(
                "profile {name} ({}) sets {}: `codex --profile {name}` has it back",
                path.display(),
                loosened.join(", ")
            ));
        }
    }
}

/// The value the last layer gives to `path` (a later layer overrides an earlier one).
fn last_setting<'a>(
    layers: &'a [(PathBuf, toml::Table)],
    path: &[&str],
) -> Option<(&'a Path, &'a toml::Value)> {
    layers.iter().rev().find_map(|(file, table)| {
        let (last, parents) = path.split_last()?;
        let mut current = table;
        for key in parents {
            current = current.get(*key)?.as_table()?;
        }
        current.get(*last).map(|value| (file.as_path(), value))
    })
}

// --- shared ----------------------------------------------------------------------------

/// An MCP server entry of a host's file.
#[derive(Clone, Debug)]
struct Server {
    name: String,
    command: Option<String>,
    args: Vec<String>,
    url: Option<String>,
    file: PathBuf,
    scope: &'static str,
}

impl Server {
    /// `toolgate mcp` on stdio (the command's file name is `toolgate`), or an HTTP
    /// server named toolgate.
    fn is_toolgate(&self) -> bool {
        let command_is_toolgate = self.command.as_deref().is_some_and(|command| {
            Path::new(command).file_name().is_some_and(|name| name == "toolgate")
        });
        (command_is_toolgate && self.args.first().is_some_and(|arg| arg == "mcp"))
            || (self.name == "toolgate" && self.url.is_some())
    }

    fn describe(&self) -> String {
        match (&self.command, &self.url) {
            (Some(command), _) => {
                format!("MCP server \"{}\" ({} {})", self.name, command, self.args.join(" "))
            }
            (None, Some(url)) => format!("MCP server \"{}\" ({url})", self.name),
            (None, None) => format!("MCP server \"{}\"", self.name),
        }
    }
}

fn collect_json_servers(value: &Value, file: &Path, scope: &'static str, out: &mut Vec<Server>) {
    let Some(entries) = value.as_object() else {
        return;
    };
    for (name, entry) in entries {
        let server = Server {
            name: name.clone(),
            command: entry["command"].as_str().map(str::to_owned),
            args: entry["args"]
                .as_array()
                .map(|args| args.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default(),
            url: entry["url"].as_str().map(str::to_owned),
            file: file.to_owned(),
            scope,
        };
        if server.is_toolgate() {
            out.push(server);
        }
    }
}

fn report_servers(report: &mut Report, servers: &[Server], add: &str) {
    if servers.is_empty() {
        report.fail(format!("toolgate is not an MCP server of this host (add it: `{add}`)"));
    }
    for server in servers {
        let scope =
            if server.scope.is_empty() { String::new() } else { format!(", {}", server.scope) };
        report.ok(format!(
            "toolgate is an MCP server: {} in {}{scope}",
            server.describe(),
            server.file.display()
        ));
    }
}

/// The file's JSON; `None` when it does not exist.
fn read_json(path: &Path) -> Result<Option<Value>, String> {
    let Some(text) = read_text(path)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|err| format!("{} is not valid JSON: {err}", path.display()))
}

/// The file's TOML table; `None` when it does not exist.
fn read_toml(path: &Path) -> Result<Option<toml::Table>, String> {
    let Some(text) = read_text(path)? else {
        return Ok(None);
    };
    text.parse::<toml::Table>()
        .map(Some)
        .map_err(|err| format!("{} is not valid TOML: {}", path.display(), err.message()))
}

/// Settings files are small; a larger one is not read whole.
const MAX_SETTINGS_BYTES: u64 = 16 * 1024 * 1024;

fn read_text(path: &Path) -> Result<Option<String>, String> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(format!("cannot read {}: {err}", path.display())),
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_SETTINGS_BYTES), &mut text)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    Ok(Some(text))
}

#[cfg(test)]
#[path = "hosts_tests.rs"]
mod tests;
