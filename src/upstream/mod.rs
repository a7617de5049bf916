//! Upstream MCP servers: toolgate as an MCP *client*, proxying the tools of the servers
//! listed in `[[mcp_servers]]` into the one Registry as `mcp__<server>__<tool>`.
//!
//! Each configured server gets a supervisor task that connects (a child process on
//! stdio, or Streamable HTTP), lists the server's tools and keeps them in the Registry
//! in step with the server: re-listed on the server's `notifications/tools/list_changed`,
//! left in place but answering `upstream_error` at once while the server is down, and
//! removed when the server leaves the configuration. A server that crashes, closes its
//! connection or stops answering pings is restarted with exponential backoff.
//!
//! Nothing here blocks the daemon: [`Upstreams::apply`] only starts tasks, so built-in
//! tools are served while a slow upstream (a package manager fetching it first, say)
//! is still starting. Child processes run in their own process group, which is killed
//! when the server is stopped, restarted or dropped; none outlives the daemon's
//! shutdown.

mod connection;
mod proxy;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::McpServerConfig;
use crate::tools::{EnvPolicy, Registry, ToolSource};

pub use proxy::{PROXY_PREFIX, check_server_name, proxied_name, server_of};
// What `daemon/status` shows of a server is defined in the bottom layer, which the
// client-only build compiles too.
pub use crate::wire::{UpstreamState, UpstreamStatus};

use self::connection::{Connection, Link, ListLimits};

/// Timing of supervision. The defaults suit real servers; tests shorten them.
#[derive(Clone, Debug)]
pub struct UpstreamOptions {
    /// Delay before the first restart; doubled after every failed attempt.
    pub backoff_initial: Duration,
    /// The longest delay between two attempts.
    pub backoff_max: Duration,
    /// A server that stayed up this long starts over from `backoff_initial` when it
    /// next fails: it was healthy, not crash-looping.
    pub backoff_reset_after: Duration,
    /// How often a ready server is pinged to notice that it hangs.
    pub ping_interval: Duration,
    /// How long a ping may take before the server counts as hung and is restarted.
    pub ping_timeout: Duration,
    /// How long a stopping child may take to exit after its stdin closed, and again
    /// after SIGTERM, before its process group is killed.
    pub stop_grace: Duration,
    /// Most `tools/list` pages read from one server per listing.
    pub max_list_pages: usize,
    /// Most tools taken from one server.
    pub max_tools: usize,
    /// Most bytes of tool definitions (JSON) taken from one server.
    pub max_tool_bytes: usize,
}

impl Default for UpstreamOptions {
    fn default() -> UpstreamOptions {
        UpstreamOptions {
            // Half a second doubling to thirty: a crash loop costs little, and a
            // server that comes back is noticed within half a minute.
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            backoff_reset_after: Duration::from_secs(60),
            // A ping every half minute is negligible traffic; ten seconds without an
            // answer is far beyond what a healthy server needs for a ping.
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(10),
            // MCP's stdio shutdown: close stdin, wait, SIGTERM, wait, SIGKILL.
            stop_grace: Duration::from_secs(2),
            // Far beyond what a real server offers (the largest list a few hundred
            // tools, well under a megabyte), and small enough that a server paging
            // forever costs a few megabytes before it is refused.
            max_list_pages: 100,
            max_tools: 1000,
            max_tool_bytes: 4 * 1024 * 1024,
        }
    }
}

/// The supervisor of one configured server.
struct Supervised {
    config: McpServerConfig,
    /// The environment policy it was started with (a change restarts it).
    env_policy: EnvPolicy,
    link: Arc<Link>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Every upstream server of the daemon. Cheap to share; all methods take `&self`.
pub struct Upstreams {
    registry: Arc<Registry>,
    options: UpstreamOptions,
    servers: Mutex<BTreeMap<String, Supervised>>,
    /// Supervisors of removed servers that are still stopping, awaited at shutdown.
    retiring: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").field("servers", &self.status()).finish()
    }
}

impl Upstreams {
    pub fn new(registry: Arc<Registry>, options: UpstreamOptions) -> Arc<Upstreams> {
        Arc::new(Upstreams {
            registry,
            options,
            servers: Mutex::new(BTreeMap::new()),
            retiring: Mutex::new(Vec::new()),
        })
    }

