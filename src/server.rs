//! Running the daemon: configuration → Registry → Daemon → listeners, then the life
//! cycle (READY, watchdog, SIGHUP reload, SIGTERM drain and stop).
//!
//! Skills are loaded before the daemon listens (local files, quick); upstream MCP
//! servers are started only once it listens, in the background, so that a slow
//! upstream never delays the built-in tools.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::agent::{CallObserver, CallRecord};
use crate::audit::{AuditLog, AuditRecord};
use crate::config::{Config, ConfigError, LoadOptions};
use crate::daemon::{Daemon, Listener, Settings};
use crate::hooks::{HookError, Hooks};
use crate::permission::{Mode, Policy, RuleConfig, RuleError};
use crate::rpc;
use crate::skills::Skills;
use crate::systemd::{Inherited, Notifier};
use crate::tools::Registry;
use crate::tools::fs::Access;
use crate::tools::jobs::ProcessSettings;
use crate::upstream::{UpstreamOptions, Upstreams};

/// Why the daemon could not start (or reload).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("invalid permission rule: {0}")]
    Rule(#[from] RuleError),
    #[error("invalid hook: {0}")]
    Hook(#[from] HookError),
    #[error("invalid permission mode {0:?}")]
    Mode(String),
    #[error(transparent)]
    Socket(#[from] rpc::unix::SocketError),
    #[error(transparent)]
    Tokens(#[from] crate::auth::TokenError),
    #[error(
        "refusing to serve MCP over HTTP on {0} without a token file: set [server] token_file \
         (a file of `name:secret` lines, mode 0600), or listen on a loopback address"
    )]
    TokenFileRequired(std::net::SocketAddr),
    #[error("cannot open the audit log: {0}")]
    Audit(#[from] crate::audit::AuditError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("{0}")]
    Other(String),
}

/// What `toolgate serve` was asked to do.
#[derive(Debug, Default)]
pub struct ServeOptions {
    pub config: Option<PathBuf>,
    pub stdio: bool,
    pub socket: Option<PathBuf>,
    /// Listeners passed by systemd (socket activation), taken before the runtime
    /// started.
    pub inherited: Vec<Inherited>,
}

/// Builds the runtime settings from a loaded configuration.
pub fn settings_from_config(
    config: &Config,
    home: Option<&std::path::Path>,
) -> Result<Settings, ServeError> {
    let mode: Mode = config
        .permissions
        .mode
        .parse()
        .map_err(|_| ServeError::Mode(config.permissions.mode.clone()))?;
    let rules = RuleConfig {
        allow: config.permissions.allow.clone(),
        ask: config.permissions.ask.clone(),
        deny: config.permissions.deny.clone(),
        unprotect: config.permissions.unprotect.clone(),
    };
    // Whoever can write a skill file decides what a tool runs: such writes always ask.
    // Each directory as configured and as resolved, since calls name resolved paths.
    let mut guarded = config.skills.dirs.clone();
    guarded.extend(config.skills.dirs.iter().filter_map(|dir| std::fs::canonicalize(dir).ok()));
    guarded.dedup();
    let policy = Policy::new(&rules, home)?.guard_writes(guarded);
    let hooks = Hooks::new(&config.hooks.pre_tool_use, &config.hooks.post_tool_use)?;
    Ok(Settings {
        roots: config.workspace.roots.clone(),
        mode,
        policy: policy.clone(),
        hooks: Arc::new(hooks),
        default_timeout: config.limits.default_timeout(),
        max_timeout: config.limits.max_timeout(),
        max_output_bytes: config.limits.max_output_bytes,
        max_read_bytes: config.limits.max_read_bytes,
        approval_timeout: config.limits.approval_timeout(),
        env_policy: config.env_policy(),
        max_calls_per_session: config.server.max_calls_per_session,
        event_buffer: config.server.event_buffer,
        access: Access::new(Vec::new(), Some(Arc::new(policy))),
        processes: ProcessSettings {
            max_running: config.limits.max_background_processes,
            output_bytes: config.limits.process_output_bytes,
            session_output_bytes: config.limits.session_process_output_bytes,
            detached_ttl: Duration::from_millis(config.limits.detached_session_ttl_ms),
            on_timeout: config.limits.on_timeout,
            spool_dir: ProcessSettings::default().spool_dir,
        },
    })
}

/// The tokens of `[server] token_file`, if one is set, with every check of
/// [`crate::auth::TokenSet::load`].
fn configured_tokens(config: &Config) -> Result<Option<crate::auth::TokenSet>, ServeError> {
    match &config.server.token_file {
        Some(path) => Ok(Some(crate::auth::TokenSet::load(path)?)),
        None => Ok(None),
    }
}

/// The tokens an MCP HTTP listener bound at `local` accepts: the configured token
/// file's, else (on loopback only) a token generated into the runtime directory,
/// announced on stderr.
fn mcp_http_tokens(
    config: &Config,
    load_options: &LoadOptions,
    local: std::net::SocketAddr,
) -> Result<crate::auth::TokenSet, ServeError> {
    if let Some(tokens) = configured_tokens(config)? {
        return Ok(tokens);
    }
    if !local.ip().is_loopback() {
        return Err(ServeError::TokenFileRequired(local));
    }
    let dir = match &load_options.runtime_dir {
        Some(runtime) => runtime.join("toolgate"),
        None => {
            let socket = rpc::unix::default_socket_path();
            socket.parent().map(std::path::Path::to_path_buf).unwrap_or_default()
        }
    };
    let file_name = format!("mcp-http-{}.tokens", local.port());
    let generated = crate::auth::generated_token_file(&dir, &file_name, "mcp")?;
    let path = generated.path.display();
    let name = &generated.name;
    let (verb, url) = (
        if generated.created { "wrote a new token to" } else { "uses the token in" },
        format!("http://{local}/mcp"),
    );
    eprintln!(
        "toolgate: MCP over HTTP at {url} needs a bearer token and {verb} {path} \
         (no [server] token_file is set). Clients send the header `Authorization: Bearer \
         <token>`, <token> being the text after `{name}:` in that file \
         (`sed -n 's/^{name}://p' {path}`)."
    );
    Ok(generated.tokens)
}

/// [`settings_from_config`] plus toolgate's own files, which no tool may open.
pub fn settings_for(config: &Config, options: &LoadOptions) -> Result<Settings, ServeError> {
    // A sandbox that is required and cannot hold as configured is no sandbox to serve
    // with (on a reload, the running configuration is kept).
    if let Some(refusal) = crate::sandbox::refusal(&config.sandbox) {
        return Err(ServeError::Other(refusal));
    }
    let mut settings = settings_from_config(config, options.home.as_deref())?;
    // Background processes' output lives with toolgate's own files, never in a root.
    if let Some(dir) = options.runtime_dir.as_ref().or(options.state_home.as_ref()) {
        settings.processes.spool_dir = dir.join("toolgate").join("processes");
    }
    let own = crate::own_files::own_paths(config, options);
    settings.access.replace(&Access::new(own, Some(Arc::new(settings.policy.clone()))));
    Ok(settings)
}

/// Every check `serve` (and `mcp`) makes before starting anything, in one place so
/// that `check-config` makes exactly the same ones: the rules, hooks and mode
/// ([`settings_from_config`]; the files' ownership and modes were checked by
/// [`Config::load`]), toolgate's own files, and the token file the network faces would
/// load. Returns the runtime settings.
pub fn preflight(config: &Config, options: &LoadOptions) -> Result<Settings, ServeError> {
    let settings = settings_for(config, options)?;
    // The token file matters to the network faces alone.
    if config.server.tcp.is_some() || config.server.mcp_http.is_some() {
        configured_tokens(config)?;
    }
    Ok(settings)
}

/// Logs the configuration's warnings (what loads but cannot do what it looks like it
/// does); `check-config` prints them instead.
fn log_warnings(config: &Config) {
    for warning in &config.warnings {
        tracing::warn!("configuration: {warning}");
    }
}

/// Loads the configuration the way the process was asked to.
pub fn load_config(explicit: Option<PathBuf>) -> Result<(Config, LoadOptions), ServeError> {
    let options = LoadOptions::from_process(explicit)?;
    let config = Config::load(&options)?;
    Ok((config, options))
}

/// [`crate::sandbox::configure`] from a loaded configuration: its `[sandbox]` section, and toolgate's
/// own files as this configuration and the process's directories place them.
fn configure_sandbox(config: &Config, options: &LoadOptions) {
    let mut own: Vec<PathBuf> = config.sources.clone();
    own.extend(options.system_dir.clone());
    own.extend(options.user_dir.clone());
    own.extend(options.state_home.as_ref().map(|dir| dir.join("toolgate")));
    own.extend(options.runtime_dir.as_ref().map(|dir| dir.join("toolgate")));
    own.extend(config.server.token_file.clone());
    own.extend(config.server.audit_log.clone());
    own.push(config.server.socket.clone());
    crate::sandbox::configure(
        config.sandbox.clone(),
        crate::sandbox::own_paths(own),
        config.workspace.roots.clone(),
    );
}

/// The registry every face serves: the built-ins and the system tools.
pub fn default_registry() -> Arc<Registry> {
    let registry = Registry::with_builtins();
    for tool in crate::agent::system_tools::all() {
        if let Err(err) = registry.register_built_in(tool) {
            tracing::error!(%err, "system tool failed to register");
        }
    }
    Arc::new(registry)
}

/// The tools that come and go while the daemon runs: skills from the skill
/// directories and the tools of upstream MCP servers. Every face that serves a
/// Registry (the native daemon, the MCP face) drives them the same way.
pub struct DynamicTools {
    pub skills: Arc<Skills>,
    pub upstreams: Arc<Upstreams>,
}

impl DynamicTools {
    /// Loads the skills into `registry` and watches their directories. Upstream
    /// servers wait for [`DynamicTools::start_upstreams`]. Needs a Tokio runtime.
    pub fn load(registry: &Arc<Registry>, config: &Config) -> DynamicTools {
        let skills = Skills::new(registry.clone());
        let report = skills.watch(crate::skills::skill_dirs(config));
        tracing::info!(
            loaded = report.loaded.len(),
            skipped = report.skipped.len(),
            dirs = ?config.skills.dirs,
            "skills loaded"
        );
        let upstreams = Upstreams::new(registry.clone(), UpstreamOptions::default());
        DynamicTools { skills, upstreams }
    }

    /// Starts the configured upstream servers in the background (returns at once).
    pub fn start_upstreams(&self, config: &Config) {
        self.upstreams.apply(&config.mcp_servers, &config.env_policy());
    }

    /// Applies a reloaded configuration: skills rescanned (with the new directories),
    /// upstream servers added, removed or restarted as their entries changed.
    pub fn reload(&self, config: &Config) {
        self.skills.watch(crate::skills::skill_dirs(config));
        self.start_upstreams(config);
    }

    /// Stops watching skills and stops every upstream server (children killed).
    pub async fn shutdown(&self) {
        self.skills.stop();
        self.upstreams.shutdown().await;
    }
}

/// Writes one audit record per finished call.
struct AuditObserver(AuditLog);

impl CallObserver for AuditObserver {
    fn call_finished(&self, record: CallRecord) {
        self.0.record(AuditRecord {
            ts: std::time::SystemTime::now(),
            session_id: record.session_id,
            client: record.client,
            call_id: record.call_id,
            tool: record.tool,
            arguments: record.arguments,
            rule: record.decision.rule_text(),
            decision: record.decision,
            ok: record.result_ok,
            error_type: record.error_type,
            duration: record.elapsed,
            sandbox: record.sandbox,
        });
    }

    fn records_dropped(&self) -> u64 {
        self.0.dropped()
    }
}

/// What both `serve` and `mcp` run on: the audit log, the daemon over the default
/// registry with every call audited, and the configured skills and upstream servers
/// registered into it (upstreams not yet started).
struct Core {
    audit: AuditLog,
    daemon: Arc<Daemon>,
    dynamic: DynamicTools,
}

impl Core {
    fn start(config: &Config, settings: Settings) -> Result<Core, ServeError> {
        // Patches a previous run left mid-way are finished or undone before any
        // session can look at their files.
        if let Err(err) = crate::tools::builtin::apply_patch::recover_journal() {
            tracing::error!(%err, "could not recover interrupted patches");
        }
        warn_about_privileges(settings.mode);
        let audit = AuditLog::open_configured(config.server.audit_log.as_deref(), &config.audit)?;
        let observer: Arc<dyn CallObserver> = Arc::new(AuditObserver(audit.clone()));
        let registry = default_registry();
        let daemon = Daemon::new(registry.clone(), settings, Some(observer));
        let dynamic = DynamicTools::load(&registry, config);
        daemon.attach_upstreams(dynamic.upstreams.clone());
        Ok(Core { audit, daemon, dynamic })
    }
}

/// Says once, at start, what running as root or in bypass mode means.
fn warn_about_privileges(mode: Mode) {
    if rustix::process::geteuid().is_root() {
        tracing::warn!(
            "running as root: every tool call, and every command a model runs, has root's \
             power over this machine, limited only by the workspace roots and the \
             permission rules; run toolgate as an ordinary user (the systemd unit uses a \
             dedicated one)"
        );
    }
    if mode == Mode::Bypass {
        tracing::warn!(
            "permission mode bypass: every call that no deny or ask rule matches runs \
             without asking, commands and file writes included"
        );
    }
}

/// Runs the daemon until SIGTERM/SIGINT (or EOF in `--stdio` mode).
pub async fn serve(options: ServeOptions) -> Result<(), ServeError> {
    let (config, load_options) = load_config(options.config.clone())?;
    let settings = preflight(&config, &load_options)?;
    log_warnings(&config);
    crate::own_files::warn_inside_roots(&settings.access, &settings.roots);
    configure_sandbox(&config, &load_options);
    let Core { audit, daemon, dynamic } = Core::start(&config, settings)?;
    let max_message = config.server.max_message_bytes;

    if options.stdio {
        let stdin = tokio::io::stdin();
        let stdout = tokio::io::stdout();
        dynamic.start_upstreams(&config);
        rpc::serve_lines(&daemon, "stdio".to_owned(), stdin, stdout, max_message).await;
        daemon.begin_shutdown();
        dynamic.shutdown().await;
        let _ = audit.flush().await;
        return Ok(());
    }

    // Signals are ours before anyone can connect: a client that sends SIGHUP (or
    // SIGTERM) as soon as the socket answers must reach the handlers, not the default
    // action that would end the process.
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|err| ServeError::Other(err.to_string()))?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|err| ServeError::Other(err.to_string()))?;
    let mut hangup =
        signal(SignalKind::hangup()).map_err(|err| ServeError::Other(err.to_string()))?;

    // Listeners: inherited ones first (socket activation), else bind our own.
    let accept_stop = CancellationToken::new();
    let socket_from_config = options.socket.is_none()
        && !options.inherited.iter().any(|inherited| matches!(inherited, Inherited::Unix { .. }));
    let mut unix_listener = None;
    let mut bound_socket = None;
    // TCP sockets from the service manager, by name (toolgate-tcp.socket names its
    // socket `tcp`, toolgate-mcp-http.socket `mcp_http`): served in place of binding
    // the configured address, which inside the service's network namespace no client
    // could reach.
    let mut inherited_tcp = None;
    let mut inherited_mcp_http = None;
    for inherited in options.inherited {
        match inherited {
            Inherited::Unix { name, listener } => {
                tracing::info!(%name, "using a unix socket passed by the service manager");
                let address = listener
                    .local_addr()
                    .ok()
                    .and_then(|addr| addr.as_pathname().map(|path| path.display().to_string()))
                    .unwrap_or_else(|| name.clone());
                daemon.add_listener(Listener { kind: "unix".to_owned(), address, inherited: true });
                listener
                    .set_nonblocking(true)
                    .map_err(|source| ServeError::Listen { addr: name.clone(), source })?;
                let listener = tokio::net::UnixListener::from_std(listener)
                    .map_err(|source| ServeError::Listen { addr: name, source })?;
                unix_listener = Some(listener);
            }
            Inherited::Tcp { name, listener } => {
                let slot = match name.as_str() {
                    "tcp" => &mut inherited_tcp,
                    "mcp_http" => &mut inherited_mcp_http,
                    _ => {
                        tracing::warn!(
                            %name,
                            "ignoring an inherited TCP socket: its FileDescriptorName= is \
                             neither tcp nor mcp_http"
                        );
                        continue;
                    }
                };
                let listen_error = |source| ServeError::Listen { addr: name.clone(), source };
                listener.set_nonblocking(true).map_err(listen_error)?;
                let listener = tokio::net::TcpListener::from_std(listener).map_err(listen_error)?;
                let local = listener.local_addr().map_err(listen_error)?;
                tracing::info!(%name, %local, "using a TCP socket passed by the service manager");
                *slot = Some(listener);
            }
        }
    }
    if unix_listener.is_none() {
        let path = options.socket.clone().unwrap_or_else(|| config.server.socket.clone());
        // The socket file is removed however this function returns from here on,
        // a failed start included.
        let (listener, file) = rpc::unix::bind_file(&path)?;
        let address = path.display().to_string();
        daemon.add_listener(Listener { kind: "unix".to_owned(), address, inherited: false });
        unix_listener = Some(listener);
        bound_socket = Some(file);
    }
    let mut accept_loops = Vec::new();
    if let Some(listener) = unix_listener {
        let daemon = daemon.clone();
        let stop = accept_stop.clone();
        let max_connections = config.server.max_connections;
        accept_loops.push(tokio::spawn(async move {
            tokio::select! {
                () = rpc::unix::serve(daemon, listener, max_connections, max_message) => {}
                () = stop.cancelled() => {}
            }
        }));
    }
    let tcp_inherited = inherited_tcp.is_some();
    let mcp_http_inherited = inherited_mcp_http.is_some();
    let tcp_listener = match (inherited_tcp, config.server.tcp) {
        (Some(listener), _) => Some(listener),
        (None, Some(addr)) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Listen { addr: addr.to_string(), source })?,
        ),
        (None, None) => None,
    };
    if let Some(listener) = tcp_listener {
        let tokens = configured_tokens(&config)?.unwrap_or_default();
        let addr = listener
            .local_addr()
            .map_err(|source| ServeError::Listen { addr: "tcp".to_owned(), source })?;
        if !tcp_inherited {
            warn_if_unreachable(&format!("[server] tcp = {addr}"), addr);
        }
        let address = addr.to_string();
        daemon.add_listener(Listener { kind: "tcp".to_owned(), address, inherited: tcp_inherited });
        let mut tcp_options = rpc::tcp::TcpOptions::new(tokens);
        tcp_options.max_message_bytes = max_message;
        tcp_options.limits = crate::admission::Limits::new(config.server.max_connections);
        // Fail before READY when the address is exposed without tokens.
        rpc::tcp::check_exposure(addr, &tcp_options.tokens)
            .map_err(|err| ServeError::Other(err.to_string()))?;
        let daemon = daemon.clone();
        let stop = accept_stop.clone();
        accept_loops.push(tokio::spawn(async move {
            tokio::select! {
                served = rpc::tcp::serve(daemon, listener, tcp_options) => {
                    if let Err(err) = served {
                        tracing::error!(%err, "the TCP transport failed");
                    }
                }
                () = stop.cancelled() => {}
            }
        }));
    }
    let mcp_http_listener = match (inherited_mcp_http, config.server.mcp_http) {
        (Some(listener), _) => Some(listener),
        (None, Some(addr)) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Listen { addr: addr.to_string(), source })?,
        ),
        (None, None) => None,
    };
    if let Some(listener) = mcp_http_listener {
        let addr = listener
            .local_addr()
            .map_err(|source| ServeError::Listen { addr: "mcp_http".to_owned(), source })?;
        if !mcp_http_inherited {
            warn_if_unreachable(&format!("[server] mcp_http = {addr}"), addr);
        }
        daemon.add_listener(Listener {
            kind: "mcp_http".to_owned(),
            address: format!("http://{addr}/mcp"),
            inherited: mcp_http_inherited,
        });
        let local = listener
            .local_addr()
            .map_err(|source| ServeError::Listen { addr: addr.to_string(), source })?;
        let tokens = mcp_http_tokens(&config, &load_options, local)?;
        tracing::info!(%addr, "MCP Streamable HTTP endpoint at /mcp");
        let options = mcp_options(&config, tokens);
        let limits = crate::admission::Limits::new(config.server.max_connections);
        let serving =
            crate::mcp::serve_http(daemon.clone(), listener, options, limits, accept_stop.clone());
        accept_loops.push(tokio::spawn(serving));
    }
    if let Some(file) = &bound_socket {
        tracing::info!(socket = %file.path().display(), roots = ?config.workspace.roots, "toolgate is listening");
    }

    let notifier = Notifier::from_env();
    let _ = notifier.ready();
    dynamic.start_upstreams(&config);
    let watchdog_stop = CancellationToken::new();
    let _watchdog = crate::systemd::spawn_watchdog(watchdog_stop.clone());

    let explicit = options.config.clone();
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = hangup.recv() => {
                let _ = notifier.reloading();
                match load_config(explicit.clone()).and_then(|(config, options)| {
                    let settings = settings_for(&config, &options)?;
                    log_warnings(&config);
                    crate::own_files::warn_inside_roots(&settings.access, &settings.roots);
                    Ok((config, options, settings))
                }) {
                    Ok((reloaded, options, settings)) => {
                        configure_sandbox(&reloaded, &options);
                        daemon.reload(settings);
                        dynamic.reload(&reloaded);
                        let unapplied = unapplied_listener_settings(
                            &config.server,
                            &reloaded.server,
                            socket_from_config,
                        );
                        for (setting, running, configured) in unapplied {
                            tracing::warn!(
                                "the reload did not apply [server] {setting}: the \
                                 configuration says {configured}, the running daemon has \
                                 {running}; listeners are opened at start only, restart \
                                 toolgate to apply it"
                            );
                        }
                        tracing::info!("configuration reloaded");
                    }
                    Err(err) => tracing::error!(%err, "reload failed; keeping the running configuration"),
                }
                let _ = notifier.ready();
            }
        }
    }

    // Stop: no new connections; let running calls finish within the grace period;
    // then cancel the rest (their processes are killed) and wait for every task.
    let _ = notifier.stopping();
    tracing::info!("stopping");
    accept_stop.cancel();
    for accept in accept_loops {
        let _ = accept.await;
    }
    let grace = config.server.shutdown_grace();
    let drained = tokio::time::timeout(grace, async {
        while daemon.calls_in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            calls = daemon.calls_in_flight(),
            "grace period over; canceling the remaining calls"
        );
    }
    daemon.begin_shutdown();
    dynamic.shutdown().await;
    daemon.tasks().close();
    if tokio::time::timeout(Duration::from_secs(5), daemon.tasks().wait()).await.is_err() {
        tracing::warn!("some connections did not close in time");
    }
    watchdog_stop.cancel();
    if let Err(err) = audit.flush().await {
        tracing::error!(%err, "flushing the audit log failed");
    }
    drop(bound_socket);
    Ok(())
}

