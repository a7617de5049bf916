//! SKELETON: command hooks.

use std::path::Path;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
pub struct Hooks {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookVerdict { Continue, Allow, Ask, Deny, Block }

pub struct PreToolUseInput { pub session_id: String, pub cwd: String, pub tool_name: String, pub tool_input: Value, pub call_id: String, pub permission_mode: String }
pub struct PostToolUseInput { pub session_id: String, pub cwd: String, pub tool_name: String, pub tool_input: Value, pub call_id: String, pub permission_mode: String, pub tool_result: Value }
pub struct PreOutcome { pub verdict: HookVerdict, pub reason: Option<String>, pub updated_input: Option<Value> }
pub struct PostOutcome { pub feedback: Option<String> }

impl Hooks {
    pub fn has_pre(&self, _tool: &str) -> bool { false }
    pub fn has_post(&self, _tool: &str) -> bool { false }
    pub async fn run_pre(&self, _input: &PreToolUseInput, _env: &[(String, String)], _cwd: &Path, _cancel: &CancellationToken) -> PreOutcome {
        PreOutcome { verdict: HookVerdict::Continue, reason: None, updated_input: None }
    }
    pub async fn run_post(&self, _input: &PostToolUseInput, _env: &[(String, String)], _cwd: &Path, _cancel: &CancellationToken) -> PostOutcome {
        PostOutcome { feedback: None }
    }
}
