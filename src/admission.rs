//! How many connections a listener serves, and for how long, before and after they
//! show who they are: unauthenticated clients cannot starve authenticated ones.
//!
//! Every accepted connection starts in the **pending** pool: it has not yet
//! authenticated (on HTTP, no request with a valid bearer token yet; on the Unix
//! socket, whose peers are checked by uid at once, no first message yet). A pending
//! connection
//! - must authenticate within [`Limits::auth_deadline`] of being accepted, else it is
//!   closed;
//! - gets no keep-alive: every answer to an unauthenticated request (a 401, `/healthz`,
//!   a 404) closes it;
//! - is closed to make room when the pending pool is full and a new connection
//!   arrives (oldest first): a flood of silent connections churns through the pool
//!   while a client that authenticates at once gets through.
//!
//! Authenticating moves a connection to the **authenticated** pool (at most
//! [`Limits::max_authenticated`], the configured `max_connections`), where it keeps
//! its slot for as long as it lives (a WebSocket for its whole session); when that
//! pool is full the request is answered `429`. On HTTP, [`Limits::header_timeout`]
//! bounds how long a request's headers may take and how long a kept-alive connection
//! may wait for its next request, so idle connections give their slot back.
//!
//! Every connection holds a descriptor, and running out of descriptors stops `accept`
//! itself, before any pool is full: then nothing is closed to make room and a client
//! with a token waits for the flood's deadline. So the process's connections, every
//! listener's, pending and authenticated, share one budget ([`Descriptors`]): the soft
//! limit on open files (raised to the hard limit at start,
//! [`raise_descriptor_limit`]) less a headroom for the files, pipes and commands of
//! calls. An accept loop at that budget first closes the oldest pending connection of
//! any listener and waits for its descriptor to be given back ([`Descriptors::room`]),
//! so `accept` always has one; should `accept` fail for want of descriptors all the
//! same (other files took them), the oldest pending connection is closed before it
//! tries again. Both pools of a listener are also no larger than the budget.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// How long an HTTP connection may take from being accepted to its first
/// authenticated request by default.
pub const DEFAULT_AUTH_DEADLINE: Duration = Duration::from_secs(10);

/// How long a request's headers may take by default; also how long a kept-alive
/// connection may idle between requests.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(15);

/// After shutdown starts, how long an HTTP connection may take to finish the request
/// it is serving (its calls are canceled, so this only bounds writing the answer).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Descriptors kept back from connections: a quarter of the limit, at least this many
/// (the runtime, logs, the audit log, and the files, pipes and supervisors of calls)...
const MIN_HEADROOM: u64 = 64;
/// ...and at most this many.
const MAX_HEADROOM: u64 = 4096;

/// How long an accept loop that ran out of descriptors waits before it tries again:
/// after closing a pending connection, only until that connection's task has run.
const OUT_OF_DESCRIPTORS_PAUSE: Duration = Duration::from_millis(5);
/// ...and when there was none to close.
const ACCEPT_FAILED_PAUSE: Duration = Duration::from_millis(50);

/// Raises the process's soft limit on open files to its hard limit (for the servers,
/// every face: a descriptor per connection, per open file, per pipe of a command).
/// Where that fails, the soft limit stays, and the connection budget follows it.
pub fn raise_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let Some(current) = limit.current else { return };
    if limit.maximum.is_some_and(|maximum| maximum <= current) {
        return;
    }
    let raised = Rlimit { current: limit.maximum, maximum: limit.maximum };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => crate::sandbox::keep_commands_descriptor_limit(current),
        Err(err) => {
            tracing::debug!(%err, current, "the limit on open files could not be raised");
        }
    }
}

/// How many connections a process whose soft limit on open files is `limit` keeps
/// open at once: the limit less the headroom.
pub fn connection_budget(limit: u64) -> usize {
    let headroom = (limit / 4).clamp(MIN_HEADROOM, MAX_HEADROOM);
    let budget = limit.saturating_sub(headroom).max(limit / 2).max(1);
    usize::try_from(budget).unwrap_or(usize::MAX)
}

