//! A proxied tool: an upstream server's tool under the name `mcp__<server>__<tool>`,
//! and the mapping of MCP's tool and result shapes onto ours.

use std::sync::Arc;

use rmcp::model::RequestId;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, ContentBlock, ResourceContents, ServerResult, Tool as McpTool,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleClient};
use serde_json::Value;

use super::connection::Link;
use crate::config::McpServerConfig;
use crate::tools::{Attachment, Definition, ErrorType, Safety, Tool, ToolContext, ToolResult};

/// Every proxied tool's name starts with this; no other kind of tool may use it.
pub const PROXY_PREFIX: &str = "mcp__";

/// The name under which a server's tool is registered.
pub fn proxied_name(server: &str, tool: &str) -> String {
    format!("{PROXY_PREFIX}{server}__{tool}")
}

pub use crate::config::check_server_name;

/// The server a proxied tool name belongs to: what comes between the prefix and the
/// first `__` after it.
pub fn server_of(proxied: &str) -> Option<&str> {
    let rest = proxied.strip_prefix(PROXY_PREFIX)?;
    rest.find("__").map(|end| &rest[..end])
}

/// Longest upstream tool name accepted; MCP names are short identifiers, and a longer
/// one would not fit the name limits of model APIs once prefixed.
const MAX_TOOL_NAME: usize = 128;

pub(crate) struct ProxyTool {
    definition: Definition,
    /// The name the server knows the tool by.
    upstream_name: String,
    link: Arc<Link>,
}

impl ProxyTool {
    /// The proxied form of an upstream tool. Safety is conservative: `read_only` only
    /// when the server says so *and* the configuration trusts its annotations.
    pub(crate) fn new(
        config: &McpServerConfig,
        tool: &McpTool,
        link: Arc<Link>,
    ) -> Result<ProxyTool, String> {
        let upstream_name = tool.name.to_string();
        let name_ok = !upstream_name.is_empty()
            && upstream_name.len() <= MAX_TOOL_NAME
            && upstream_name.chars().all(|c| c.is_ascii_graphic());
        if !name_ok {
            return Err(format!("{upstream_name:?} is not a usable tool name"));
        }
        let name = proxied_name(&config.name, &upstream_name);
        if server_of(&name) != Some(config.name.as_str()) {
            return Err(format!(
                "{name:?} would fall in another server's namespace (mcp__{}__...)",
                server_of(&name).unwrap_or_default()
            ));
        }
        let read_only_hint = tool.annotations.as_ref().and_then(|a| a.read_only_hint);
        let safety = if config.trust_annotations && read_only_hint == Some(true) {
            Safety::ReadOnly
        } else {
            Safety::SideEffect
        };
        let description = match (&tool.description, &tool.title) {
            (Some(description), _) if !description.trim().is_empty() => description.to_string(),
            (_, Some(title)) => title.clone(),
            _ => format!("The {upstream_name} tool of the MCP server {}.", config.name),
        };
        Ok(ProxyTool {
            definition: Definition {
                name,
                description,
                input_schema: Value::Object((*tool.input_schema).clone()),
                safety,
                system: false,
                timeout: config.call_timeout(),
                facts: Default::default(),
            },
            upstream_name,
            link,
        })
    }

    fn unavailable(&self) -> ToolResult {
        let status = self.link.status();
        let mut message =
            format!("the MCP server {} is not available ({}", self.link.name(), status.state);
        if let Some(reason) = status.reason {
            message.push_str(": ");
            message.push_str(&reason);
        }
        message.push(')');
        ToolResult::failure(ErrorType::UpstreamError, message)
            .with_meta("server", self.link.name().to_owned())
    }
}

#[async_trait::async_trait]
impl Tool for ProxyTool {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let Some(live) = self.link.live() else {
            return self.unavailable();
        };
        let arguments = match args {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(self.upstream_name.clone()).with_arguments(arguments),
        ));
        let handle = match live
            .peer
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(handle) => handle,
            Err(err) => return upstream_failure(self.link.name(), &err.to_string()),
        };
        let mut pending =
            PendingCall { peer: Some(live.peer.clone()), request_id: handle.id.clone() };
        let _route = self.link.route_progress(handle.progress_token.clone(), ctx.output.clone());
        let res = tokio::select! {
            biased;
            res = handle.await_response() => match res {
                Ok(ServerResult::CallToolResult(result)) => convert_result(self.link.name(), result),
                Ok(_) => upstream_failure(self.link.name(), "the server answered tools/call with something other than a tool result"),
                Err(err) => upstream_failure(self.link.name(), &err.to_string()),
            },
            // Canceled or past its deadline; `pending` tells the server on the way out.
            () = ctx.cancel.cancelled() => ToolResult::failure(ErrorType::Canceled, "the call was canceled"),
            () = live.gone.cancelled() => upstream_failure(self.link.name(), "the server went away during the call"),
        };
        if !ctx.cancel.is_cancelled() {
            pending.answered();
        }
        res
    }
}

/// A request the server is working on. Unless it was answered, dropping it sends
/// `notifications/cancelled` upstream: the registry drops a call's future on timeout
/// and on cancel without polling it again, and a caller may give up on it too.
struct PendingCall {
    peer: Option<Peer<RoleClient>>,
    request_id: RequestId,
}

impl PendingCall {
    fn answered(&mut self) {
        self.peer = None;
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let params = CancelledNotificationParam::new(
            Some(self.request_id.clone()),
            Some("canceled by the client or past its deadline".to_owned()),
        );
        // Sending is quick (a queued message), but cannot happen inside `drop`.
        runtime.spawn(async move {
            let _ = peer.notify_cancelled(params).await;
        });
    }
}

