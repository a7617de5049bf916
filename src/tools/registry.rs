//! The one runtime catalogue of tools, and the boundary where untrusted calls become
//! execution.
//!
//! [`Registry::execute`] applies its guards in a fixed order (see DESIGN section 1):
//! unknown name, JSON validity, JSON Schema validity, Env defaults, the effective
//! deadline, cancellation versus timeout, panic isolation, and finally stamping the
//! tool name and call id on the result. No other code path runs a tool.
//!
//! Every entry remembers where it came from ([`ToolSource`]): the built-ins, a proxied
//! MCP server, or a skill file. Hot reload goes through [`Registry::sync`] and
//! [`Registry::register_or_replace`], which only ever replace or remove what the same
//! source owns, so a skill can never shadow a built-in or a proxied tool.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use futures::FutureExt;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::duration::describe_duration;
use super::{Call, Definition, Env, ErrorType, OutputSink, Safety, Tool, ToolContext, ToolResult};

/// Why a tool could not be registered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegisterError {
    #[error("no tool given")]
    Missing,
    #[error("a tool name must not be blank")]
    BlankName,
    #[error("a tool named {0:?} is already registered")]
    Duplicate(String),
    #[error("the input schema of {name:?} is not a valid JSON Schema: {reason}")]
    InvalidSchema { name: String, reason: String },
    /// Hot reload tried to replace a tool that another source registered.
    #[error("the name {name:?} is taken by a tool from {owner}")]
    Taken { name: String, owner: ToolSource },
    /// A sync was handed a tool of another family of sources (a programming error).
    #[error("{name:?} comes from {from}, outside the family being synced")]
    Foreign { name: String, from: ToolSource },
}

/// Where a registered tool came from; shown to clients next to `tools/list` so that a
/// user can tell a built-in from a proxied or a skill tool of a similar name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ToolSource {
    /// Compiled into toolgate (the built-ins and the system tools).
    Builtin,
    /// Proxied from the configured MCP server of that name.
    Mcp(String),
    /// Declared by the skill file (or `SKILL.md` folder) at that path.
    Skill(PathBuf),
    /// The MCP conformance suite's fixtures (`toolgate mcp --conformance-fixtures`, in
    /// a build with the `conformance` feature); never registered otherwise.
    #[cfg(feature = "conformance")]
    Conformance,
}

impl ToolSource {
    /// Whether two sources belong to the same reloadable family: every skill belongs
    /// to one family (a skill may move from one file to another), each MCP server is
    /// its own, and the built-ins are never reloaded.
    pub fn same_family(&self, other: &ToolSource) -> bool {
        match (self, other) {
            (ToolSource::Builtin, ToolSource::Builtin) => true,
            (ToolSource::Mcp(a), ToolSource::Mcp(b)) => a == b,
            (ToolSource::Skill(_), ToolSource::Skill(_)) => true,
            #[cfg(feature = "conformance")]
            (ToolSource::Conformance, ToolSource::Conformance) => true,
            _ => false,
        }
    }
}

impl std::fmt::Display for ToolSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolSource::Builtin => f.write_str("builtin"),
            ToolSource::Mcp(server) => write!(f, "mcp:{server}"),
            ToolSource::Skill(path) => write!(f, "skill:{}", path.display()),
            #[cfg(feature = "conformance")]
            ToolSource::Conformance => f.write_str("conformance"),
        }
    }
}

/// What one [`Registry::sync`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Names newly registered.
    pub added: Vec<String>,
    /// Names whose definition (or source) changed.
    pub changed: Vec<String>,
    /// Names removed because the source no longer offers them.
    pub removed: Vec<String>,
    /// Tools that were not registered, with the reason (taken by another source,
    /// invalid schema, blank name, offered twice).
    pub refused: Vec<(String, RegisterError)>,
}

impl SyncReport {
    /// Whether the visible set of tools changed (a `tools_list_changed` was sent).
    pub fn changed_anything(&self) -> bool {
        !(self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty())
    }
}

