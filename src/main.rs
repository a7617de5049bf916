//! The `toolgate` command line: the daemon (`serve`), the MCP server for hosts' config
//! files (`mcp`), and a human's client on the socket (`list`, `call`, `status`,
//! `explain`), plus `check-config`. The only place that uses `anyhow`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use toolgate::cli::Output;

#[derive(Parser, Debug)]
#[command(
    name = "toolgate",
    version,
    about = "Hosts a coding agent's tools and runs model-produced tool calls behind guards",
    after_help = "Output: `list`, `call`, `status` and `explain` print text for a person when \
                  stdout is a terminal, and the daemon's JSON when it is not (a pipe, a file) \
                  or with --json. Colour only on a terminal, and never when NO_COLOR is set."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
        /// Register the fixture tools of the MCP conformance suite.
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
    /// Say which layer and rule would decide a call, without running it.
    Explain {
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
}

fn main() -> ExitCode {
    // The per-call process supervisor is this binary re-executed in a hidden mode; it
    // must take over before anything else starts (no runtime, no logging, no clap).
    if let Some(code) = toolgate::tools::process::supervise_if_requested() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("toolgate: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::CheckConfig { config } => toolgate::cli::check_config(config),
        Command::Serve { config, stdio, socket } => {
            init_tracing();
            // Sockets passed by systemd must be taken while the process has one thread
            // (taking them edits the environment).
            let inherited =
                if stdio { Vec::new() } else { toolgate::systemd::inherited_listeners()? };
            runtime()?.block_on(toolgate::server::serve(toolgate::server::ServeOptions {
                config,
                stdio,
                socket,
                inherited,
            }))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp { config, roots, mode, conformance_fixtures, http } => {
            init_tracing();
            runtime()?.block_on(toolgate::server::serve_mcp(
                toolgate::server::McpCommandOptions {
                    config,
                    roots,
                    mode,
                    conformance_fixtures,
                    http,
                },
            ))?;
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
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "toolgate", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { dir: None } => {
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { dir: Some(dir) } => {
            clap_mangen::generate_to(Cli::command(), dir)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// Logs go to stderr (journald picks them up under systemd), never to stdout: stdout
/// carries the protocol in `--stdio` and `mcp` modes.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOOLGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