    /// Makes the running servers match `servers` (start-up and every reload): new
    /// servers are started, removed ones stopped (their tools unregistered), changed
    /// ones restarted. Returns at once; connecting happens in the background.
    /// Must be called inside a Tokio runtime.
    pub fn apply(&self, servers: &[McpServerConfig], env_policy: &EnvPolicy) {
        let mut running = self.lock();
        let wanted: BTreeMap<&str, &McpServerConfig> =
            servers.iter().map(|server| (server.name.as_str(), server)).collect();
        let gone: Vec<String> = running
            .iter()
            .filter(|(name, supervised)| {
                wanted.get(name.as_str()).is_none_or(|config| {
                    **config != supervised.config || *env_policy != supervised.env_policy
                })
            })
            .map(|(name, _)| name.clone())
            .collect();
        let mut previous = BTreeMap::new();
        for name in gone {
            if let Some(supervised) = running.remove(&name) {
                tracing::info!(server = %name, "stopping MCP server (configuration changed)");
                supervised.stop.cancel();
                // Unregistered now so that clients stop seeing them at once; the
                // supervisor does it again when it has stopped.
                self.registry.sync(&ToolSource::Mcp(name.clone()), Vec::new());
                previous.insert(name, supervised.task);
            }
        }
        for (name, config) in wanted {
            if running.contains_key(name) {
                continue;
            }
            // A changed server's replacement starts once the old supervisor is gone,
            // so that the old one's clean-up never removes the new one's tools.
            let previous = previous.remove(name);
            let link = Link::new(name);
            let stop = CancellationToken::new();
            let supervisor = Supervisor {
                config: config.clone(),
                env_policy: env_policy.clone(),
                link: link.clone(),
                registry: self.registry.clone(),
                options: self.options.clone(),
                stop: stop.clone(),
            };
            let task = tokio::spawn(async move {
                if let Some(previous) = previous {
                    let _ = previous.await;
                }
                supervisor.run().await;
            });
            running.insert(
                name.to_owned(),
                Supervised {
                    config: config.clone(),
                    env_policy: env_policy.clone(),
                    link,
                    stop,
                    task,
                },
            );
        }
        // Whatever is left belongs to servers that were removed outright.
        self.retire(previous.into_values());
    }

    fn retire(&self, tasks: impl IntoIterator<Item = JoinHandle<()>>) {
        let mut retiring = self.retiring.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        retiring.retain(|task| !task.is_finished());
        retiring.extend(tasks);
    }

    /// The state of every configured server, by name.
    pub fn status(&self) -> Vec<UpstreamStatus> {
        self.lock().values().map(|supervised| supervised.link.status()).collect()
    }

