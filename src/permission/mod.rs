//! The permission engine: whether a call may run, must ask a person, or is refused,
//! and why.
//!
//! Pure logic with no I/O: the engine sees the tool's declared facts, the call's
//! arguments and the session's working directory and roots, and answers with a
//! [`Decision`] whose [`Explanation`] names the layer and rule that decided (it goes on
//! the wire in events and into the audit log). The layers, in order:
//!
//! 1. **system** tools (the control plane) are always allowed; no rule or mode applies.
//! 2. **deny** rules refuse.
//! 3. **plan** mode refuses every side-effecting call with its own verdict,
//!    [`Verdict::NotAllowedInMode`], so the caller can report `tool_not_allowed`
//!    rather than a rule denial.
//! 4. **ask** rules ask.
//! 5. **allow** rules, then **session grants**, allow.
//! 6. the **mode default** decides the rest (see [`Mode`]); in `dont_ask` mode an ask
//!    becomes a deny whose reason names a rule to add.
//!
//! Rules are explicit user intent, so they rank above modes: an ask rule asks even in
//! `bypass` mode, and a session grant never overrides an ask rule. For the same reason
//! a command too long to check completely against the deny and ask rules asks in every
//! mode when such rules exist.
//!
//! Design of session state: a [`Policy`] holds the configured rules, compiled once per
//! configuration load and shared by every session. A [`PermissionEngine`] is a small
//! per-session value: the policy, the session's grants (an immutable, `Arc`-shared
//! index) and the configured and current modes. Cloning it costs two reference counts,
//! so the daemon keeps one per session and replaces it (behind its own lock) when the
//! mode changes or a grant is added; adding a grant rebuilds only the small grant
//! index. A configuration reload swaps the policy and keeps the grants.
//!
//! The engine is built to run on every call: rules are parsed and their globs compiled
//! once; a decision does one hash lookup per rule index and a few glob-set matches.
//! Only `run_command` pays for parsing the command text.

mod decided;
pub mod display;
mod path;
mod resolve;
mod rule;
mod shell;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, LazyLock};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tools::facts::{self, PathAccess};
use crate::tools::{Definition, Env, ErrorType, Facts, Safety, builtin};

// The policy's wire types (a session's mode, why and how a call was decided) are
// defined in the bottom layer, which the client-only build compiles too.
pub use crate::wire::{CallDecision, DecidedBy, Explanation, Layer, Mode, Outcome, RuleList};
pub use resolve::{Entry, Lexical, Resolver, SystemResolver, follow};
pub use rule::{
    RuleError, RuleProblem, check_rule, claude_code_aliases, covered_by, rule_warnings,
};

use rule::{PathTarget, Rule, RuleIndex, ToolRules, command_tool, earliest, is_command_tool};
use shell::{Analysis, Hazard, ShellWord};

/// Whether `tool` is a built-in that edits files (its facts say so): what
/// [`Mode::AcceptEdits`] lets run inside the roots without asking.
fn edits_files(tool: &str) -> bool {
    builtin::facts(tool).is_some_and(|facts| facts.edits)
}

/// Whether `tool` is a built-in whose path names a directory to list or search.
fn searches(tool: &str) -> bool {
    builtin::facts(tool).is_some_and(Facts::searches)
}

/// A call of the command tool running `input`.
fn command_call(input: &str) -> Value {
    serde_json::json!({ command_tool().command: input })
}

impl Mode {
    pub const ALL: [Mode; 5] =
        [Mode::Default, Mode::AcceptEdits, Mode::Plan, Mode::Bypass, Mode::DontAsk];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Default => "default",
            Mode::AcceptEdits => "accept_edits",
            Mode::Plan => "plan",
            Mode::Bypass => "bypass",
            Mode::DontAsk => "dont_ask",
        }
    }

    /// Whether every call this mode lets run (with or without asking) the other mode
    /// would let run too, with no more asking.
    pub fn is_at_most(self, other: Mode) -> bool {
        use Mode::*;
        self == other
            || matches!(
                (self, other),
                (Plan | DontAsk, Default | AcceptEdits | Bypass)
                    | (Default, AcceptEdits | Bypass)
                    | (AcceptEdits, Bypass)
            )
    }

    /// The mode a session gets when a client asks for `requested` and the daemon is
    /// configured with `configured`: a client may narrow, never widen.
    ///
    /// The requested mode when it is at most the configured one, else the configured
    /// one. For the incomparable pair (`plan` and `dont_ask`) the answer is `plan`;
    /// [`PermissionEngine`] then also keeps the configured mode as a ceiling, deciding
    /// each call under both and taking the stricter verdict, so such a session neither
    /// runs side effects nor asks.
    pub fn restrict(configured: Mode, requested: Mode) -> Mode {
        if requested.is_at_most(configured) {
            requested
        } else if configured.is_at_most(requested) {
            configured
        } else {
            Mode::Plan
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode name that is not one of the five (nor a Claude Code spelling of one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown permission mode {0:?}; expected one of default, accept_edits, plan, bypass, dont_ask"
)]
pub struct ParseModeError(pub String);

impl FromStr for Mode {
    type Err = ParseModeError;

    /// Accepts the snake_case names and Claude Code's spellings (`acceptEdits`,
    /// `bypassPermissions`, `dontAsk`).
    fn from_str(text: &str) -> Result<Mode, ParseModeError> {
        match text {
            "default" => Ok(Mode::Default),
            "accept_edits" | "acceptEdits" => Ok(Mode::AcceptEdits),
            "plan" => Ok(Mode::Plan),
            "bypass" | "bypassPermissions" => Ok(Mode::Bypass),
            "dont_ask" | "dontAsk" => Ok(Mode::DontAsk),
            other => Err(ParseModeError(other.to_owned())),
        }
    }
}

/// The outcome of a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    /// A person must approve the call first.
    Ask,
    Deny,
    /// The session's mode does not run this kind of tool (a side effect in plan mode).
    NotAllowedInMode,
}

impl Verdict {
    /// The error a refused call reports (the tool never runs); `None` for allow and ask.
    pub fn error_type(self) -> Option<ErrorType> {
        match self {
            Verdict::Allow | Verdict::Ask => None,
            Verdict::Deny => Some(ErrorType::PermissionDenied),
            Verdict::NotAllowedInMode => Some(ErrorType::ToolNotAllowed),
        }
    }

    /// Lower is stricter; used to combine the decisions under two modes.
    fn strictness(self) -> u8 {
        match self {
            Verdict::NotAllowedInMode => 0,
            Verdict::Deny => 1,
            Verdict::Ask => 2,
            Verdict::Allow => 3,
        }
    }
}

