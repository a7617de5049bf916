//! The daemon: one Registry, many sessions, the approval hub and the audit log; what
//! every transport calls. Nothing here knows about JSON-RPC framing or sockets.

pub mod approvals;
mod client;
pub mod events;
pub mod named;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::approvals::{ApprovalHub, SessionBroker};
use self::events::EventHub;
use crate::agent::{CallObserver, Event, EventSink, Session, SessionOptions};
use crate::hooks::Hooks;
use crate::permission::{Mode, PermissionEngine, Policy};
use crate::tools::jobs::ProcessSettings;
use crate::tools::{Env, EnvPolicy, Registry, Todo};
use crate::upstream::{UpstreamStatus, Upstreams};

pub use self::client::{Client, MAX_SESSIONS_PER_CONNECTION};

/// What a client asks of a session: at open, intersected with the configuration;
/// at update, it may only narrow the session. `None` keeps what there is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionSpec {
    /// Relative to the first root.
    pub cwd: Option<String>,
    pub roots: Option<Vec<String>>,
    pub mode: Option<Mode>,
    /// Only these tools (system tools are always available).
    pub allowlist: Option<Vec<String>>,
    pub timeout: Option<Duration>,
    pub max_output_bytes: Option<usize>,
    pub max_read_bytes: Option<u64>,
    /// Kept under this name for the client's identity: the session outlives the
    /// connection, and a later connection of the same identity gets it back.
    pub name: Option<String>,
    /// Re-attach to the session this token was given for (a session detached from
    /// its connection, kept while its background processes run); the other fields
    /// are ignored.
    pub resume_token: Option<String>,
}

/// What a session is, as granted.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionState {
    pub session_id: String,
    pub cwd: PathBuf,
    pub roots: Vec<PathBuf>,
    pub mode: Mode,
    pub allowlist: Vec<String>,
    pub timeout: Duration,
    pub max_output_bytes: usize,
    pub max_read_bytes: u64,
    pub todos: Vec<Todo>,
    /// What re-attaches a client to this session after its connection ends
    /// ([`SessionSpec::resume_token`]); `None` for sessions that cannot be resumed.
    pub resume_token: Option<String>,
}

/// The daemon at a glance.
#[derive(Clone, Debug)]
pub struct Status {
    pub version: &'static str,
    pub pid: u32,
    pub uptime: Duration,
    pub connections: usize,
    pub sessions: usize,
    pub calls_in_flight: usize,
    pub tools: usize,
    pub upstreams: Vec<UpstreamStatus>,
    /// The kernel sandbox and process containment commands get (see
    /// `sandbox::status`).
    pub sandbox: serde_json::Value,
    /// Audit records lost since start (see [`CallObserver::records_dropped`]).
    pub audit_records_dropped: u64,
    /// The configured workspace roots (every session's, unless it narrowed them).
    pub roots: Vec<PathBuf>,
    /// The configured permission mode (every session's default and ceiling).
    pub mode: Mode,
    /// Where the daemon accepts connections, as the serving code registered them.
    pub listeners: Vec<Listener>,
}

/// One place the daemon accepts connections (a wire type: `daemon/status` lists them).
pub use crate::wire::Listener;

/// What the configuration grants, in the form the daemon uses at runtime. Rebuilt on
/// reload; sessions keep their own copy of the parts they narrowed.
#[derive(Clone)]
pub struct Settings {
    /// Absolute, canonical.
    pub roots: Vec<PathBuf>,
    /// The configured mode: the default and the ceiling of every session.
    pub mode: Mode,
    /// The configured rules, compiled once and shared by every session.
    pub policy: Policy,
    pub hooks: Arc<Hooks>,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub max_output_bytes: usize,
    pub max_read_bytes: u64,
    pub approval_timeout: Duration,
    pub env_policy: EnvPolicy,
    pub max_calls_per_session: usize,
    /// Events kept per session while nobody subscribes.
    pub event_buffer: usize,
    /// What no tool may open (toolgate's own files, rules on resolved paths); shared
    /// by every session, updated in place on reload.
    pub access: crate::tools::fs::Access,
    /// Background processes: limits, spool directory, detached sessions' wait.
    pub processes: ProcessSettings,
}

