//! Permission rules: `tool` or `tool(specifier)`, parsed once into matchers.
//!
//! A rule names a tool exactly, by a `*` wildcard (`mcp__git__*`), or by one of Claude
//! Code's names (`Bash`, `Read`, `Edit`, `Write`, `Glob`, `Grep`) so users can reuse
//! their rules. What the specifier means depends on the tool:
//!
//! - `run_command`: a pattern over the command's parsed words. `git status` is exact;
//!   `git status:*` is a prefix (the words start with `git status`, so `git status`
//!   itself matches and `git statusx` does not); a `*` inside a word matches any text
//!   in that word, and a `*` standing alone matches any number of words (`npm run test
//!   *`). Quotes make `*` and spaces literal.
//! - the file tools (`read_file`, `write_file`, `edit_file`, `notebook_edit`, every
//!   path of an `apply_patch` patch, and the `path` of `find_files` and
//!   `search_code`): a gitignore-style glob. Relative to each root by
//!   default, anchored when it contains a `/` (`src/**`), at any depth otherwise
//!   (`*.md`, `.env*`); `//abs/path/**` is absolute and `~/...` is under the home
//!   directory. As in gitignore, a pattern that matches a directory covers everything
//!   beneath it.
//! - any other tool (proxied `mcp__` tools, skills): a text pattern matched against
//!   the call's arguments, where `*` matches any text. `name=pattern` looks at the
//!   top-level argument `name` only (its text when it is a string, its JSON
//!   otherwise); a plain `pattern` looks at every string value in the arguments, at
//!   any depth. Values are trimmed first. A deny or ask rule applies when any value
//!   looked at matches, ignoring ASCII case (`DROP *` catches `drop table x`); an
//!   allow rule only when every value looked at matches, exactly, and there is at
//!   least one (so it never allows a value it does not describe).
//!
//! A specifier on a wildcard name is an error, since what it would mean depends on
//! the tool. Configuration loading also refuses a rule whose name is no known tool,
//! alias, `mcp__` or `skill__` pattern (see [`check_rule`]): such a rule could never
//! apply, which for a deny rule is a silent hole.
//!
//! [`RuleIndex`] groups compiled rules by tool and list, with path globs of one group in
//! a single `GlobSet`, so a decision does one hash lookup and a few set matches however
//! many rules are configured.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use globset::{Candidate, Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use super::RuleList;
use super::shell::ShellWord;
use crate::tools::builtin;
use crate::tools::facts::{self, Facts};

/// The built-in tool that runs shell commands (the one whose facts say its subject is a
/// command): its specifier is a command pattern.
pub(crate) struct CommandTool {
    pub(crate) name: &'static str,
    /// The argument holding the command text.
    pub(crate) command: &'static str,
    /// The argument naming the directory it runs in.
    pub(crate) cwd: &'static str,
}

/// The built-in command tool, read from the built-in tools' facts.
pub(crate) fn command_tool() -> &'static CommandTool {
    static TOOL: LazyLock<CommandTool> = LazyLock::new(|| {
        builtin::declared()
            .iter()
            .find_map(|(name, facts)| match facts.subject {
                facts::Subject::Command { command, cwd } => {
                    Some(CommandTool { name: name.as_str(), command, cwd })
                }
                _ => None,
            })
            // No built-in runs commands: a name no tool has.
            .unwrap_or(CommandTool { name: "", command: "", cwd: "" })
    });
    &TOOL
}

/// Whether `tool` is the built-in command tool.
pub(crate) fn is_command_tool(tool: &str) -> bool {
    !tool.is_empty() && tool == command_tool().name
}

/// Whether `tool`'s specifier is a path glob: a built-in whose facts name paths (its
/// path arguments, or the files of its patch).
pub(crate) fn takes_path_rules(tool: &str) -> bool {
    builtin::facts(tool).is_some_and(Facts::takes_path_rules)
}

/// Claude Code's tool names and the built-in tools each stands for, from the built-in
/// tools' facts: each tool under its Claude Code name and aliases; and since Claude's
/// `Edit` rules govern every file edit, `Edit` covers every tool that edits files too
/// (`write_file`, `apply_patch`: every path of the patch, `notebook_edit`), after the
/// tool that bears the name.
fn aliases() -> &'static [(&'static str, Vec<&'static str>)] {
    static ALIASES: LazyLock<Vec<(&'static str, Vec<&'static str>)>> = LazyLock::new(|| {
        let declared = builtin::declared();
        let mut aliases: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
        for (name, facts) in declared {
            let Some(claude) = facts.claude_code.tool() else { continue };
            for alias in std::iter::once(claude.name).chain(claude.aliases.iter().copied()) {
                match aliases.iter_mut().find(|(known, _)| *known == alias) {
                    Some((_, tools)) => tools.push(name.as_str()),
                    None => aliases.push((alias, vec![name.as_str()])),
                }
            }
        }
        if let Some((_, tools)) = aliases.iter_mut().find(|(alias, _)| *alias == EDIT_ALIAS) {
            for (name, facts) in declared {
                if facts.edits && !tools.contains(&name.as_str()) {
                    tools.push(name.as_str());
                }
            }
        }
        aliases
    });
    &ALIASES
}

/// Claude Code's name for its file-editing tool, whose rules govern every file edit.
const EDIT_ALIAS: &str = "Edit";

/// Claude Code's tool names with the built-in tools each stands for (the alias table
/// rules use); hook matchers use it too.
pub fn claude_code_aliases() -> &'static [(&'static str, Vec<&'static str>)] {
    aliases()
}

/// The system tools: always allowed, but a rule may still name them.
pub(crate) const SYSTEM_TOOLS: &[&str] = &["exit_plan_mode", "todo_write"];

/// Prefixes of tool families that come and go at run time (proxied MCP tools and
/// instruction skills); a rule may name any tool of them.
pub(crate) const DYNAMIC_PREFIXES: &[&str] = &["mcp__", "skill__"];

