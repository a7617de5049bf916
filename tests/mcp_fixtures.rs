//! The conformance suite's fixtures are a tool source of their own, present only when
//! the MCP face is started with them; the live handler serves none of them.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

mod mcp_support;

use mcp_support::{StdioClient, TestDaemon};
use serde_json::{Value, json};
use toolgate::mcp::McpOptions;
use toolgate::tools::ToolSource;

fn names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn without_the_option_no_fixture_is_served() {
    let test = TestDaemon::new();
    let mut client = StdioClient::start(&test.daemon, McpOptions::default());
    let init = client.initialize("2025-11-25", json!({})).await;
    // Resources are only long results' whole texts, read by their links: none listed.
    assert_eq!(init["result"]["capabilities"]["resources"], json!({}), "{init}");
    let list = client.request(1, "tools/list", json!({})).await;
    assert!(!names(&list).iter().any(|name| name.starts_with("test_")), "{list}");
    let resources = client.request(2, "resources/list", json!({})).await;
    assert_eq!(resources["result"]["resources"], json!([]), "{resources}");
    let fixture = client.request(3, "resources/read", json!({"uri": "test://static-text"})).await;
    assert_eq!(fixture["error"]["code"], json!(-32002), "{fixture}");
    let refused = client.request(4, "prompts/list", json!({})).await;
    assert_eq!(refused["error"]["code"], json!(-32601), "{refused}");
    assert!(test.daemon.registry().get("test_simple_text").is_none());
    client.close().await;
}

#[tokio::test]
async fn with_the_option_the_fixtures_are_a_source_of_their_own() {
    let test = TestDaemon::new();
    let options = McpOptions { conformance_fixtures: true, ..McpOptions::default() };
    let mut client = StdioClient::start(&test.daemon, options);
    let init = client.initialize("2025-11-25", json!({})).await;
    assert!(init["result"]["capabilities"]["resources"].is_object(), "{init}");
    let list = client.request(1, "tools/list", json!({})).await;
    assert!(names(&list).contains(&"test_simple_text".to_owned()), "{list}");
    assert_eq!(
        test.daemon.registry().sources().get("test_simple_text"),
        Some(&ToolSource::Conformance)
    );
    let call =
        client.request(2, "tools/call", json!({"name": "test_simple_text", "arguments": {}})).await;
    assert_eq!(call["result"]["isError"], json!(false), "{call}");
    let resources = client.request(3, "resources/list", json!({})).await;
    assert!(resources["result"]["resources"].is_array(), "{resources}");
    client.close().await;
}