/// The listener settings of a reloaded configuration that differ from those the
/// daemon started with, as `(setting, running, configured)`: listeners, and the tokens
/// the network ones check, are opened once at start, so a reload cannot apply them.
/// `socket` counts only when the Unix socket came from the configuration (not from
/// `--socket` or the service manager).
fn unapplied_listener_settings(
    running: &crate::config::ServerConfig,
    reloaded: &crate::config::ServerConfig,
    socket_from_config: bool,
) -> Vec<(&'static str, String, String)> {
    fn shown<T: std::fmt::Display>(value: Option<T>) -> String {
        value.map_or_else(|| "none".to_owned(), |value| value.to_string())
    }
    let mut changed = Vec::new();
    if socket_from_config && running.socket != reloaded.socket {
        changed.push((
            "socket",
            running.socket.display().to_string(),
            reloaded.socket.display().to_string(),
        ));
    }
    for (setting, was, now) in
        [("tcp", running.tcp, reloaded.tcp), ("mcp_http", running.mcp_http, reloaded.mcp_http)]
    {
        if was != now {
            changed.push((setting, shown(was), shown(now)));
        }
    }
    let networked = running.tcp.is_some() || running.mcp_http.is_some();
    if networked && running.token_file != reloaded.token_file {
        changed.push((
            "token_file",
            shown(running.token_file.as_ref().map(|path| path.display())),
            shown(reloaded.token_file.as_ref().map(|path| path.display())),
        ));
    }
    changed
}

