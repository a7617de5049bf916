//! The `toolgate` command line: the daemon (`serve`), the MCP server for hosts' config
//! files (`mcp`), and a human's client on the socket (`list`, `call`, `status`,
//! `explain`), plus `check-config`, `doctor` and `audit verify`. With `cli.rs`, the only
//! place that uses `anyhow`.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use toolgate::cli::Output;

/// The version and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("TOOLGATE_COMMIT"), ")");

/// What each exit status means, for `--help` and the manual's EXIT STATUS section; the
/// README says the same.
const EXIT_CODES: &[(&str, &str)] = &[
    ("0", "success"),
    (
        "1",
        "the tool call failed (`call`: the result is not ok; `explain`: the tool is \
         unknown), the audit log's chain is broken (`audit verify`), or the MCP host is \
         not locked down (`doctor`)",
    ),
    (
        "2",
        "a local error: invalid arguments or configuration, no daemon to talk to, the \
         daemon refused the request",
    ),
    (
        "141",
        "standard output was closed early (`toolgate list | head -1`); nothing is \
         printed about it",
    ),
];

/// Logging and output, for `--help` and the manual's NOTES section.
const NOTES: &[&str] = &[
    "Logging (serve, mcp): TOOLGATE_LOG, else RUST_LOG, is a filter such as `debug` or \
     `warn,toolgate=debug`; without either, toolgate logs at info (at warn for `mcp` over \
     stdio, whose host records stderr) and its dependencies at warn, and -v / -q move \
     that up or down.",
    "Output: `list`, `call`, `status` and `explain` print text for a person when stdout \
     is a terminal, and the daemon's JSON when it is not (a pipe, a file) or with \
     --json. Colour only on a terminal, and never when NO_COLOR is set.",
];

/// The text `--help` ends with: the exit codes, then the notes.
fn after_help() -> String {
    let mut text = String::from("Exit status:\n");
    for (code, meaning) in EXIT_CODES {
        let lines = wrap(meaning, 74);
        for (index, line) in lines.iter().enumerate() {
            let first = if index == 0 { code } else { "" };
            text.push_str(&format!("  {first:<5}{line}\n"));
        }
    }
    for note in NOTES {
        text.push('\n');
        text.push_str(&wrap(note, 84).join("\n"));
        text.push('\n');
    }
    text.trim_end().to_owned()
}

/// `text` in lines of at most `width` characters, broken between words.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.len() + 1 + word.len() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

/// Exit status when stdout was closed under us: what a shell reports for a process
/// ended by SIGPIPE (128 + 13), as for any Unix tool in `... | head -1`.
const BROKEN_PIPE_EXIT: u8 = 141;

