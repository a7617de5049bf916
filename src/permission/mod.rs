//! SKELETON: the permission engine (the real one replaces this file).

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tools::Safety;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Default,
    AcceptEdits,
    Plan,
    Bypass,
    DontAsk,
}

impl Mode {
    fn rank(self) -> u8 {
        match self {
            Mode::Plan => 0,
            Mode::DontAsk => 1,
            Mode::Default => 2,
            Mode::AcceptEdits => 3,
            Mode::Bypass => 4,
        }
    }
    pub fn restrict_to(self, ceiling: Mode) -> Mode {
        if self.rank() <= ceiling.rank() { self } else { ceiling }
    }
    pub fn within(self, ceiling: Mode) -> bool {
        self.rank() <= ceiling.rank()
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Default => "default",
            Mode::AcceptEdits => "accept_edits",
            Mode::Plan => "plan",
            Mode::Bypass => "bypass",
            Mode::DontAsk => "dont_ask",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    System,
    Rule,
    Mode,
    SessionGrant,
    Hook,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuleList {
    Allow,
    Ask,
    Deny,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Explanation {
    pub layer: Layer,
    pub rule: Option<String>,
    pub list: Option<RuleList>,
    pub reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Ask,
    Deny,
    NotAllowedInMode,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub explanation: Explanation,
}

pub struct ToolFacts<'a> {
    pub name: &'a str,
    pub safety: Safety,
    pub system: bool,
}

pub struct CallContext<'a> {
    pub cwd: &'a Path,
    pub roots: &'a [PathBuf],
}

#[derive(Debug, Default)]
pub struct Policy {}

impl Policy {
    pub fn decide(
        &self,
        mode: Mode,
        grants: &[String],
        tool: &ToolFacts,
        _args: &Value,
        _ctx: &CallContext,
    ) -> Decision {
        let (verdict, layer) = if tool.system {
            (Verdict::Allow, Layer::System)
        } else if grants.iter().any(|g| g == tool.name) {
            (Verdict::Allow, Layer::SessionGrant)
        } else if tool.safety == Safety::ReadOnly || mode == Mode::Bypass {
            (Verdict::Allow, Layer::Mode)
        } else if mode == Mode::Plan {
            (Verdict::NotAllowedInMode, Layer::Mode)
        } else {
            (Verdict::Ask, Layer::Mode)
        };
        Decision {
            verdict,
            explanation: Explanation {
                layer,
                rule: None,
                list: None,
                reason: format!("{mode} mode"),
            },
        }
    }
    pub fn suggestions(&self, tool: &str, _args: &Value) -> Vec<String> {
        vec![tool.to_owned()]
    }
}
