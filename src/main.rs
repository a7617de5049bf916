//! The `toolgate` command line: the daemon (`serve`), the MCP server for hosts' config
//! files (`mcp`), and a human's client on the socket (`list`, `call`, `status`,
//! `explain`), plus `check-config`. The only place that uses `anyhow`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "toolgate",
    version,
    about = "Hosts a coding agent's tools and runs model-produced tool calls behind guards"
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
        /// Print the raw JSON definitions.
        #[arg(long)]
        json: bool,
    },
    /// Call one tool and print its result (asks for approval on the terminal).
    Call {
        name: String,
        /// The arguments as JSON text.
        #[arg(default_value = "{}")]
        arguments: String,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Show the daemon's status.
    Status {
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Load and check the configuration, and print the effective result.
    CheckConfig {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Say which layer and rule would decide a call, without running it.
    Explain {
        name: String,
        #[arg(default_value = "{}")]
        arguments: String,
        #[arg(long)]
        socket: Option<PathBuf>,
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

/// Before the runtime starts threads: secrets out of the environment block, the
/// process not dumpable (see `toolgate::sandbox::harden`).
fn harden_daemon() {
    for problem in toolgate::sandbox::harden_daemon() {
        tracing::warn!("{problem}");
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
            harden_daemon();
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
            harden_daemon();
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
        Command::List { socket, json } => runtime()?.block_on(toolgate::cli::list(socket, json)),
        Command::Call { name, arguments, socket } => {
            runtime()?.block_on(toolgate::cli::call(socket, &name, &arguments))
        }
        Command::Status { socket } => runtime()?.block_on(toolgate::cli::status(socket)),
        Command::Explain { name, arguments, socket } => {
            runtime()?.block_on(toolgate::cli::explain(socket, &name, &arguments))
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