impl RuleList {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleList::Allow => "allow",
            RuleList::Ask => "ask",
            RuleList::Deny => "deny",
        }
    }
}

impl fmt::Display for RuleList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer for one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Decision {
    pub verdict: Verdict,
    pub explanation: Explanation,
    /// Allow rules that together would let this call run without asking; filled when
    /// the call asks (or is denied only because nobody may be asked) for lack of a
    /// rule. Empty when no rule could help (an ask rule matched, or the command holds
    /// something no pattern can vouch for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suggestions: Vec<String>,
    /// What an "allow for this session" answer would grant; filled when the call asks
    /// and such a grant could settle later calls. Never wider than what the person is
    /// shown: the suggested rules, else this exact call.
    #[serde(skip)]
    pub grant: Option<SessionGrant>,
}

/// What "allow for this session" adds to a session. Its [`SessionGrant::description`]
/// is shown in the approval request, so the person sees what they grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionGrant {
    kind: GrantKind,
    description: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum GrantKind {
    /// Allow rules (the call's suggestions).
    Rules(Vec<String>),
    /// Exactly this call again: the tool and the key of its arguments.
    Exact { tool: String, key: String },
}

impl SessionGrant {
    /// One line for a person: the rules granted, or the exact call.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The grant of exactly this call, when no safe rule can describe it.
    fn exact(tool: &str, args: &Value) -> SessionGrant {
        let command = command_tool();
        let shown = match args.get(command.command).and_then(Value::as_str) {
            Some(text) if is_command_tool(tool) => format!("this exact command: {text}"),
            _ => format!("{tool} with exactly these arguments: {args}"),
        };
        SessionGrant {
            kind: GrantKind::Exact { tool: tool.to_owned(), key: exact_key(tool, args) },
            description: display::inline(&shown),
        }
    }
}

/// What makes two calls "the same call" for an exact grant: for `run_command` its
/// command text and directory (a different timeout is the same command), for any
/// other tool all of its arguments.
fn exact_key(tool: &str, args: &Value) -> String {
    if is_command_tool(tool) {
        let command = command_tool();
        serde_json::json!([args.get(command.command), args.get(command.cwd)]).to_string()
    } else {
        args.to_string()
    }
}

/// The text explanations name an exact grant by.
const EXACT_GRANT: &str = "(this exact call, allowed for the session)";

impl Decision {
    fn new(verdict: Verdict, layer: Layer, reason: String) -> Decision {
        Decision {
            verdict,
            explanation: Explanation { layer, rule: None, list: None, reason },
            suggestions: Vec::new(),
            grant: None,
        }
    }

    fn with_rule(mut self, list: RuleList, rule: &str) -> Decision {
        self.explanation.rule = Some(rule.to_owned());
        self.explanation.list = Some(list);
        self
    }

    /// Whether the call may run now. Only such calls may join a concurrent batch; any
    /// other verdict makes the call its own batch.
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allow
    }

    /// For a caller that cannot ask anyone (dont_ask mode, or no approver connected):
    /// an `ask` becomes a `deny` whose reason adds `why` and the rules that would let
    /// the call through. Other verdicts are returned unchanged.
    pub fn refuse_unasked(mut self, why: &str) -> Decision {
        if self.verdict != Verdict::Ask {
            return self;
        }
        let mut reason = std::mem::take(&mut self.explanation.reason);
        reason.push_str("; ");
        reason.push_str(why);
        // Suggestions hold names from the call (a file name may carry an escape).
        match self.suggestions.as_slice() {
            [] => {}
            [one] => {
                reason.push_str(&format!(" (add an allow rule such as {})", display::inline(one)));
            }
            several => reason.push_str(&format!(
                " (add the allow rules {})",
                display::inline(&several.join(", "))
            )),
        }
        self.explanation.reason = reason;
        self.verdict = Verdict::Deny;
        self
    }
}

/// The configured rule lists, as strings (parsed by [`PermissionEngine::new`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RuleConfig {
    pub allow: Vec<String>,
    pub ask: Vec<String>,
    pub deny: Vec<String>,
    /// Names of [`PROTECTIONS`] turned off; every other protection is in force.
    pub unprotect: Vec<String>,
}

/// A protection built into the engine: deny rules in force whatever the configured
/// lists say (a `deny` list replaced by a later configuration file cannot drop them),
/// until `[permissions] unprotect` names the protection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Protection {
    /// What `unprotect` calls it.
    pub name: &'static str,
    /// Its deny rules, in rule syntax.
    pub rules: &'static [&'static str],
    /// What it protects, and why, in one phrase.
    pub why: &'static str,
}

/// Every built-in protection.
pub const PROTECTIONS: &[Protection] = &[Protection {
    name: "git",
    rules: &["Edit(**/.git/**)"],
    why: "git's own files at any depth, a `.git` file included: a repository's \
          configuration or hooks name commands git runs (core.fsmonitor, core.pager, hooks)",
}];

/// The protection named `name`, or why there is none.
pub fn protection(name: &str) -> Result<&'static Protection, RuleProblem> {
    PROTECTIONS.iter().find(|protection| protection.name == name).ok_or_else(|| {
        RuleProblem::UnknownProtection {
            name: name.to_owned(),
            known: PROTECTIONS.iter().map(|p| p.name).collect::<Vec<_>>().join(", "),
        }
    })
}

/// The protections in force under `unprotect` (names already checked or not: an
/// unknown name turns nothing off).
pub fn protections_in_force(unprotect: &[String]) -> Vec<&'static Protection> {
    PROTECTIONS.iter().filter(|p| !unprotect.iter().any(|name| name == p.name)).collect()
}

/// What the engine needs to know about the tool being called.
#[derive(Clone, Copy, Debug)]
pub struct ToolFacts<'a> {
    pub name: &'a str,
    pub safety: Safety,
    pub system: bool,
}

impl<'a> ToolFacts<'a> {
    pub fn of(definition: &'a Definition) -> ToolFacts<'a> {
        ToolFacts { name: &definition.name, safety: definition.safety, system: definition.system }
    }
}

/// Where the call would run.
#[derive(Clone, Copy)]
pub struct CallContext<'a> {
    /// Absolute working directory; relative paths in arguments resolve against it.
    pub cwd: &'a Path,
    /// Absolute roots; root-relative rules match paths inside them.
    pub roots: &'a [PathBuf],
    /// Where paths really lead (symlinks followed): the one way the file system
    /// enters a decision.
    pub resolver: &'a dyn Resolver,
}

impl fmt::Debug for CallContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallContext").field("cwd", &self.cwd).field("roots", &self.roots).finish()
    }
}