/// Whether a configured rule names something that can exist: a built-in or system
/// tool, a Claude Code alias, an `mcp__`/`skill__` tool, one of `extra` (skill command
/// tools found at load time), or a wildcard matching any of these.
pub fn check_rule(text: &str, home: Option<&Path>, extra: &[String]) -> Result<(), RuleProblem> {
    let rule = Rule::parse(text, home)?;
    let builtins = builtin::declared().iter().map(|(name, _)| name.as_str());
    let fixed = builtins
        .clone()
        .chain(SYSTEM_TOOLS.iter().copied())
        .chain(extra.iter().map(String::as_str));
    let known = |name: &str| {
        DYNAMIC_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
            || fixed.clone().any(|known| known == name)
    };
    let ok = match &rule.tools {
        ToolMatch::Names(names) => names.iter().all(|name| known(name)),
        ToolMatch::Wildcard(wildcard) => {
            DYNAMIC_PREFIXES.iter().any(|prefix| {
                wildcard.segments.first().is_some_and(|first| {
                    first.starts_with(prefix) || prefix.starts_with(first.as_str())
                })
            }) || fixed.clone().any(|name| wildcard.is_match(name))
        }
    };
    if ok {
        return Ok(());
    }
    let name = text.trim().split('(').next().unwrap_or_default().trim().to_owned();
    let names: Vec<&str> = builtins.chain(aliases().iter().map(|(alias, _)| *alias)).collect();
    Err(RuleProblem::UnknownTool { name, known: names.join(", ") })
}

/// Why a rule that parses cannot do what it looks like it does, one sentence each (empty
/// when nothing is wrong, or the rule does not parse: [`check_rule`] reports that).
/// `roots` are the workspace roots; `properties` gives the argument names of a tool
/// whose input schema is known (`None` when it is not, as for proxied MCP tools).
pub fn rule_warnings(
    text: &str,
    home: Option<&Path>,
    roots: &[PathBuf],
    properties: &dyn Fn(&str) -> Option<Vec<String>>,
) -> Vec<String> {
    let Ok(rule) = Rule::parse(text, home) else { return Vec::new() };
    let ToolMatch::Names(names) = &rule.tools else { return Vec::new() };
    let trimmed = text.trim();
    let Some((name, spec)) = trimmed
        .split_once('(')
        .and_then(|(name, rest)| Some((name.trim_end(), rest.strip_suffix(')')?.trim())))
    else {
        return Vec::new();
    };
    let assigned = spec.split_once('=').map(|(key, _)| key).filter(|key| {
        !key.is_empty()
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !key.starts_with(|c: char| c.is_ascii_digit())
    });
    let mut warnings = Vec::new();
    match &rule.spec {
        Spec::Command(_) if assigned.is_some() => warnings.push(format!(
            "never applies: `{spec}` is read as a command pattern, and a command starting with \
             `{}=` only sets a variable (a run_command specifier is the command itself, not an \
             argument; write `{name}(<command>:*)`)",
            assigned.unwrap_or_default()
        )),
        Spec::Command(pattern) if !pattern.tokens.contains(&Token::AnyWords) => {
            warnings.push(format!(
                "matches only the exact command `{spec}`, not `{spec}` with more words after \
                 it; write `{name}({spec}:*)` to match every command that starts with it"
            ));
        }
        Spec::Path(_) if assigned.is_some() => warnings.push(format!(
            "never applies as an argument pattern: `{spec}` is read as a path glob, a file \
             named so (a {} specifier is a path glob; write `{name}(<glob>)`)",
            names.first().map(String::as_str).unwrap_or_default()
        )),
        Spec::Path(pattern) if pattern.absolute && !roots.is_empty() => {
            let prefix = literal_prefix(pattern.globs.first().map(String::as_str).unwrap_or("/"));
            let touches = |path: &Path| {
                roots.iter().any(|root| root.starts_with(path) || path.starts_with(root))
            };
            let canonical = std::fs::canonicalize(&prefix).ok();
            if !touches(&prefix) && !canonical.as_deref().is_some_and(touches) {
                let shown: Vec<String> =
                    roots.iter().map(|root| root.display().to_string()).collect();
                warnings.push(format!(
                    "names only paths beneath {}, outside every workspace root ({}), where no \
                     file tool reaches, so the rule never applies",
                    prefix.display(),
                    shown.join(", ")
                ));
            }
        }
        Spec::Arguments(pattern) => {
            if let Some(key) = &pattern.key {
                for tool in names {
                    if let Some(known) = properties(tool)
                        && !known.is_empty()
                        && !known.contains(key)
                    {
                        warnings.push(format!(
                            "never applies: {tool} has no argument `{key}` (its arguments: \
                             {})",
                            known.join(", ")
                        ));
                    }
                }
            }
        }
        _ => {}
    }
    warnings
}

/// Whether rule `a` matches nothing that rule `b` does not: the same specifier, and
/// every tool `a` names named by `b` too (`Edit(x)` covers `edit_file(x)`). False when
/// either does not parse.
pub fn covered_by(a: &str, b: &str, home: Option<&Path>) -> bool {
    let (Ok(a), Ok(b)) = (Rule::parse(a, home), Rule::parse(b, home)) else { return false };
    a.spec == b.spec
        && match (&a.tools, &b.tools) {
            (ToolMatch::Names(a), ToolMatch::Names(b)) => a.iter().all(|name| b.contains(name)),
            (a, b) => a == b,
        }
}

/// The directories of an absolute glob before its first wildcard (`/etc/**` → `/etc`).
fn literal_prefix(glob: &str) -> PathBuf {
    let mut prefix = PathBuf::from("/");
    for component in glob.split('/').filter(|c| !c.is_empty()) {
        if component.contains(['*', '?', '[', '{', '\\']) {
            break;
        }
        prefix.push(component);
    }
    prefix
}