/// A registered tool with its argument validator.
#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    validator: Arc<ArgumentSchema>,
    source: ToolSource,
    /// Top-level properties for which a `null` means "left out"
    /// ([`super::null_means_absent`]).
    null_means_absent: Arc<[String]>,
}

impl Entry {
    /// Drops the `null`s that stand for a property left out.
    fn drop_absent_nulls(&self, args: &mut Value) {
        if self.null_means_absent.is_empty() {
            return;
        }
        if let Value::Object(map) = args {
            map.retain(|name, value| !(value.is_null() && self.null_means_absent.contains(name)));
        }
    }

    /// Checks arguments against the tool's input schema.
    fn validate(&self, args: &Value) -> Result<(), ToolResult> {
        self.validator.validate(&self.tool.definition().input_schema, args)
    }
}

/// The catalogue. Cheap to share behind an `Arc`; lookups take a short read lock that
/// is never held across an await.
pub struct Registry {
    /// Sorted by name, so `definitions()` is stable for prompts.
    tools: RwLock<BTreeMap<String, Entry>>,
    /// Bumped on every change after start-up; transports turn it into
    /// `tools_list_changed`.
    generation: watch::Sender<u64>,
    /// Every definition rendered as JSON once, until the tools change (see
    /// [`Registry::listing`]).
    listing: Mutex<Option<Arc<Listing>>>,
}

/// The catalogue as clients are shown it: each tool's definition rendered as JSON
/// once, sorted by name, with its source. Built on first use after a change and shared
/// until the next one, so listing the tools costs a copy of text, not a walk over
/// every schema.
#[derive(Debug)]
pub struct Listing {
    pub tools: Vec<Listed>,
}

/// One tool of a [`Listing`].
#[derive(Debug)]
pub struct Listed {
    pub name: String,
    pub safety: Safety,
    pub system: bool,
    /// The definition as JSON.
    pub json: Box<str>,
    /// Its source, as `tools/list` names it.
    pub source: String,
    /// `"<name>":"<source>"`, the tool's member of a JSON object of sources.
    pub source_json: Box<str>,
}

