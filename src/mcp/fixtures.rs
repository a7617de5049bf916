//! The fixture tools, resources and prompts the MCP conformance suite calls
//! (`toolgate mcp --conformance-fixtures`); never registered in normal use.
//!
//! The fixture tools are ordinary [`Tool`]s registered in the ordinary Registry, so
//! the suite exercises the real path (session, permission, registry guard, result
//! mapping). Some of them must talk back to the client while they run (log
//! messages, progress, sampling, elicitation). A tool only gets a [`ToolContext`],
//! which knows nothing of MCP, so the MCP handler *attaches* a [`CallClient`] to a
//! side table keyed by (session id, call id) for the duration of each call, and a
//! fixture looks itself up there. The side table is process-wide because the
//! fixtures are registered once per Registry while handlers come and go; keys are
//! unique because session ids are unique per daemon and call ids per session.

#![allow(deprecated)] // Sampling and logging are deprecated in 2026-07-28; the suite still tests them.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use dashmap::DashMap;
use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResponse,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, LoggingLevel,
    PaginatedRequestParams, ProgressToken, ReadResourceRequestParams, ReadResourceResponse,
};
use rmcp::service::{Peer, RequestContext};
use serde_json::{Value, json};

use rmcp::handler::server::ServerHandler;
use rmcp::model::{CallToolRequestParams, CallToolResponse, ServerConfig};

use super::McpOptions;
use super::server::{LiveHandler, call_id_text, is_modern};
use crate::tools::{
    Attachment, Definition, ErrorType, Registry, Safety, Tool, ToolContext, ToolResult, ToolSource,
};

/// A 1×1 PNG.
const TEST_IMAGE_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A minimal WAV file.
const TEST_AUDIO_BASE64: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";
/// The pause between a fixture's notifications, so that clients see them arrive
/// during the call rather than all at once (what the suite's scenarios describe).
const STEP_PAUSE: Duration = Duration::from_millis(50);

/// What a fixture may use of the MCP client behind its call.
pub(crate) struct CallClient {
    pub(crate) peer: Peer<RoleServer>,
    pub(crate) progress_token: Option<ProgressToken>,
    pub(crate) log_level: Option<LoggingLevel>,
    /// The request speaks 2026-07-28 (no server-to-client requests allowed).
    pub(crate) modern: bool,
}

type Key = (String, String);

static CLIENTS: LazyLock<DashMap<Key, Arc<CallClient>>> = LazyLock::new(DashMap::new);

/// Detaches the client of a call when the call ends.
pub(crate) struct Attached(Key);

impl Drop for Attached {
    fn drop(&mut self) {
        CLIENTS.remove(&self.0);
    }
}

pub(crate) fn attach(session_id: &str, call_id: &str, client: CallClient) -> Attached {
    let key = (session_id.to_owned(), call_id.to_owned());
    CLIENTS.insert(key.clone(), Arc::new(client));
    Attached(key)
}

fn client_of(ctx: &ToolContext) -> Option<Arc<CallClient>> {
    CLIENTS
        .get(&(ctx.env.session_id.clone(), ctx.call_id.clone()))
        .map(|entry| entry.value().clone())
}