/// What is wrong with a rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleProblem {
    #[error("the rule is empty")]
    Empty,
    #[error("the tool name is empty")]
    EmptyToolName,
    #[error("the tool name {0:?} contains whitespace or parentheses")]
    BadToolName(String),
    #[error("the specifier has no closing parenthesis at the end")]
    Unclosed,
    #[error("the specifier in parentheses is empty; write the bare tool name to match every call")]
    EmptySpecifier,
    #[error("a specifier needs an exact tool name, not a wildcard")]
    SpecifierOnWildcard,
    #[error("the command pattern has an unterminated quote")]
    UnterminatedQuote,
    #[error("the path glob is invalid: {0}")]
    BadGlob(String),
    #[error("`~` needs the home directory, which is not known")]
    NoHome,
    #[error(
        "no tool is named {name:?}, so the rule could never apply; name a tool ({known}), an \
         `mcp__<server>__<tool>` or `skill__<name>` pattern, or a skill's tool"
    )]
    UnknownTool { name: String, known: String },
    #[error("the argument name before `=` is empty")]
    EmptyArgumentName,
    #[error(
        "no built-in protection is named {name:?}, so unprotect could not turn it off; the \
         protections are: {known}"
    )]
    UnknownProtection { name: String, known: String },
    #[error(
        "a path glob cannot contain `..`: rules match paths already resolved (use //abs/path for a path outside the roots)"
    )]
    ParentInGlob,
}

/// A rule that cannot be used, naming the rule as written and the list it came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid {kind} rule {rule:?}: {problem}",
    kind = .list.map_or("permission", RuleList::as_str)
)]
pub struct RuleError {
    /// The rule text as configured.
    pub rule: String,
    /// The list it was configured in; `None` for a session grant being added.
    pub list: Option<RuleList>,
    pub problem: RuleProblem,
}

/// Text with `*` wildcards (nothing else is special), matched against a whole string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Wildcard {
    /// The literal text between the stars; one segment means no star.
    pub(crate) segments: Vec<String>,
}

impl Wildcard {
    fn new(pattern: &str) -> Wildcard {
        Wildcard { segments: pattern.split('*').map(str::to_owned).collect() }
    }

    /// The same pattern matching ASCII letters of either case (the pattern and the
    /// text are both lowered before matching).
    fn lowered(&self) -> Wildcard {
        Wildcard { segments: self.segments.iter().map(|s| s.to_ascii_lowercase()).collect() }
    }

    pub(crate) fn is_match(&self, text: &str) -> bool {
        let [first, middle @ .., last] = self.segments.as_slice() else {
            return self.segments.first().is_some_and(|only| only == text);
        };
        if text.len() < first.len() + last.len()
            || !text.starts_with(first.as_str())
            || !text.ends_with(last.as_str())
        {
            return false;
        }
        // Both bounds are character boundaries: the text starts with `first` and ends
        // with `last`, and the two do not overlap.
        let mut rest = &text[first.len()..text.len() - last.len()];
        for segment in middle {
            match rest.find(segment.as_str()) {
                Some(at) => rest = &rest[at + segment.len()..],
                None => return false,
            }
        }
        true
    }
}

/// One element of a command pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// Zero or more words (a standalone `*`, or the `:*` suffix).
    AnyWords,
    /// Exactly one known word matching the wildcard.
    Word(Wildcard),
}

/// A `run_command` specifier, matched against a simple command's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CommandPattern {
    tokens: Vec<Token>,
}

impl CommandPattern {
    fn parse(spec: &str) -> Result<CommandPattern, RuleProblem> {
        let spec = spec.trim();
        let (body, prefix) = match spec.strip_suffix(":*") {
            Some(body) => (body, true),
            None => (spec, false),
        };
        let mut tokens = split_pattern_words(body)?;
        if prefix {
            tokens.push(Token::AnyWords);
        }
        tokens.dedup_by(|next, previous| *next == Token::AnyWords && *previous == Token::AnyWords);
        Ok(CommandPattern { tokens })
    }

    /// Whether the words match; a word only known at run time matches nothing but a
    /// standalone `*`.
    pub(crate) fn matches(&self, words: &[ShellWord]) -> bool {
        match_tokens(&self.tokens, words)
    }
}

fn match_tokens(tokens: &[Token], words: &[ShellWord]) -> bool {
    match tokens.split_first() {
        None => words.is_empty(),
        Some((Token::AnyWords, rest)) => {
            (0..=words.len()).any(|skip| match_tokens(rest, &words[skip..]))
        }
        Some((Token::Word(wildcard), rest)) => match words.split_first() {
            Some((word, remaining)) => {
                word.literal().is_some_and(|text| wildcard.is_match(text))
                    && match_tokens(rest, remaining)
            }
            None => false,
        },
    }
}

/// Splits a command pattern into tokens: whitespace separates words, quotes and
/// backslashes make characters literal, an unquoted `*` is a wildcard.
fn split_pattern_words(body: &str) -> Result<Vec<Token>, RuleProblem> {
    /// The word being built: literal segments between unquoted stars.
    #[derive(Default)]
    struct Pending {
        segments: Vec<String>,
        current: String,
        started: bool,
    }
    impl Pending {
        fn finish(&mut self, tokens: &mut Vec<Token>) {
            if !self.started {
                return;
            }
            let mut segments = std::mem::take(&mut self.segments);
            segments.push(std::mem::take(&mut self.current));
            self.started = false;
            if segments.len() == 2 && segments.iter().all(String::is_empty) {
                tokens.push(Token::AnyWords);
            } else {
                tokens.push(Token::Word(Wildcard { segments }));
            }
        }
    }

    let mut tokens = Vec::new();
    let mut pending = Pending::default();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => pending.finish(&mut tokens),
            '*' => {
                pending.started = true;
                pending.segments.push(std::mem::take(&mut pending.current));
            }
            '\\' => {
                pending.started = true;
                if let Some(escaped) = chars.next() {
                    pending.current.push(escaped);
                }
            }
            '\'' => {
                pending.started = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(inner) => pending.current.push(inner),
                        None => return Err(RuleProblem::UnterminatedQuote),
                    }
                }
            }
            '"' => {
                pending.started = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(escaped @ ('"' | '\\')) => pending.current.push(escaped),
                            Some(other) => {
                                pending.current.push('\\');
                                pending.current.push(other);
                            }
                            None => return Err(RuleProblem::UnterminatedQuote),
                        },
                        Some(inner) => pending.current.push(inner),
                        None => return Err(RuleProblem::UnterminatedQuote),
                    }
                }
            }
            other => {
                pending.started = true;
                pending.current.push(other);
            }
        }
    }
    pending.finish(&mut tokens);
    Ok(tokens)
}

