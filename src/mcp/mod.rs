//! The MCP face: toolgate as a Model Context Protocol server, so that every MCP host
//! (Claude Code, Cursor, Codex, Zed, ...) can use it unmodified.
//!
//! It is a second protocol over the same core, not a second engine: each MCP
//! conversation drives an agent [`crate::agent::Session`] opened through the
//! [`Daemon`], so rules, hooks, approvals, limits and the audit log behave exactly as
//! on the native protocol. The protocol itself (both eras: the `initialize`
//! handshake of 2024-11-05 .. 2025-11-25 and the stateless 2026-07-28 revision with
//! `server/discover`) is served by `rmcp`, the official Rust SDK.
//!
//! - [`run_stdio`] / [`serve_stream`]: one conversation over newline-delimited JSON
//!   (stdout carries nothing but protocol lines);
//! - [`http_router`]: the Streamable HTTP endpoint `/mcp`, with Host/Origin
//!   validation, bearer tokens ([`crate::auth`]) and 128-bit random session ids;
//!   [`serve_http`] serves it with the connection limits of [`crate::admission`].
//!
//! Layout: [`mapping`] (Definition → Tool, Result → CallToolResult), `server` (the
//! handler), [`approval`] (permission questions as elicitations), `stdio`, `http`,
//! [`fixtures`] (the conformance suite's fixture tools, behind an option), `tasks` (the
//! tasks extension: long calls answered as tasks), [`results`] (long results as
//! resource links) and `roots`.

pub mod approval;
#[cfg(feature = "conformance")]
pub mod fixtures;
mod http;
pub mod mapping;
pub mod results;
mod roots;
mod server;
mod stdio;
mod tasks;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde_json::Value;

pub use http::{http_router, serve_http};
pub use results::ResultLinks;
pub use server::McpHandler;
pub use stdio::{run_stdio, serve_stream};

use crate::daemon::Daemon;

/// The client identity of an MCP request: `token:<name>` when it came over HTTP with
/// a bearer token (the HTTP face puts the token's identity in the request's parts),
/// else `mcp` (stdio).
pub(crate) fn client_identity(
    ctx: &rmcp::service::RequestContext<rmcp::RoleServer>,
) -> Cow<'static, str> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<crate::auth::Identity>())
        .map_or(Cow::Borrowed("mcp"), |identity| Cow::Owned(identity.to_string()))
}

/// The largest message accepted on stdio or in an HTTP body. Tool arguments are
/// small; file contents given to write_file are the largest legitimate payloads.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = crate::rpc::DEFAULT_MAX_MESSAGE_BYTES;

/// How long an unanswered `input_required` question (2026-07-28) is remembered.
/// Long enough for a person to read it; short enough that abandoned questions do not
/// pile up.
const PENDING_INPUT_TTL: Duration = Duration::from_secs(15 * 60);
/// Unanswered questions remembered at once; the oldest are forgotten first.
const MAX_PENDING_INPUTS: usize = 1024;

/// How the MCP face is served.
#[derive(Clone, Debug)]
pub struct McpOptions {
    /// Register the conformance suite's fixture tools, resources and prompts
    /// (`toolgate mcp --conformance-fixtures`); never for real use.
    pub conformance_fixtures: bool,
    /// HTTP only: requests must carry `Authorization: Bearer <token>` with one of
    /// these; with none, every HTTP request is refused.
    pub tokens: crate::auth::TokenSet,
    /// HTTP only: `Host` names accepted besides localhost, 127.0.0.1 and [::1]
    /// (DNS-rebinding protection).
    pub allowed_hosts: Vec<String>,
    /// HTTP only: `Origin`s accepted besides http(s)://localhost, 127.0.0.1 and
    /// [::1] on any port.
    pub allowed_origins: Vec<String>,
    pub max_message_bytes: usize,
    /// How long a `tools/call` from a client that declared the tasks extension
    /// (`io.modelcontextprotocol/tasks`) may run before it is answered with a task
    /// instead of its result.
    pub task_after: Duration,
    /// When a result is answered with an excerpt and a `resource_link` to its whole
    /// text, and how many such texts are kept for `resources/read`.
    pub result_links: ResultLinks,
}

/// The default of [`McpOptions::task_after`]: a call still running after this long
/// becomes a task (well below the minute after which many MCP clients give up on
/// a request).
pub const DEFAULT_TASK_AFTER: Duration = Duration::from_secs(2);

impl Default for McpOptions {
    fn default() -> McpOptions {
        McpOptions {
            conformance_fixtures: false,
            tokens: crate::auth::TokenSet::empty(),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            task_after: DEFAULT_TASK_AFTER,
            result_links: ResultLinks::default(),
        }
    }
}

/// Why serving MCP stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum McpServeError {
    #[error("the MCP session failed to start: {0}")]
    Start(String),
    #[error("the MCP service ended abnormally: {0}")]
    Join(String),
}

/// What every conversation of one MCP face shares.
pub(crate) struct Face {
    pub(crate) daemon: Arc<Daemon>,
    pub(crate) options: McpOptions,
    /// Questions asked with `input_required` and not answered yet, by the opaque
    /// `requestState` handle the client echoes back.
    pub(crate) pending: DashMap<String, PendingInput>,
    /// Calls answered as tasks (the tasks extension), by owner.
    pub(crate) tasks: tasks::Tasks,
    /// Long results' whole texts, by owner, for `resources/read`.
    pub(crate) results: results::ResultStore,
}

impl Drop for Face {
    fn drop(&mut self) {
        self.tasks.shutdown();
    }
}

/// One question asked with `input_required`: the retry must be the same call, and
/// resumes it where the first round stopped.
pub(crate) struct PendingInput {
    pub(crate) tool: String,
    pub(crate) arguments: Value,
    pub(crate) question: crate::agent::Question,
    pub(crate) created: Instant,
}

impl Face {
    pub(crate) fn new(daemon: Arc<Daemon>, options: McpOptions) -> Arc<Face> {
        #[cfg(feature = "conformance")]
        if options.conformance_fixtures {
            fixtures::register(daemon.registry());
        }
        let tasks = tasks::Tasks::new(daemon.settings().max_timeout);
        let results = results::ResultStore::new(options.result_links.clone());
        Arc::new(Face { daemon, options, pending: DashMap::new(), tasks, results })
    }

    /// Remembers a question, forgetting expired ones and keeping the table bounded.
    pub(crate) fn remember_pending(&self, handle: String, input: PendingInput) {
        self.pending.retain(|_, pending| pending.created.elapsed() < PENDING_INPUT_TTL);
        while self.pending.len() >= MAX_PENDING_INPUTS {
            let oldest = self
                .pending
                .iter()
                .min_by_key(|entry| entry.created)
                .map(|entry| entry.key().clone());
            match oldest {
                Some(key) => {
                    self.pending.remove(&key);
                }
                None => break,
            }
        }
        self.pending.insert(handle, input);
    }
}

/// 128 random bits from the operating system's CSPRNG, as 32 hex digits. Used for
/// session ids and `requestState` handles, which must not be guessable; there is no
/// fallback to a weaker source.
pub(crate) fn random_hex() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_128_bit_hex_and_distinct() {
        let ids: Vec<String> = (0..64).map(|_| random_hex().unwrap()).collect();
        for id in &ids {
            assert_eq!(id.len(), 32);
            assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        }
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
    }
}
