//! How toolgate's tool contract looks on the MCP wire: a [`Definition`] becomes an
//! MCP `Tool`, a [`ToolResult`] becomes a `CallToolResult`.
//!
//! The mapping is pure (no I/O, no session) so that it can be pinned by snapshot
//! tests: MCP hosts cache tool lists and models see them verbatim, so the shape must
//! not drift by accident.

use std::borrow::Cow;

use rmcp::model::{CallToolResult, ContentBlock, Tool};
use serde_json::{Map, Value, json};

use super::results::{Linked, RESULT_MIME_TYPE};
use crate::tools::{Attachment, Definition, ToolResult};

/// The `_meta` key carrying whether a tool is a control-plane tool.
pub const META_SYSTEM: &str = "toolgate/system";
/// The `_meta` key carrying a tool's own deadline in milliseconds.
pub const META_TIMEOUT_MS: &str = "toolgate/timeout_ms";

/// The wire form of one Definition, as plain JSON (what `tools/list` sends).
pub fn tool_json(definition: &Definition) -> Value {
    let read_only = definition.safety.is_read_only();
    let mut meta = Map::new();
    meta.insert(META_SYSTEM.to_owned(), Value::Bool(definition.system));
    if let Some(timeout) = definition.timeout {
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        meta.insert(META_TIMEOUT_MS.to_owned(), Value::from(millis));
    }
    let mut input_schema = definition.input_schema.clone();
    // MCP requires an object schema at the top; every registered tool has one, but a
    // schema that says nothing (`true`, `{}`) still has to be sent as an object.
    match &mut input_schema {
        Value::Object(map) => {
            map.entry("type").or_insert_with(|| Value::String("object".to_owned()));
        }
        other => *other = json!({"type": "object"}),
    }
    json!({
        "name": definition.name,
        "title": title_for(&definition.name),
        // Hosts and the spec expect a description; a tool without one shows its title.
        "description": if definition.description.trim().is_empty() {
            title_for(&definition.name)
        } else {
            definition.description.clone()
        },
        "inputSchema": input_schema,
        "annotations": {
            "readOnlyHint": read_only,
            "destructiveHint": !read_only,
        },
        "_meta": meta,
    })
}

/// A Definition as rmcp's `Tool`.
pub fn tool(definition: &Definition) -> Result<Tool, serde_json::Error> {
    serde_json::from_value(tool_json(definition))
}

/// A human title derived from the snake_case name (`read_file` → `Read file`), for
/// hosts that show `title` rather than `name`.
fn title_for(name: &str) -> String {
    let spaced = name.replace(['_', '-'], " ");
    let mut chars = spaced.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The text a model reads for a result: the tool's rendering, or for a failure
/// without one, the error code and message (a client that only shows `content` must
/// still learn why the call failed).
/// Borrowed from the result when it is the tool's rendering.
pub fn result_text(result: &ToolResult) -> Cow<'_, str> {
    if !result.content.is_empty() || result.ok {
        return Cow::Borrowed(&result.content);
    }
    let code = result.error_type.map(|code| code.as_str()).unwrap_or("error");
    match &result.error {
        Some(message) => Cow::Owned(format!("{code}: {message}")),
        None => Cow::Borrowed(code),
    }
}

/// The wire form of one result, as plain JSON (`CallToolResult`).
pub fn call_result_json(result: &ToolResult) -> Value {
    let mut content = Vec::with_capacity(1 + result.attachments.len());
    let text = result_text(result);
    // An image-only result needs no empty text block; anything else always carries
    // its text so that text-only hosts see something.
    if !text.is_empty() || result.attachments.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for attachment in &result.attachments {
        content.push(match attachment {
            Attachment::Image { mime_type, data } => {
                json!({"type": "image", "data": data, "mimeType": mime_type})
            }
            Attachment::Audio { mime_type, data } => {
                json!({"type": "audio", "data": data, "mimeType": mime_type})
            }
            Attachment::Resource { uri, mime_type, text } => {
                let mut resource = json!({"uri": uri, "text": text});
                if let (Some(mime), Value::Object(map)) = (mime_type, &mut resource) {
                    map.insert("mimeType".to_owned(), Value::String(mime.clone()));
                }
                json!({"type": "resource", "resource": resource})
            }
        });
    }
    let structured = serde_json::to_value(result).unwrap_or(Value::Null);
    // `resultType` is required from 2026-07-28 on; rmcp removes it for older peers.
    json!({
        "resultType": "complete",
        "content": content,
        "structuredContent": structured,
        "isError": !result.ok,
    })
}

