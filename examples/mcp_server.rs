//! A stand-alone MCP server over the library API, for the interop and conformance
//! scripts in `tests/interop/` (the `toolgate mcp` command serves the same code).
//!
//! ```text
//! mcp_server [--root DIR]... [--mode MODE] [--fixtures] [--http 127.0.0.1:PORT] [--token T]
//! ```
//! Without `--http` it speaks MCP on stdio. With `--http` it prints
//! `listening on ADDR` on stderr once the listener is bound.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use toolgate::daemon::{Daemon, Settings};
use toolgate::mcp::{McpOptions, http_router, run_stdio};
use toolgate::permission::Mode;
use toolgate::tools::Registry;

#[derive(Parser)]
struct Args {
    #[arg(long = "root")]
    roots: Vec<PathBuf>,
    #[arg(long, value_parser = parse_mode)]
    mode: Option<Mode>,
    #[arg(long)]
    fixtures: bool,
    #[arg(long)]
    http: Option<String>,
    #[arg(long)]
    token: Option<String>,
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|err| err.to_string())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let roots = if args.roots.is_empty() { vec![std::env::current_dir()?] } else { args.roots };
    let roots = roots.iter().map(std::fs::canonicalize).collect::<Result<Vec<_>, _>>()?;
    let mut settings = Settings::for_roots(roots);
    if let Some(mode) = args.mode {
        settings.mode = mode;
    }
    let daemon = Daemon::new(Arc::new(Registry::with_builtins()), settings, None);
    let options = McpOptions {
        conformance_fixtures: args.fixtures,
        bearer_token: args.token,
        ..McpOptions::default()
    };
    match args.http {
        None => run_stdio(daemon, options).await?,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            eprintln!("listening on {}", listener.local_addr()?);
            let shutdown = daemon.shutdown_token().clone();
            let router = http_router(daemon.clone(), options);
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = tokio::signal::ctrl_c().await;
                    shutdown.cancel();
                })
                .await?;
        }
    }
    Ok(())
}