/// A file-tool specifier compiled to globs (validated at parse time; matched through
/// the index's sets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PathPattern {
    /// Matched against the absolute path rather than the path relative to a root.
    absolute: bool,
    /// The pattern itself and the variant that covers what lies beneath a directory.
    globs: Vec<String>,
}

impl PathPattern {
    fn parse(spec: &str, home: Option<&Path>) -> Result<PathPattern, RuleProblem> {
        let spec = spec.trim();
        if spec.split('/').any(|component| component == "..") {
            // Paths are resolved before matching, so such a rule could never match;
            // for a deny rule that silence would be dangerous.
            return Err(RuleProblem::ParentInGlob);
        }
        let (absolute, anchored, body) = if let Some(rest) = spec.strip_prefix("//") {
            (true, true, format!("/{}", rest.trim_start_matches('/')))
        } else if spec == "~" || spec.starts_with("~/") {
            let home = home.and_then(Path::to_str).ok_or(RuleProblem::NoHome)?;
            let home = globset::escape(home.trim_end_matches('/'));
            (true, true, format!("{home}/{}", spec[1..].trim_start_matches('/')))
        } else if let Some(rest) = spec.strip_prefix('/') {
            (false, true, rest.to_owned())
        } else {
            let rest = spec.strip_prefix("./").unwrap_or(spec);
            (false, rest.trim_end_matches('/').contains('/'), rest.to_owned())
        };

        let directory_only = body.ends_with('/');
        let core = body.trim_end_matches('/');
        let base = match (absolute, core.is_empty(), anchored) {
            (true, true, _) => String::new(),
            (false, true, _) => "**".to_owned(),
            (_, false, true) => core.to_owned(),
            (_, false, false) => format!("**/{core}"),
        };
        let globs = if directory_only || base.is_empty() {
            vec![format!("{base}/**")]
        } else if let Some(parent) = base.strip_suffix("/**") {
            // `src/**` also names `src` itself (a directory find_files may search).
            vec![base.clone(), parent.to_owned()]
        } else {
            vec![base.clone(), format!("{base}/**")]
        };
        for glob in &globs {
            build_glob(glob).map_err(|err| RuleProblem::BadGlob(err.kind().to_string()))?;
        }
        Ok(PathPattern { absolute, globs })
    }
}

/// A specifier of a tool with no command or path kind: a text pattern over the call's
/// arguments (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ArgumentPattern {
    /// The top-level argument looked at; `None` looks at every string value.
    key: Option<String>,
    exact: Wildcard,
    /// The same pattern, lowered, for deny and ask rules.
    folded: Wildcard,
}

impl ArgumentPattern {
    fn parse(spec: &str) -> Result<ArgumentPattern, RuleProblem> {
        let spec = spec.trim();
        let (key, pattern) = match spec.split_once('=') {
            Some((key, pattern))
                if key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) =>
            {
                if key.is_empty() {
                    return Err(RuleProblem::EmptyArgumentName);
                }
                (Some(key.to_owned()), pattern.trim())
            }
            _ => (None, spec),
        };
        if pattern.is_empty() {
            return Err(RuleProblem::EmptySpecifier);
        }
        let exact = Wildcard::new(pattern);
        let folded = exact.lowered();
        Ok(ArgumentPattern { key, exact, folded })
    }

    /// Whether the rule applies to a call with these arguments, as a rule of `list`.
    pub(crate) fn matches(&self, list: RuleList, args: &serde_json::Value) -> bool {
        let mut values: Vec<std::borrow::Cow<'_, str>> = Vec::new();
        match &self.key {
            Some(key) => match args.get(key) {
                Some(serde_json::Value::String(text)) => values.push(text.as_str().into()),
                Some(other) => values.push(other.to_string().into()),
                None => {}
            },
            None => collect_strings(args, &mut values),
        }
        match list {
            RuleList::Allow => {
                !values.is_empty() && values.iter().all(|value| self.exact.is_match(value.trim()))
            }
            RuleList::Ask | RuleList::Deny => {
                values.iter().any(|value| self.folded.is_match(&value.trim().to_ascii_lowercase()))
            }
        }
    }
}

/// Every string value in a JSON value, at any depth (object keys excluded).
fn collect_strings<'a>(value: &'a serde_json::Value, out: &mut Vec<std::borrow::Cow<'a, str>>) {
    match value {
        serde_json::Value::String(text) => out.push(text.as_str().into()),
        serde_json::Value::Array(items) => items.iter().for_each(|item| collect_strings(item, out)),
        serde_json::Value::Object(map) => map.values().for_each(|item| collect_strings(item, out)),
        _ => {}
    }
}

fn build_glob(glob: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(glob).literal_separator(true).backslash_escape(true).build()
}

/// Which tools a rule applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToolMatch {
    /// Canonical tool names (an alias may stand for several).
    Names(Vec<String>),
    Wildcard(Wildcard),
}

/// What part of a call a rule looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Spec {
    /// No specifier: every call of the tool.
    Whole,
    Command(CommandPattern),
    Path(PathPattern),
    /// A text pattern over the arguments of any other tool.
    Arguments(ArgumentPattern),
}

/// One parsed rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    /// The rule exactly as configured, for explanations.
    pub(crate) text: String,
    pub(crate) tools: ToolMatch,
    pub(crate) spec: Spec,
}