impl<'a> CallContext<'a> {
    /// A session's context: its working directory and roots, and the real file
    /// system to follow symlinks on.
    pub fn of(env: &'a Env) -> CallContext<'a> {
        CallContext { cwd: &env.cwd, roots: &env.roots, resolver: &SystemResolver }
    }
}

/// The configured allow, ask and deny rules, parsed and compiled. Immutable and cheap
/// to clone (the compiled rules sit behind an `Arc`): build one per configuration load
/// and hand a clone to every session's [`PermissionEngine`].
#[derive(Clone)]
pub struct Policy {
    rules: Arc<RuleIndex>,
    /// Resolves `~/` in rules, including session grants added later.
    home: Option<Arc<Path>>,
    /// Directories whose files decide what runs (the skill directories): a file tool
    /// writing beneath one asks in every mode but bypass, whatever the rules allow.
    guarded: Arc<[PathBuf]>,
    /// The texts of the deny rules the built-in protections in force added.
    protected: Arc<[&'static str]>,
}

impl Default for Policy {
    /// No configured rules and no home directory: the built-in protections, then the
    /// modes, decide.
    fn default() -> Policy {
        Policy::new(&RuleConfig::default(), None).unwrap_or_else(|err| {
            // The protections' rules are fixed text, parsed by a test; should one ever
            // fail, say so and keep a policy with no rules at all.
            tracing::error!(%err, "the built-in protections do not parse");
            Policy {
                rules: Arc::new(RuleIndex::empty()),
                home: None,
                guarded: Arc::from([]),
                protected: Arc::from([]),
            }
        })
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<(RuleList, &str)> =
            self.rules.rules().map(|(list, rule)| (list, rule.text.as_str())).collect();
        f.debug_struct("Policy").field("rules", &rules).field("home", &self.home).finish()
    }
}

impl Policy {
    /// Parses and compiles the configured rules; the first bad rule is reported with
    /// its text and list. `home` resolves `~/` in path rules (a rule using `~` without
    /// a home directory is an error).
    ///
    /// The deny rules of every built-in protection `config.unprotect` does not name
    /// come after the configured ones (a configured rule that also matches is the one
    /// an explanation names); an unknown name in `unprotect` is an error.
    pub fn new(config: &RuleConfig, home: Option<&Path>) -> Result<Policy, RuleError> {
        for name in &config.unprotect {
            protection(name).map_err(|problem| RuleError {
                rule: name.clone(),
                list: None,
                problem,
            })?;
        }
        let mut rules =
            Vec::with_capacity(config.allow.len() + config.ask.len() + config.deny.len() + 1);
        let lists = [
            (RuleList::Allow, &config.allow),
            (RuleList::Ask, &config.ask),
            (RuleList::Deny, &config.deny),
        ];
        for (list, texts) in lists {
            for text in texts {
                let rule = Rule::parse(text, home).map_err(|problem| RuleError {
                    rule: text.clone(),
                    list: Some(list),
                    problem,
                })?;
                rules.push((list, rule));
            }
        }
        let mut protected = Vec::new();
        for protection in protections_in_force(&config.unprotect) {
            for &text in protection.rules {
                let rule = Rule::parse(text, home).map_err(|problem| RuleError {
                    rule: text.to_owned(),
                    list: Some(RuleList::Deny),
                    problem,
                })?;
                rules.push((RuleList::Deny, rule));
                protected.push(text);
            }
        }
        Ok(Policy {
            rules: Arc::new(RuleIndex::build(rules)?),
            home: home.map(Arc::from),
            guarded: Arc::from([]),
            protected: Arc::from(protected),
        })
    }

    /// Makes writes beneath `dirs` (absolute) ask in every mode but bypass, above allow
    /// rules, session grants and accept_edits; deny rules still refuse first.
    pub fn guard_writes(mut self, dirs: Vec<PathBuf>) -> Policy {
        self.guarded = Arc::from(dirs);
        self
    }
}

/// The configured rules as the file layer applies them to resolved paths: read access
/// is bound by `read_file` rules (Claude Code's `Read`), write access by `edit_file`
/// and `write_file` rules (`Edit`, `Write`). Deny rules first, then ask rules.
impl crate::tools::fs::PathRules for Policy {
    fn binding_rule(
        &self,
        access: crate::tools::fs::AccessKind,
        path: &Path,
        roots: &[PathBuf],
    ) -> Option<crate::tools::fs::RuleHit> {
        use crate::tools::fs::{RuleEffect, RuleHit};
        let target = PathTarget { absolute: path, roots };
        for (list, effect) in [(RuleList::Deny, RuleEffect::Deny), (RuleList::Ask, RuleEffect::Ask)]
        {
            // The first configured rule of any of the tools, whatever order they are in.
            let first = access_tools(access)
                .iter()
                .filter_map(|tool| {
                    let rules = self.rules.for_tool(tool);
                    earliest(rules.whole(list), rules.path(list, &target))
                })
                .min();
            if let Some(id) = first {
                return Some(RuleHit { effect, rule: self.rules.rule(id).text.clone() });
            }
        }
        None
    }

    fn restricts(&self, access: crate::tools::fs::AccessKind) -> bool {
        access_tools(access).iter().any(|tool| {
            let rules = self.rules.for_tool(tool);
            rules.any(RuleList::Deny) || rules.any(RuleList::Ask)
        })
    }
}

/// The tools whose rules bind an access on resolved paths: the built-ins whose facts
/// say their path rules stand for every access of their paths' kind.
fn access_tools(access: crate::tools::fs::AccessKind) -> &'static [&'static str] {
    use crate::tools::fs::AccessKind;
    static TOOLS: LazyLock<[Vec<&'static str>; 2]> = LazyLock::new(|| {
        let binding = |kind: PathAccess| -> Vec<&'static str> {
            builtin::declared()
                .iter()
                .filter(|(_, facts)| {
                    facts.binds_access
                        && matches!(facts.subject, facts::Subject::Paths(paths)
                            if paths.iter().any(|path| path.access == kind))
                })
                .map(|(name, _)| name.as_str())
                .collect()
        };
        [binding(PathAccess::Read), binding(PathAccess::Write)]
    });
    match access {
        AccessKind::Read => &TOOLS[0],
        AccessKind::Write => &TOOLS[1],
    }
}

/// Decides calls for one session: a [`Policy`], the session's grants and its modes.
/// Cheap to clone; see the module documentation.
#[derive(Clone)]
pub struct PermissionEngine {
    policy: Policy,
    /// Allow rules granted during the session.
    grants: Arc<RuleIndex>,
    /// Exact calls granted during the session: (tool, key of the arguments).
    exact: Arc<HashSet<(String, String)>>,
    /// The configured mode: the ceiling no request can raise.
    configured: Mode,
    /// The session's mode, already restricted by the ceiling.
    mode: Mode,
}