/// Registers every fixture tool as a source of its own (`conformance` in
/// `tools/list`); a name another source holds is left alone and logged.
pub fn register(registry: &Registry) {
    for fixture in all() {
        let name = fixture.definition().name.clone();
        if let Err(err) = registry.register_or_replace(fixture, ToolSource::Conformance) {
            tracing::debug!(%name, %err, "fixture tool not registered");
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    SimpleText,
    Image,
    Audio,
    EmbeddedResource,
    MultipleContentTypes,
    Logging,
    ErrorHandling,
    Progress,
    Sampling,
    Elicitation,
    ElicitationDefaults,
    ElicitationEnums,
    JsonSchema2020,
}

struct Fixture {
    kind: Kind,
    definition: Definition,
}

fn all() -> Vec<Arc<dyn Tool>> {
    let no_args = json!({"type": "object", "properties": {}});
    let fixtures = [
        (
            Kind::SimpleText,
            "test_simple_text",
            "Tests simple text content response",
            no_args.clone(),
        ),
        (Kind::Image, "test_image_content", "Tests image content response", no_args.clone()),
        (Kind::Audio, "test_audio_content", "Tests audio content response", no_args.clone()),
        (
            Kind::EmbeddedResource,
            "test_embedded_resource",
            "Tests embedded resource content response",
            no_args.clone(),
        ),
        (
            Kind::MultipleContentTypes,
            "test_multiple_content_types",
            "Tests response with multiple content types (text, image, resource)",
            no_args.clone(),
        ),
        (
            Kind::Logging,
            "test_tool_with_logging",
            "Tests tool that emits log messages during execution",
            no_args.clone(),
        ),
        (
            Kind::ErrorHandling,
            "test_error_handling",
            "Tests error response handling",
            no_args.clone(),
        ),
        (
            Kind::Progress,
            "test_tool_with_progress",
            "Tests tool that reports progress notifications",
            no_args.clone(),
        ),
        (
            Kind::Sampling,
            "test_sampling",
            "Tests server-initiated sampling (LLM completion request)",
            json!({"type": "object", "properties": {"prompt": {"type": "string", "description": "The prompt to send to the LLM"}}, "required": ["prompt"]}),
        ),
        (
            Kind::Elicitation,
            "test_elicitation",
            "Tests server-initiated elicitation (user input request)",
            json!({"type": "object", "properties": {"message": {"type": "string", "description": "The message to show the user"}}, "required": ["message"]}),
        ),
        (
            Kind::ElicitationDefaults,
            "test_elicitation_sep1034_defaults",
            "Tests elicitation with default values per SEP-1034",
            no_args.clone(),
        ),
        (
            Kind::ElicitationEnums,
            "test_elicitation_sep1330_enums",
            "Tests elicitation with enum schema improvements per SEP-1330",
            no_args,
        ),
        (
            Kind::JsonSchema2020,
            "json_schema_2020_12_tool",
            "Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613)",
            json_schema_2020_12(),
        ),
    ];
    fixtures
        .into_iter()
        .map(|(kind, name, description, input_schema)| {
            Arc::new(Fixture {
                kind,
                definition: Definition {
                    name: name.to_owned(),
                    description: description.to_owned(),
                    input_schema,
                    safety: Safety::ReadOnly,
                    system: false,
                    timeout: None,
                },
            }) as Arc<dyn Tool>
        })
        .collect()
}

/// The suite checks that every keyword of this schema survives `tools/list`.
fn json_schema_2020_12() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {
                "$anchor": "addressDef",
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}}
            }
        },
        "properties": {
            "name": {"type": "string"},
            "address": {"$ref": "#/$defs/address"},
            "contactMethod": {"type": "string", "enum": ["phone", "email"]},
            "phone": {"type": "string"},
            "email": {"type": "string"}
        },
        "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
        "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
        "then": {"required": ["phone"]},
        "else": {"required": ["email"]},
        "additionalProperties": false
    })
}

