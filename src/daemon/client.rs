//! The client API: what one connected client can do, whatever face it came through.
//!
//! A [`Client`] owns the connection's identity (`uid:1000`, `token:ci`, `mcp`), its
//! default session and the sessions it opens. Every face (NDJSON on the Unix socket
//! or stdio, WebSocket, TCP HTTP and WS, MCP stdio and HTTP) is framing plus calls to
//! these methods, so a guarantee enforced here holds at every entry point: a session
//! can only be narrowed — roots, cwd, mode, limits and allowlist — never widened.
//!
//! Adding a method is one method here plus one arm per face; adding a transport is
//! framing only.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

use super::approvals::RespondError;
use super::events::Subscriber;
use super::{
    ConnectionGuard, Daemon, SessionEntry, SessionError, SessionSpec, SessionState, Status,
};
use crate::agent::{ApprovalAnswer, ApprovalBroker, EventSink};
use crate::permission::Explanation;
use crate::tools::{Call, Definition, ToolResult};

/// Sessions one connection may hold at once, its default session included: a client
/// that opens sessions in a loop runs into this, not into the daemon's memory.
pub const MAX_SESSIONS_PER_CONNECTION: usize = 64;

/// One connected client.
pub struct Client {
    daemon: Arc<Daemon>,
    guard: ConnectionGuard,
    identity: String,
    /// Opened with the connection (native faces) or on first use (MCP).
    default: OnceLock<Arc<SessionEntry>>,
    next_subscription: AtomicU64,
}

impl Client {
    /// A client without a session yet (see [`Client::open_default_as`]).
    pub fn connect(daemon: &Arc<Daemon>, identity: impl Into<String>) -> Client {
        Client {
            daemon: daemon.clone(),
            guard: daemon.connect(),
            identity: identity.into(),
            default: OnceLock::new(),
            next_subscription: AtomicU64::new(1),
        }
    }

    /// A client of a native face: its default session, with the configured grants,
    /// buffers its events until the client subscribes and asks its questions through
    /// them.
    pub fn open(daemon: &Arc<Daemon>, identity: impl Into<String>) -> Result<Client, SessionError> {
        let client = Client::connect(daemon, identity);
        let entry = daemon.open_session(client.id(), &client.identity, &SessionSpec::default())?;
        let _ = client.default.set(entry);
        Ok(client)
    }

    /// Opens the default session with its events and questions going where the face
    /// says (the MCP face turns output into progress and questions into
    /// elicitations), recorded under `identity`: the MCP face learns who is calling
    /// only with the first request (over HTTP, the bearer token's name). Once opened,
    /// later calls return it as it is.
    pub fn open_default_as(
        &self,
        identity: &str,
        spec: &SessionSpec,
        events: Arc<dyn EventSink>,
        approvals: Arc<dyn ApprovalBroker>,
    ) -> Result<Arc<SessionEntry>, SessionError> {
        if let Some(entry) = self.default.get() {
            return Ok(entry.clone());
        }
        let entry = self.daemon.open_session_with(self.id(), identity, spec, events, approvals)?;
        Ok(self.default.get_or_init(|| entry).clone())
    }