impl fmt::Debug for PermissionEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermissionEngine")
            .field("mode", &self.mode)
            .field("configured", &self.configured)
            .field("policy", &self.policy)
            .field("grants", &self.session_rules())
            .finish()
    }
}

impl PermissionEngine {
    /// An engine for a new session: `mode` is both its starting mode and its ceiling
    /// (narrow it afterwards with [`PermissionEngine::set_mode`]).
    pub fn new(policy: Policy, mode: Mode) -> PermissionEngine {
        PermissionEngine {
            policy,
            grants: Arc::new(RuleIndex::empty()),
            exact: Arc::new(HashSet::new()),
            configured: mode,
            mode,
        }
    }

    /// The session's effective mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The configured mode (the ceiling).
    pub fn configured_mode(&self) -> Mode {
        self.configured
    }

    /// Switches the session to `requested`, restricted by the configured mode (see
    /// [`Mode::restrict`]); returns the mode now in effect.
    pub fn set_mode(&mut self, requested: Mode) -> Mode {
        self.mode = Mode::restrict(self.configured, requested);
        self.mode
    }

    /// Adds a session-scoped allow rule (an approval "for this session"), for example
    /// one of a decision's suggestions. Adding a rule already granted changes nothing.
    pub fn add_session_rule(&mut self, text: &str) -> Result<(), RuleError> {
        let rule = Rule::parse(text, self.policy.home.as_deref()).map_err(|problem| RuleError {
            rule: text.to_owned(),
            list: None,
            problem,
        })?;
        if self.grants.rules().any(|(_, granted)| granted.text == rule.text) {
            return Ok(());
        }
        let mut rules: Vec<(RuleList, Rule)> =
            self.grants.rules().map(|(list, granted)| (list, granted.clone())).collect();
        rules.push((RuleList::Allow, rule));
        self.grants = Arc::new(RuleIndex::build(rules)?);
        Ok(())
    }

    /// Adds what an "allow for this session" answer grants (see [`Decision::grant`]).
    pub fn add_session_grant(&mut self, grant: &SessionGrant) -> Result<(), RuleError> {
        match &grant.kind {
            GrantKind::Rules(rules) => {
                for rule in rules {
                    self.add_session_rule(rule)?;
                }
            }
            GrantKind::Exact { tool, key } => {
                let mut exact = (*self.exact).clone();
                exact.insert((tool.clone(), key.clone()));
                self.exact = Arc::new(exact);
            }
        }
        Ok(())
    }

    /// The session grants, in the order they were added.
    pub fn session_rules(&self) -> Vec<String> {
        self.grants.rules().map(|(_, rule)| rule.text.clone()).collect()
    }

    /// Replaces the policy and the configured mode (a configuration reload). Session
    /// grants survive; the session's mode is re-restricted by the new ceiling.
    pub fn reload(&mut self, policy: Policy, configured: Mode) {
        self.policy = policy;
        self.configured = configured;
        self.mode = Mode::restrict(configured, self.mode);
    }

    /// Decides one call. `args` are the call's arguments as the model sent them (not
    /// yet validated: anything unexpected simply matches no specifier).
    pub fn decide(&self, tool: &ToolFacts<'_>, args: &Value, ctx: &CallContext<'_>) -> Decision {
        if tool.name == crate::tools::builtin::process_tools::WRITE && !tool.system {
            return self.decide_process_write(tool, args, ctx);
        }
        self.decide_one(tool, args, ctx)
    }

    /// `process_kill` of one of the session's own background processes: its start was
    /// decided (and approved, where it had to be) when it was started, and stopping it
    /// takes back only what that allowed, so where the mode alone would ask, it is
    /// allowed. An id that names no process of the session has nothing to approve: it
    /// is let through to fail as `not_found` instead of asking anyone. A deny rule still
    /// refuses either, an ask rule still asks about a process that is there, and plan
    /// mode still refuses.
    pub fn decide_process_kill(
        &self,
        tool: &ToolFacts<'_>,
        args: &Value,
        ctx: &CallContext<'_>,
        started_here: bool,
    ) -> Decision {
        let own = self.decide_one(tool, args, ctx);
        let id = display::inline(args.get("id").and_then(Value::as_str).unwrap_or_default());
        let by_mode = own.explanation.layer == Layer::Mode;
        let reason = match own.verdict {
            _ if tool.system => return own,
            Verdict::Ask | Verdict::Deny
                if !started_here && (by_mode || own.verdict == Verdict::Ask) =>
            {
                format!("{id} names no process of this session: there is nothing to approve")
            }
            Verdict::Ask | Verdict::Deny if started_here && by_mode => format!(
                "{} stops {id}, a background process this session started: its start was \
                 decided then",
                tool.name
            ),
            _ => return own,
        };
        Decision::new(Verdict::Allow, Layer::Mode, reason)
    }

    /// `process_write` writes to a running program, as like as not a shell: writing
    /// is running commands. Its `input` is judged as a `run_command` command line
    /// (run_command's rules, grants and the mode for commands). A rule (or grant) of
    /// `process_write`'s own decides instead when one matches, except that
    /// run_command's deny and ask rules on the input still win over it (deny > ask >
    /// allow); a mode that refuses side effects refuses either way.
    fn decide_process_write(
        &self,
        tool: &ToolFacts<'_>,
        args: &Value,
        ctx: &CallContext<'_>,
    ) -> Decision {
        let own = self.decide_one(tool, args, ctx);
        let input = args.get("input").and_then(Value::as_str).unwrap_or("");
        let facts =
            ToolFacts { name: command_tool().name, safety: Safety::SideEffect, system: false };
        let mut as_command = self.decide_one(&facts, &command_call(input), ctx);
        as_command.explanation.reason = format!(
            "the input, judged as a run_command command line: {}",
            as_command.explanation.reason
        );
        let by_rule = |decision: &Decision| {
            matches!(decision.explanation.layer, Layer::Rule | Layer::SessionGrant)
        };
        if own.verdict == Verdict::NotAllowedInMode {
            return own;
        }
        // Under rules that restrict commands, an alias or a function defined in an
        // interactive shell would let a later line run what they refuse under another
        // name: such input is refused.
        if let Some(defined) = self.defines_names(input, ctx) {
            return Decision::new(
                Verdict::Deny,
                Layer::Rule,
                format!(
                    "the input defines {defined} in the process; with deny or ask rules on \
                     run_command, a later line could run what they refuse under that name"
                ),
            );
        }
        if as_command.verdict == Verdict::NotAllowedInMode || !by_rule(&own) {
            return as_command;
        }
        if by_rule(&as_command) && as_command.verdict.strictness() < own.verdict.strictness() {
            as_command
        } else {
            own
        }
    }