impl Rule {
    /// Parses one rule; `home` resolves `~/` in path globs.
    pub(crate) fn parse(text: &str, home: Option<&Path>) -> Result<Rule, RuleProblem> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(RuleProblem::Empty);
        }
        let (name, specifier) = match trimmed.find('(') {
            None if trimmed.contains(')') => {
                return Err(RuleProblem::BadToolName(trimmed.to_owned()));
            }
            None => (trimmed, None),
            Some(open) => {
                let inner = trimmed[open + 1..].strip_suffix(')').ok_or(RuleProblem::Unclosed)?;
                (trimmed[..open].trim_end(), Some(inner))
            }
        };
        if name.is_empty() {
            return Err(RuleProblem::EmptyToolName);
        }
        if name.chars().any(|c| c.is_whitespace() || c.is_control() || c == '(' || c == ')') {
            return Err(RuleProblem::BadToolName(name.to_owned()));
        }
        let tools = if name.contains('*') {
            ToolMatch::Wildcard(Wildcard::new(name))
        } else {
            ToolMatch::Names(canonical_names(name))
        };
        let spec = match (specifier, &tools) {
            (None, _) => Spec::Whole,
            (Some(inner), _) if inner.trim().is_empty() => return Err(RuleProblem::EmptySpecifier),
            (Some(_), ToolMatch::Wildcard(_)) => return Err(RuleProblem::SpecifierOnWildcard),
            (Some(inner), ToolMatch::Names(names)) => {
                let first = names.first().map(String::as_str).unwrap_or_default();
                if is_command_tool(first) {
                    Spec::Command(CommandPattern::parse(inner)?)
                } else if takes_path_rules(first) {
                    Spec::Path(PathPattern::parse(inner, home)?)
                } else {
                    Spec::Arguments(ArgumentPattern::parse(inner)?)
                }
            }
        };
        Ok(Rule { text: trimmed.to_owned(), tools, spec })
    }

    fn applies_to(&self, tool: &str) -> bool {
        match &self.tools {
            ToolMatch::Names(names) => names.iter().any(|name| name == tool),
            ToolMatch::Wildcard(wildcard) => wildcard.is_match(tool),
        }
    }
}

fn canonical_names(name: &str) -> Vec<String> {
    match aliases().iter().find(|(alias, _)| *alias == name) {
        Some((_, names)) => names.iter().map(|name| (*name).to_owned()).collect(),
        None => vec![name.to_owned()],
    }
}

/// Position of a rule in the index, in configured order.
pub(crate) type RuleId = usize;

/// The path a file-tool call names, with the roots that relative globs are matched
/// under.
pub(crate) struct PathTarget<'a> {
    /// Lexically resolved absolute path.
    pub(crate) absolute: &'a Path,
    pub(crate) roots: &'a [PathBuf],
}

/// Path rules of one tool and list, compiled into two glob sets.
struct PathIndex {
    relative: GlobSet,
    /// The rule of each glob in `relative`.
    relative_ids: Vec<RuleId>,
    absolute: GlobSet,
    absolute_ids: Vec<RuleId>,
}

impl PathIndex {
    fn first_match(&self, target: &PathTarget<'_>) -> Option<RuleId> {
        let mut best: Option<RuleId> = None;
        let mut consider = |set: &GlobSet, ids: &[RuleId], candidate: &Candidate<'_>| {
            if !set.is_empty() && set.is_match_candidate(candidate) {
                for glob_idx in set.matches_candidate(candidate) {
                    if let Some(&id) = ids.get(glob_idx) {
                        best = Some(best.map_or(id, |seen| seen.min(id)));
                    }
                }
            }
        };
        consider(&self.absolute, &self.absolute_ids, &Candidate::new(target.absolute));
        for root in target.roots {
            if let Ok(relative) = target.absolute.strip_prefix(root) {
                consider(&self.relative, &self.relative_ids, &Candidate::new(relative));
            }
        }
        best
    }
}

/// The rules of one tool in one list.
#[derive(Default)]
struct ListIndex {
    /// The first bare rule naming the tool exactly.
    whole: Option<RuleId>,
    /// Command-pattern rules, in configured order.
    commands: Vec<RuleId>,
    /// Argument-pattern rules, in configured order.
    arguments: Vec<RuleId>,
    paths: Option<PathIndex>,
}

/// The path globs of one tool and list while building: (absolute?, glob, rule).
type GlobGroup<'a> = Vec<(bool, &'a str, RuleId)>;

/// Compiled rules grouped for lookup. Immutable; shared behind an `Arc`.
pub(crate) struct RuleIndex {
    rules: Vec<(RuleList, Rule)>,
    /// Per canonical tool name, one entry per list (indexed by [`list_slot`]).
    tools: HashMap<String, [ListIndex; 3]>,
    /// Rules with a wildcard tool name (always bare), per list.
    wildcards: [Vec<RuleId>; 3],
}

fn list_slot(list: RuleList) -> usize {
    match list {
        RuleList::Allow => 0,
        RuleList::Ask => 1,
        RuleList::Deny => 2,
    }
}

impl RuleIndex {
    pub(crate) fn empty() -> RuleIndex {
        RuleIndex { rules: Vec::new(), tools: HashMap::new(), wildcards: Default::default() }
    }

    /// Groups parsed rules by tool and list and compiles their path globs.
    pub(crate) fn build(rules: Vec<(RuleList, Rule)>) -> Result<RuleIndex, RuleError> {
        let mut tools: HashMap<String, [ListIndex; 3]> = HashMap::new();
        let mut wildcards: [Vec<RuleId>; 3] = Default::default();
        // Path globs per (tool, slot): (absolute?, glob, rule).
        let mut globs: HashMap<(String, usize), GlobGroup<'_>> = HashMap::new();
        for (id, (list, rule)) in rules.iter().enumerate() {
            let slot = list_slot(*list);
            let names = match &rule.tools {
                ToolMatch::Wildcard(_) => {
                    wildcards[slot].push(id);
                    continue;
                }
                ToolMatch::Names(names) => names,
            };
            for name in names {
                let entry = &mut tools.entry(name.clone()).or_default()[slot];
                match &rule.spec {
                    Spec::Whole => {
                        entry.whole.get_or_insert(id);
                    }
                    Spec::Command(_) => entry.commands.push(id),
                    Spec::Path(pattern) => {
                        let group = globs.entry((name.clone(), slot)).or_default();
                        for glob in &pattern.globs {
                            group.push((pattern.absolute, glob, id));
                        }
                    }
                    Spec::Arguments(_) => entry.arguments.push(id),
                }
            }
        }
        for ((name, slot), group) in globs {
            let index = compile_paths(&group).map_err(|problem| {
                let first = group.first().map(|(_, _, id)| *id).unwrap_or_default();
                let (list, rule) = &rules[first];
                RuleError { rule: rule.text.clone(), list: Some(*list), problem }
            })?;
            if let Some(lists) = tools.get_mut(&name) {
                lists[slot].paths = Some(index);
            }
        }
        Ok(RuleIndex { rules, tools, wildcards })
    }