#[async_trait::async_trait]
impl Tool for Fixture {
    fn definition(&self) -> &Definition {
        &self.definition
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolResult {
        let image =
            || Attachment::Image { mime_type: "image/png".into(), data: TEST_IMAGE_BASE64.into() };
        match self.kind {
            Kind::SimpleText => ToolResult::success("This is a simple text response for testing."),
            Kind::Image => ToolResult::success("").with_attachment(image()),
            Kind::Audio => ToolResult::success("").with_attachment(Attachment::Audio {
                mime_type: "audio/wav".into(),
                data: TEST_AUDIO_BASE64.into(),
            }),
            Kind::EmbeddedResource => {
                ToolResult::success("").with_attachment(Attachment::Resource {
                    uri: "test://embedded-resource".into(),
                    mime_type: Some("text/plain".into()),
                    text: "This is an embedded resource content.".into(),
                })
            }
            Kind::MultipleContentTypes => ToolResult::success("Multiple content types test:")
                .with_attachment(image())
                .with_attachment(Attachment::Resource {
                    uri: "test://mixed-content-resource".into(),
                    mime_type: Some("application/json".into()),
                    text: json!({"test": "data", "value": 123}).to_string(),
                }),
            Kind::Logging => logging(&ctx).await,
            Kind::ErrorHandling => ToolResult::failure(
                // The fixture stands for a tool that failed inside itself.
                ErrorType::InternalError,
                "This tool intentionally returns an error for testing",
            ),
            Kind::Progress => progress(&ctx).await,
            Kind::Sampling => sampling(&ctx, &args).await,
            Kind::Elicitation => {
                let message = args.get("message").and_then(Value::as_str).unwrap_or("").to_owned();
                let schema = json!({
                    "type": "object",
                    "properties": {"response": {"type": "string", "description": "User's response"}},
                    "required": ["response"]
                });
                elicit(&ctx, &message, schema, "User response").await
            }
            Kind::ElicitationDefaults => {
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "User name", "default": "John Doe"},
                        "age": {"type": "integer", "description": "User age", "default": 30},
                        "score": {"type": "number", "description": "User score", "default": 95.5},
                        "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"], "default": "active"},
                        "verified": {"type": "boolean", "description": "Verification status", "default": true}
                    },
                    "required": []
                });
                elicit(
                    &ctx,
                    "Please review and update the form fields with defaults",
                    schema,
                    "Elicitation completed",
                )
                .await
            }
            Kind::ElicitationEnums => {
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "untitledSingle": {"type": "string", "description": "Select one option", "enum": ["option1", "option2", "option3"]},
                        "titledSingle": {"type": "string", "description": "Select one option with titles", "oneOf": [
                            {"const": "value1", "title": "First Option"},
                            {"const": "value2", "title": "Second Option"},
                            {"const": "value3", "title": "Third Option"}
                        ]},
                        "legacyEnum": {"type": "string", "description": "Select one option (legacy)", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
                        "untitledMulti": {"type": "array", "description": "Select multiple options", "minItems": 1, "maxItems": 3, "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                        "titledMulti": {"type": "array", "description": "Select multiple options with titles", "minItems": 1, "maxItems": 3, "items": {"anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"}
                        ]}}
                    },
                    "required": []
                });
                elicit(
                    &ctx,
                    "Please select options from the enum fields",
                    schema,
                    "Elicitation completed",
                )
                .await
            }
            Kind::JsonSchema2020 => {
                ToolResult::success(format!("JSON Schema 2020-12 tool called with: {args}"))
            }
        }
    }
}

fn level_rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

async fn logging(ctx: &ToolContext) -> ToolResult {
    if let Some(client) = client_of(ctx) {
        // Without logging/setLevel the client gets every level (the spec lets the
        // server choose); with it, only that level and above.
        let wanted = client
            .log_level
            .is_none_or(|level| level_rank(level) <= level_rank(LoggingLevel::Info));
        for (step, text) in
            ["Tool execution started", "Tool processing data", "Tool execution completed"]
                .iter()
                .enumerate()
        {
            if step > 0 {
                tokio::time::sleep(STEP_PAUSE).await;
            }
            if wanted {
                let param = json!({"level": "info", "logger": "toolgate", "data": text});
                if let Ok(param) = serde_json::from_value(param) {
                    let _ = client.peer.notify_logging_message(param).await;
                }
            }
        }
    }
    ToolResult::success("Tool with logging executed successfully")
}