/// Warns when the listener `what` bound at `addr` cannot be reached
/// from beyond this process's network namespace: an address meant for other machines,
/// in a namespace whose only interface is the loopback (systemd's `PrivateNetwork=yes`).
fn warn_if_unreachable(what: &str, addr: std::net::SocketAddr) {
    let interfaces = match std::fs::read_to_string("/proc/self/net/dev") {
        Ok(text) => network_interfaces(&text),
        Err(_) => return,
    };
    // systemd sets INVOCATION_ID for every unit it runs.
    let service = std::env::var_os("INVOCATION_ID").is_some();
    if let Some(why) = unreachable_listener(addr, &interfaces, service) {
        tracing::warn!(
            "{what}: {why}; in the system service, enable \
             toolgate-tcp.socket or toolgate-mcp-http.socket instead, whose sockets \
             systemd opens outside the namespace"
        );
    }
}

/// The interface names of `/proc/self/net/dev` (two header lines, then `name: counters`).
fn network_interfaces(dev: &str) -> Vec<String> {
    dev.lines()
        .skip(2)
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

/// Why a listener on `addr` reaches no client, given the namespace's interfaces and
/// whether a service manager runs toolgate (a loopback-only namespace there is the
/// service's own, `PrivateNetwork=yes`, whose loopback no other program shares);
/// `None` when it can.
fn unreachable_listener(
    addr: std::net::SocketAddr,
    interfaces: &[String],
    service: bool,
) -> Option<String> {
    let only_loopback = !interfaces.is_empty() && interfaces.iter().all(|name| name == "lo");
    if !only_loopback {
        return None;
    }
    if !addr.ip().is_loopback() {
        return Some(
            "no client can reach it: toolgate runs in a network namespace whose only \
             interface is the loopback (PrivateNetwork=yes, for one)"
                .to_owned(),
        );
    }
    service.then(|| {
        "no client can reach it: the service runs in a network namespace of its own \
         (PrivateNetwork=yes), whose loopback is not the machine's"
            .to_owned()
    })
}

/// What `toolgate mcp` was asked to do.
#[derive(Debug, Default)]
pub struct McpCommandOptions {
    pub config: Option<PathBuf>,
    /// Replace the configured roots (the operator's choice on the command line).
    pub roots: Vec<PathBuf>,
    /// Replace the configured mode (likewise).
    pub mode: Option<String>,
    pub conformance_fixtures: bool,
    /// Serve Streamable HTTP on this address instead of stdio.
    pub http: Option<String>,
}

/// `toolgate mcp`: one MCP conversation on stdio (or an HTTP endpoint), over the same
/// engine as the daemon. Returns at the end of input (stdio) or on SIGTERM/SIGINT.
pub async fn serve_mcp(options: McpCommandOptions) -> Result<(), ServeError> {
    let (mut config, load_options) = load_config(options.config.clone())?;
    if !options.roots.is_empty() {
        let mut roots = Vec::with_capacity(options.roots.len());
        for root in &options.roots {
            let canonical = std::fs::canonicalize(root)
                .map_err(|err| ServeError::Other(format!("--root {}: {err}", root.display())))?;
            roots.push(canonical);
        }
        // Workspace skills are those of the roots the host named, wherever toolgate
        // was started; so are their trust and the guard on writing them.
        let replaced: Vec<PathBuf> = config
            .workspace
            .roots
            .iter()
            .map(|root| crate::skills::workspace_skill_dir(root))
            .collect();
        config.skills.dirs.retain(|dir| !replaced.contains(dir));
        config
            .skills
            .dirs
            .extend(roots.iter().map(|root| crate::skills::workspace_skill_dir(root)));
        config.workspace.roots = roots;
    }
    let mut settings = preflight(&config, &load_options)?;
    log_warnings(&config);
    configure_sandbox(&config, &load_options);
    if let Some(mode) = &options.mode {
        settings.mode = mode.parse().map_err(|_| ServeError::Mode(mode.clone()))?;
    }
    crate::own_files::warn_inside_roots(&settings.access, &settings.roots);
    // Skills and upstream servers reach MCP hosts through the same guards.
    let Core { audit, daemon, dynamic } = Core::start(&config, settings)?;
    dynamic.start_upstreams(&config);
    let outcome = match &options.http {
        None => {
            let mut mcp_options = mcp_options(&config, crate::auth::TokenSet::empty());
            mcp_options.conformance_fixtures = options.conformance_fixtures;
            crate::mcp::run_stdio(daemon.clone(), mcp_options)
                .await
                .map_err(|err| ServeError::Other(err.to_string()))
        }
        Some(addr) => {
            serve_mcp_http(&daemon, &config, &load_options, addr, options.conformance_fixtures)
                .await
        }
    };
    daemon.begin_shutdown();
    daemon.tasks().close();
    let _ = tokio::time::timeout(Duration::from_secs(5), daemon.tasks().wait()).await;
    dynamic.shutdown().await;
    let _ = audit.flush().await;
    outcome
}

/// `toolgate mcp --http ADDR`: never without tokens (see [`mcp_http_tokens`]).
async fn serve_mcp_http(
    daemon: &Arc<Daemon>,
    config: &Config,
    load_options: &LoadOptions,
    addr: &str,
    conformance_fixtures: bool,
) -> Result<(), ServeError> {
    let listen_error = |source| ServeError::Listen { addr: addr.to_owned(), source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(listen_error)?;
    let local = listener.local_addr().map_err(listen_error)?;
    warn_if_unreachable(&format!("mcp --http {local}"), local);
    let tokens = mcp_http_tokens(config, load_options, local)?;
    let mut mcp_options = mcp_options(config, tokens);
    mcp_options.conformance_fixtures = conformance_fixtures;
    tracing::info!(%local, "MCP Streamable HTTP endpoint at /mcp");
    let stop = CancellationToken::new();
    let limits = crate::admission::Limits::new(config.server.max_connections);
    let serving =
        crate::mcp::serve_http(daemon.clone(), listener, mcp_options, limits, stop.clone());
    tokio::select! {
        () = serving => {}
        () = termination() => stop.cancel(),
    }
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn termination() {
    let (Ok(mut terminate), Ok(mut interrupt)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
}

/// The MCP face's options from the configuration, with the tokens HTTP requests
/// must present.
fn mcp_options(config: &Config, tokens: crate::auth::TokenSet) -> crate::mcp::McpOptions {
    crate::mcp::McpOptions {
        tokens,
        max_message_bytes: config.server.max_message_bytes,
        ..crate::mcp::McpOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_beyond_loopback_in_a_loopback_only_namespace_is_unreachable() {
        let dev = "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n    lo: 1 2 3\n";
        let only_lo = network_interfaces(dev);
        assert_eq!(only_lo, ["lo"]);
        let with_eth = network_interfaces(&format!("{dev}  eth0: 4 5 6\n"));
        assert_eq!(with_eth, ["lo", "eth0"]);
        let wide: std::net::SocketAddr = "0.0.0.0:7810".parse().unwrap();
        let local: std::net::SocketAddr = "127.0.0.1:7810".parse().unwrap();
        assert!(unreachable_listener(wide, &only_lo, false).unwrap().contains("only interface"));
        assert_eq!(unreachable_listener(wide, &with_eth, true), None);
        assert_eq!(unreachable_listener(local, &only_lo, false), None);
        assert!(unreachable_listener(local, &only_lo, true).unwrap().contains("of its own"));
        assert_eq!(unreachable_listener(local, &with_eth, true), None);
        assert_eq!(unreachable_listener(wide, &[], true), None);
    }
}