    pub(crate) fn rule(&self, id: RuleId) -> &Rule {
        &self.rules[id].1
    }

    pub(crate) fn rules(&self) -> impl Iterator<Item = (RuleList, &Rule)> {
        self.rules.iter().map(|(list, rule)| (*list, rule))
    }

    /// The rules that can apply to `tool` (one hash lookup for the whole decision).
    pub(crate) fn for_tool<'a>(&'a self, tool: &'a str) -> ToolRules<'a> {
        ToolRules { index: self, tool, lists: self.tools.get(tool) }
    }
}

/// The rules of one index that can apply to one tool.
pub(crate) struct ToolRules<'a> {
    index: &'a RuleIndex,
    tool: &'a str,
    lists: Option<&'a [ListIndex; 3]>,
}

impl ToolRules<'_> {
    pub(crate) fn rule(&self, id: RuleId) -> &Rule {
        self.index.rule(id)
    }

    /// The first rule in `list` that matches every call of the tool.
    pub(crate) fn whole(&self, list: RuleList) -> Option<RuleId> {
        let slot = list_slot(list);
        let exact = self.lists.and_then(|lists| lists[slot].whole);
        let wildcard = self.index.wildcards[slot]
            .iter()
            .copied()
            .find(|&id| self.index.rules[id].1.applies_to(self.tool));
        earliest(exact, wildcard)
    }

    /// Whether `list` holds any rule that can match a call of the tool.
    pub(crate) fn any(&self, list: RuleList) -> bool {
        let slot = list_slot(list);
        let own = self.lists.is_some_and(|lists| {
            let rules = &lists[slot];
            rules.whole.is_some()
                || !rules.commands.is_empty()
                || !rules.arguments.is_empty()
                || rules.paths.is_some()
        });
        own || self.whole(list).is_some()
    }

    /// The first command-pattern rule in `list` matching the words.
    pub(crate) fn command(&self, list: RuleList, words: &[ShellWord]) -> Option<RuleId> {
        let lists = self.lists?;
        lists[list_slot(list)].commands.iter().copied().find(|&id| {
            match &self.index.rules[id].1.spec {
                Spec::Command(pattern) => pattern.matches(words),
                _ => false,
            }
        })
    }

    /// The first argument-pattern rule in `list` applying to these arguments.
    pub(crate) fn arguments(&self, list: RuleList, args: &serde_json::Value) -> Option<RuleId> {
        let lists = self.lists?;
        lists[list_slot(list)].arguments.iter().copied().find(|&id| {
            match &self.index.rules[id].1.spec {
                Spec::Arguments(pattern) => pattern.matches(list, args),
                _ => false,
            }
        })
    }

    /// The first path rule in `list` matching the path.
    pub(crate) fn path(&self, list: RuleList, target: &PathTarget<'_>) -> Option<RuleId> {
        self.lists?[list_slot(list)].paths.as_ref()?.first_match(target)
    }
}

/// The rule configured first of two candidates.
pub(crate) fn earliest(a: Option<RuleId>, b: Option<RuleId>) -> Option<RuleId> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn compile_paths(group: &[(bool, &str, RuleId)]) -> Result<PathIndex, RuleProblem> {
    let mut relative = GlobSetBuilder::new();
    let mut relative_ids = Vec::new();
    let mut absolute = GlobSetBuilder::new();
    let mut absolute_ids = Vec::new();
    for &(is_absolute, glob, id) in group {
        let compiled =
            build_glob(glob).map_err(|err| RuleProblem::BadGlob(err.kind().to_string()))?;
        if is_absolute {
            absolute.add(compiled);
            absolute_ids.push(id);
        } else {
            relative.add(compiled);
            relative_ids.push(id);
        }
    }
    let build = |builder: &GlobSetBuilder| {
        builder.build().map_err(|err| RuleProblem::BadGlob(err.kind().to_string()))
    };
    Ok(PathIndex {
        relative: build(&relative)?,
        relative_ids,
        absolute: build(&absolute)?,
        absolute_ids,
    })
}

/// A `run_command` rule text allowing commands that start with `words`.
pub(crate) fn command_prefix_rule(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|word| quote_pattern_word(word)).collect();
    format!("{}({}:*)", command_tool().name, quoted.join(" "))
}