/// The limits of one listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Authenticated connections served at once.
    pub max_authenticated: usize,
    /// Connections not authenticated yet, at once; past it the oldest is closed.
    pub max_pending: usize,
    /// From accept until the connection must have authenticated.
    pub auth_deadline: Duration,
    /// HTTP only: how long a request's headers may take, and a kept-alive connection
    /// may wait for its next request.
    pub header_timeout: Duration,
}

impl Limits {
    /// `max_connections` authenticated connections and as many pending ones (each no
    /// more than the process's connection budget), with the default deadlines.
    pub fn new(max_connections: usize) -> Limits {
        let max = max_connections.min(Descriptors::process().budget).max(1);
        Limits {
            max_authenticated: max,
            max_pending: max,
            auth_deadline: DEFAULT_AUTH_DEADLINE,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
        }
    }
}

/// The descriptors the connections of every listener of the process share.
pub struct Descriptors {
    /// Connections open at once, past which a new one closes the oldest pending one.
    budget: usize,
    shared: Mutex<Shared>,
    next_id: AtomicU64,
    /// Woken when a connection lets go of its descriptor.
    freed: tokio::sync::Notify,
}

#[derive(Default)]
struct Shared {
    /// Connections open now: pending and authenticated, every listener's.
    open: usize,
    /// Of those, the ones closed to make room whose tasks have not let go of them yet.
    closing: usize,
    /// Pending connections of every listener, oldest first.
    pending: VecDeque<Waiting>,
}

/// A pending connection.
struct Waiting {
    /// Its listener's pools.
    pool: u64,
    id: u64,
    /// Closes it.
    evicted: CancellationToken,
    /// Its listener's count of pending connections.
    count: Arc<AtomicUsize>,
}

impl Waiting {
    /// Leaves the pending pool (its connection is not closed by this).
    fn leave(self) -> CancellationToken {
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.evicted
    }
}

impl Shared {
    /// Takes connection `id` out of the pending pool, if it is there.
    fn leave(&mut self, id: u64) {
        if let Some(at) = self.pending.iter().position(|waiting| waiting.id == id)
            && let Some(waiting) = self.pending.remove(at)
        {
            waiting.leave();
        }
    }

    /// Closes the oldest pending connection (of pool `pool` only, when given); whether
    /// there was one.
    fn evict_oldest(&mut self, pool: Option<u64>) -> bool {
        let at = match pool {
            Some(pool) => self.pending.iter().position(|waiting| waiting.pool == pool),
            None => (!self.pending.is_empty()).then_some(0),
        };
        match at.and_then(|at| self.pending.remove(at)) {
            Some(oldest) => {
                oldest.leave().cancel();
                self.closing += 1;
                true
            }
            None => false,
        }
    }

    /// At `budget`, closes the oldest pending connection of any listener, unless one
    /// closed to make room is still on its way out; whether room is on its way.
    fn make_room(&mut self, budget: usize) -> bool {
        self.open >= budget && (self.closing > 0 || self.evict_oldest(None))
    }
}