impl Settings {
    /// Settings for one root with the defaults (tests, `toolgate mcp --root`).
    pub fn for_roots(roots: Vec<PathBuf>) -> Settings {
        Settings {
            roots,
            mode: Mode::Default,
            policy: Policy::default(),
            hooks: Arc::new(Hooks::default()),
            default_timeout: crate::tools::DEFAULT_TIMEOUT,
            max_timeout: crate::tools::MAX_TIMEOUT,
            max_output_bytes: crate::tools::DEFAULT_MAX_OUTPUT_BYTES,
            max_read_bytes: crate::tools::DEFAULT_MAX_READ_BYTES,
            approval_timeout: Duration::from_secs(300),
            env_policy: EnvPolicy::default(),
            max_calls_per_session: 16,
            event_buffer: 1024,
            access: Default::default(),
            processes: ProcessSettings::default(),
        }
    }
}

/// Why a session could not be opened as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SessionError {
    #[error("root {0:?} is not inside the configured roots")]
    RootOutside(String),
    #[error("cwd {0:?} is not inside the session roots")]
    CwdOutside(String),
    #[error("{0:?} does not exist or is not a directory")]
    NoSuchDirectory(String),
    #[error("no such session: {0}")]
    UnknownSession(String),
    #[error("the session {0} belongs to another connection")]
    NotYours(String),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// Something asked for is wider than what the session (or connection) has.
    #[error("{0}")]
    Widening(String),
    #[error("mode {asked} is beyond what the configuration grants ({ceiling})")]
    ModeBeyond { asked: Mode, ceiling: Mode },
    #[error("the connection's default session closes with the connection")]
    DefaultSession,
    #[error("this session's events are not subscribable")]
    NotSubscribable,
    #[error("a connection holds at most {0} sessions; close one first")]
    TooMany(usize),
    #[error("too many named sessions (at most {0}); close one with session/close")]
    TooManyNamed(usize),
    #[error(
        "no session to resume with that token (it was closed, its wait ended, or the token belongs to another client)"
    )]
    NoSuchResume,
}

/// A session with its delivery parts and its owner.
pub struct SessionEntry {
    pub session: Arc<Session>,
    /// Where clients subscribe to the session's events; `None` when the face that
    /// opened the session delivers them itself (MCP).
    pub events: Option<Arc<EventHub>>,
    /// The connection that opened it; only it may use the session.
    pub owner: u64,
}

pub struct Daemon {
    registry: Arc<Registry>,
    settings: RwLock<Arc<Settings>>,
    sessions: DashMap<String, Arc<SessionEntry>>,
    approvals: Arc<ApprovalHub>,
    observer: Option<Arc<dyn CallObserver>>,
    started: Instant,
    /// Fired once at shutdown; every session's token is its child.
    shutdown: CancellationToken,
    /// Connection and request tasks, awaited at shutdown.
    tasks: TaskTracker,
    connections: AtomicUsize,
    next_connection: AtomicU64,
    next_session: AtomicU64,
    /// The upstream MCP servers, when the serving code started any (for status).
    upstreams: std::sync::OnceLock<Arc<Upstreams>>,
    /// Sessions kept by name between connections (see [`named`]).
    named: std::sync::Mutex<named::NamedSessions>,
    /// Resume tokens of native sessions, by session id.
    resume_tokens: DashMap<String, String>,
    /// Sessions kept without a connection because their processes run, by session id,
    /// with the number of their detachment (a re-attach or a new detachment makes the
    /// wait of an older one void).
    detached: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    next_detach: AtomicU64,
    /// Where the daemon listens (for status), as the serving code opens it.
    listeners: std::sync::Mutex<Vec<Listener>>,
}

/// The owner of a session no connection holds.
const DETACHED: u64 = 0;