/// The wire form of a result whose text was too long to send: `content` holds an
/// excerpt of it and a `resource_link` to the whole text, and `structuredContent`
/// (toolgate's Result object; tools declare no outputSchema) carries the same
/// excerpt as its `content` and the link in `metadata.full_result`, so that neither
/// form repeats the long text.
pub fn linked_call_result_json(result: &ToolResult, linked: &Linked, name: &str) -> Value {
    let mut wire = call_result_json(result);
    let link = json!({
        "type": "resource_link",
        "uri": linked.uri,
        "name": name,
        "description": format!("The whole text of this {} result", result.tool),
        "mimeType": RESULT_MIME_TYPE,
        "size": linked.size,
    });
    if let Some(Value::Array(content)) = wire.get_mut("content") {
        // The first block is the text (a long result always has one).
        if let Some(first) = content.first_mut() {
            *first = json!({"type": "text", "text": linked.excerpt});
        }
        content.insert(1, link);
    }
    if let Some(Value::Object(structured)) = wire.get_mut("structuredContent") {
        if !result.content.is_empty() {
            structured.insert("content".to_owned(), Value::String(linked.excerpt.clone()));
        }
        if let Some(Value::Object(metadata)) = structured.get_mut("metadata") {
            metadata
                .insert("full_result".to_owned(), json!({"uri": linked.uri, "bytes": linked.size}));
        }
    }
    wire
}

/// A result as rmcp's `CallToolResult`, with a long text replaced by an excerpt and
/// a link when `linked` says where its whole text is kept.
pub fn call_result_with(
    result: &ToolResult,
    linked: Option<&Linked>,
) -> Result<CallToolResult, serde_json::Error> {
    match linked {
        Some(linked) => {
            let name =
                format!("{}-result", if result.tool.is_empty() { "tool" } else { &result.tool });
            serde_json::from_value(linked_call_result_json(result, linked, &name))
        }
        None => call_result(result),
    }
}