impl Descriptors {
    /// Descriptors for `budget` connections at once.
    pub fn new(budget: usize) -> Arc<Descriptors> {
        Arc::new(Descriptors {
            budget: budget.max(1),
            shared: Mutex::new(Shared::default()),
            next_id: AtomicU64::new(0),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// The process's, sized by [`connection_budget`] from its soft limit on open files
    /// when first used (after [`raise_descriptor_limit`]).
    pub fn process() -> Arc<Descriptors> {
        static PROCESS: OnceLock<Arc<Descriptors>> = OnceLock::new();
        PROCESS
            .get_or_init(|| {
                let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
                Descriptors::new(connection_budget(limit.current.unwrap_or(u64::MAX)))
            })
            .clone()
    }

    /// Connections open at once before new ones close pending ones.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Connections open now, every listener's.
    pub fn open(&self) -> usize {
        self.shared().open
    }

    /// Closes the oldest pending connection of any listener (an accept failed for want
    /// of descriptors); whether there was one.
    pub fn evict_oldest(&self) -> bool {
        self.shared().evict_oldest(None)
    }

    /// Resolves when a connection may be accepted: below the budget at once; at it,
    /// once the oldest pending connection of any listener, closed to make room, has let
    /// go of its descriptor. When every open connection is authenticated there is
    /// nothing to close, and it resolves at once (the headroom takes the connection,
    /// and a full authenticated pool answers it `429`).
    pub async fn room(&self) {
        loop {
            let freed = self.freed.notified();
            let mut freed = pin!(freed);
            // Registered before the check, so that a descriptor freed after it wakes us.
            freed.as_mut().enable();
            if !self.shared().make_room(self.budget) {
                return;
            }
            freed.await;
        }
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection's descriptor, counted among the process's open connections until
/// dropped: held by the connection and by its authenticated slot (which a WebSocket
/// keeps after its connection task has handed the stream over).
struct Open {
    descriptors: Arc<Descriptors>,
    /// The connection's eviction: one closed to make room is no longer on its way out.
    evicted: CancellationToken,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut shared = self.descriptors.shared();
        shared.open = shared.open.saturating_sub(1);
        if self.evicted.is_cancelled() {
            shared.closing = shared.closing.saturating_sub(1);
        }
        drop(shared);
        self.descriptors.freed.notify_waiters();
    }
}

/// The two pools of one listener.
pub struct Pools {
    authenticated: Arc<Semaphore>,
    max_pending: usize,
    /// This listener's pending connections (they queue in `descriptors`).
    pending: Arc<AtomicUsize>,
    id: u64,
    descriptors: Arc<Descriptors>,
}

impl Pools {
    /// A listener's pools among the process's descriptors.
    pub fn new(limits: &Limits) -> Arc<Pools> {
        Pools::sharing(limits, Descriptors::process())
    }

    /// A listener's pools among `descriptors`.
    pub fn sharing(limits: &Limits, descriptors: Arc<Descriptors>) -> Arc<Pools> {
        Arc::new(Pools {
            authenticated: Arc::new(Semaphore::new(limits.max_authenticated.max(1))),
            max_pending: limits.max_pending.max(1),
            pending: Arc::new(AtomicUsize::new(0)),
            id: descriptors.next_id.fetch_add(1, Ordering::Relaxed),
            descriptors,
        })
    }

    /// Takes a new connection into the pending pool, closing the oldest pending one of
    /// this listener when its pool is full, and the oldest pending one of any listener
    /// when the process's connections are at their budget.
    pub fn admit(self: &Arc<Pools>) -> Admission {
        let descriptors = &self.descriptors;
        let id = descriptors.next_id.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        {
            let mut shared = descriptors.shared();
            while self.pending.load(Ordering::Relaxed) >= self.max_pending
                && shared.evict_oldest(Some(self.id))
            {}
            shared.make_room(descriptors.budget);
            shared.open += 1;
            self.pending.fetch_add(1, Ordering::Relaxed);
            shared.pending.push_back(Waiting {
                pool: self.id,
                id,
                evicted: evicted.clone(),
                count: self.pending.clone(),
            });
        }
        let open = Arc::new(Open { descriptors: descriptors.clone(), evicted: evicted.clone() });
        Admission(Arc::new(AdmissionInner {
            pools: self.clone(),
            id,
            evicted,
            slot: Mutex::new(None),
            open,
        }))
    }

    /// Connections waiting to authenticate.
    pub fn pending_count(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// The descriptors these pools share with the process's other listeners.
    pub fn descriptors(&self) -> &Arc<Descriptors> {
        &self.descriptors
    }
}

/// One connection's place in its listener's pools. Cheap to clone; the connection
/// leaves the pools when the last clone is dropped.
#[derive(Clone)]
pub struct Admission(Arc<AdmissionInner>);

struct AdmissionInner {
    pools: Arc<Pools>,
    id: u64,
    evicted: CancellationToken,
    slot: Mutex<Option<Slot>>,
    open: Arc<Open>,
}

impl Drop for AdmissionInner {
    fn drop(&mut self) {
        self.pools.descriptors.shared().leave(self.id);
    }
}

/// A place in the authenticated pool; held by whatever outlives the connection task
/// (a WebSocket session).
#[derive(Clone)]
pub struct Slot(#[expect(dead_code, reason = "held, never read")] Arc<Held>);

/// What an authenticated connection holds: its place, and its descriptor's count.
struct Held {
    _permit: OwnedSemaphorePermit,
    _open: Arc<Open>,
}

/// Why a connection could not join the authenticated pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    #[error("too many connections")]
    Full,
    #[error("the connection was closed to make room for newer ones")]
    Evicted,
}

impl IntoResponse for Busy {
    /// `429` with `Retry-After`, closing the connection.
    fn into_response(self) -> Response {
        (
            StatusCode::TOO_MANY_REQUESTS,
            [
                (header::RETRY_AFTER, HeaderValue::from_static("1")),
                (header::CONNECTION, HeaderValue::from_static("close")),
            ],
            "too many connections\n",
        )
            .into_response()
    }
}

impl Admission {
    /// Moves the connection to the authenticated pool (once; later calls return the
    /// same slot).
    pub fn promote(&self) -> Result<Slot, Busy> {
        let mut slot = self.0.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = slot.as_ref() {
            return Ok(slot.clone());
        }
        let mut shared = self.0.pools.descriptors.shared();
        if self.0.evicted.is_cancelled() {
            return Err(Busy::Evicted);
        }
        let permit =
            self.0.pools.authenticated.clone().try_acquire_owned().map_err(|_| Busy::Full)?;
        shared.leave(self.0.id);
        let granted = Slot(Arc::new(Held { _permit: permit, _open: self.0.open.clone() }));
        *slot = Some(granted.clone());
        Ok(granted)
    }

    /// Whether the connection has authenticated.
    pub fn is_authenticated(&self) -> bool {
        self.0.slot.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    /// The connection's authenticated slot, once it has one.
    pub fn slot(&self) -> Option<Slot> {
        self.0.slot.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Fires when the pending connection is closed to make room for a newer one.
    pub fn evicted(&self) -> &CancellationToken {
        &self.0.evicted
    }

    /// Resolves when a pending connection must be closed: evicted, or past `deadline`
    /// without having authenticated. Never resolves once it has authenticated.
    pub async fn expired(&self, deadline: Duration) {
        tokio::select! {
            () = self.0.evicted.cancelled() => {}
            () = tokio::time::sleep(deadline) => {}
        }
        // Only a pending connection is evicted; past the deadline, one that has
        // authenticated meanwhile stays.
        if self.is_authenticated() {
            std::future::pending::<()>().await;
        }
    }
}

/// The address a request came from (in the extensions of requests served by
/// [`serve_http`]), for logs.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

type HyperRequest = axum::http::Request<hyper::body::Incoming>;

/// Serves HTTP/1.1 (with upgrades, for WebSocket) on `listener` until `shutdown`,
/// then waits for its connections to finish. Every request carries its connection's
/// [`Admission`] and [`Peer`]; the authentication middleware
/// ([`crate::auth::require_bearer`]) promotes the connection. Connection tasks are
/// also tracked by `tasks`, so a caller that drops this future still finds them in
/// its shutdown wait.
pub async fn serve_http(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let pools = Pools::new(&limits);
    let connections = TaskTracker::new();
    loop {
        // A descriptor for the connection first: `accept` must not be what runs out.
        let accepted = tokio::select! {
            accepted = async {
                pools.descriptors.room().await;
                listener.accept().await
            } => accepted,
            () = shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                tracing::warn!(%err, "accept failed on an HTTP listener");
                accept_failed(&pools, &err).await;
                continue;
            }
        };
        // Something this daemon started (a command, a hook, an upstream server) is
        // never a client of it, whatever token it found.
        if let Ok(local) = stream.local_addr()
            && crate::sandbox::peers::tcp_peer_is_ours(local, peer)
        {
            tracing::warn!(%peer, "connection from a process this daemon started refused");
            continue;
        }
        // Requests and responses are small and latency-bound.
        let _ = stream.set_nodelay(true);
        let admission = pools.admit();
        let app = app.clone();
        let for_requests = admission.clone();
        let service = hyper::service::service_fn(move |request: HyperRequest| {
            let mut request = request.map(Body::new);
            request.extensions_mut().insert(for_requests.clone());
            request.extensions_mut().insert(Peer(peer));
            let app = app.clone();
            let admission = for_requests.clone();
            async move {
                let Ok(mut response) = app.oneshot(request).await;
                if !admission.is_authenticated() {
                    // Nothing is kept open for a client that has not authenticated.
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, Infallible>(response)
            }
        });
        let serving = serve_connection(stream, service, admission, limits, shutdown.clone());
        tokio::spawn(connections.track_future(tasks.track_future(serving)));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Serves one connection until it closes, its pending time runs out, or shutdown plus
/// a grace period.
async fn serve_connection<S>(
    stream: TcpStream,
    service: S,
    admission: Admission,
    limits: Limits,
    shutdown: CancellationToken,
) where
    S: hyper::service::Service<HyperRequest, Response = Response, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service).with_upgrades());
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(err) = result {
                tracing::debug!(%err, "http connection ended with an error");
            }
        }
        () = admission.expired(limits.auth_deadline) => {
            tracing::debug!("connection closed before it authenticated");
        }
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            if tokio::time::timeout(SHUTDOWN_GRACE, conn).await.is_err() {
                tracing::debug!("http connection cut at shutdown");
            }
        }
    }
}

/// After an `accept` that failed for another reason than the connection: out of
/// descriptors (which the budget should have prevented: other files took them), the
/// oldest pending connection of any listener is closed to make room; then, a pause
/// before the next try.
pub async fn accept_failed(pools: &Pools, err: &std::io::Error) {
    let out_of_descriptors = matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
    let pause = if out_of_descriptors && pools.descriptors.evict_oldest() {
        OUT_OF_DESCRIPTORS_PAUSE
    } else {
        ACCEPT_FAILED_PAUSE
    };
    tokio::time::sleep(pause).await;
}

fn is_connection_error(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pools of their own descriptors, far from their budget.
    fn pools(limits: &Limits) -> Arc<Pools> {
        Pools::sharing(limits, Descriptors::new(1000))
    }

    fn limits(authenticated: usize, pending: usize) -> Limits {
        Limits {
            max_authenticated: authenticated,
            max_pending: pending,
            auth_deadline: Duration::from_secs(60),
            header_timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_full_pending_pool_closes_its_oldest() {
        let pools = pools(&limits(4, 2));
        let first = pools.admit();
        let second = pools.admit();
        assert!(!first.evicted().is_cancelled());
        let third = pools.admit();
        assert!(first.evicted().is_cancelled());
        assert!(!second.evicted().is_cancelled() && !third.evicted().is_cancelled());
        assert_eq!(first.promote().err(), Some(Busy::Evicted));
        assert!(third.promote().is_ok());
        assert_eq!(pools.pending_count(), 1);
        drop(second);
        assert_eq!(pools.pending_count(), 0);
    }

    #[test]
    fn authenticated_slots_are_counted_apart_and_given_back() {
        let pools = pools(&limits(1, 8));
        let first = pools.admit();
        let second = pools.admit();
        let slot = first.promote().unwrap();
        assert!(first.promote().is_ok(), "promoting twice keeps the same slot");
        assert_eq!(second.promote().err(), Some(Busy::Full));
        // Pending connections do not use authenticated capacity, and the other way round.
        let others: Vec<Admission> = (0..5).map(|_| pools.admit()).collect();
        assert_eq!(pools.pending_count(), 6);
        drop(first);
        assert_eq!(second.promote().err(), Some(Busy::Full), "the WebSocket still holds it");
        drop(slot);
        assert!(second.promote().is_ok());
        drop(others);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_connection_expires_and_an_authenticated_one_does_not() {
        let pools = pools(&limits(2, 2));
        let pending = pools.admit();
        tokio::time::timeout(Duration::from_secs(2), pending.expired(Duration::from_secs(1)))
            .await
            .unwrap();
        let authenticated = pools.admit();
        authenticated.promote().unwrap();
        let waited = tokio::time::timeout(
            Duration::from_secs(5),
            authenticated.expired(Duration::from_secs(1)),
        )
        .await;
        assert!(waited.is_err());
    }

    #[test]
    fn the_process_budget_closes_the_oldest_pending_connection_of_any_listener() {
        let descriptors = Descriptors::new(4);
        let first = Pools::sharing(&limits(8, 8), descriptors.clone());
        let second = Pools::sharing(&limits(8, 8), descriptors.clone());
        let oldest = first.admit();
        let authenticated = second.admit();
        let slot = authenticated.promote().unwrap();
        let others = [second.admit(), first.admit()];
        assert_eq!(descriptors.open(), 4);
        // At the budget: the oldest pending connection goes, whichever its listener;
        // an authenticated one never does.
        let newest = second.admit();
        assert!(oldest.evicted().is_cancelled());
        assert!(!authenticated.evicted().is_cancelled());
        assert!(others.iter().all(|other| !other.evicted().is_cancelled()));
        assert!(!newest.evicted().is_cancelled());
        assert_eq!((first.pending_count(), second.pending_count()), (1, 2));
        // A descriptor counts until its connection is gone.
        assert_eq!(descriptors.open(), 5);
        drop(oldest);
        assert_eq!(descriptors.open(), 4);
        // An accept that failed for want of descriptors closes the oldest one left.
        assert!(descriptors.evict_oldest());
        assert!(others[0].evicted().is_cancelled());
        // The WebSocket's slot keeps its descriptor counted after its connection.
        drop(authenticated);
        assert_eq!(descriptors.open(), 4);
        drop(slot);
        assert_eq!(descriptors.open(), 3);
    }

    #[tokio::test]
    async fn at_the_budget_accepting_waits_for_the_oldest_pending_connection_to_go() {
        let descriptors = Descriptors::new(2);
        let pools = Pools::sharing(&limits(8, 8), descriptors.clone());
        let oldest = pools.admit();
        let newer = pools.admit();
        let room = tokio::spawn({
            let descriptors = descriptors.clone();
            async move { descriptors.room().await }
        });
        while !oldest.evicted().is_cancelled() {
            tokio::task::yield_now().await;
        }
        assert!(!newer.evicted().is_cancelled());
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!room.is_finished(), "the evicted connection still holds its descriptor");
        drop(oldest);
        room.await.unwrap();
        // Nothing to close: every connection is authenticated.
        let slot = newer.promote().unwrap();
        let _third = pools.admit().promote().unwrap();
        descriptors.room().await;
        drop(slot);
    }

    #[test]
    fn the_budget_leaves_a_headroom_of_the_limit() {
        assert_eq!(connection_budget(256), 192);
        assert_eq!(connection_budget(1024), 768);
        assert_eq!(connection_budget(1 << 20), (1 << 20) - 4096);
        assert_eq!(connection_budget(100), 50);
        assert_eq!(connection_budget(0), 1);
    }
}
