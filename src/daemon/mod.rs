//! The daemon: one Registry, many sessions, the approval hub and the audit log; what
//! every transport calls. Nothing here knows about JSON-RPC framing or sockets.

pub mod approvals;
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
use crate::protocol::{SessionInfo, SessionOpenParams};
use crate::tools::{Env, EnvPolicy, Registry};
use crate::upstream::{UpstreamStatus, Upstreams};

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
    #[error("too many named sessions (at most {0}); close one with session/close")]
    TooManyNamed(usize),
}

/// A session with its delivery parts and its owner.
pub struct SessionEntry {
    pub session: Arc<Session>,
    pub events: Arc<EventHub>,
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
}

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
    pub fn open_session(
        &self,
        owner: u64,
        client: &str,
        params: &SessionOpenParams,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        self.expire_named();
        match params.name.as_deref() {
            Some(name) => self.open_named(owner, client, name, params),
            None => self.open_unnamed(owner, client, params),
        }
    }

    fn open_unnamed(
        &self,
        owner: u64,
        client: &str,
        params: &SessionOpenParams,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        let events = Arc::new(EventHub::new(self.settings().event_buffer));
        let broker =
            Arc::new(SessionBroker { hub: self.approvals.clone(), events: events.clone() });
        self.open_session_with(owner, client, params, events.clone(), events, broker)
    }

    /// Opens the session `client` keeps under `name`, or finds it again: it then
    /// belongs to `owner`, and the other parameters are those it was opened with.
    fn open_named(
        &self,
        owner: u64,
        client: &str,
        name: &str,
        params: &SessionOpenParams,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        // Held while opening, so that two connections asking for one name get one session.
        let mut named = self.named.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(id) = named.claim(client, name, Instant::now()) {
            if let Some(entry) = self.sessions.get(&id).map(|entry| entry.value().clone()) {
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
            if let Some((_, entry)) = self.sessions.remove(&id) {
                entry.session.close();
            }
        }
    }

    /// How long a parked named session waits (tests shorten it).
    pub fn set_named_session_idle(&self, idle: Duration) {
        self.named.lock().unwrap_or_else(std::sync::PoisonError::into_inner).idle = idle;
    }

    /// Opens a session whose events and permission questions go where the caller
    /// says (the MCP face turns output into progress notifications and questions into
    /// elicitations). The intersection with the configuration is the same as for
    /// [`Daemon::open_session`]; `hub` is what `broadcast` reaches.
    pub fn open_session_with(
        &self,
        owner: u64,
        client: &str,
        params: &SessionOpenParams,
        hub: Arc<EventHub>,
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
        let timeout = params
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(settings.default_timeout)
            .min(settings.max_timeout);
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

    /// The ids of the sessions a connection opened.
    pub fn session_ids_of(&self, owner: u64) -> Vec<String> {
        self.sessions
            .iter()
            .filter(|entry| entry.owner == owner)
            .map(|entry| entry.key().clone())
            .collect()
    }

    /// Closes a session: its calls are canceled (processes killed) and its pending
    /// approvals dropped.
    pub fn close_session(&self, owner: u64, session_id: &str) -> Result<(), SessionError> {
        let entry = self.session_for(owner, session_id)?;
        self.sessions.remove(session_id);
        self.named.lock().unwrap_or_else(std::sync::PoisonError::into_inner).forget(session_id);
        entry.session.close();
        Ok(())
    }

    /// Everything a connection owned goes away with it, except named sessions: those
    /// are parked for their client to find again (their calls end with the
    /// connection's requests).
    pub fn disconnect(&self, owner: u64) {
        let owned: Vec<Arc<SessionEntry>> = self
            .sessions
            .iter()
            .filter(|entry| entry.owner == owner)
            .map(|entry| entry.value().clone())
            .collect();
        let now = Instant::now();
        for entry in owned {
            let id = entry.session.id();
            if self.named.lock().unwrap_or_else(std::sync::PoisonError::into_inner).park(id, now) {
                continue;
            }
            self.sessions.remove(id);
            entry.session.close();
        }
        self.expire_named();
        for entry in &self.sessions {
            entry.events.unsubscribe_connection(owner);
        }
    }

    /// Sends an event to every session (e.g. `tools_list_changed`).
    pub fn broadcast(&self, event: Event) {
        let entries: Vec<Arc<SessionEntry>> =
            self.sessions.iter().map(|entry| entry.value().clone()).collect();
        for entry in entries {
            entry.events.emit(event.clone());
        }
    }

    /// Applies new settings (SIGHUP): new sessions get them; running sessions get the
    /// new rules and hooks at once.
    pub fn reload(&self, settings: Settings) {
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

    pub fn info(&self, session: &Session) -> SessionInfo {
        let env = session.env();
        SessionInfo {
            session_id: session.id().to_owned(),
            cwd: env.cwd.display().to_string(),
            roots: env.roots.iter().map(|root| root.display().to_string()).collect(),
            mode: session.mode(),
            allowlist: session.allowlist(),
            timeout_ms: u64::try_from(env.timeout.as_millis()).unwrap_or(u64::MAX),
            max_output_bytes: env.max_output_bytes,
            max_read_bytes: env.max_read_bytes,
            todos: session.todos(),
        }
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

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.daemon.disconnect(self.id);
        self.daemon.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