#[derive(Parser, Debug)]
#[command(
    name = "toolgate",
    version = VERSION,
    about = "Hosts a coding agent's tools and runs model-produced tool calls behind guards",
    after_help = after_help()
)]
struct Cli {
    /// Log more: -v adds toolgate's debug messages, -vv its trace and the
    /// dependencies' info, -vvv everything.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log less: -q only warnings, -qq only errors.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, conflicts_with = "verbose")]
    quiet: u8,
    /// How logs are written to stderr. `auto`: for the journal when stderr is
    /// connected to it (no timestamps, no colour, a syslog priority per line), else
    /// text, coloured only on a terminal (and not when NO_COLOR is set).
    #[arg(long, value_enum, global = true, env = "TOOLGATE_LOG_FORMAT", default_value_t = LogFormat::Auto)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Auto,
    Text,
    Journal,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon (Unix socket, plus TCP and MCP HTTP when configured).
    Serve {
        /// An explicit configuration file (read after the system and user ones).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Serve the native protocol on stdin/stdout (NDJSON) instead of the socket.
        #[arg(long)]
        stdio: bool,
        /// Listen on this Unix socket instead of the configured one.
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Serve MCP on stdio (for MCP hosts' configuration files).
    Mcp {
        #[arg(long)]
        config: Option<PathBuf>,
        /// A workspace root (repeatable); default: the configured roots.
        #[arg(long = "root")]
        roots: Vec<PathBuf>,
        /// The permission mode, replacing the configured one (default | accept_edits |
        /// plan | bypass | dont_ask).
        #[arg(long)]
        mode: Option<String>,
        /// Register the fixture tools of the MCP conformance suite (in a build with the
        /// `conformance` feature only).
        #[arg(long, hide = true)]
        conformance_fixtures: bool,
        /// Serve MCP Streamable HTTP at http://ADDR/mcp instead of stdio.
        #[arg(long, value_name = "ADDR")]
        http: Option<String>,
    },
    /// List the tools the daemon offers.
    List {
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Print the daemon's JSON (the default when stdout is not a terminal).
        #[arg(long)]
        json: bool,
    },
    /// Call one tool and print its result (asks for approval on the terminal).
    Call {
        /// The tool (`toolgate list` names them).
        #[arg(value_parser = ToolName, hide_possible_values = true)]
        name: String,
        /// The arguments as JSON text, or `-` to read them from stdin.
        #[arg(default_value = "{}")]
        arguments: String,
        #[arg(long)]
        socket: Option<PathBuf>,
        /// A named session the daemon keeps between commands (for a while after the
        /// last one ends): what one call read, another may edit; "always this session"
        /// grants last as long.
        #[arg(long, env = "TOOLGATE_SESSION")]
        session: Option<String>,
        /// Print the daemon's JSON (the default when stdout is not a terminal).
        #[arg(long)]
        json: bool,
    },
    /// Show the daemon's status.
    Status {
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Print the daemon's JSON (the default when stdout is not a terminal).
        #[arg(long)]
        json: bool,
    },
    /// Load and check the configuration, and print the effective result.
    CheckConfig {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Say whether an MCP host's own file and shell tools are off and toolgate is its MCP
    /// server, from the host's settings files for this user and project (exit status 1
    /// when not).
    Doctor {
        /// The host whose settings are read.
        #[arg(long, value_enum)]
        host: HostArg,
        /// The project directory the host is started in; default: the current one.
        #[arg(long, value_name = "DIR")]
        project: Option<PathBuf>,
        /// Print the settings that lock the host down instead (nothing is written).
        #[arg(long)]
        print_config: bool,
    },
    /// Say which layer and rule would decide a call, without running it.
    Explain {
        /// The tool (`toolgate list` names them).
        #[arg(value_parser = ToolName, hide_possible_values = true)]
        name: String,
        /// The arguments as JSON text, or `-` to read them from stdin.
        #[arg(default_value = "{}")]
        arguments: String,
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Explain within this named session (its grants count); see `call --session`.
        #[arg(long, env = "TOOLGATE_SESSION")]
        session: Option<String>,
        /// Print the daemon's JSON (the default when stdout is not a terminal).
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff), or write one page per command into a directory.
    Man {
        /// Write toolgate.1 and toolgate-COMMAND.1 for every command into DIR.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Work with the audit log.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Watch and stop a session's background processes (started with
    /// `toolgate call run_command '{"command": "...", "background": true}'`).
    Process {
        #[command(subcommand)]
        command: ProcessCommand,
        #[arg(long, global = true)]
        socket: Option<PathBuf>,
        /// The named session that started the process; see `call --session`.
        #[arg(long, global = true, env = "TOOLGATE_SESSION")]
        session: Option<String>,
        /// Print the daemon's JSON (the default when stdout is not a terminal).
        #[arg(long, global = true)]
        json: bool,
    },
}

/// A tool's name: any text (the daemon may offer tools of upstream servers), with the
/// built-in tools' names as the values shell completions offer.
#[derive(Clone, Debug)]
struct ToolName;

impl clap::builder::TypedValueParser for ToolName {
    type Value = String;

    fn parse_ref(
        &self,
        command: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        clap::builder::StringValueParser::new().parse_ref(command, arg, value)
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        let tools =
            toolgate::tools::builtin::all().into_iter().chain(toolgate::agent::system_tools::all());
        let mut names: Vec<String> = tools.map(|tool| tool.definition().name.clone()).collect();
        names.sort();
        // Asked for only to write completions or a manual, once per process.
        Some(Box::new(
            names
                .into_iter()
                .map(|name| clap::builder::PossibleValue::new(&*Box::leak(name.into_boxed_str()))),
        ))
    }
}

/// The MCP hosts `doctor` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum HostArg {
    /// Claude Code: ~/.claude/settings.json, .claude/settings.json,
    /// .claude/settings.local.json, ~/.claude.json, .mcp.json.
    ClaudeCode,
    /// Codex: $CODEX_HOME/config.toml (default ~/.codex/config.toml), its profiles
    /// (NAME.config.toml beside it), .codex/config.toml.
    Codex,
}

impl From<HostArg> for toolgate::cli::hosts::Host {
    fn from(host: HostArg) -> Self {
        match host {
            HostArg::ClaudeCode => toolgate::cli::hosts::Host::ClaudeCode,
            HostArg::Codex => toolgate::cli::hosts::Host::Codex,
        }
    }
}

#[derive(Subcommand, Debug)]
enum ProcessCommand {
    /// Print a process's output as it comes, until it ends; the exit status is the
    /// process's (1 when it was killed by a signal).
    Follow {
        /// The process id (`p1`, ...).
        id: String,
        /// Start at this byte offset (a negative one counts back from the end).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        offset: i64,
    },
    /// List the session's background processes.
    List,
    /// Kill a process and everything it started (or send one signal).
    Kill {
        id: String,
        #[arg(long)]
        signal: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum AuditCommand {
    /// Check the audit log's hash chain, across its rotated files (oldest first), and
    /// name the first record that was changed, removed or inserted, or a rotated file
    /// missing between kept ones (exit status 1).
    Verify {
        /// The log; default: the configured one ([server] audit_log).
        file: Option<PathBuf>,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    // The per-call process supervisor is this binary re-executed in a hidden mode; it
    // must take over before anything else starts (no runtime, no logging, no clap).
    if let Some(code) = toolgate::exec::supervise_if_requested() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // Likewise the launcher of sandboxed upstream servers (it only returns on failure).
    if let Some(code) = toolgate::sandbox::exec::exec_if_requested() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // Before any thread starts: large freed blocks go back to the system.
    toolgate::sys::give_large_blocks_back();
    let cli = Cli::parse();
    init_tracing(&cli);
    match run(cli) {
        Ok(code) => code,
        Err(err) if is_broken_pipe(&err) => ExitCode::from(BROKEN_PIPE_EXIT),
        Err(err) => {
            eprintln!("toolgate: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// Whether the error is a write to a closed pipe: the reader (`head -1`) has all it
/// wanted, which is no error worth a message.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || cause.downcast_ref::<toolgate::cli::ClientError>().is_some_and(|client| {
                matches!(client, toolgate::cli::ClientError::Io(io)
                    if io.kind() == std::io::ErrorKind::BrokenPipe)
            })
    })
}

/// Before the runtime starts threads: secrets out of the environment block, the
/// process not dumpable (see `toolgate::sandbox::harden`).
fn harden_daemon() {
    let policy = toolgate::tools::EnvPolicy::default();
    for problem in toolgate::sandbox::harden_daemon(|name| policy.inherits(name)) {
        tracing::warn!("{problem}");
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::CheckConfig { config } => toolgate::cli::check_config(config),
        Command::Doctor { host, project, print_config } => {
            toolgate::cli::doctor(host.into(), project, print_config)
        }
        Command::Audit { command: AuditCommand::Verify { file, config } } => {
            audit_verify(file, config)
        }
        Command::Serve { config, stdio, socket } => {
            // Sockets passed by systemd must be taken while the process has one thread
            // (taking them edits the environment).
            let inherited =
                if stdio { Vec::new() } else { toolgate::systemd::inherited_listeners()? };
            harden_daemon();
            toolgate::admission::raise_descriptor_limit();
            runtime()?.block_on(toolgate::server::serve(toolgate::server::ServeOptions {
                config,
                stdio,
                socket,
                inherited,
            }))?;
            toolgate::exec::release_spares();
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp { config, roots, mode, conformance_fixtures, http } => {
            if conformance_fixtures && !cfg!(feature = "conformance") {
                anyhow::bail!(
                    "this toolgate was built without the MCP conformance fixtures (they are \
                     for the interoperability tests: build with `--features conformance`)"
                );
            }
            harden_daemon();
            toolgate::admission::raise_descriptor_limit();
            // A server on its host's pipes: its threads do not take the processor from
            // the host when they wake (every thread it starts inherits this; the
            // commands it runs go back to the usual policy).
            if http.is_none()
                && let Err(err) = toolgate::sys::set_scheduling(toolgate::sys::Scheduling::Batch)
            {
                tracing::debug!(%err, "batch scheduling is not available");
            }
            runtime()?.block_on(toolgate::server::serve_mcp(
                toolgate::server::McpCommandOptions {
                    config,
                    roots,
                    mode,
                    conformance_fixtures,
                    http,
                },
            ))?;
            toolgate::exec::release_spares();
            Ok(ExitCode::SUCCESS)
        }
        Command::List { socket, json } => {
            runtime()?.block_on(toolgate::cli::list(socket, Output::choose(json)))
        }
        Command::Call { name, arguments, socket, session, json } => {
            runtime()?.block_on(toolgate::cli::call(
                socket,
                session.as_deref(),
                &name,
                &arguments,
                Output::choose(json),
            ))
        }
        Command::Status { socket, json } => {
            runtime()?.block_on(toolgate::cli::status(socket, Output::choose(json)))
        }
        Command::Explain { name, arguments, socket, session, json } => {
            runtime()?.block_on(toolgate::cli::explain(
                socket,
                session.as_deref(),
                &name,
                &arguments,
                Output::choose(json),
            ))
        }
        Command::Process { command, socket, session, json } => {
            let runtime = runtime()?;
            let session = session.as_deref();
            match command {
                ProcessCommand::Follow { id, offset } => {
                    runtime.block_on(toolgate::cli::follow(socket, session, &id, offset))
                }
                ProcessCommand::List => runtime.block_on(toolgate::cli::call(
                    socket,
                    session,
                    "process_list",
                    "{}",
                    Output::choose(json),
                )),
                ProcessCommand::Kill { id, signal } => {
                    let mut arguments = serde_json::json!({ "id": id });
                    if let Some(signal) = signal {
                        arguments["signal"] = serde_json::json!(signal);
                    }
                    runtime.block_on(toolgate::cli::call(
                        socket,
                        session,
                        "process_kill",
                        &arguments.to_string(),
                        Output::choose(json),
                    ))
                }
            }
        }
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "toolgate", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { dir: None } => {
            let mut out = std::io::stdout().lock();
            render_manual(&clap_mangen::Man::new(manual_command()), &mut out)?;
            std::io::Write::flush(&mut out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { dir: Some(dir) } => {
            let command = manual_command();
            // One page per command, as clap_mangen writes them; toolgate.1 as below.
            for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
                clap_mangen::generate_to(sub.clone(), &dir)?;
            }
            let man = clap_mangen::Man::new(command);
            let mut file = std::fs::File::create(dir.join(man.get_filename()))?;
            render_manual(&man, &mut file)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `1 file`, `2 files`.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The command as the manual describes it: the exit codes and notes of `--help` get
/// sections of their own instead of clap_mangen's EXTRA.
fn manual_command() -> clap::Command {
    let mut command = Cli::command().after_help(None::<&str>).disable_help_subcommand(true);
    command.build();
    command
}

/// The manual page: clap_mangen's sections, then EXIT STATUS (each code and what it
/// means) and NOTES, then the version.
fn render_manual(man: &clap_mangen::Man, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    man.render_subcommands_section(out)?;
    writeln!(out, ".SH \"EXIT STATUS\"")?;
    for (code, meaning) in EXIT_CODES {
        writeln!(out, ".TP\n\\fB{code}\\fR\n{}", roff_text(meaning))?;
    }
    writeln!(out, ".SH NOTES")?;
    for note in NOTES {
        writeln!(out, ".PP\n{}", roff_text(note))?;
    }
    man.render_version_section(out)
}

/// Text as a roff text line: backslashes and hyphens escaped, and a leading `.` or `'`
/// not taken for a request.
fn roff_text(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with(['.', '\'']) { format!("\\&{escaped}") } else { escaped }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// `toolgate audit verify`: prints what it found; 1 when the chain is broken.
fn audit_verify(file: Option<PathBuf>, config: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    let path = match file {
        Some(path) => path,
        None => {
            let (config, _) = toolgate::server::load_config(config)?;
            config.server.audit_log.ok_or_else(|| {
                anyhow::anyhow!("the audit log is turned off ([server] audit_log = false)")
            })?
        }
    };
    let report = toolgate::audit::verify(&path)
        .map_err(|err| anyhow::anyhow!("cannot verify {}: {err}", path.display()))?;
    let mut out = std::io::stdout().lock();
    let files = count(report.files.len(), "file", "files");
    let records = count(report.records, "record", "records");
    if let Some(broken) = &report.broken {
        writeln!(out, "broken: {broken}")?;
        let link = if report.records == 1 { "links" } else { "link" };
        writeln!(out, "{records} before it {link} up ({files})")?;
        return Ok(ExitCode::FAILURE);
    }
    writeln!(out, "ok: {records} in {files}, every record links to the one before")?;
    if let Some(prev) = &report.starts_after {
        writeln!(
            out,
            "the oldest record follows one that is no longer kept (rotated away): {prev}"
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Sets up logging to stderr, never to stdout: stdout carries the protocol in
/// `--stdio` and `mcp` modes.
///
/// The filter is `TOOLGATE_LOG`, else `RUST_LOG`, else toolgate at info (at warn for
/// `mcp` over stdio) and its dependencies at warn (their per-session chatter, such as rmcp's dump of every
/// initialize request, is not for a service log), moved by `-v`/`-q`. The format is
/// chosen by `--log-format`: under systemd (stderr is the journal's stream) lines
/// carry a syslog priority and neither timestamps nor colour, as the journal adds
/// its own; colour only ever goes to a terminal.
fn init_tracing(cli: &Cli) {
    use tracing_subscriber::EnvFilter;

    let verbosity = i16::from(cli.verbose) - i16::from(cli.quiet);
    // An MCP host records a stdio server's stderr, often as errors: there, toolgate
    // says only what needs attention unless asked for more.
    let mcp_stdio = matches!(cli.command, Command::Mcp { http: None, .. });
    let default_filter = match verbosity {
        ..=-2 => "error",
        -1 => "warn",
        0 if mcp_stdio => "warn",
        0 => "warn,toolgate=info",
        1 => "warn,toolgate=debug",
        2 => "info,toolgate=trace",
        _ => "trace",
    };
    let mut problem = None;
    let filter = ["TOOLGATE_LOG", "RUST_LOG"]
        .iter()
        .find_map(|name| {
            let value = std::env::var(name).ok().filter(|value| !value.trim().is_empty())?;
            match EnvFilter::try_new(&value) {
                Ok(filter) => Some(filter),
                Err(err) => {
                    problem = Some(format!("ignoring {name}={value:?}: {err}"));
                    None
                }
            }
        })
        .unwrap_or_else(|| EnvFilter::new(default_filter));

    let format = match cli.log_format {
        LogFormat::Auto if stderr_is_journal() => LogFormat::Journal,
        LogFormat::Auto => LogFormat::Text,
        other => other,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
        LogFormat::Journal => builder
            .event_format(journal::JournalFormat(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_target(false)
                    .with_ansi(false),
            ))
            .try_init(),
        LogFormat::Auto | LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
            builder
                .with_target(false)
                .with_ansi(std::io::stderr().is_terminal() && !no_color)
                .try_init()
        }
    };
    if let Err(err) = installed {
        eprintln!("toolgate: cannot set up logging: {err}");
    }
    if let Some(problem) = problem {
        tracing::warn!("{problem}");
    }
}

/// Whether stderr is the journal's stream: systemd sets `JOURNAL_STREAM` to its
/// `device:inode`, and a process whose stderr was redirected elsewhere keeps the
/// variable, so the two are compared.
fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|value| value.split_once(':')) else {
        return false;
    };
    let Ok(stat) = rustix::fs::fstat(std::io::stderr()) else {
        return false;
    };
    dev.parse::<u64>().ok() == Some(stat.st_dev) && ino.parse::<u64>().ok() == Some(stat.st_ino)
}

mod journal {
    use tracing::{Event, Level, Subscriber};
    use tracing_subscriber::fmt::FmtContext;
    use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
    use tracing_subscriber::registry::LookupSpan;

    /// Prefixes each line with its syslog priority (`<3>` error ... `<7>` debug), which
    /// the journal reads from a service's stderr and strips.
    pub(super) struct JournalFormat<F>(pub(super) F);

    impl<S, N, F> FormatEvent<S, N> for JournalFormat<F>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
        F: FormatEvent<S, N>,
    {
        fn format_event(
            &self,
            ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> std::fmt::Result {
            let priority = match *event.metadata().level() {
                Level::ERROR => 3,
                Level::WARN => 4,
                Level::INFO => 6,
                _ => 7,
            };
            write!(writer, "<{priority}>")?;
            self.0.format_event(ctx, writer, event)
        }
    }
}