fn upstream_failure(server: &str, detail: &str) -> ToolResult {
    ToolResult::failure(ErrorType::UpstreamError, format!("MCP server {server}: {detail}"))
        .with_meta("server", server.to_owned())
}

/// Maps an MCP tool result onto ours: text blocks become the content, images, audio
/// and embedded resources become attachments; `isError` stays a tool error
/// (`upstream_error`, with the server's text as the message).
fn convert_result(server: &str, result: CallToolResult) -> ToolResult {
    let mut texts = Vec::new();
    let mut attachments = Vec::new();
    for block in result.content {
        match block {
            ContentBlock::Text(text) => texts.push(text.text),
            ContentBlock::Image(image) => {
                attachments.push(Attachment::Image { mime_type: image.mime_type, data: image.data })
            }
            ContentBlock::Audio(audio) => {
                attachments.push(Attachment::Audio { mime_type: audio.mime_type, data: audio.data })
            }
            ContentBlock::Resource(embedded) => match embedded.resource {
                ResourceContents::TextResourceContents { uri, mime_type, text, .. } => {
                    attachments.push(Attachment::Resource { uri, mime_type, text });
                }
                ResourceContents::BlobResourceContents { uri, mime_type, blob, .. } => {
                    match mime_type.as_deref() {
                        Some(mime) if mime.starts_with("image/") => attachments
                            .push(Attachment::Image { mime_type: mime.to_owned(), data: blob }),
                        Some(mime) if mime.starts_with("audio/") => attachments
                            .push(Attachment::Audio { mime_type: mime.to_owned(), data: blob }),
                        // Our attachments carry text resources only; name the blob.
                        other => texts.push(format!(
                            "[binary resource {uri} ({}), {} base64 characters, not shown]",
                            other.unwrap_or("unknown type"),
                            blob.len()
                        )),
                    }
                }
                _ => texts.push("[a resource of a kind this build cannot show]".to_owned()),
            },
            ContentBlock::ResourceLink(link) => {
                texts.push(format!("[resource link: {}]", link.uri));
            }
            _ => texts.push("[content of a kind this build cannot show]".to_owned()),
        }
    }
    let mut text = texts.join("\n");
    if text.is_empty()
        && let Some(structured) = &result.structured_content
    {
        // A result that is only structured still needs a text rendering.
        text = structured.to_string();
    }
    let mut res = if result.is_error == Some(true) {
        let message = if text.is_empty() { "the tool reported an error".to_owned() } else { text };
        ToolResult::failure(ErrorType::UpstreamError, message)
    } else {
        ToolResult::success(text)
    };
    res.attachments = attachments;
    res = res.with_meta("server", server.to_owned());
    if let Some(structured) = result.structured_content {
        res = res.with_meta("structured_content", structured);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(trust: bool) -> McpServerConfig {
        McpServerConfig {
            name: "fx".to_owned(),
            command: Some("true".to_owned()),
            args: Vec::new(),
            env: Default::default(),
            cwd: None,
            url: None,
            headers: Default::default(),
            startup_timeout_ms: 1000,
            call_timeout_ms: Some(5000),
            trust_annotations: trust,
            sandbox: true,
            writable: Vec::new(),
            readable: Vec::new(),
            network: None,
        }
    }

    fn tool(read_only_hint: Option<bool>) -> McpTool {
        let mut value = serde_json::json!({
            "name": "look",
            "description": "Looks.",
            "inputSchema": {"type": "object"},
        });
        if let Some(hint) = read_only_hint {
            value["annotations"] = serde_json::json!({"readOnlyHint": hint});
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn read_only_needs_the_hint_and_trust() {
        let cases = [
            (true, Some(true), Safety::ReadOnly),
            (false, Some(true), Safety::SideEffect),
            (true, Some(false), Safety::SideEffect),
            (true, None, Safety::SideEffect),
            (false, None, Safety::SideEffect),
        ];
        for (trust, hint, expected) in cases {
            let proxy = ProxyTool::new(&server(trust), &tool(hint), Link::new("fx")).unwrap();
            assert_eq!(proxy.definition.safety, expected, "trust={trust} hint={hint:?}");
            assert_eq!(proxy.definition.name, "mcp__fx__look");
            assert_eq!(proxy.definition.timeout, Some(std::time::Duration::from_secs(5)));
        }
    }

    #[test]
    fn results_map_text_attachments_and_errors() {
        let result: CallToolResult = serde_json::from_value(serde_json::json!({
            "content": [
                {"type": "text", "text": "one"},
                {"type": "image", "data": "aW1n", "mimeType": "image/png"},
                {"type": "text", "text": "two"},
                {"type": "resource", "resource": {"uri": "file:///a.bin", "mimeType": "application/octet-stream", "blob": "AAAA"}},
            ],
            "isError": true
        }))
        .unwrap();
        let res = convert_result("fx", result);
        assert!(!res.ok);
        assert_eq!(res.error_type, Some(ErrorType::UpstreamError));
        assert_eq!(
            res.error.as_deref(),
            Some(
                "one\ntwo\n[binary resource file:///a.bin (application/octet-stream), 4 base64 characters, not shown]"
            )
        );
        assert_eq!(
            res.attachments,
            vec![Attachment::Image { mime_type: "image/png".to_owned(), data: "aW1n".to_owned() }]
        );
    }
}