    /// What `input` (judged as a command line) names for later lines, where run_command
    /// has deny or ask rules: an alias (`alias name=...`) or a shell function. `None`
    /// when it defines neither, or no rule restricts commands.
    fn defines_names(&self, input: &str, ctx: &CallContext<'_>) -> Option<&'static str> {
        let command = command_tool().name;
        let rules = self.policy.rules.for_tool(command);
        if !rules.any(RuleList::Deny) && !rules.any(RuleList::Ask) {
            return None;
        }
        let Subject::Command(analysis) = Subject::of(command, &command_call(input), ctx) else {
            return None;
        };
        if analysis.hazards.contains(&shell::Hazard::FunctionDefinition) {
            return Some("a shell function");
        }
        let aliases = analysis.commands.iter().any(|command| {
            command.words.first().and_then(|word| word.literal()) == Some("alias")
                && command.words.len() > 1
        });
        aliases.then_some("an alias")
    }

    /// `process_write` with input whose effect on the process's line is not modelled
    /// (`why`: which control character): the rules on commands cannot judge what it
    /// runs. Only a rule (or grant) of `process_write`'s own lets such raw input
    /// through, and none does while run_command has deny or ask rules, which it would
    /// slip past.
    pub fn decide_unmodelled_input(
        &self,
        tool: &ToolFacts<'_>,
        args: &Value,
        ctx: &CallContext<'_>,
        why: &str,
    ) -> Decision {
        let own = self.decide_one(tool, args, ctx);
        let by_rule = matches!(own.explanation.layer, Layer::Rule | Layer::SessionGrant);
        let commands = self.policy.rules.for_tool(command_tool().name);
        let restricted = commands.any(RuleList::Deny) || commands.any(RuleList::Ask);
        if own.verdict == Verdict::NotAllowedInMode || (by_rule && !restricted) {
            return own;
        }
        let reason = if restricted {
            format!(
                "{why}, so the deny and ask rules on run_command could not judge what it \
                 runs; such raw input is refused while they exist"
            )
        } else {
            format!(
                "{why}, so the rules on commands cannot judge what it runs; only a rule of \
                 process_write's own (allow process_write) lets raw input through"
            )
        };
        Decision::new(Verdict::Deny, Layer::Rule, reason)
    }

    fn decide_one(&self, tool: &ToolFacts<'_>, args: &Value, ctx: &CallContext<'_>) -> Decision {
        if tool.system {
            return Decision::new(
                Verdict::Allow,
                Layer::System,
                format!(
                    "{} is a system tool; permission rules and modes do not apply to it",
                    tool.name
                ),
            );
        }
        let subject = Subject::of(tool.name, args, ctx);
        let exact = !self.exact.is_empty()
            && self.exact.contains(&(tool.name.to_owned(), exact_key(tool.name, args)));
        let matched = self.match_rules(tool.name, &subject, args, exact, ctx);
        let mut decision = self.apply_mode(self.mode, tool, &subject, &matched, ctx);
        if !self.mode.is_at_most(self.configured) {
            // Only for the incomparable pair: the ceiling's verdict may be stricter.
            let ceiling = self.apply_mode(self.configured, tool, &subject, &matched, ctx);
            if ceiling.verdict.strictness() < decision.verdict.strictness() {
                decision = ceiling;
            }
        }
        let widening = is_command_tool(tool.name).then(|| sandbox_widening(args)).flatten();
        if let Some(widening) = &widening {
            decision = widened(decision, widening, self.mode, self.configured);
        }
        if decision.verdict == Verdict::Ask && widening.is_none() {
            decision.grant = session_grant(tool.name, args, &matched, &decision.suggestions);
        }
        // Parts and paths from the call are already folded; this catches any hidden
        // character left (a path in a hazard, a tool name), so a reason is always safe
        // to print.
        if decision.explanation.reason.contains(display::is_hidden) {
            decision.explanation.reason = display::visible(&decision.explanation.reason);
        }
        decision
    }

    /// Allow rules a user could add so this call runs without asking (empty when the
    /// call is already allowed, refused regardless, or no rule can vouch for it).
    pub fn suggestions(
        &self,
        tool: &ToolFacts<'_>,
        args: &Value,
        ctx: &CallContext<'_>,
    ) -> Vec<String> {
        self.decide(tool, args, ctx).suggestions
    }

    fn match_rules(
        &self,
        tool: &str,
        subject: &Subject,
        args: &Value,
        exact: bool,
        ctx: &CallContext<'_>,
    ) -> Matched {
        let configured = self.policy.rules.for_tool(tool);
        let granted = self.grants.for_tool(tool);
        match subject {
            Subject::Command(analysis) => match_command(&configured, &granted, exact, analysis),
            Subject::Path(target) => {
                let target =
                    target.as_deref().map(|absolute| PathTarget { absolute, roots: ctx.roots });
                let find = |rules: &ToolRules<'_>, list| {
                    let by_path = target.as_ref().and_then(|target| rules.path(list, target));
                    earliest(rules.whole(list), by_path)
                };
                match_simple(&configured, &granted, exact, find)
            }
            Subject::Other => {
                let find = |rules: &ToolRules<'_>, list| {
                    earliest(rules.whole(list), rules.arguments(list, args))
                };
                match_simple(&configured, &granted, exact, find)
            }
            Subject::Paths(paths) => {
                let targets: Vec<PathTarget<'_>> = paths
                    .iter()
                    .map(|absolute| PathTarget { absolute, roots: ctx.roots })
                    .collect();
                match_paths(&configured, &granted, &targets)
            }
        }
    }

    fn apply_mode(
        &self,
        mode: Mode,
        tool: &ToolFacts<'_>,
        subject: &Subject,
        matched: &Matched,
        ctx: &CallContext<'_>,
    ) -> Decision {
        let name = tool.name;
        match matched {
            Matched::Deny { rule, part } => {
                let reason = match part {
                    Some(part) => {
                        format!("`{}` matches the deny rule {rule}", display::inline(part))
                    }
                    None => format!("{name} is denied by the rule {rule}"),
                };
                let reason = match PROTECTIONS.iter().find(|p| {
                    p.rules.contains(&rule.as_str())
                        && self.policy.protected.contains(&rule.as_str())
                }) {
                    Some(protection) => format!(
                        "{reason}, a built-in protection ({}: {}) that only [permissions] \
                         unprotect = [\"{}\"] turns off",
                        protection.name, protection.why, protection.name
                    ),
                    None => reason,
                };
                return Decision::new(Verdict::Deny, Layer::Rule, reason)
                    .with_rule(RuleList::Deny, rule);
            }
            _ if mode == Mode::Plan && tool.safety == Safety::SideEffect => {
                return Decision::new(
                    Verdict::NotAllowedInMode,
                    Layer::Mode,
                    format!("plan mode only runs read-only tools, and {name} has side effects"),
                );
            }
            _ if mode != Mode::Bypass
                && let Some(dir) = subject.written_dir(name, &self.policy.guarded) =>
            {
                let decision = Decision::new(
                    Verdict::Ask,
                    Layer::Mode,
                    format!(
                        "{name} writes into the skill directory {}, which needs approval in every mode but bypass",
                        dir.display()
                    ),
                );
                return match mode {
                    Mode::DontAsk => decision.refuse_unasked("dont_ask mode never asks"),
                    _ => decision,
                };
            }
            Matched::Ask { rule, part } => {
                let reason = match part {
                    Some(part) => {
                        format!("`{}` matches the ask rule {rule}", display::inline(part))
                    }
                    None => format!("{name} requires approval by the rule {rule}"),
                };
                let decision =
                    Decision::new(Verdict::Ask, Layer::Rule, reason).with_rule(RuleList::Ask, rule);
                return match mode {
                    Mode::DontAsk => decision.refuse_unasked("dont_ask mode never asks"),
                    _ => decision,
                };
            }
            Matched::Unchecked => {
                let decision = Decision::new(
                    Verdict::Ask,
                    Layer::Rule,
                    format!(
                        "{name} requires approval because the command is too long to check \
                         against the deny and ask rules"
                    ),
                );
                return match mode {
                    Mode::DontAsk => decision.refuse_unasked("dont_ask mode never asks"),
                    _ => decision,
                };
            }
            Matched::Allow { rules, session } => {
                let (layer, kind) = if *session {
                    (Layer::SessionGrant, "the session grant")
                } else {
                    (Layer::Rule, "the rule")
                };
                let reason = match rules.as_slice() {
                    [one] => format!("{name} is allowed by {kind} {one}"),
                    several => {
                        let what = match subject {
                            Subject::Paths(_) => "every path of the patch",
                            _ => "every part of the command",
                        };
                        format!("{what} is allowed, by {}", several.join(", "))
                    }
                };
                let first = rules.first().map(String::as_str).unwrap_or_default();
                return Decision::new(Verdict::Allow, layer, reason)
                    .with_rule(RuleList::Allow, first);
            }
            Matched::Nothing(_) => {}
        }

        if tool.safety == Safety::ReadOnly {
            return Decision::new(
                Verdict::Allow,
                Layer::Mode,
                // Every read-only call comes this way: joined, not formatted.
                ["read-only tools are allowed in ", mode.as_str(), " mode"].concat(),
            );
        }
        match mode {
            Mode::Bypass => Decision::new(
                Verdict::Allow,
                Layer::Mode,
                "bypass mode allows every call no rule denies".to_owned(),
            ),
            Mode::AcceptEdits if edits_files(name) && subject.path_inside(ctx.roots) => {
                Decision::new(
                    Verdict::Allow,
                    Layer::Mode,
                    "accept_edits mode allows file edits inside the roots".to_owned(),
                )
            }
            Mode::Plan => Decision::new(
                Verdict::NotAllowedInMode,
                Layer::Mode,
                format!("plan mode only runs read-only tools, and {name} has side effects"),
            ),
            Mode::Default | Mode::AcceptEdits | Mode::DontAsk => {
                let mut reason = match mode {
                    Mode::DontAsk => format!("{name} requires approval"),
                    _ => format!("{name} requires approval in {mode} mode"),
                };
                if let Matched::Nothing(why) = matched {
                    match why {
                        Unmatched::NoRule => {}
                        Unmatched::Hazard { hazard, parts } => {
                            reason.push_str(&format!(" because {hazard}"));
                            if !parts.is_empty() {
                                reason.push_str(&format!("; it runs {}", name_parts(parts)));
                            }
                        }
                        Unmatched::Uncovered { parts, .. } => {
                            reason.push_str(&format!(
                                " because no allow rule covers {}",
                                name_parts(parts)
                            ));
                        }
                    }
                }
                let mut decision = Decision::new(Verdict::Ask, Layer::Mode, reason);
                decision.suggestions = suggest(name, subject, matched, ctx);
                match mode {
                    Mode::DontAsk => decision.refuse_unasked("dont_ask mode never asks"),
                    _ => decision,
                }
            }
        }
    }
}