impl Daemon {
    pub fn new(
        registry: Arc<Registry>,
        settings: Settings,
        observer: Option<Arc<dyn CallObserver>>,
    ) -> Arc<Daemon> {
        let daemon = Arc::new(Daemon {
            registry,
            settings: RwLock::new(Arc::new(settings)),
            sessions: DashMap::new(),
            approvals: Arc::new(ApprovalHub::default()),
            observer,
            started: Instant::now(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            connections: AtomicUsize::new(0),
            next_connection: AtomicU64::new(1),
            next_session: AtomicU64::new(1),
            upstreams: std::sync::OnceLock::new(),
            named: std::sync::Mutex::default(),
            resume_tokens: DashMap::new(),
            detached: std::sync::Mutex::default(),
            next_detach: AtomicU64::new(1),
            listeners: std::sync::Mutex::default(),
        });
        daemon.watch_registry();
        daemon
    }

    /// Tells every session when the set of tools changes.
    fn watch_registry(self: &Arc<Daemon>) {
        let mut changes = self.registry.subscribe_changes();
        let weak = Arc::downgrade(self);
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            loop {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    () = shutdown.cancelled() => return,
                }
                let Some(daemon) = weak.upgrade() else { return };
                daemon.broadcast(Event::ToolsListChanged {});
            }
        });
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Lets `daemon/status` report the upstream MCP servers (set once, at start-up).
    pub fn attach_upstreams(&self, upstreams: Arc<Upstreams>) {
        let _ = self.upstreams.set(upstreams);
    }

    /// The state of every upstream MCP server (empty when none are configured).
    pub fn upstreams(&self) -> Vec<UpstreamStatus> {
        self.upstreams.get().map(|upstreams| upstreams.status()).unwrap_or_default()
    }

    pub fn settings(&self) -> Arc<Settings> {
        self.settings.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn approvals(&self) -> &Arc<ApprovalHub> {
        &self.approvals
    }

    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Registers a new connection; the returned guard unregisters it.
    pub fn connect(self: &Arc<Daemon>) -> ConnectionGuard {
        self.connections.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard {
            daemon: self.clone(),
            id: self.next_connection.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub fn calls_in_flight(&self) -> usize {
        self.sessions.iter().map(|entry| entry.session.calls_in_flight()).sum()
    }

    /// Opens a session for a connection; everything asked for is intersected with what
    /// the configuration grants.
    pub(crate) fn open_session(
        &self,
        owner: u64,
        client: &str,
        params: &SessionSpec,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        self.expire_named();
        if let Some(token) = &params.resume_token {
            return self.resume(owner, client, token);
        }
        match params.name.as_deref() {
            Some(name) => self.open_named(owner, client, name, params),
            None => self.open_unnamed(owner, client, params),
        }
    }

    /// Re-attaches `owner` to the session `token` was given for, if `client` opened
    /// it. A session still attached to another connection of the same client (one
    /// the daemon has not seen drop yet) moves to this one.
    fn resume(
        &self,
        owner: u64,
        client: &str,
        token: &str,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        use subtle::ConstantTimeEq;
        let id = self
            .resume_tokens
            .iter()
            .find(|entry| bool::from(entry.value().as_bytes().ct_eq(token.as_bytes())))
            .map(|entry| entry.key().clone())
            .ok_or(SessionError::NoSuchResume)?;
        // Under the lock of the detached table, so that a wait that ends meanwhile
        // either finds the session re-attached or has taken it away first.
        let resumed = {
            let mut detached =
                self.detached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let entry = self
                .sessions
                .get(&id)
                .map(|entry| entry.value().clone())
                .ok_or(SessionError::NoSuchResume)?;
            if entry.session.client() != client {
                return Err(SessionError::NoSuchResume);
            }
            detached.remove(&id);
            let resumed = Arc::new(SessionEntry {
                session: entry.session.clone(),
                events: entry.events.clone(),
                owner,
            });
            self.sessions.insert(id.clone(), resumed.clone());
            resumed
        };
        // A parked named session is owned again too.
        let mut named = self.named.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        named.unpark(&id);
        Ok(resumed)
    }

    fn open_unnamed(
        &self,
        owner: u64,
        client: &str,
        params: &SessionSpec,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        let events = Arc::new(EventHub::new(self.settings().event_buffer));
        let broker =
            Arc::new(SessionBroker { hub: self.approvals.clone(), events: events.clone() });
        self.open_session_inner(owner, client, params, Some(events.clone()), events, broker)
    }

    /// Opens the session `client` keeps under `name`, or finds it again: it then
    /// belongs to `owner`, and the other parameters are those it was opened with.
    fn open_named(
        &self,
        owner: u64,
        client: &str,
        name: &str,
        params: &SessionSpec,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        // Held while opening, so that two connections asking for one name get one session.
        let mut named = self.named.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(id) = named.claim(client, name, Instant::now()) {
            if let Some(entry) = self.sessions.get(&id).map(|entry| entry.value().clone()) {
                self.detached.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
                let entry = Arc::new(SessionEntry {
                    session: entry.session.clone(),
                    events: entry.events.clone(),
                    owner,
                });
                self.sessions.insert(id, entry.clone());
                return Ok(entry);
            }
            named.forget(&id);
        }
        if named.count(client) >= named::MAX_NAMED_SESSIONS {
            return Err(SessionError::TooManyNamed(named::MAX_NAMED_SESSIONS));
        }
        let entry = self.open_unnamed(owner, client, params)?;
        named.insert(client, name, entry.session.id().to_owned());
        Ok(entry)
    }

    /// Closes the named sessions nobody came back for.
    fn expire_named(&self) {
        let expired = self
            .named
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .expire(Instant::now());
        for id in expired {
            if let Some(entry) = self.remove_session(&id) {
                entry.session.close();
            }
        }
    }

    /// Opens a session whose events and permission questions go where the caller
    /// says (the MCP face turns output into progress notifications and questions into
    /// elicitations). The intersection with the configuration is the same as for
    /// [`Daemon::open_session`]; `events` also receives what `broadcast` sends.
    pub(crate) fn open_session_with(
        &self,
        owner: u64,
        client: &str,
        params: &SessionSpec,
        events: Arc<dyn EventSink>,
        approvals: Arc<dyn crate::agent::ApprovalBroker>,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        self.open_session_inner(owner, client, params, None, events, approvals)
    }

    fn open_session_inner(
        &self,
        owner: u64,
        client: &str,
        params: &SessionSpec,
        hub: Option<Arc<EventHub>>,
        events: Arc<dyn EventSink>,
        approvals: Arc<dyn crate::agent::ApprovalBroker>,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        if self.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        let settings = self.settings();
        let roots = match &params.roots {
            None => settings.roots.clone(),
            Some(asked) => {
                let mut roots = Vec::with_capacity(asked.len());
                for root in asked {
                    let path = canonical_dir(&settings.roots[..], root)?;
                    if !settings.roots.iter().any(|granted| path.starts_with(granted)) {
                        return Err(SessionError::RootOutside(root.clone()));
                    }
                    roots.push(path);
                }
                if roots.is_empty() { settings.roots.clone() } else { roots }
            }
        };
        let cwd = match &params.cwd {
            None => roots.first().cloned().unwrap_or_default(),
            Some(cwd) => {
                let path = canonical_dir(&roots, cwd)?;
                if !roots.iter().any(|root| path.starts_with(root)) {
                    return Err(SessionError::CwdOutside(cwd.clone()));
                }
                path
            }
        };
        let timeout = params.timeout.unwrap_or(settings.default_timeout).min(settings.max_timeout);
        let env = Env {
            session_id: String::new(),
            cwd,
            roots,
            timeout,
            max_timeout: settings.max_timeout,
            max_output_bytes: params
                .max_output_bytes
                .unwrap_or(settings.max_output_bytes)
                .min(settings.max_output_bytes),
            max_read_bytes: params
                .max_read_bytes
                .unwrap_or(settings.max_read_bytes)
                .min(settings.max_read_bytes),
            env_policy: settings.env_policy.clone(),
            files: Arc::default(),
            access: settings.access.clone(),
            control: Default::default(),
        };
        let id = format!("s{}", self.next_session.fetch_add(1, Ordering::Relaxed));
        let session = Session::new(
            self.registry.clone(),
            SessionOptions {
                id: id.clone(),
                client: client.to_owned(),
                env,
                engine: PermissionEngine::new(settings.policy.clone(), settings.mode),
                mode: params.mode.unwrap_or(settings.mode),
                allowlist: params.allowlist.clone().unwrap_or_default(),
                hooks: settings.hooks.clone(),
                approval_timeout: settings.approval_timeout,
                max_concurrent_calls: settings.max_calls_per_session,
                events,
                approvals,
                observer: self.observer.clone(),
                cancel: self.shutdown.child_token(),
            },
        );
        session.keep_processes(settings.processes.clone(), self.tasks.clone());
        if hub.is_some() {
            self.resume_tokens.insert(id.clone(), new_resume_token());
        }
        let entry = Arc::new(SessionEntry { session, events: hub, owner });
        self.sessions.insert(id, entry.clone());
        Ok(entry)
    }

    /// The session a connection may use.
    pub fn session_for(
        &self,
        owner: u64,
        session_id: &str,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        let entry = self
            .sessions
            .get(session_id)
            .map(|entry| entry.value().clone())
            .ok_or_else(|| SessionError::UnknownSession(session_id.to_owned()))?;
        if entry.owner != owner {
            return Err(SessionError::NotYours(session_id.to_owned()));
        }
        Ok(entry)
    }

    /// The sessions a connection opened.
    pub fn sessions_of(&self, owner: u64) -> Vec<Arc<SessionEntry>> {
        self.sessions
            .iter()
            .filter(|entry| entry.owner == owner)
            .map(|entry| entry.value().clone())
            .collect()
    }

    /// Narrows a session as asked, all or nothing: roots inside its roots, a cwd
    /// inside those, limits at most its own, a mode within the configured ceiling, an
    /// allowlist inside its allowlist. Running calls keep the Env they started with.
    pub(crate) fn narrow(
        &self,
        session: &Session,
        change: &SessionSpec,
    ) -> Result<(), SessionError> {
        let current = session.env();
        let roots = match &change.roots {
            None => current.roots.clone(),
            Some(asked) => {
                let mut roots = Vec::with_capacity(asked.len());
                for root in asked {
                    let path = canonical_dir(&current.roots, root)?;
                    if !current.roots.iter().any(|granted| path.starts_with(granted)) {
                        return Err(SessionError::RootOutside(root.clone()));
                    }
                    roots.push(path);
                }
                if roots.is_empty() {
                    return Err(SessionError::Widening(
                        "an empty list of roots cannot narrow a session".to_owned(),
                    ));
                }
                roots
            }
        };
        let cwd = match &change.cwd {
            Some(cwd) => {
                let path = canonical_dir(&roots, cwd)?;
                if !roots.iter().any(|root| path.starts_with(root)) {
                    return Err(SessionError::CwdOutside(cwd.clone()));
                }
                path
            }
            None if roots.iter().any(|root| current.cwd.starts_with(root)) => current.cwd.clone(),
            None => roots.first().cloned().unwrap_or_default(),
        };
        let timeout = at_most("timeout_ms", change.timeout, current.timeout, |t| t.as_millis())?;
        let max_output_bytes =
            at_most("max_output_bytes", change.max_output_bytes, current.max_output_bytes, |n| n)?;
        let max_read_bytes =
            at_most("max_read_bytes", change.max_read_bytes, current.max_read_bytes, |n| n)?;
        if let Some(asked) = change.mode
            && !asked.is_at_most(session.mode_ceiling())
        {
            return Err(SessionError::ModeBeyond { asked, ceiling: session.mode_ceiling() });
        }
        if let Some(allowlist) = &change.allowlist {
            session.check_allowlist(allowlist).map_err(SessionError::Widening)?;
        }
        // Everything is allowed: apply it.
        let env_changed = roots != current.roots
            || cwd != current.cwd
            || timeout != current.timeout
            || max_output_bytes != current.max_output_bytes
            || max_read_bytes != current.max_read_bytes;
        if env_changed {
            session.replace_env(Env {
                cwd,
                roots,
                timeout,
                max_output_bytes,
                max_read_bytes,
                ..Env::clone(&current)
            });
        }
        if let Some(mode) = change.mode {
            session.set_mode(mode);
        }
        if let Some(allowlist) = &change.allowlist {
            session.set_allowlist(allowlist.clone()).map_err(SessionError::Widening)?;
        }
        Ok(())
    }

    /// Closes a session: its calls are canceled (processes killed) and its pending
    /// approvals dropped.
    pub fn close_session(&self, owner: u64, session_id: &str) -> Result<(), SessionError> {
        let entry = self.session_for(owner, session_id)?;
        self.remove_session(session_id);
        self.named.lock().unwrap_or_else(std::sync::PoisonError::into_inner).forget(session_id);
        entry.session.close();
        Ok(())
    }

    /// Takes a session out of every table (the caller closes it).
    fn remove_session(&self, id: &str) -> Option<Arc<SessionEntry>> {
        self.resume_tokens.remove(id);
        self.detached.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(id);
        self.sessions.remove(id).map(|(_, entry)| entry)
    }

    /// Keeps a session whose connection went because its background processes run:
    /// no connection owns it, and when `ttl` passes without a client re-attaching
    /// (with its resume token), its processes are killed, and an unnamed session is
    /// closed.
    fn detach(self: &Arc<Daemon>, entry: &Arc<SessionEntry>, named: bool) {
        let id = entry.session.id().to_owned();
        let number = self.next_detach.fetch_add(1, Ordering::Relaxed);
        {
            let mut detached =
                self.detached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match self.sessions.get_mut(&id) {
                // Still the leaving connection's: no one re-attached meanwhile.
                Some(mut current) if current.owner == entry.owner => {
                    *current = Arc::new(SessionEntry {
                        session: entry.session.clone(),
                        events: entry.events.clone(),
                        owner: DETACHED,
                    });
                }
                _ => return,
            }
            detached.insert(id.clone(), number);
        }
        let ttl = self.settings().processes.detached_ttl;
        let weak = Arc::downgrade(self);
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(ttl) => {}
                () = shutdown.cancelled() => return,
            }
            let Some(daemon) = weak.upgrade() else { return };
            let taken = {
                let mut detached =
                    daemon.detached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if detached.get(&id) != Some(&number) {
                    return;
                }
                detached.remove(&id);
                if named {
                    daemon.sessions.get(&id).map(|entry| entry.value().clone())
                } else {
                    daemon
                        .sessions
                        .remove_if(&id, |_, entry| entry.owner == DETACHED)
                        .map(|(_, entry)| entry)
                }
            };
            let Some(entry) = taken else { return };
            if let Some(processes) = crate::tools::SessionControl::processes(&*entry.session) {
                processes
                    .kill_all("its session stayed detached past [limits] detached_session_ttl_ms")
                    .await;
            }
            if !named {
                daemon.resume_tokens.remove(&id);
                entry.session.close();
            }
        });
    }

    /// Everything a connection owned goes away with it, except named sessions: those
    /// are parked for their client to find again (their calls end with the
    /// connection's requests).
    ///
    /// A native session that owns running background processes is detached instead
    /// of closed: it waits for a client to re-attach with its resume token for
    /// `[limits] detached_session_ttl_ms` (a parked named session keeps its processes
    /// as long).
    pub fn disconnect(self: &Arc<Daemon>, owner: u64) {
        if owner == DETACHED {
            return;
        }
        let owned: Vec<Arc<SessionEntry>> = self
            .sessions
            .iter()
            .filter(|entry| entry.owner == owner)
            .map(|entry| entry.value().clone())
            .collect();
        let now = Instant::now();
        for entry in owned {
            let id = entry.session.id();
            let keeps_processes = entry.events.is_some()
                && entry.session.running_processes() > 0
                && !self.shutdown.is_cancelled();
            if self.named.lock().unwrap_or_else(std::sync::PoisonError::into_inner).park(id, now) {
                if keeps_processes {
                    self.detach(&entry, true);
                }
                continue;
            }
            if keeps_processes {
                self.detach(&entry, false);
                continue;
            }
            // Unless another connection re-attached it meanwhile.
            if self.sessions.remove_if(id, |_, current| current.owner == owner).is_some() {
                self.resume_tokens.remove(id);
                entry.session.close();
            }
        }
        self.expire_named();
        for entry in &self.sessions {
            if let Some(hub) = &entry.events {
                hub.unsubscribe_connection(owner);
            }
        }
    }

    /// Sends an event to every session (e.g. `tools_list_changed`).
    pub fn broadcast(&self, event: Event) {
        let entries: Vec<Arc<SessionEntry>> =
            self.sessions.iter().map(|entry| entry.value().clone()).collect();
        for entry in entries {
            entry.session.emit(event.clone());
        }
    }

    /// Applies new settings (SIGHUP): new sessions get them; running sessions get the
    /// new rules and hooks at once.
    pub fn reload(&self, mut settings: Settings) {
        // Running sessions hold the current Access: update it in place.
        let current = self.settings().access.clone();
        current.replace(&settings.access);
        settings.access = current;
        let settings = Arc::new(settings);
        *self.settings.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            settings.clone();
        for entry in &self.sessions {
            entry.session.reload(settings.policy.clone(), settings.mode, settings.hooks.clone());
        }
    }

    /// Begins shutdown: no new sessions; every session's calls are canceled.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// What a session is now.
    pub fn state(&self, session: &Session) -> SessionState {
        let env = session.env();
        SessionState {
            session_id: session.id().to_owned(),
            cwd: env.cwd.clone(),
            roots: env.roots.clone(),
            mode: session.mode(),
            allowlist: session.allowlist(),
            timeout: env.timeout,
            max_output_bytes: env.max_output_bytes,
            max_read_bytes: env.max_read_bytes,
            todos: session.todos(),
            resume_token: self.resume_tokens.get(session.id()).map(|token| token.value().clone()),
        }
    }

    /// Records a place the daemon accepts connections on, for status.
    pub fn add_listener(&self, listener: Listener) {
        self.listeners.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(listener);
    }

    pub fn status(&self) -> Status {
        let settings = self.settings();
        let listeners =
            self.listeners.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        Status {
            roots: settings.roots.clone(),
            mode: settings.mode,
            listeners,
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            uptime: self.uptime(),
            connections: self.connection_count(),
            sessions: self.session_count(),
            calls_in_flight: self.calls_in_flight(),
            tools: self.registry.names().len(),
            upstreams: self.upstreams(),
            sandbox: crate::sandbox::status(),
            audit_records_dropped: self
                .observer
                .as_ref()
                .map_or(0, |observer| observer.records_dropped()),
        }
    }
}