/// Quotes a word for a command pattern when it holds anything the pattern syntax would
/// read differently.
fn quote_pattern_word(word: &str) -> String {
    let plain = !word.is_empty()
        && !word.chars().any(|c| c.is_whitespace() || matches!(c, '*' | '\'' | '"' | '\\'));
    if plain {
        word.to_owned()
    } else if !word.contains('\'') {
        format!("'{word}'")
    } else {
        format!("\"{}\"", word.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

/// A file-tool rule text naming `path` (relative to a root, or absolute), glob
/// metacharacters escaped; `directory` adds `/**` to cover everything beneath it. A
/// relative file name gets a leading `/` so that it stays anchored to the root rather
/// than matching at any depth.
pub(crate) fn path_rule(tool: &str, path: &Path, relative: bool, directory: bool) -> String {
    let escaped = globset::escape(&path.to_string_lossy());
    let spec = match (relative, directory) {
        (true, true) => format!("{escaped}/**"),
        (true, false) if escaped.contains('/') => escaped,
        (true, false) | (false, false) => format!("/{escaped}"),
        (false, true) => format!("/{escaped}/**"),
    };
    format!("{tool}({spec})")
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn words(command: &str) -> Vec<ShellWord> {
        command.split_whitespace().map(|word| ShellWord::Literal(word.to_owned())).collect()
    }

    #[test]
    fn parse_errors_name_the_problem() {
        let table: &[(&str, RuleProblem)] = &[
            ("", RuleProblem::Empty),
            ("   ", RuleProblem::Empty),
            ("(git status)", RuleProblem::EmptyToolName),
            ("run_command(git status", RuleProblem::Unclosed),
            ("run_command(git) extra", RuleProblem::Unclosed),
            ("run_command()", RuleProblem::EmptySpecifier),
            ("run command", RuleProblem::BadToolName("run command".to_owned())),
            ("run_command)", RuleProblem::BadToolName("run_command)".to_owned())),
            ("mcp__*(x)", RuleProblem::SpecifierOnWildcard),
            ("Bash(echo 'oops)", RuleProblem::UnterminatedQuote),
            (
                "read_file(src/[)",
                RuleProblem::BadGlob("unclosed character class; missing ']'".to_owned()),
            ),
            ("read_file(~/.ssh/**)", RuleProblem::NoHome),
            ("edit_file(../secrets/**)", RuleProblem::ParentInGlob),
            ("edit_file(//w/a/../b)", RuleProblem::ParentInGlob),
        ];
        for (text, problem) in table {
            assert_eq!(Rule::parse(text, None).as_ref().err(), Some(problem), "rule {text:?}");
        }
        let err = RuleError {
            rule: "run_command()".to_owned(),
            list: Some(RuleList::Deny),
            problem: RuleProblem::EmptySpecifier,
        };
        expect![[r#"invalid deny rule "run_command()": the specifier in parentheses is empty; write the bare tool name to match every call"#]]
            .assert_eq(&err.to_string());
    }

    #[test]
    fn aliases_and_specifier_kinds() {
        let table: &[(&str, &[&str], &str)] = &[
            ("Bash(git status:*)", &["run_command"], "command"),
            ("Read(src/**)", &["read_file"], "path"),
            ("Edit(src/**)", &["edit_file", "write_file", "apply_patch", "notebook_edit"], "path"),
            ("Write", &["write_file"], "whole"),
            ("Glob(src/**)", &["find_files"], "path"),
            ("Grep(src/**)", &["search_code"], "path"),
            ("MultiEdit(src/**)", &["edit_file"], "path"),
            ("NotebookEdit(**/*.ipynb)", &["notebook_edit"], "path"),
            ("notebook_edit(**/*.ipynb)", &["notebook_edit"], "path"),
            ("apply_patch(src/**)", &["apply_patch"], "path"),
            ("process_write(input=*)", &["process_write"], "arguments"),
            ("mcp__git__status(anything)", &["mcp__git__status"], "arguments"),
            ("bash(x)", &["bash"], "arguments"),
        ];
        for (text, names, kind) in table {
            let rule = Rule::parse(text, None).unwrap_or_else(|err| panic!("{text}: {err}"));
            let expected_names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
            assert_eq!(rule.tools, ToolMatch::Names(expected_names), "{text}");
            let actual_kind = match rule.spec {
                Spec::Whole => "whole",
                Spec::Command(_) => "command",
                Spec::Path(_) => "path",
                Spec::Arguments(_) => "arguments",
            };
            assert_eq!(actual_kind, *kind, "{text}");
        }
    }

    #[test]
    fn tool_name_wildcards() {
        let rule = Rule::parse("mcp__git__*", None).unwrap_or_else(|err| panic!("{err}"));
        let table = [
            ("mcp__git__status", true),
            ("mcp__git__", true),
            ("mcp__github__status", false),
            ("mcp__gi", false),
            ("run_command", false),
        ];
        for (tool, expected) in table {
            assert_eq!(rule.applies_to(tool), expected, "{tool}");
        }
        let all_mcp = Rule::parse("mcp__*__delete_*", None).unwrap_or_else(|err| panic!("{err}"));
        assert!(all_mcp.applies_to("mcp__db__delete_row"));
        assert!(!all_mcp.applies_to("mcp__db__insert_row"));
    }

    #[test]
    fn command_patterns() {
        let table: &[(&str, &str, bool)] = &[
            // Prefix form.
            ("git status:*", "git status", true),
            ("git status:*", "git status --short", true),
            ("git status:*", "git statusx", false),
            ("git status:*", "git", false),
            ("git status:*", "git log status", false),
            // Exact form.
            ("git status", "git status", true),
            ("git status", "git status --short", false),
            // Glob form: standalone star is any number of words.
            ("npm run test *", "npm run test", true),
            ("npm run test *", "npm run test unit --watch", true),
            ("npm run test *", "npm run testx", false),
            ("git * --dry-run", "git push origin --dry-run", true),
            ("git * --dry-run", "git push origin", false),
            // Star inside a word.
            ("cargo test*", "cargo test", true),
            ("cargo test*", "cargo tests", true),
            ("cargo test*", "cargo test --all", false),
            ("ls*:*", "lsof -i", true),
            ("*", "anything at all", true),
            // Quotes make stars and spaces literal.
            ("echo '*'", "echo *", true),
            ("echo '*'", "echo x", false),
            ("git commit -m \"wip now\":*", "git commit -m x", false),
        ];
        for (pattern, command, expected) in table {
            let parsed = CommandPattern::parse(pattern).unwrap_or_else(|err| panic!("{err}"));
            assert_eq!(parsed.matches(&words(command)), *expected, "{pattern:?} vs {command:?}");
        }
        let quoted = CommandPattern::parse("git commit -m \"wip now\":*")
            .unwrap_or_else(|err| panic!("{err}"));
        let with_space = vec![
            ShellWord::Literal("git".to_owned()),
            ShellWord::Literal("commit".to_owned()),
            ShellWord::Literal("-m".to_owned()),
            ShellWord::Literal("wip now".to_owned()),
        ];
        assert!(quoted.matches(&with_space));
        // A word only known at run time matches no literal, only a standalone star.
        let dynamic =
            vec![ShellWord::Literal("git".to_owned()), ShellWord::Dynamic("$X".to_owned())];
        assert!(!CommandPattern::parse("git status:*").is_ok_and(|p| p.matches(&dynamic)));
        assert!(CommandPattern::parse("git:*").is_ok_and(|p| p.matches(&dynamic)));
    }

    #[test]
    fn path_patterns_compile_gitignore_style() {
        let home = Path::new("/home/u");
        let table: &[(&str, bool, &[&str])] = &[
            ("src/**", false, &["src/**", "src"]),
            ("*.md", false, &["**/*.md", "**/*.md/**"]),
            ("**/.env*", false, &["**/.env*", "**/.env*/**"]),
            (".git", false, &["**/.git", "**/.git/**"]),
            ("build/", false, &["**/build/**"]),
            ("/Cargo.toml", false, &["Cargo.toml", "Cargo.toml/**"]),
            ("./docs/*.md", false, &["docs/*.md", "docs/*.md/**"]),
            ("//etc/**", true, &["/etc/**", "/etc"]),
            ("~/.ssh/**", true, &["/home/u/.ssh/**", "/home/u/.ssh"]),
            ("~", true, &["/home/u/**"]),
        ];
        for (spec, absolute, globs) in table {
            let pattern =
                PathPattern::parse(spec, Some(home)).unwrap_or_else(|err| panic!("{spec}: {err}"));
            assert_eq!(pattern.absolute, *absolute, "{spec}");
            assert_eq!(pattern.globs, *globs, "{spec}");
        }
    }

    #[test]
    fn index_matches_paths_under_each_root() {
        let rules = ["edit_file(src/**)", "edit_file(*.md)", "edit_file(//etc/**)"]
            .iter()
            .map(|text| Rule::parse(text, None).map(|rule| (RuleList::Allow, rule)))
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|err| panic!("{err}"));
        let index = RuleIndex::build(rules).unwrap_or_else(|err| panic!("{err}"));
        let roots = [PathBuf::from("/w/a"), PathBuf::from("/w/b")];
        let table: &[(&str, Option<RuleId>)] = &[
            ("/w/a/src/main.rs", Some(0)),
            ("/w/b/src/deep/x.rs", Some(0)),
            ("/w/a/src", Some(0)),
            ("/w/a/docs/README.md", Some(1)),
            ("/w/a/README.md", Some(1)),
            ("/w/c/src/main.rs", None),
            ("/w/a/srcx/main.rs", None),
            ("/etc/passwd", Some(2)),
            ("/w/a/etc/passwd", None),
        ];
        for (path, expected) in table {
            let target = PathTarget { absolute: Path::new(path), roots: &roots };
            assert_eq!(
                index.for_tool("edit_file").path(RuleList::Allow, &target),
                *expected,
                "{path}"
            );
        }
        let target = PathTarget { absolute: Path::new("/w/a/src/x"), roots: &roots };
        assert_eq!(index.for_tool("read_file").path(RuleList::Allow, &target), None);
    }

    #[test]
    fn warnings_name_rules_that_never_do_what_they_look_like() {
        let home = Path::new("/home/u");
        let roots = [PathBuf::from("/home/u"), PathBuf::from("/w/proj")];
        let properties = |tool: &str| match tool {
            "say" => Some(vec!["text".to_owned()]),
            _ => None,
        };
        let warned = |text: &str| rule_warnings(text, Some(home), &roots, &properties);
        let table: &[(&str, Option<&str>)] = &[
            ("run_command(git push)", Some("write `run_command(git push:*)`")),
            ("Bash(git push)", Some("write `Bash(git push:*)`")),
            ("run_command(git push:*)", None),
            ("run_command(npm run test *)", None),
            ("run_command(path=*.env)", Some("only sets a variable")),
            ("Bash(FOO=1 make:*)", Some("only sets a variable")),
            ("read_file(path=*.env)", Some("is read as a path glob")),
            ("Edit(//etc/**)", Some("beneath /etc, outside every workspace root")),
            ("Read(//srv/data/*.csv)", Some("beneath /srv/data, outside")),
            ("Read(~/.ssh/**)", None),
            ("Edit(//w/proj/src/**)", None),
            ("Edit(//w/**)", None),
            ("Edit(src/**)", None),
            ("say(txt=*secret*)", Some("say has no argument `txt` (its arguments: text)")),
            ("say(text=*secret*)", None),
            ("say(*secret*)", None),
            ("mcp__db__query(sql=DROP *)", None),
            ("run_command", None),
        ];
        for (text, expected) in table {
            let warnings = warned(text);
            match expected {
                Some(needle) => assert!(
                    warnings.len() == 1 && warnings[0].contains(needle),
                    "{text}: {warnings:?}"
                ),
                None => assert!(warnings.is_empty(), "{text}: {warnings:?}"),
            }
        }
        assert!(covered_by("edit_file(x/**)", "Edit(x/**)", None));
        assert!(covered_by("Bash(git push:*)", "run_command(git push:*)", None));
        assert!(!covered_by("Edit(x/**)", "edit_file(x/**)", None));
        assert!(!covered_by("run_command(git push:*)", "run_command(git push)", None));
    }

    #[test]
    fn suggestion_texts_round_trip() {
        let table: &[&[&str]] =
            &[&["cargo", "test"], &["echo", "a b"], &["ls", "*"], &["say", "it's"]];
        for words_in in table {
            let text = command_prefix_rule(words_in);
            let rule = Rule::parse(&text, None).unwrap_or_else(|err| panic!("{text}: {err}"));
            let Spec::Command(pattern) = rule.spec else { panic!("{text} is not a command rule") };
            let mut literal: Vec<ShellWord> =
                words_in.iter().map(|word| ShellWord::Literal((*word).to_owned())).collect();
            assert!(pattern.matches(&literal), "{text}");
            literal.push(ShellWord::Literal("--more".to_owned()));
            assert!(pattern.matches(&literal), "{text}");
        }
        expect![[r#"run_command(echo "it's" 'a b' '*':*)"#]]
            .assert_eq(&command_prefix_rule(&["echo", "it's", "a b", "*"]));
    }
}