async fn progress(ctx: &ToolContext) -> ToolResult {
    let client = client_of(ctx);
    let token = client.as_ref().and_then(|client| client.progress_token.clone());
    for (step, done) in [0u32, 50, 100].into_iter().enumerate() {
        if step > 0 {
            tokio::time::sleep(STEP_PAUSE).await;
        }
        if let (Some(client), Some(token)) = (&client, &token) {
            let param = json!({
                "progressToken": token,
                "progress": done,
                "total": 100,
                "message": format!("Completed step {done} of 100"),
            });
            if let Ok(param) = serde_json::from_value(param) {
                let _ = client.peer.notify_progress(param).await;
            }
        }
    }
    let text = token.map(|token| match token.0 {
        rmcp::model::NumberOrString::Number(n) => n.to_string(),
        rmcp::model::NumberOrString::String(s) => s.to_string(),
    });
    ToolResult::success(text.unwrap_or_else(|| "0".to_owned()))
}

async fn sampling(ctx: &ToolContext, args: &Value) -> ToolResult {
    let Some(client) = client_of(ctx).filter(|client| !client.modern) else {
        return ToolResult::success("Sampling not supported or error: no client to ask");
    };
    let prompt = args.get("prompt").and_then(Value::as_str).unwrap_or("");
    let params = json!({
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
        "maxTokens": 100
    });
    let params = match serde_json::from_value(params) {
        Ok(params) => params,
        Err(err) => return ToolResult::success(format!("Sampling not supported or error: {err}")),
    };
    match client.peer.create_message(params).await {
        Ok(result) => {
            let value = serde_json::to_value(&result).unwrap_or(Value::Null);
            let text = value
                .pointer("/content/text")
                .and_then(Value::as_str)
                .unwrap_or("No response")
                .to_owned();
            ToolResult::success(format!("LLM response: {text}"))
        }
        Err(err) => ToolResult::success(format!("Sampling not supported or error: {err}")),
    }
}

async fn elicit(ctx: &ToolContext, message: &str, schema: Value, label: &str) -> ToolResult {
    let Some(client) = client_of(ctx).filter(|client| !client.modern) else {
        return ToolResult::success("Elicitation not supported or error: no client to ask");
    };
    let params = json!({"mode": "form", "message": message, "requestedSchema": schema});
    let params = match serde_json::from_value(params) {
        Ok(params) => params,
        Err(err) => {
            return ToolResult::success(format!("Elicitation not supported or error: {err}"));
        }
    };
    match client.peer.create_elicitation(params).await {
        Ok(result) => {
            let value = serde_json::to_value(&result).unwrap_or(Value::Null);
            let action = value.get("action").and_then(Value::as_str).unwrap_or("unknown");
            let content = value.get("content").cloned().unwrap_or_else(|| json!({}));
            ToolResult::success(format!("{label}: action={action}, content={content}"))
        }
        Err(err) => ToolResult::success(format!("Elicitation not supported or error: {err}")),
    }
}

// ----- The handler that serves the fixtures -----

/// The live handler wrapped with the fixtures: each call gets its [`CallClient`]
/// attached, and resources, prompts and completion are served. Built only under
/// `--conformance-fixtures`.
#[derive(Clone)]
pub struct Conformance {
    live: LiveHandler,
}

impl Conformance {
    pub(crate) fn new(live: LiveHandler) -> Conformance {
        Conformance { live }
    }

    pub(crate) fn live(&self) -> &LiveHandler {
        &self.live
    }

    fn options(&self) -> &McpOptions {
        &self.live.face().options
    }

    /// The live server info, with the capabilities the fixtures add.
    pub(crate) fn get_info(&self) -> ServerConfig {
        let mut info = serde_json::to_value(self.live.get_info()).unwrap_or_default();
        if let Some(capabilities) = info.get_mut("capabilities").and_then(Value::as_object_mut) {
            capabilities
                .insert("resources".into(), json!({"subscribe": true, "listChanged": true}));
            capabilities.insert("prompts".into(), json!({"listChanged": true}));
            capabilities.insert("completions".into(), json!({}));
        }
        serde_json::from_value(info).unwrap_or_default()
    }