/// A limit asked for, refused when above the session's own.
fn at_most<T: PartialOrd + Copy, D: std::fmt::Display>(
    name: &str,
    asked: Option<T>,
    current: T,
    shown: impl Fn(T) -> D,
) -> Result<T, SessionError> {
    match asked {
        None => Ok(current),
        Some(asked) if asked <= current => Ok(asked),
        Some(asked) => Err(SessionError::Widening(format!(
            "{name} {} is above the session's {}; a session can only be narrowed",
            shown(asked),
            shown(current)
        ))),
    }
}

/// Resolves a client-given directory (relative ones against the first root) to a
/// canonical path.
fn canonical_dir(bases: &[PathBuf], dir: &str) -> Result<PathBuf, SessionError> {
    let path = Path::new(dir);
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        bases.first().map(|base| base.join(path)).unwrap_or_else(|| path.to_path_buf())
    };
    match std::fs::canonicalize(&joined) {
        Ok(canonical) if canonical.is_dir() => Ok(canonical),
        _ => Err(SessionError::NoSuchDirectory(dir.to_owned())),
    }
}

/// Counts a live connection; dropping it closes the connection's sessions.
pub struct ConnectionGuard {
    daemon: Arc<Daemon>,
    pub id: u64,
}

/// A fresh resume token: 128 random bits, hex.
fn new_resume_token() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No randomness: a token nobody can guess is one nobody gets.
        return format!("unavailable-{}", std::process::id());
    }
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl Daemon {
    /// Whether a session is kept without a connection.
    pub fn is_detached(&self, session_id: &str) -> bool {
        self.detached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(session_id)
    }

    /// Whether the session is in the daemon's map and owned by this connection.
    pub fn owns(&self, owner: u64, session_id: &str) -> bool {
        self.sessions.get(session_id).is_some_and(|entry| entry.owner == owner)
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.daemon.disconnect(self.id);
        self.daemon.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
