//! The policy's wire types: a session's permission mode, which layer and rule decided a
//! call and why, and how the call was finally decided.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How much a session may do without asking.
///
/// Permissiveness is a partial order: `plan` ≤ `default` ≤ `accept_edits` ≤ `bypass`,
/// and `dont_ask` ≤ `default`. `plan` and `dont_ask` are incomparable (plan may ask
/// about read-only calls, which dont_ask never does; dont_ask may run side effects that
/// rules allow, which plan never does). See [`Mode::restrict`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Read-only tools run; side-effecting tools ask.
    #[default]
    Default,
    /// Like `default`, but file edits (`write_file`, `edit_file`, `apply_patch`,
    /// `notebook_edit`) inside the roots run without asking. Commands still ask.
    #[serde(alias = "acceptEdits")]
    AcceptEdits,
    /// Only read-only tools run; side-effecting calls are refused.
    Plan,
    /// Everything no rule denies or asks about runs.
    #[serde(alias = "bypassPermissions")]
    Bypass,
    /// Like `default`, but whatever would ask is denied: for headless agents with
    /// nobody to approve.
    #[serde(alias = "dontAsk")]
    DontAsk,
}

/// Which layer of the engine decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// A system tool: rules and modes do not apply.
    System,
    /// A configured allow, ask or deny rule.
    Rule,
    /// The session's mode (no rule matched, plan mode refused, or dont_ask converted).
    Mode,
    /// An allow rule granted at run time for this session.
    SessionGrant,
    /// A PreToolUse hook answered. The engine never decides by this layer; the agent
    /// layer uses it when a hook's answer settles the call, and `tools/explain` lists
    /// every hook that would run for the call, whose answer only the call itself gets.
    Hook,
    /// Where the call's paths resolve: outside the session roots the tool refuses
    /// (`access_denied`). The engine never decides by this layer; `tools/explain`
    /// reports it.
    Confinement,
    /// The kernel sandbox a command runs in: what it may read and write, and what
    /// never. The engine never decides by this layer; `tools/explain` reports it for
    /// the tools that run commands.
    Sandbox,
}

/// The three configured rule lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuleList {
    Allow,
    Ask,
    Deny,
}

/// Why a decision came out as it did: for users, events and the audit log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Explanation {
    pub layer: Layer,
    /// The deciding rule as configured (for a compound command allowed by several
    /// rules, the first; the reason names them all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The list the deciding rule belongs to (`allow` for session grants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<RuleList>,
    /// One human sentence.
    pub reason: String,
}

/// Whether the call went on to its tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The call reached the registry (which may still refuse its arguments).
    Allow,
    /// The call was refused before its tool ran.
    Deny,
}

/// Who or what settled the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    /// A configured allow, ask or deny rule (named by `rule`).
    Rule,
    /// The session's mode: no rule matched, plan mode, or `dont_ask`.
    Mode,
    /// An "allow for this session" answer given earlier.
    SessionGrant,
    /// A system tool: rules and modes do not apply.
    System,
    /// The session's tool allowlist.
    Allowlist,
    /// A PreToolUse hook: its allow, deny or block, or an updated input that is invalid.
    Hook,
    /// A person answered the question.
    Person,
    /// Nobody answered within the approval timeout.
    Timeout,
    /// The call was canceled while it waited for an answer.
    Canceled,
    /// Nobody could be asked: no approver connected, or a client that cannot answer.
    Unavailable,
    /// No policy applies: the tool is unknown, and the registry says so.
    Registry,
}

/// The decision about one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CallDecision {
    pub outcome: Outcome,
    pub decided_by: DecidedBy,
    /// Whether the call needed a person's answer (asked, or tried to ask).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub asked: bool,
    /// The layer of the permission engine whose verdict applied, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<Layer>,
    /// The rule as written in the configuration (or granted in the session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The list that rule belongs to (`allow` for session grants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<RuleList>,
}