    pub fn id(&self) -> u64 {
        self.guard.id
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn daemon(&self) -> &Arc<Daemon> {
        &self.daemon
    }

    /// The default session, once opened.
    pub fn default_session(&self) -> Option<&Arc<SessionEntry>> {
        self.default.get()
    }

    /// A session of this client: the default one when no id is given.
    pub fn session(&self, session_id: Option<&str>) -> Result<Arc<SessionEntry>, SessionError> {
        match (session_id, self.default.get()) {
            (None, Some(entry)) => Ok(entry.clone()),
            (Some(id), Some(entry)) if id == entry.session.id() => Ok(entry.clone()),
            (None, None) => Err(SessionError::UnknownSession("(default)".to_owned())),
            (Some(id), _) => self.daemon.session_for(self.id(), id),
        }
    }

    /// Opens another session (a sub-agent's). Everything asked for is intersected with
    /// the configuration, and the allowlist with the connection's own (its default
    /// session's): a client cannot escape its narrowing by opening a new session.
    pub fn open_session(&self, spec: &SessionSpec) -> Result<SessionState, SessionError> {
        if self.daemon.sessions_of(self.id()).len() >= MAX_SESSIONS_PER_CONNECTION {
            return Err(SessionError::TooMany(MAX_SESSIONS_PER_CONNECTION));
        }
        let mut spec = spec.clone();
        if let Some(default) = self.default.get() {
            let own = default.session.allowlist();
            if !own.is_empty() {
                spec.allowlist = Some(match spec.allowlist.take() {
                    Some(asked) if !asked.is_empty() => {
                        asked.into_iter().filter(|name| own.contains(name)).collect()
                    }
                    // An empty intersection must not mean "every tool".
                    _ => own,
                });
                if spec.allowlist.as_ref().is_some_and(Vec::is_empty) {
                    return Err(SessionError::Widening(
                        "the allowlist asked for shares no tool with the connection's".to_owned(),
                    ));
                }
            }
        }
        let entry = self.daemon.open_session(self.id(), &self.identity, &spec)?;
        Ok(self.daemon.state(&entry.session))
    }

    /// Narrows a session: roots, cwd, mode, limits and allowlist. Anything wider than
    /// what the session has is refused, and nothing changes then.
    pub fn update(
        &self,
        session_id: Option<&str>,
        change: &SessionSpec,
    ) -> Result<SessionState, SessionError> {
        let entry = self.session(session_id)?;
        self.daemon.narrow(&entry.session, change)?;
        Ok(self.daemon.state(&entry.session))
    }

    /// Closes a session this client opened (not its default one, which closes with
    /// the connection). False when there was no such session.
    pub fn close_session(&self, session_id: &str) -> Result<bool, SessionError> {
        if self.default.get().is_some_and(|entry| entry.session.id() == session_id) {
            return Err(SessionError::DefaultSession);
        }
        Ok(self.daemon.close_session(self.id(), session_id).is_ok())
    }

    /// The tools a session may see, and where each comes from (`builtin`,
    /// `mcp:<server>`, `skill:<path>`).
    pub fn list(
        &self,
        session_id: Option<&str>,
    ) -> Result<(Vec<Definition>, BTreeMap<String, String>), SessionError> {
        let entry = self.session(session_id)?;
        let tools = entry.session.definitions();
        let registered = self.daemon.registry().sources();
        let sources = tools
            .iter()
            .filter_map(|tool| {
                let source = registered.get(&tool.name)?;
                Some((tool.name.clone(), source.to_string()))
            })
            .collect();
        Ok((tools, sources))
    }

    /// Runs one call through the session's whole pipeline; questions go through the
    /// session's broker.
    pub async fn call(
        &self,
        session_id: Option<&str>,
        call: Call,
        cancel: &CancellationToken,
    ) -> Result<Arc<ToolResult>, SessionError> {
        let entry = self.session(session_id)?;
        Ok(entry.session.execute_shared(call, cancel).await)
    }

    /// One model turn; results in call order.
    pub async fn batch(
        &self,
        session_id: Option<&str>,
        calls: &[Call],
        cancel: &CancellationToken,
    ) -> Result<Vec<ToolResult>, SessionError> {
        let entry = self.session(session_id)?;
        Ok(entry.session.execute_calls(calls, cancel).await)
    }

    /// Which layer and rule would decide a call, without running anything.
    pub fn explain(
        &self,
        session_id: Option<&str>,
        call: &Call,
    ) -> Result<(String, Option<Explanation>, Vec<Explanation>), SessionError> {
        Ok(self.session(session_id)?.session.explain_layers(call))
    }

    /// Cancels the running calls with this id; how many there were.
    pub fn cancel(&self, session_id: Option<&str>, call_id: &str) -> Result<usize, SessionError> {
        Ok(self.session(session_id)?.session.cancel_call(call_id))
    }

    /// Answers a question put to one of this client's sessions. False when it is no
    /// longer pending.
    pub fn respond(&self, request_id: &str, answer: ApprovalAnswer) -> Result<bool, RespondError> {
        let owner = self.id();
        let default = self.default.get().map(|entry| entry.session.id().to_owned());
        let outcome = self.daemon.approvals().respond(request_id, answer, |session_id| {
            default.as_deref() == Some(session_id)
                || self.daemon.session_for(owner, session_id).is_ok()
        });
        match outcome {
            Ok(()) => Ok(true),
            Err(RespondError::NotPending) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// A new subscription id, unique to this client.
    pub fn subscription_id(&self) -> String {
        format!("sub-{}-{}", self.id(), self.next_subscription.fetch_add(1, Ordering::Relaxed))
    }

    /// Delivers a session's events (its backlog first) to `subscriber`.
    pub fn subscribe(
        &self,
        entry: &SessionEntry,
        subscription: String,
        subscriber: Arc<dyn Subscriber>,
    ) -> Result<(), SessionError> {
        let Some(hub) = &entry.events else {
            return Err(SessionError::NotSubscribable);
        };
        hub.subscribe(subscription, self.id(), subscriber);
        Ok(())
    }

    /// Ends a subscription of this client; false when there was none.
    pub fn unsubscribe(&self, subscription: &str) -> bool {
        let mut removed = false;
        for entry in
            self.default.get().into_iter().cloned().chain(self.daemon.sessions_of(self.id()))
        {
            if let Some(hub) = &entry.events {
                removed |= hub.unsubscribe(subscription);
            }
        }
        removed
    }

    pub fn status(&self) -> Status {
        self.daemon.status()
    }

    /// Ends the connection's sessions: calls canceled, processes killed, questions
    /// withdrawn. Dropping the client does the same. A session detached because its
    /// background processes run, or already re-attached to another connection with
    /// its resume token, is left alone.
    pub fn close(&self) {
        self.daemon.disconnect(self.id());
        if let Some(entry) = self.default.get()
            && self.daemon.owns(self.id(), entry.session.id())
        {
            entry.session.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::permission::Mode;
    use crate::tools::Registry;

    fn daemon(root: &std::path::Path) -> Arc<Daemon> {
        let root = std::fs::canonicalize(root).unwrap();
        std::fs::create_dir_all(root.join("a/deeper")).unwrap();
        std::fs::create_dir_all(root.join("b")).unwrap();
        let settings = super::super::Settings::for_roots(vec![root]);
        Daemon::new(Arc::new(Registry::with_builtins()), settings, None)
    }

    /// Keeps no record: each one it is given is lost, and counted as such.
    #[derive(Default)]
    struct Losing(AtomicU64);

    impl crate::agent::CallObserver for Losing {
        fn call_finished(&self, _record: crate::agent::CallRecord) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }

        fn records_dropped(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
    }

    #[tokio::test]
    async fn status_counts_the_audit_records_lost() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("notes.txt"), "hello\n").unwrap();
        let losing = Arc::new(Losing::default());
        let settings = super::super::Settings::for_roots(vec![root]);
        let daemon =
            Daemon::new(Arc::new(Registry::with_builtins()), settings, Some(losing.clone()));
        assert_eq!(daemon.status().audit_records_dropped, 0);

        let client = Client::open(&daemon, "test").unwrap();
        let cancel = CancellationToken::new();
        for id in ["1", "2"] {
            let call = Call::from_value(id, "read_file", &serde_json::json!({"path": "notes.txt"}));
            let result = client.call(None, call, &cancel).await.unwrap();
            assert!(result.ok, "{result:?}");
        }
        assert_eq!(daemon.status().audit_records_dropped, 2);
    }

    #[tokio::test]
    async fn update_narrows_and_refuses_anything_wider_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = daemon(dir.path());
        let client = Client::open(&daemon, "test").unwrap();
        let root = daemon.settings().roots[0].clone();

        let narrowed = client
            .update(
                None,
                &SessionSpec {
                    roots: Some(vec!["a".to_owned()]),
                    timeout: Some(Duration::from_secs(5)),
                    allowlist: Some(vec!["read_file".to_owned(), "find_files".to_owned()]),
                    ..SessionSpec::default()
                },
            )
            .unwrap();
        assert_eq!(narrowed.roots, [root.join("a")]);
        // The old cwd (the root) is outside the new roots: the first root it is.
        assert_eq!(narrowed.cwd, root.join("a"));
        assert_eq!(narrowed.timeout, Duration::from_secs(5));

        let before = client.update(None, &SessionSpec::default()).unwrap();
        let wider = [
            SessionSpec {
                roots: Some(vec![root.join("b").display().to_string()]),
                ..SessionSpec::default()
            },
            SessionSpec {
                cwd: Some(root.join("b").display().to_string()),
                ..SessionSpec::default()
            },
            SessionSpec { timeout: Some(Duration::from_secs(6)), ..SessionSpec::default() },
            SessionSpec { mode: Some(Mode::Bypass), ..SessionSpec::default() },
            SessionSpec { allowlist: Some(Vec::new()), ..SessionSpec::default() },
            SessionSpec {
                // A narrowing with one wider part changes nothing at all.
                cwd: Some("deeper".to_owned()),
                allowlist: Some(vec!["write_file".to_owned()]),
                ..SessionSpec::default()
            },
        ];
        for spec in wider {
            assert!(client.update(None, &spec).is_err(), "{spec:?} was accepted");
            assert_eq!(client.update(None, &SessionSpec::default()).unwrap(), before, "{spec:?}");
        }
        let entry = client.session(None).unwrap();
        assert!(entry.session.set_allowlist(vec!["write_file".to_owned()]).is_err());
        assert!(entry.session.set_allowlist(Vec::new()).is_err());
        assert!(entry.session.set_allowlist(vec!["read_file".to_owned()]).is_ok());
    }

    #[tokio::test]
    async fn a_connection_holds_a_bounded_number_of_sessions_and_closing_frees_them() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = daemon(dir.path());
        let client = Client::open(&daemon, "test").unwrap();
        let opened: Vec<String> = (1..MAX_SESSIONS_PER_CONNECTION)
            .map(|_| client.open_session(&SessionSpec::default()).unwrap().session_id)
            .collect();
        assert_eq!(daemon.session_count(), MAX_SESSIONS_PER_CONNECTION);
        assert_eq!(
            client.open_session(&SessionSpec::default()).err(),
            Some(SessionError::TooMany(MAX_SESSIONS_PER_CONNECTION))
        );
        // A closed session is gone from the daemon (its buffers with it), and makes room.
        let entry = client.session(Some(&opened[0])).unwrap();
        let weak = Arc::downgrade(&entry);
        drop(entry);
        assert_eq!(client.close_session(&opened[0]), Ok(true));
        assert!(weak.upgrade().is_none(), "the closed session is still held");
        assert_eq!(daemon.session_count(), MAX_SESSIONS_PER_CONNECTION - 1);
        assert!(client.open_session(&SessionSpec::default()).is_ok());
        // Another connection has its own allowance.
        let other = Client::open(&daemon, "other").unwrap();
        assert!(other.open_session(&SessionSpec::default()).is_ok());
        drop(client);
        assert_eq!(daemon.session_count(), 2, "a connection's sessions end with it");
    }

    #[tokio::test]
    async fn a_new_session_keeps_the_connections_allowlist() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = daemon(dir.path());
        let client = Client::open(&daemon, "test").unwrap();
        let narrow = vec!["read_file".to_owned(), "find_files".to_owned()];
        client
            .update(
                None,
                &SessionSpec { allowlist: Some(narrow.clone()), ..SessionSpec::default() },
            )
            .unwrap();
        assert_eq!(client.open_session(&SessionSpec::default()).unwrap().allowlist, narrow);
        let asked = SessionSpec {
            allowlist: Some(vec!["read_file".to_owned(), "write_file".to_owned()]),
            ..SessionSpec::default()
        };
        assert_eq!(client.open_session(&asked).unwrap().allowlist, ["read_file"]);
        let outside = SessionSpec {
            allowlist: Some(vec!["write_file".to_owned()]),
            ..SessionSpec::default()
        };
        assert!(client.open_session(&outside).is_err());
        // Another connection is not bound by this one's narrowing.
        let other = Client::open(&daemon, "other").unwrap();
        assert!(other.open_session(&outside).is_ok());
    }
}