/// What a run_command call asks beyond the sandbox (its `sandbox` argument), in words;
/// `None` when it asks for nothing.
fn sandbox_widening(args: &Value) -> Option<String> {
    let asked = args.get("sandbox")?;
    let mut parts: Vec<String> = Vec::new();
    for (key, verb) in [("writable", "write"), ("readable", "read")] {
        for path in asked.get(key).and_then(Value::as_array).into_iter().flatten() {
            parts.push(match path.as_str() {
                Some(path) => format!("{verb} beneath {}", display::inline(path)),
                None => format!("{verb} beneath {path}"),
            });
        }
    }
    if asked.get("network").and_then(Value::as_bool) == Some(true) {
        parts.push("open network connections".to_owned());
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// A call that widens the sandbox needs a person, in every mode: no mode, allow rule
/// or session grant lets the model widen its own sandbox. Refusals stay refusals.
fn widened(decision: Decision, widening: &str, mode: Mode, configured: Mode) -> Decision {
    match decision.verdict {
        Verdict::Deny | Verdict::NotAllowedInMode => decision,
        Verdict::Ask | Verdict::Allow => {
            let reason = format!(
                "the command asks to leave its sandbox for this call ({widening}), which only \
                 a person can approve"
            );
            let asked = if decision.verdict == Verdict::Ask {
                let mut asked = decision;
                asked.explanation.reason =
                    format!("{reason}; besides, {}", asked.explanation.reason);
                // No rule can vouch for a widening.
                asked.suggestions.clear();
                asked
            } else {
                Decision::new(Verdict::Ask, Layer::Mode, reason)
            };
            if mode == Mode::DontAsk || configured == Mode::DontAsk {
                asked.refuse_unasked("dont_ask mode never asks")
            } else {
                asked
            }
        }
    }
}

/// What a call's specifier rules are matched against.
enum Subject {
    /// `run_command`: its command text, analyzed.
    Command(Analysis),
    /// A file tool: its `path`, resolved lexically; `None` when the call names none
    /// (only bare rules can match then).
    Path(Option<PathBuf>),
    /// `apply_patch`: every path its patch names, resolved lexically. A deny or ask
    /// rule matching any of them decides; an allow needs every one allowed.
    Paths(Vec<PathBuf>),
    /// Any other tool: bare rules, and argument patterns over its arguments.
    Other,
}

impl Subject {
    fn of(tool: &str, args: &Value, ctx: &CallContext<'_>) -> Subject {
        let Some(facts) = builtin::facts(tool) else { return Subject::Other };
        let resolve = |path: &str| path::resolve(ctx.cwd, Path::new(path));
        match facts.subject {
            facts::Subject::Arguments => Subject::Other,
            facts::Subject::Command { command, cwd } => {
                let cwd = resolve(args.get(cwd).and_then(Value::as_str).unwrap_or(""));
                match args.get(command).and_then(Value::as_str) {
                    Some(command) => {
                        Subject::Command(shell::analyze(command, &cwd, ctx.roots, ctx.resolver))
                    }
                    None => Subject::Command(Analysis {
                        commands: Vec::new(),
                        hazards: vec![Hazard::Unparseable(
                            "the call has no command string".to_owned(),
                        )],
                        truncated: false,
                    }),
                }
            }
            facts::Subject::Paths([_]) => {
                Subject::Path(builtin::paths_named(facts, args).first().map(|path| resolve(path)))
            }
            facts::Subject::Paths(_) | facts::Subject::Patch { .. } => Subject::Paths(
                builtin::paths_named(facts, args).iter().map(|path| resolve(path)).collect(),
            ),
        }
    }

    /// The guarded directory a file tool's call would write beneath, if any.
    fn written_dir<'a>(&self, tool: &str, guarded: &'a [PathBuf]) -> Option<&'a PathBuf> {
        if !edits_files(tool) {
            return None;
        }
        let paths: &[PathBuf] = match self {
            Subject::Path(Some(path)) => std::slice::from_ref(path),
            Subject::Paths(paths) => paths,
            _ => return None,
        };
        guarded.iter().find(|dir| paths.iter().any(|path| path.starts_with(dir)))
    }

    fn path_inside(&self, roots: &[PathBuf]) -> bool {
        match self {
            Subject::Path(Some(path)) => path::inside_roots(path, roots),
            Subject::Paths(paths) => {
                !paths.is_empty() && paths.iter().all(|path| path::inside_roots(path, roots))
            }
            _ => false,
        }
    }
}

