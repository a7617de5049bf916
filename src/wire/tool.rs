//! The tool contract's wire types: what a tool declares ([`Definition`]), the one
//! structured result every outcome becomes ([`ToolResult`]), a session's task list and
//! the streams of live output.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::json_text;
use super::metadata::Metadata;

/// Whether a tool can change anything outside itself.
///
/// This must be conservative: a tool that writes anything at all is `SideEffect`. A
/// wrong `ReadOnly` would let the tool run concurrently with others and in plan mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Safety {
    ReadOnly,
    SideEffect,
}

impl Safety {
    pub fn is_read_only(self) -> bool {
        self == Safety::ReadOnly
    }
}

/// What a tool declares about itself; the only part of a tool the model ever sees.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Definition {
    pub name: String,
    pub description: String,
    /// A JSON Schema (2020-12) object describing the `arguments` of a call.
    pub input_schema: Value,
    pub safety: Safety,
    /// Control-plane tools: always listed, never subject to allowlists or permission
    /// rules (they still pass hooks and the registry guard).
    #[serde(default)]
    pub system: bool,
    /// The tool's own deadline, overriding the session's default timeout.
    #[serde(
        default,
        rename = "timeout_ms",
        with = "duration_ms_opt",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<u64>")]
    pub timeout: Option<Duration>,
    /// What the layers above the registry know about the tool (see [`super::facts`]);
    /// never sent, so a definition read back from the wire declares nothing.
    #[serde(skip)]
    #[schemars(skip)]
    pub facts: super::facts::Facts,
}

/// Stable wire codes for why a call did not succeed. Clients must tolerate codes they
/// do not know: unknown codes deserialize to [`ErrorType::Unknown`]. A code is never
/// reused for another meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorType {
    // The registry boundary.
    UnknownTool,
    InvalidArguments,
    Timeout,
    Canceled,
    InternalError,
    // The agent layer: the tool never ran.
    HookBlocked,
    PermissionDenied,
    PermissionCanceled,
    ToolNotAllowed,
    // The tools.
    NotFound,
    NotUnique,
    CommandFailed,
    AccessDenied,
    StaleFile,
    BinaryFile,
    TooLarge,
    IsDirectory,
    IoError,
    UpstreamError,
    /// A code this build does not know (sent by a newer peer).
    #[serde(other)]
    Unknown,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::UnknownTool => "unknown_tool",
            ErrorType::InvalidArguments => "invalid_arguments",
            ErrorType::Timeout => "timeout",
            ErrorType::Canceled => "canceled",
            ErrorType::InternalError => "internal_error",
            ErrorType::HookBlocked => "hook_blocked",
            ErrorType::PermissionDenied => "permission_denied",
            ErrorType::PermissionCanceled => "permission_canceled",
            ErrorType::ToolNotAllowed => "tool_not_allowed",
            ErrorType::NotFound => "not_found",
            ErrorType::NotUnique => "not_unique",
            ErrorType::CommandFailed => "command_failed",
            ErrorType::AccessDenied => "access_denied",
            ErrorType::StaleFile => "stale_file",
            ErrorType::BinaryFile => "binary_file",
            ErrorType::TooLarge => "too_large",
            ErrorType::IsDirectory => "is_directory",
            ErrorType::IoError => "io_error",
            ErrorType::UpstreamError => "upstream_error",
            ErrorType::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ErrorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Content beyond text that a result can carry (the MCP face turns these into image,
/// audio and resource blocks). `ToolResult::content` stays the text rendering.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Attachment {
    Image {
        mime_type: String,
        /// Base64 (standard alphabet, padded).
        data: String,
    },
    Audio {
        mime_type: String,
        /// Base64 (standard alphabet, padded).
        data: String,
    },
    Resource {
        uri: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime_type: Option<String>,
        text: String,
    },
}

/// The one structured observation every outcome becomes: success, a tool's business
/// error, a guard's refusal, a timeout or a panic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolResult {
    pub ok: bool,
    /// The tool that was called (filled in by the registry for every result).
    pub tool: String,
    /// The text rendering of the outcome; what a text-only model reads.
    #[serde(default, serialize_with = "json_text::serialize")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<ErrorType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Structured facts about the outcome. Always holds `call_id`.
    #[serde(default)]
    pub metadata: Metadata,
    /// Rich content (images, audio, resources); omitted when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

impl ToolResult {
    /// A successful result with a text rendering.
    pub fn success(content: impl Into<String>) -> ToolResult {
        ToolResult {
            ok: true,
            tool: String::new(),
            content: content.into(),
            error_type: None,
            error: None,
            metadata: Metadata::new(),
            attachments: Vec::new(),
        }
    }

    /// A failed result with a stable error code and a message for the model.
    pub fn failure(error_type: ErrorType, message: impl Into<String>) -> ToolResult {
        ToolResult {
            ok: false,
            tool: String::new(),
            content: String::new(),
            error_type: Some(error_type),
            error: Some(message.into()),
            metadata: Metadata::new(),
            attachments: Vec::new(),
        }
    }

    /// Adds one metadata entry (builder style).
    pub fn with_meta(mut self, key: &'static str, value: impl Into<Value>) -> ToolResult {
        self.metadata.insert(key, value.into());
        self
    }

    /// Replaces the text rendering (builder style).
    pub fn with_content(mut self, content: impl Into<String>) -> ToolResult {
        self.content = content.into();
        self
    }

    pub fn with_attachment(mut self, attachment: Attachment) -> ToolResult {
        self.attachments.push(attachment);
        self
    }

    pub fn call_id(&self) -> Option<&str> {
        self.metadata.get("call_id").and_then(Value::as_str)
    }

    /// Stamps the tool name and call id; done by the registry and the agent layer on
    /// every result so that no result is ever anonymous.
    pub fn stamp(mut self, tool: &str, call_id: &str) -> ToolResult {
        if self.tool.is_empty() {
            self.tool = tool.to_owned();
        }
        // A result the registry stamped is stamped again by the session (which also
        // finishes calls the registry never saw): the same id is left as it is.
        if self.call_id() != Some(call_id) {
            self.metadata.insert("call_id", Value::String(call_id.to_owned()));
        }
        self
    }
}

/// One entry of a session's task list (`todo_write`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Todo {
    pub content: String,
    pub status: TodoStatus,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    Pending,
    InProgress,
    Completed,
}

/// Which stream a chunk of live output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Serde helper: `Option<Duration>` as integer milliseconds.
pub(crate) mod duration_ms_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}
