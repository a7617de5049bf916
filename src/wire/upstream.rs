//! What `daemon/status` shows of each upstream MCP server.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a supervisor is doing with its server, as `daemon/status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamState {
    /// Connecting, initializing or listing tools (first start or a restart).
    Starting,
    /// Connected; its tools are live.
    Ready,
    /// Down (failed to start, crashed or hung); waiting for the next attempt.
    Failed,
    /// Removed from the configuration or the daemon is stopping.
    Stopped,
}

impl UpstreamState {
    /// The wire name (`starting`, `ready`, `failed`, `stopped`).
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamState::Starting => "starting",
            UpstreamState::Ready => "ready",
            UpstreamState::Failed => "failed",
            UpstreamState::Stopped => "stopped",
        }
    }
}

impl std::fmt::Display for UpstreamState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One upstream server in `daemon/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UpstreamStatus {
    pub name: String,
    pub state: UpstreamState,
    /// Why the server is down (set in `failed`, kept while it restarts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How many times the server was started again after its first attempt.
    pub restarts: u32,
    /// How many of its tools are registered.
    pub tools: usize,
}