/// What the rules said, before the mode has its say.
enum Matched {
    Deny {
        rule: String,
        part: Option<String>,
    },
    Ask {
        rule: String,
        part: Option<String>,
    },
    /// Allowed by these rules (several when parts of a compound command needed
    /// different ones); `session` when any of them is a session grant.
    Allow {
        rules: Vec<String>,
        session: bool,
    },
    /// Too much unparseable text to check every part against the deny and ask
    /// rules: asks whatever the mode (a person can read it; the engine could not).
    Unchecked,
    Nothing(Unmatched),
}

/// Why no allow rule applied, for the reason sentence and the suggestions.
enum Unmatched {
    NoRule,
    /// The command holds something no pattern can vouch for; `parts` are the
    /// commands in it no allow rule covers (nested ones included), for the reason.
    Hazard {
        hazard: Hazard,
        parts: Vec<String>,
    },
    /// Parts of a compound command no rule covers (indexes into the analysis, and
    /// their texts), every one named in the reason.
    Uncovered {
        parts: Vec<String>,
        commands: Vec<usize>,
    },
}

/// Matching for tools whose calls are one subject: `find` gives the first rule of a
/// list that matches.
fn match_simple(
    configured: &ToolRules<'_>,
    granted: &ToolRules<'_>,
    exact: bool,
    find: impl Fn(&ToolRules<'_>, RuleList) -> Option<usize>,
) -> Matched {
    if let Some(id) = find(configured, RuleList::Deny) {
        return Matched::Deny { rule: configured_text(configured, id), part: None };
    }
    if let Some(id) = find(configured, RuleList::Ask) {
        return Matched::Ask { rule: configured_text(configured, id), part: None };
    }
    if let Some(id) = find(configured, RuleList::Allow) {
        return Matched::Allow { rules: vec![configured_text(configured, id)], session: false };
    }
    if exact {
        return Matched::Allow { rules: vec![EXACT_GRANT.to_owned()], session: true };
    }
    if let Some(id) = find(granted, RuleList::Allow) {
        return Matched::Allow { rules: vec![configured_text(granted, id)], session: true };
    }
    Matched::Nothing(Unmatched::NoRule)
}

/// Matching for calls with several paths: a deny, then an ask rule matching any path
/// decides; an allow needs a bare rule or every path allowed (by configured rules or
/// session grants).
fn match_paths(
    configured: &ToolRules<'_>,
    granted: &ToolRules<'_>,
    targets: &[PathTarget<'_>],
) -> Matched {
    let any = |rules: &ToolRules<'_>, list| {
        let by_path = targets.iter().filter_map(|target| rules.path(list, target)).min();
        earliest(rules.whole(list), by_path)
    };
    if let Some(id) = any(configured, RuleList::Deny) {
        return Matched::Deny { rule: configured_text(configured, id), part: None };
    }
    if let Some(id) = any(configured, RuleList::Ask) {
        return Matched::Ask { rule: configured_text(configured, id), part: None };
    }
    if let Some(id) = configured.whole(RuleList::Allow) {
        return Matched::Allow { rules: vec![configured_text(configured, id)], session: false };
    }
    if let Some(id) = granted.whole(RuleList::Allow) {
        return Matched::Allow { rules: vec![configured_text(granted, id)], session: true };
    }
    if targets.is_empty() {
        return Matched::Nothing(Unmatched::NoRule);
    }
    let mut rules = Vec::new();
    let mut session = false;
    for target in targets {
        let found = configured
            .path(RuleList::Allow, target)
            .map(|id| (configured_text(configured, id), false))
            .or_else(|| {
                granted.path(RuleList::Allow, target).map(|id| (configured_text(granted, id), true))
            });
        match found {
            Some((text, from_session)) => {
                session |= from_session;
                if !rules.contains(&text) {
                    rules.push(text);
                }
            }
            None => return Matched::Nothing(Unmatched::NoRule),
        }
    }
    Matched::Allow { rules, session }
}

fn configured_text(rules: &ToolRules<'_>, id: usize) -> String {
    rules.rule(id).text.clone()
}

/// Matching for `run_command`: deny and ask rules see every command found (nested
/// ones and wrapper readings included); an allow needs a bare rule, or no hazard and
/// every top-level command covered by a rule or harmless.
fn match_command(
    configured: &ToolRules<'_>,
    granted: &ToolRules<'_>,
    exact: bool,
    analysis: &Analysis,
) -> Matched {
    for list in [RuleList::Deny, RuleList::Ask] {
        let mut found = configured.whole(list).map(|id| (id, None));
        if found.is_none() {
            found = analysis.commands.iter().find_map(|command| {
                command
                    .views()
                    .find_map(|view| configured.command(list, view))
                    .map(|id| (id, Some(command.text())))
            });
        }
        if let Some((id, part)) = found {
            let rule = configured_text(configured, id);
            return match list {
                RuleList::Deny => Matched::Deny { rule, part },
                _ => Matched::Ask { rule, part },
            };
        }
    }
    if analysis.truncated && (configured.any(RuleList::Deny) || configured.any(RuleList::Ask)) {
        return Matched::Unchecked;
    }
    if let Some(id) = configured.whole(RuleList::Allow) {
        return Matched::Allow { rules: vec![configured_text(configured, id)], session: false };
    }
    if exact {
        return Matched::Allow { rules: vec![EXACT_GRANT.to_owned()], session: true };
    }
    if let Some(id) = granted.whole(RuleList::Allow) {
        return Matched::Allow { rules: vec![configured_text(granted, id)], session: true };
    }
    if let Some(hazard) = analysis.hazards.first() {
        let covered = |words: &[ShellWord]| {
            configured.command(RuleList::Allow, words).is_some()
                || granted.command(RuleList::Allow, words).is_some()
        };
        let mut parts: Vec<String> = Vec::new();
        for command in &analysis.commands {
            if command.harmless || covered(&command.words) {
                continue;
            }
            let text = command.text();
            if !parts.contains(&text) {
                parts.push(text);
            }
        }
        return Matched::Nothing(Unmatched::Hazard { hazard: hazard.clone(), parts });
    }

    let mut rules: Vec<String> = Vec::new();
    let mut session = false;
    let mut uncovered = Vec::new();
    for (idx, command) in
        analysis.commands.iter().enumerate().filter(|(_, command)| !command.nested)
    {
        let by_rule = configured
            .command(RuleList::Allow, &command.words)
            .map(|id| (configured_text(configured, id), false))
            .or_else(|| {
                granted
                    .command(RuleList::Allow, &command.words)
                    .map(|id| (configured_text(granted, id), true))
            });
        match by_rule {
            Some((text, from_session)) => {
                session |= from_session;
                if !rules.contains(&text) {
                    rules.push(text);
                }
            }
            None if command.harmless => {}
            None => uncovered.push(idx),
        }
    }
    if !uncovered.is_empty() {
        let mut parts: Vec<String> = Vec::new();
        for &idx in &uncovered {
            let text = analysis.commands[idx].text();
            if !parts.contains(&text) {
                parts.push(text);
            }
        }
        return Matched::Nothing(Unmatched::Uncovered { parts, commands: uncovered });
    }
    if rules.is_empty() {
        // Nothing but harmless builtins (or nothing at all): no rule vouched for it.
        return Matched::Nothing(Unmatched::NoRule);
    }
    Matched::Allow { rules, session }
}

/// Names command parts in a sentence: `a`, `b` and `c`, each shown folded and with
/// hidden characters visible.
fn name_parts(parts: &[String]) -> String {
    let quoted: Vec<String> =
        parts.iter().map(|part| format!("`{}`", display::inline(part))).collect();
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// What "allow for this session" grants for an asking call: the suggested rules, else
/// exactly this call. Nothing when a grant could not settle such a call anyway (an
/// ask rule, or a command too long to check, asks whatever is granted).
fn session_grant(
    tool: &str,
    args: &Value,
    matched: &Matched,
    suggestions: &[String],
) -> Option<SessionGrant> {
    match matched {
        Matched::Ask { .. } | Matched::Unchecked | Matched::Deny { .. } => None,
        _ if suggestions.is_empty() => Some(SessionGrant::exact(tool, args)),
        _ => Some(SessionGrant {
            kind: GrantKind::Rules(suggestions.to_vec()),
            description: display::inline(&suggestions.join(", ")),
        }),
    }
}

/// Rules that would let an asking call through, or none when no rule can.
fn suggest(tool: &str, subject: &Subject, matched: &Matched, ctx: &CallContext<'_>) -> Vec<String> {
    match (subject, matched) {
        (Subject::Command(analysis), Matched::Nothing(Unmatched::Uncovered { commands, .. })) => {
            let mut rules = Vec::new();
            for command in commands.iter().filter_map(|&idx| analysis.commands.get(idx)) {
                // A part no prefix can safely describe: no set of rules covers the
                // command, so none is suggested (and a session grant is this command).
                let Some(rule) = command_suggestion(&command.words) else {
                    return Vec::new();
                };
                if !rules.contains(&rule) {
                    rules.push(rule);
                }
            }
            rules
        }
        (Subject::Command(_), _) => Vec::new(),
        (Subject::Path(Some(target)), Matched::Nothing(_)) => {
            vec![path_suggestion(tool, target, ctx.roots)]
        }
        (Subject::Path(None), _) => Vec::new(),
        (Subject::Paths(targets), Matched::Nothing(_)) => {
            let mut rules = Vec::new();
            for target in targets {
                let rule = path_suggestion(tool, target, ctx.roots);
                if !rules.contains(&rule) {
                    rules.push(rule);
                }
            }
            rules
        }
        (Subject::Other, Matched::Nothing(_)) => vec![tool.to_owned()],
        _ => Vec::new(),
    }
}

/// `run_command(<program> [<subcommand>]:*)`: the first word, plus the second when it
/// reads like a subcommand (`cargo test`, `git status`) rather than an option or path.
fn command_suggestion(words: &[ShellWord]) -> Option<String> {
    let program = words.first()?.literal()?;
    if shell::runs_any_code(program) {
        return None;
    }
    let mut picked = vec![program];
    if let Some(second) = words.get(1).and_then(ShellWord::literal) {
        let looks_like_subcommand = second.starts_with(|c: char| c.is_ascii_alphabetic())
            && second.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if looks_like_subcommand {
            picked.push(second);
        }
    }
    Some(rule::command_prefix_rule(&picked))
}

/// For a file: its directory (`edit_file(src/**)`), or the file itself at a root's top
/// level. For a search tool: the searched directory, or the bare tool for a root.
fn path_suggestion(tool: &str, target: &Path, roots: &[PathBuf]) -> String {
    let directory = searches(tool);
    match roots.iter().find_map(|root| target.strip_prefix(root).ok()) {
        Some(relative) if relative.as_os_str().is_empty() => tool.to_owned(),
        Some(relative) if directory => rule::path_rule(tool, relative, true, true),
        Some(relative) => match relative.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            Some(parent) => rule::path_rule(tool, parent, true, true),
            None => rule::path_rule(tool, relative, true, false),
        },
        None if directory => rule::path_rule(tool, target, false, true),
        None => match target.parent() {
            Some(parent) => rule::path_rule(tool, parent, false, true),
            None => rule::path_rule(tool, target, false, false),
        },
    }
}