impl Default for Registry {
    fn default() -> Registry {
        Registry::new()
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("tools", &self.names()).finish()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            tools: RwLock::new(BTreeMap::new()),
            generation: watch::Sender::new(0),
            listing: Mutex::new(None),
        }
    }

    /// A registry holding the built-in tools.
    pub fn with_builtins() -> Registry {
        let registry = Registry::new();
        for tool in super::builtin::all() {
            // A failure here is a programming error caught by the registry tests.
            if let Err(err) = registry.register_built_in(tool) {
                tracing::error!(%err, "built-in tool failed to register");
            }
        }
        registry
    }

    /// Adds a tool compiled into the binary whose input schema the tests check against
    /// its meta-schema (the built-ins, the agent's system tools): the schema is compiled
    /// on the tool's first call rather than now. Otherwise as [`Registry::register`].
    pub fn register_built_in(&self, tool: Arc<dyn Tool>) -> Result<(), RegisterError> {
        self.insert(Self::entry_for(Some(tool), ToolSource::Builtin, Compile::OnFirstCall)?)
    }

    /// Adds a tool. Rejects a missing tool, a blank name, a duplicate name and an
    /// input schema that does not compile; never silently overrides.
    pub fn register(&self, tool: Option<Arc<dyn Tool>>) -> Result<(), RegisterError> {
        self.insert(Self::entry_for(tool, ToolSource::Builtin, Compile::Now)?)
    }

    fn insert(&self, entry: Entry) -> Result<(), RegisterError> {
        let name = entry.tool.definition().name.clone();
        let mut tools = self.write();
        if tools.contains_key(&name) {
            return Err(RegisterError::Duplicate(name));
        }
        tools.insert(name, entry);
        drop(tools);
        self.forget_listing();
        Ok(())
    }

    /// Adds or replaces one tool of `source`. For hot reload only (proxied servers,
    /// skills). A tool registered by another family of sources is never replaced
    /// (`Taken`). The change generation is bumped when the tool is new or its
    /// definition or source changed; a replacement that clients cannot see (same
    /// definition, new implementation) is silent.
    pub fn register_or_replace(
        &self,
        tool: Arc<dyn Tool>,
        source: ToolSource,
    ) -> Result<(), RegisterError> {
        let entry = Self::entry_for(Some(tool), source, Compile::Now)?;
        let name = entry.tool.definition().name.clone();
        let visible = {
            let mut tools = self.write();
            let visible = match tools.get(&name) {
                Some(existing) if !existing.source.same_family(&entry.source) => {
                    return Err(RegisterError::Taken { name, owner: existing.source.clone() });
                }
                Some(existing) => {
                    existing.source != entry.source
                        || existing.tool.definition() != entry.tool.definition()
                }
                None => true,
            };
            tools.insert(name, entry);
            visible
        };
        if visible {
            self.bump();
        }
        Ok(())
    }

    /// Makes the tools of one family of sources (see [`ToolSource::same_family`])
    /// exactly `tools`, in one step and with at most one change notification: new
    /// names are added, changed ones replaced, and names the family had but no longer
    /// offers are removed. Names that another family holds are refused, never
    /// replaced; so is a tool whose source is outside `family`.
    pub fn sync(&self, family: &ToolSource, tools: Vec<(Arc<dyn Tool>, ToolSource)>) -> SyncReport {
        let owns = |source: &ToolSource| source.same_family(family);
        let mut report = SyncReport::default();
        let mut entries = BTreeMap::new();
        for (tool, source) in tools {
            let name = tool.definition().name.clone();
            if !owns(&source) {
                let err = RegisterError::Foreign { name: name.clone(), from: source };
                report.refused.push((name, err));
                continue;
            }
            match Self::entry_for(Some(tool), source, Compile::Now) {
                Ok(entry) if entries.contains_key(&name) => {
                    drop(entry);
                    report.refused.push((name.clone(), RegisterError::Duplicate(name)));
                }
                Ok(entry) => {
                    entries.insert(name, entry);
                }
                Err(err) => report.refused.push((name, err)),
            }
        }
        {
            let mut current = self.write();
            let stale: Vec<String> = current
                .iter()
                .filter(|(name, entry)| owns(&entry.source) && !entries.contains_key(*name))
                .map(|(name, _)| name.clone())
                .collect();
            for name in stale {
                current.remove(&name);
                report.removed.push(name);
            }
            for (name, entry) in entries {
                match current.get(&name) {
                    Some(existing) if !owns(&existing.source) => {
                        let owner = existing.source.clone();
                        report.refused.push((name.clone(), RegisterError::Taken { name, owner }));
                        continue;
                    }
                    Some(existing) => {
                        if existing.source != entry.source
                            || existing.tool.definition() != entry.tool.definition()
                        {
                            report.changed.push(name.clone());
                        }
                    }
                    None => report.added.push(name.clone()),
                }
                current.insert(name, entry);
            }
        }
        if report.changed_anything() {
            self.bump();
        }
        report
    }

    /// Removes a tool (hot reload). Returns whether it was there.
    pub fn unregister(&self, name: &str) -> bool {
        let removed = self.write().remove(name).is_some();
        if removed {
            self.bump();
        }
        removed
    }

    /// Where a known tool came from; `None` for an unknown name.
    pub fn source(&self, name: &str) -> Option<ToolSource> {
        self.read().get(name).map(|entry| entry.source.clone())
    }

    /// Every tool's source, by name.
    pub fn sources(&self) -> BTreeMap<String, ToolSource> {
        self.read().iter().map(|(name, entry)| (name.clone(), entry.source.clone())).collect()
    }

    fn bump(&self) {
        self.forget_listing();
        self.generation.send_modify(|generation| *generation += 1);
    }

    fn forget_listing(&self) {
        *self.listing.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Every tool rendered for a listing (see [`Listing`]).
    pub fn listing(&self) -> Arc<Listing> {
        let mut cached = self.listing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(listing) = cached.as_ref() {
            return listing.clone();
        }
        let tools = self
            .read()
            .iter()
            .map(|(name, entry)| {
                let definition = entry.tool.definition();
                Listed {
                    name: name.clone(),
                    safety: definition.safety,
                    system: definition.system,
                    json: serde_json::to_string(definition).unwrap_or_default().into(),
                    source: entry.source.to_string(),
                    source_json: format!(
                        "{}:{}",
                        super::json_text::escape(name),
                        super::json_text::escape(&entry.source.to_string())
                    )
                    .into(),
                }
            })
            .collect();
        let listing = Arc::new(Listing { tools });
        *cached = Some(listing.clone());
        listing
    }

    /// A receiver that changes whenever the set of tools changes after start-up.
    pub fn subscribe_changes(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.read().get(name).map(|entry| entry.tool.clone())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.read().contains_key(name)
    }

    /// The safety of a known tool; `None` for an unknown name.
    pub fn safety(&self, name: &str) -> Option<Safety> {
        self.read().get(name).map(|entry| entry.tool.definition().safety)
    }

    /// Whether a known tool is a system (control-plane) tool.
    pub fn is_system(&self, name: &str) -> bool {
        self.read().get(name).is_some_and(|entry| entry.tool.definition().system)
    }

    /// What the error of a call to an unknown tool says: that no tool has the name
    /// and, when a registered name is a likely misspelling of it, that one.
    pub fn unknown(&self, name: &str) -> String {
        let tools = self.read();
        match closest(name, tools.keys().map(String::as_str)) {
            Some(near) => format!("no tool is named {name:?}; did you mean {near:?}?"),
            None => format!("no tool is named {name:?} (tools/list names them)"),
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// Every definition, sorted by name.
    pub fn definitions(&self) -> Vec<Definition> {
        self.read().values().map(|entry| entry.tool.definition().clone()).collect()
    }

    /// An empty `allowed` list means everything; otherwise the named tools plus every
    /// system tool, in name order.
    pub fn definitions_filtered(&self, allowed: &[String]) -> Vec<Definition> {
        if allowed.is_empty() {
            return self.definitions();
        }
        self.read()
            .values()
            .map(|entry| entry.tool.definition())
            .filter(|def| def.system || allowed.iter().any(|name| name == &def.name))
            .cloned()
            .collect()
    }

    /// Runs one call through the boundary guards, discarding live output.
    pub async fn execute(
        &self,
        call: &Call,
        env: &Arc<Env>,
        cancel: &CancellationToken,
    ) -> ToolResult {
        self.execute_streaming(call, env, cancel, OutputSink::discard()).await
    }

    /// Runs one call through the boundary guards, in this order:
    /// 1. unknown name → `unknown_tool`;
    /// 2. arguments that are not JSON, or violate the input schema → `invalid_arguments`
    ///    (naming the JSON pointer of the first violation);
    /// 3. Env defaults filled;
    /// 4. the effective deadline: what the call asks for, else the tool's own, else the
    ///    Env's, never above the Env's maximum;
    /// 5. deadline → `timeout`, cancellation → `canceled` (distinct codes); the tool's
    ///    token is canceled either way so that its children die with it;
    /// 6. a panic → `internal_error`;
    /// 7. `tool` and `metadata.call_id` stamped on the result.
    pub async fn execute_streaming(
        &self,
        call: &Call,
        env: &Arc<Env>,
        cancel: &CancellationToken,
        output: OutputSink,
    ) -> ToolResult {
        self.execute_owned(call, env, cancel.child_token(), output).await
    }

    /// [`Registry::execute_streaming`] with a token that belongs to this call alone, as
    /// the session's token for an admitted call does: the tool is handed that token
    /// itself rather than a child of it, and it is canceled when the run ends, however
    /// it ends. A caller whose token outlives the call uses `execute_streaming`.
    pub async fn execute_owned(
        &self,
        call: &Call,
        env: &Arc<Env>,
        cancel: CancellationToken,
        output: OutputSink,
    ) -> ToolResult {
        self.run_guarded(call, env, cancel, output).await.stamp(&call.name, &call.id)
    }

    async fn run_guarded(
        &self,
        call: &Call,
        env: &Arc<Env>,
        tool_cancel: CancellationToken,
        output: OutputSink,
    ) -> ToolResult {
        // 1. Unknown name.
        let Some(entry) = self.read().get(&*call.name).cloned() else {
            return ToolResult::failure(ErrorType::UnknownTool, self.unknown(&call.name));
        };

        // 2. JSON, then the schema.
        let mut args = match parse_arguments(&call.arguments) {
            Ok(args) => args,
            Err(res) => return res,
        };
        entry.drop_absent_nulls(&mut args);
        if let Err(res) = entry.validate(&args) {
            return res;
        }

        // 3. Env defaults.
        let env = match env.with_defaults() {
            Some(filled) => Arc::new(filled),
            None => env.clone(),
        };

        // 4. The effective deadline.
        let definition = entry.tool.definition();
        let timeout = entry
            .tool
            .requested_timeout(&args)
            .or(definition.timeout)
            .unwrap_or(env.timeout)
            .min(env.max_timeout);

        // 5. Cancellation and deadline.
        if tool_cancel.is_cancelled() {
            return canceled();
        }
        let ctx = ToolContext {
            call_id: call.id.clone(),
            env,
            cancel: tool_cancel.clone(),
            timeout,
            output,
        };
        // 6. Panics inside the tool's future become `internal_error`.
        let run = AssertUnwindSafe(entry.tool.execute(args, ctx)).catch_unwind();
        // The guard cancels the tool's token when this future is dropped early (the
        // caller gave up), so no tool keeps working after the registry is gone.
        let _drop_guard = tool_cancel.clone().drop_guard();
        tokio::select! {
            biased;
            outcome = run => match outcome {
                Ok(res) => res,
                Err(panic) => {
                    let message = panic_message(panic.as_ref());
                    tracing::error!(tool = %call.name, call_id = %call.id, %message, "tool panicked");
                    ToolResult::failure(
                        ErrorType::InternalError,
                        format!("the tool {} failed internally", call.name),
                    )
                }
            },
            () = tool_cancel.cancelled() => canceled(),
            () = tokio::time::sleep(timeout) => {
                tool_cancel.cancel();
                ToolResult::failure(
                    ErrorType::Timeout,
                    format!("{} timed out after {}", call.name, describe_duration(timeout)),
                )
                .with_meta("timeout_ms", u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
            }
        }
    }

    /// Checks raw arguments against a tool's schema without running it (used by the
    /// agent layer to re-validate a hook's `updated_input`).
    pub fn validate_arguments(&self, name: &str, arguments: &str) -> Result<Value, ToolResult> {
        let Some(entry) = self.read().get(name).cloned() else {
            return Err(ToolResult::failure(ErrorType::UnknownTool, self.unknown(name)));
        };
        let mut args = parse_arguments(arguments)?;
        entry.drop_absent_nulls(&mut args);
        entry.validate(&args)?;
        Ok(args)
    }

    fn entry_for(
        tool: Option<Arc<dyn Tool>>,
        source: ToolSource,
        compile: Compile,
    ) -> Result<Entry, RegisterError> {
        let Some(tool) = tool else {
            return Err(RegisterError::Missing);
        };
        let definition = tool.definition();
        if definition.name.trim().is_empty() {
            return Err(RegisterError::BlankName);
        }
        let validator = if compile == Compile::OnFirstCall {
            ArgumentSchema::Deferred(std::sync::OnceLock::new())
        } else {
            let (validator, _) =
                super::schema::compile(&definition.input_schema).map_err(|reason| {
                    RegisterError::InvalidSchema { name: definition.name.clone(), reason }
                })?;
            ArgumentSchema::Compiled(validator)
        };
        let null_means_absent = super::null_means_absent(&definition.input_schema).into();
        Ok(Entry { tool, validator: Arc::new(validator), source, null_means_absent })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        // A poisoned lock only means a panic happened while a writer held it; the map
        // itself is always left consistent (single insert/remove), so keep serving.
        self.tools.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        self.tools.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn canceled() -> ToolResult {
    ToolResult::failure(ErrorType::Canceled, "the call was canceled")
}

/// Parses raw argument text. Blank text counts as `{}` (models do send that for tools
/// without parameters); anything else must be JSON, and JSON whose parsed form would
/// cost far more memory than its text (see [`parsed_cost`]) is refused before it is
/// parsed.
pub fn parse_arguments(arguments: &str) -> Result<Value, ToolResult> {
    if arguments.trim().is_empty() {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    let budget = parse_budget(arguments.len());
    let cost = parsed_cost(arguments.as_bytes());
    if cost > budget {
        return Err(ToolResult::failure(
            ErrorType::InvalidArguments,
            format!(
                "arguments refused: {} bytes holding too many JSON objects, arrays and values \
                 for their size (parsing them would take about {} MiB)",
                arguments.len(),
                cost >> 20
            ),
        )
        .with_meta("arguments_bytes", arguments.len()));
    }
    serde_json::from_str(arguments).map_err(|err| {
        ToolResult::failure(
            ErrorType::InvalidArguments,
            format!("arguments are not valid JSON: {err}"),
        )
    })
}

/// What parsed arguments may cost in memory: a small multiple of their text, plus a
/// constant that any ordinary call fits in.
pub fn parse_budget(text_bytes: usize) -> usize {
    PARSE_BUDGET_FACTOR.saturating_mul(text_bytes).saturating_add(PARSE_BUDGET_BASE)
}

/// See [`parse_budget`].
const PARSE_BUDGET_FACTOR: usize = 4;
/// See [`parse_budget`].
const PARSE_BUDGET_BASE: usize = 1024 * 1024;
/// What one parsed JSON object costs at least beyond its members' text: a map node
/// holds room for eleven entries.
const OBJECT_COST: usize = 640;
/// What one value inside an object or array costs beyond its text: the value's slot,
/// a key's or a string's allocation.
const MEMBER_COST: usize = 64;

/// An upper estimate of the memory `serde_json` takes to parse `text` into a
/// [`Value`], from one pass over its bytes (no allocation): its length, plus a cost for
/// every object and for every member or element. Strings are skipped whole (escapes
/// included), so a bracket or comma inside a string costs nothing. Text that is not
/// JSON gets an estimate too; the parser refuses it afterwards.
pub fn parsed_cost(text: &[u8]) -> usize {
    let mut objects = 0usize;
    let mut members = 0usize;
    let mut at = 0;
    while at < text.len() {
        match text[at] {
            b'"' => {
                // Skip to the closing quote: the next quote not escaped.
                at += 1;
                while let Some(next) = memchr::memchr2(b'"', b'\\', &text[at..]) {
                    at += next + 1;
                    if text[at - 1] == b'"' {
                        break;
                    }
                    // An escape: skip the escaped byte.
                    at = (at + 1).min(text.len());
                }
                continue;
            }
            b'{' => objects += 1,
            // An array's first element, or any further member or element.
            b'[' | b',' => members += 1,
            _ => {}
        }
        at += 1;
    }
    // An object's first member costs what a comma does.
    text.len()
        .saturating_add(objects.saturating_mul(OBJECT_COST))
        .saturating_add(members.saturating_add(objects).saturating_mul(MEMBER_COST))
}

/// When a tool's input schema is compiled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Compile {
    Now,
    OnFirstCall,
}

/// A tool's argument validator. Schemas from outside (upstream servers, skills) are
/// compiled when the tool is registered, so a bad one is refused then, and so are those
/// of tools registered with [`Registry::register`]. A built-in's schema
/// ([`Registry::register_built_in`]), which the tests check against its meta-schema,
/// is compiled from its definition on the tool's first call: compiling checks the
/// schema against the meta-schema, whose own validator (built once, kept for good) is
/// most of an idle server's heap.
enum ArgumentSchema {
    Compiled(jsonschema::Validator),
    Deferred(std::sync::OnceLock<Result<jsonschema::Validator, String>>),
}

impl ArgumentSchema {
    /// Checks `args`; `schema` is the tool's input schema, compiled here on first use
    /// when it was deferred.
    fn validate(&self, schema: &Value, args: &Value) -> Result<(), ToolResult> {
        let validator = match self {
            ArgumentSchema::Compiled(validator) => validator,
            ArgumentSchema::Deferred(compiled) => {
                let compiled = compiled
                    .get_or_init(|| super::schema::compile(schema).map(|(validator, _)| validator));
                match compiled {
                    Ok(validator) => validator,
                    Err(reason) => {
                        return Err(ToolResult::failure(
                            ErrorType::InternalError,
                            format!("the tool's input schema does not compile: {reason}"),
                        ));
                    }
                }
            }
        };
        validate(validator, schema, args)
    }
}

fn validate(
    validator: &jsonschema::Validator,
    schema: &Value,
    args: &Value,
) -> Result<(), ToolResult> {
    // The common case, valid arguments, without building an error iterator.
    if validator.is_valid(args) {
        return Ok(());
    }
    match validator.iter_errors(args).next() {
        None => Ok(()),
        Some(err) => {
            let pointer = err.instance_path.to_string();
            let shown = if pointer.is_empty() { "/".to_owned() } else { pointer.clone() };
            let mut message = format!("at {shown}: {}", truncate_message(&err.to_string()));
            if let jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } =
                &err.kind
            {
                message.push_str(&suggest_properties(
                    schema,
                    &err.schema_path.to_string(),
                    unexpected,
                ));
            }
            Err(ToolResult::failure(ErrorType::InvalidArguments, message)
                .with_meta("pointer", pointer))
        }
    }
}

/// For properties a schema does not allow: the allowed ones they are likely
/// misspellings of (`; did you mean "path" for "pth"?`), or nothing.
fn suggest_properties(schema: &Value, schema_path: &str, unexpected: &[String]) -> String {
    // The schema path ends in the keyword that failed; its object lists the properties.
    let object = schema_path
        .strip_suffix("/additionalProperties")
        .and_then(|parent| if parent.is_empty() { Some(schema) } else { schema.pointer(parent) });
    let Some(properties) =
        object.and_then(|object| object.get("properties")).and_then(Value::as_object)
    else {
        return String::new();
    };
    let guesses: Vec<String> = unexpected
        .iter()
        .filter_map(|name| {
            let near = closest(name, properties.keys().map(String::as_str))?;
            Some(format!("{near:?} for {name:?}"))
        })
        .collect();
    if guesses.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", guesses.join(", "))
    }
}

/// The candidate nearest to `name` by edit distance (a swap of two neighbouring
/// characters counting as one edit), when it is near enough to be a likely misspelling:
/// at most a third of the name's length, and at least one edit allowed.
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .filter(|candidate| *candidate != name)
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// The optimal string alignment distance: insertions, deletions, substitutions and
/// swaps of neighbouring characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let width = b.len() + 1;
    let mut table = vec![0usize; (a.len() + 1) * width];
    for i in 0..=a.len() {
        for j in 0..=b.len() {
            table[i * width + j] = if i == 0 || j == 0 {
                i.max(j)
            } else {
                let cost = usize::from(a[i - 1] != b[j - 1]);
                let mut best = (table[(i - 1) * width + j] + 1)
                    .min(table[i * width + j - 1] + 1)
                    .min(table[(i - 1) * width + j - 1] + cost);
                if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                    best = best.min(table[(i - 2) * width + j - 2] + 1);
                }
                best
            };
        }
    }
    table[a.len() * width + b.len()]
}

/// Keeps error messages that echo huge argument values readable.
fn truncate_message(message: &str) -> String {
    const MAX: usize = 300;
    if message.len() <= MAX {
        return message.to_owned();
    }
    let mut end = MAX;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
