//! What `daemon/status` shows of the daemon itself.

/// One place the daemon accepts connections.
#[derive(
    Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Listener {
    /// `unix` (the native protocol on the socket), `tcp` (the native protocol over
    /// HTTP and WebSocket) or `mcp_http` (MCP Streamable HTTP at `/mcp`).
    pub kind: String,
    /// The socket's path, or the address and port.
    pub address: String,
    /// Passed by the service manager (socket activation) rather than opened here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inherited: bool,
}