    /// Attaches the MCP client to the call for the fixture tools, then runs it as
    /// the live handler does.
    pub(crate) async fn call_tool(
        &self,
        params: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let session = self.live.session(&ctx).await?;
        let _client = attach(
            session.id(),
            &call_id_text(&ctx),
            CallClient {
                peer: ctx.peer.clone(),
                progress_token: ctx.meta.get_progress_token(),
                log_level: self.live.log_level(),
                modern: is_modern(&ctx),
            },
        );
        self.live.call_tool(params, ctx).await
    }

    pub(crate) fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        list_resources(self.options(), request, ctx)
    }

    pub(crate) fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        list_resource_templates(self.options(), request, ctx)
    }

    pub(crate) fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        read_resource(self.options(), request, ctx)
    }

    pub(crate) fn subscribe(
        &self,
        uri: &str,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        subscribe(self.options(), uri, ctx)
    }

    pub(crate) fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        list_prompts(self.options(), request, ctx)
    }

    pub(crate) fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        get_prompt(self.options(), request, ctx)
    }

    pub(crate) fn complete(
        &self,
        request: CompleteRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        complete(self.options(), request, ctx)
    }
}

// ----- Resources, prompts and completion (only with fixtures) -----

fn not_served<T>(what: &'static str) -> Result<T, McpError> {
    Err(McpError::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!("{what} is not served"),
        None,
    ))
}

/// Builds a result from its JSON form, marked complete (`resultType` is required on
/// 2026-07-28; rmcp removes it for older peers).
fn from_json<T: serde::de::DeserializeOwned>(mut value: Value) -> Result<T, McpError> {
    if let Value::Object(map) = &mut value {
        map.insert("resultType".to_owned(), Value::String("complete".to_owned()));
    }
    serde_json::from_value(value).map_err(|err| McpError::internal_error(err.to_string(), None))
}

fn list_resources(
    options: &McpOptions,
    _request: Option<PaginatedRequestParams>,
    _ctx: RequestContext<RoleServer>,
) -> Result<ListResourcesResult, McpError> {
    if !options.conformance_fixtures {
        return not_served("resources/list");
    }
    from_json(json!({"resources": [
        {"uri": "test://static-text", "name": "static-text", "title": "Static Text Resource", "description": "A static text resource for testing", "mimeType": "text/plain"},
        {"uri": "test://static-binary", "name": "static-binary", "title": "Static Binary Resource", "description": "A static binary resource (image) for testing", "mimeType": "image/png"},
        {"uri": "test://watched-resource", "name": "watched-resource", "title": "Watched Resource", "description": "A resource clients may subscribe to", "mimeType": "text/plain"}
    ]}))
}

fn list_resource_templates(
    options: &McpOptions,
    _request: Option<PaginatedRequestParams>,
    _ctx: RequestContext<RoleServer>,
) -> Result<ListResourceTemplatesResult, McpError> {
    if !options.conformance_fixtures {
        return not_served("resources/templates/list");
    }
    from_json(json!({"resourceTemplates": [
        {"uriTemplate": "test://template/{id}/data", "name": "template", "title": "Resource Template", "description": "A resource template with parameter substitution", "mimeType": "application/json"}
    ]}))
}

fn read_resource(
    options: &McpOptions,
    request: ReadResourceRequestParams,
    _ctx: RequestContext<RoleServer>,
) -> Result<ReadResourceResponse, McpError> {
    if !options.conformance_fixtures {
        return not_served("resources/read");
    }
    let uri = request.uri.as_str();
    let contents = match uri {
        "test://static-text" => {
            json!({"uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource."})
        }
        "test://static-binary" => {
            json!({"uri": uri, "mimeType": "image/png", "blob": TEST_IMAGE_BASE64})
        }
        "test://watched-resource" => {
            json!({"uri": uri, "mimeType": "text/plain", "text": "Watched resource content"})
        }
        _ => match uri.strip_prefix("test://template/").and_then(|rest| rest.strip_suffix("/data"))
        {
            Some(id) if !id.is_empty() && !id.contains('/') => json!({
                "uri": uri,
                "mimeType": "application/json",
                "text": json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")}).to_string(),
            }),
            _ => {
                return Err(McpError::resource_not_found(
                    format!("Resource not found: {uri}"),
                    Some(json!({"uri": uri})),
                ));
            }
        },
    };
    Ok(ReadResourceResponse::Complete(from_json(json!({"contents": [contents]}))?))
}