    /// Stops every server: connections closed, child process groups killed, tools
    /// unregistered. Waits for the supervisors (each bounded by the stop grace).
    pub async fn shutdown(&self) {
        let stopped: Vec<Supervised> = std::mem::take(&mut *self.lock()).into_values().collect();
        for supervised in &stopped {
            supervised.stop.cancel();
        }
        for supervised in stopped {
            if let Err(err) = supervised.task.await {
                tracing::error!(server = %supervised.config.name, %err, "MCP supervisor failed");
            }
        }
        let retiring = std::mem::take(
            &mut *self.retiring.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in retiring {
            let _ = task.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Supervised>> {
        // Short critical sections without awaits; a poisoned map is still consistent.
        self.servers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Upstreams {
    fn drop(&mut self) {
        // Supervisors own their children; stopping them kills the process groups
        // even when nobody awaited `shutdown`.
        for supervised in self.lock().values() {
            supervised.stop.cancel();
        }
    }
}

/// Why a connected server stopped being usable.
enum Ended {
    /// Asked to stop (removed from the configuration, or shutdown).
    Stopped,
    /// It went away or stopped answering; restart it.
    Lost(String),
}

/// The task that keeps one server connected and its tools registered.
struct Supervisor {
    config: McpServerConfig,
    env_policy: EnvPolicy,
    link: Arc<Link>,
    registry: Arc<Registry>,
    options: UpstreamOptions,
    stop: CancellationToken,
}

impl Supervisor {
    async fn run(self) {
        let name = self.config.name.clone();
        if let Err(reason) = check_server_name(&name) {
            // Configuration loading refuses such names; a server built some other way
            // is shown as failed and never started.
            tracing::warn!(server = %name, %reason, "MCP server not started");
            self.link.set_state(UpstreamState::Failed, Some(reason));
            self.stop.cancelled().await;
            self.link.set_state(UpstreamState::Stopped, None);
            return;
        }
        let mut backoff = self.options.backoff_initial;
        let mut first = true;
        loop {
            if !first {
                self.link.count_restart();
            }
            first = false;
            self.link.set_state(UpstreamState::Starting, None);
            let started = Instant::now();
            let reason = match self.start().await {
                Ok(connection) => {
                    tracing::info!(server = %name, tools = self.link.status().tools, "MCP server ready");
                    let ended = self.serve(&connection).await;
                    self.link.go_down();
                    connection.close(self.options.stop_grace).await;
                    match ended {
                        Ended::Stopped => break,
                        Ended::Lost(reason) => reason,
                    }
                }
                Err(reason) => reason,
            };
            if self.stop.is_cancelled() {
                break;
            }
            if started.elapsed() >= self.options.backoff_reset_after {
                backoff = self.options.backoff_initial;
            }
            tracing::warn!(server = %name, %reason, retry_in_ms = backoff.as_millis() as u64, "MCP server is down");
            self.link.set_state(UpstreamState::Failed, Some(reason));
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.stop.cancelled() => break,
            }
            backoff = (backoff * 2).min(self.options.backoff_max);
        }
        self.link.go_down();
        let report = self.link.publish(|status| {
            let report = self.registry.sync(&ToolSource::Mcp(name.clone()), Vec::new());
            status.tools = 0;
            status.state = UpstreamState::Stopped;
            status.reason = None;
            report
        });
        if report.changed_anything() {
            tracing::info!(server = %name, removed = report.removed.len(), "MCP server tools removed");
        }
    }

    /// Connects, initializes and registers the server's tools, all within the
    /// configured startup timeout (and abandoned at once when asked to stop).
    async fn start(&self) -> Result<Connection, String> {
        let startup = self.config.startup_timeout();
        let attempt = async {
            let connection = Connection::open(&self.config, &self.env_policy, &self.link).await?;
            match self.sync_tools(&connection).await {
                Ok(()) => Ok(connection),
                Err(reason) => {
                    connection.close(self.options.stop_grace).await;
                    Err(reason)
                }
            }
        };
        tokio::select! {
            res = tokio::time::timeout(startup, attempt) => match res {
                Ok(res) => res,
                Err(_) => Err(format!("did not start within {} ms", startup.as_millis())),
            },
            () = self.stop.cancelled() => Err("stopped while starting".to_owned()),
        }
    }

    /// Lists the server's tools and makes the Registry match them.
    async fn sync_tools(&self, connection: &Connection) -> Result<(), String> {
        let limits = ListLimits {
            max_pages: self.options.max_list_pages,
            max_tools: self.options.max_tools,
            max_bytes: self.options.max_tool_bytes,
        };
        let listed = connection.list_tools(&limits).await?;
        let source = ToolSource::Mcp(self.config.name.clone());
        let mut tools = Vec::with_capacity(listed.len());
        for tool in listed {
            match proxy::ProxyTool::new(&self.config, &tool, self.link.clone()) {
                Ok(proxy) => {
                    tools.push((Arc::new(proxy) as Arc<dyn crate::tools::Tool>, source.clone()))
                }
                Err(reason) => {
                    tracing::warn!(server = %self.config.name, tool = %tool.name, %reason, "skipping an MCP tool");
                }
            }
        }
        // Live before the tools appear, so that a client seeing them can call them.
        self.link.go_live(connection.peer().clone());
        let report = self.link.publish(|status| {
            let report = self.registry.sync(&source, tools);
            status.tools = self
                .registry
                .sources()
                .values()
                .filter(|registered| **registered == source)
                .count();
            status.state = UpstreamState::Ready;
            status.reason = None;
            report
        });
        for (tool, err) in &report.refused {
            tracing::warn!(server = %self.config.name, %tool, %err, "MCP tool not registered");
        }
        Ok(())
    }

    /// Runs a ready connection until it ends: re-syncs tools when the server says
    /// they changed, pings it to notice a hang, and watches for it going away.
    async fn serve(&self, connection: &Connection) -> Ended {
        let mut pings = tokio::time::interval(self.options.ping_interval);
        pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick of an interval is immediate; the server just answered.
        pings.reset();
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return Ended::Stopped,
                reason = connection.closed() => return Ended::Lost(reason),
                () = self.link.tools_changed() => {
                    tracing::info!(server = %self.config.name, "MCP server changed its tools; listing them again");
                    let synced = tokio::select! {
                        res = tokio::time::timeout(self.config.startup_timeout(), self.sync_tools(connection)) => res,
                        () = self.stop.cancelled() => return Ended::Stopped,
                    };
                    match synced {
                        Ok(Ok(())) => {}
                        Ok(Err(reason)) => return Ended::Lost(reason),
                        Err(_) => return Ended::Lost("did not answer tools/list in time".to_owned()),
                    }
                }
                _ = pings.tick() => {
                    let answered = tokio::select! {
                        res = tokio::time::timeout(self.options.ping_timeout, connection.ping()) => res,
                        () = self.stop.cancelled() => return Ended::Stopped,
                    };
                    match answered {
                        Ok(Ok(())) => {}
                        Ok(Err(reason)) => return Ended::Lost(reason),
                        Err(_) => {
                            return Ended::Lost(format!(
                                "did not answer a ping within {} ms",
                                self.options.ping_timeout.as_millis()
                            ));
                        }
                    }
                }
            }
        }
    }
}