/// A result as rmcp's `CallToolResult`: the same wire form as [`call_result_json`].
/// A result without attachments (nearly all) is built directly, without going
/// through a JSON tree and back.
pub fn call_result(result: &ToolResult) -> Result<CallToolResult, serde_json::Error> {
    if !result.attachments.is_empty() {
        return serde_json::from_value(call_result_json(result));
    }
    let mut wire =
        CallToolResult::success(vec![ContentBlock::text(result_text(result).into_owned())]);
    wire.structured_content = Some(serde_json::to_value(result).unwrap_or(Value::Null));
    wire.is_error = Some(!result.ok);
    Ok(wire)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use expect_test::expect;

    use super::*;
    use crate::tools::{ErrorType, Safety};

    fn definition(
        name: &str,
        safety: Safety,
        system: bool,
        timeout: Option<Duration>,
    ) -> Definition {
        Definition {
            name: name.to_owned(),
            description: format!("the {name} tool"),
            input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            safety,
            system,
            timeout,
            facts: Default::default(),
        }
    }

    fn pretty(value: &Value) -> String {
        serde_json::to_string_pretty(value).unwrap_or_default()
    }

    #[test]
    fn read_only_tool_maps_to_read_only_hint() {
        let tool = tool_json(&definition("read_file", Safety::ReadOnly, false, None));
        expect![[r#"
            {
              "_meta": {
                "toolgate/system": false
              },
              "annotations": {
                "destructiveHint": false,
                "readOnlyHint": true
              },
              "description": "the read_file tool",
              "inputSchema": {
                "properties": {
                  "path": {
                    "type": "string"
                  }
                },
                "type": "object"
              },
              "name": "read_file",
              "title": "Read file"
            }"#]]
        .assert_eq(&pretty(&tool));
    }

    #[test]
    fn side_effect_system_tool_carries_flags_and_timeout() {
        let tool = tool_json(&definition(
            "exit_plan_mode",
            Safety::SideEffect,
            true,
            Some(Duration::from_secs(30)),
        ));
        expect![[r#"
            {
              "_meta": {
                "toolgate/system": true,
                "toolgate/timeout_ms": 30000
              },
              "annotations": {
                "destructiveHint": true,
                "readOnlyHint": false
              },
              "description": "the exit_plan_mode tool",
              "inputSchema": {
                "properties": {
                  "path": {
                    "type": "string"
                  }
                },
                "type": "object"
              },
              "name": "exit_plan_mode",
              "title": "Exit plan mode"
            }"#]]
        .assert_eq(&pretty(&tool));
        // And rmcp accepts it as a Tool.
        assert!(super::tool(&definition("x", Safety::ReadOnly, false, None)).is_ok());
    }

    #[test]
    fn schema_without_type_gets_object_type() {
        let mut def = definition("t", Safety::ReadOnly, false, None);
        def.input_schema = json!(true);
        assert_eq!(tool_json(&def)["inputSchema"], json!({"type": "object"}));
        def.input_schema = json!({"properties": {}});
        assert_eq!(tool_json(&def)["inputSchema"], json!({"type": "object", "properties": {}}));
    }

    #[test]
    fn success_result_maps_to_text_and_structured_content() {
        let res = ToolResult::success("hello").stamp("read_file", "7").with_meta("lines", 1);
        expect![[r#"
            {
              "content": [
                {
                  "text": "hello",
                  "type": "text"
                }
              ],
              "isError": false,
              "resultType": "complete",
              "structuredContent": {
                "content": "hello",
                "metadata": {
                  "call_id": "7",
                  "lines": 1
                },
                "ok": true,
                "tool": "read_file"
              }
            }"#]]
        .assert_eq(&pretty(&call_result_json(&res)));
    }

    #[test]
    fn failure_without_content_renders_code_and_message() {
        let res = ToolResult::failure(ErrorType::PermissionDenied, "no").stamp("run_command", "1");
        let wire = call_result_json(&res);
        assert_eq!(wire["isError"], json!(true));
        assert_eq!(wire["content"], json!([{"type": "text", "text": "permission_denied: no"}]));
        assert_eq!(wire["structuredContent"]["error_type"], json!("permission_denied"));
        assert!(call_result(&res).is_ok());
    }

    #[test]
    fn direct_result_has_the_json_wire_form() {
        let results = [
            ToolResult::success("hello\tworld\n").stamp("read_file", "7").with_meta("lines", 1),
            ToolResult::success("").stamp("write_file", "8"),
            ToolResult::failure(ErrorType::PermissionDenied, "no").stamp("run_command", "1"),
            ToolResult::failure(ErrorType::NotFound, "gone").stamp("read_file", "x"),
        ];
        for res in &results {
            let direct = serde_json::to_value(call_result(res).unwrap()).unwrap();
            assert_eq!(direct, call_result_json(res), "{res:?}");
        }
    }

    #[test]
    fn linked_result_carries_the_excerpt_and_the_link_in_both_forms() {
        let res = ToolResult::success("x".repeat(100)).stamp("run_command", "3");
        let linked =
            Linked { uri: "toolgate://results/ab".into(), excerpt: "xx[...]xx".into(), size: 100 };
        expect![[r#"
            {
              "content": [
                {
                  "text": "xx[...]xx",
                  "type": "text"
                },
                {
                  "description": "The whole text of this run_command result",
                  "mimeType": "text/plain",
                  "name": "run_command-result",
                  "size": 100,
                  "type": "resource_link",
                  "uri": "toolgate://results/ab"
                }
              ],
              "isError": false,
              "resultType": "complete",
              "structuredContent": {
                "content": "xx[...]xx",
                "metadata": {
                  "call_id": "3",
                  "full_result": {
                    "bytes": 100,
                    "uri": "toolgate://results/ab"
                  }
                },
                "ok": true,
                "tool": "run_command"
              }
            }"#]]
        .assert_eq(&pretty(&linked_call_result_json(&res, &linked, "run_command-result")));
        // rmcp reads it as a CallToolResult with a resource_link block.
        let wire = call_result_with(&res, Some(&linked)).unwrap();
        assert!(wire.content.get(1).and_then(|block| block.as_resource_link()).is_some());
    }

    #[test]
    fn attachments_become_blocks_in_order() {
        let res = ToolResult::success("")
            .with_attachment(Attachment::Image {
                mime_type: "image/png".into(),
                data: "AA==".into(),
            })
            .with_attachment(Attachment::Audio {
                mime_type: "audio/wav".into(),
                data: "AQ==".into(),
            })
            .with_attachment(Attachment::Resource {
                uri: "test://r".into(),
                mime_type: Some("text/plain".into()),
                text: "body".into(),
            });
        let wire = call_result_json(&res);
        assert_eq!(
            wire["content"],
            json!([
                {"type": "image", "data": "AA==", "mimeType": "image/png"},
                {"type": "audio", "data": "AQ==", "mimeType": "audio/wav"},
                {"type": "resource", "resource": {"uri": "test://r", "text": "body", "mimeType": "text/plain"}},
            ])
        );
        assert!(call_result(&res).is_ok());
    }
}