fn subscribe(
    options: &McpOptions,
    _uri: &str,
    _ctx: RequestContext<RoleServer>,
) -> Result<(), McpError> {
    if !options.conformance_fixtures {
        return not_served("resources/subscribe");
    }
    // The fixture resources never change, so a subscription has nothing to deliver.
    Ok(())
}

fn list_prompts(
    options: &McpOptions,
    _request: Option<PaginatedRequestParams>,
    _ctx: RequestContext<RoleServer>,
) -> Result<ListPromptsResult, McpError> {
    if !options.conformance_fixtures {
        return not_served("prompts/list");
    }
    from_json(json!({"prompts": [
        {"name": "test_simple_prompt", "title": "Simple Test Prompt", "description": "A simple prompt without arguments"},
        {"name": "test_prompt_with_arguments", "title": "Prompt With Arguments", "description": "A prompt with required arguments", "arguments": [
            {"name": "arg1", "description": "First test argument", "required": true},
            {"name": "arg2", "description": "Second test argument", "required": true}
        ]},
        {"name": "test_prompt_with_embedded_resource", "title": "Prompt With Embedded Resource", "description": "A prompt that includes an embedded resource", "arguments": [
            {"name": "resourceUri", "description": "URI of the resource to embed", "required": true}
        ]},
        {"name": "test_prompt_with_image", "title": "Prompt With Image", "description": "A prompt that includes image content"}
    ]}))
}

fn get_prompt(
    options: &McpOptions,
    request: GetPromptRequestParams,
    _ctx: RequestContext<RoleServer>,
) -> Result<GetPromptResponse, McpError> {
    if !options.conformance_fixtures {
        return not_served("prompts/get");
    }
    let argument = |name: &str| -> Result<String, McpError> {
        request
            .arguments
            .as_ref()
            .and_then(|args| args.get(name))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| McpError::invalid_params(format!("missing argument {name}"), None))
    };
    let text = |text: String| json!({"role": "user", "content": {"type": "text", "text": text}});
    let messages = match request.name.as_ref() {
        "test_simple_prompt" => json!([text("This is a simple prompt for testing.".into())]),
        "test_prompt_with_arguments" => {
            let (arg1, arg2) = (argument("arg1")?, argument("arg2")?);
            json!([text(format!("Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"))])
        }
        "test_prompt_with_embedded_resource" => {
            let uri = argument("resourceUri")?;
            json!([
                {"role": "user", "content": {"type": "resource", "resource": {"uri": uri, "mimeType": "text/plain", "text": "Embedded resource content for testing."}}},
                text("Please process the embedded resource above.".into())
            ])
        }
        "test_prompt_with_image" => json!([
            {"role": "user", "content": {"type": "image", "data": TEST_IMAGE_BASE64, "mimeType": "image/png"}},
            text("Please analyze the image above.".into())
        ]),
        other => return Err(McpError::invalid_params(format!("unknown prompt: {other}"), None)),
    };
    Ok(GetPromptResponse::Complete(from_json(json!({"messages": messages}))?))
}

fn complete(
    options: &McpOptions,
    _request: CompleteRequestParams,
    _ctx: RequestContext<RoleServer>,
) -> Result<CompleteResult, McpError> {
    if !options.conformance_fixtures {
        return not_served("completion/complete");
    }
    from_json(json!({"completion": {"values": [], "total": 0, "hasMore": false}}))
}
