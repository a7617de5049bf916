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

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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
    /// `max_connections` authenticated connections and as many pending ones, with the
    /// default deadlines.
    pub fn new(max_connections: usize) -> Limits {
        let max = max_connections.max(1);
        Limits {
            max_authenticated: max,
            max_pending: max,
            auth_deadline: DEFAULT_AUTH_DEADLINE,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
        }
    }
}

/// The two pools of one listener.
pub struct Pools {
    authenticated: Arc<Semaphore>,
    max_pending: usize,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
}

/// Pending connections, oldest first, each with the token that closes it.
#[derive(Default)]
struct Pending {
    queue: VecDeque<(u64, CancellationToken)>,
}

impl Pools {
    pub fn new(limits: &Limits) -> Arc<Pools> {
        Arc::new(Pools {
            authenticated: Arc::new(Semaphore::new(limits.max_authenticated.max(1))),
            max_pending: limits.max_pending.max(1),
            pending: Mutex::new(Pending::default()),
            next_id: AtomicU64::new(0),
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a new connection into the pending pool, closing the oldest pending one
    /// when the pool is full.
    pub fn admit(self: &Arc<Pools>) -> Admission {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        {
            let mut pending = self.pending();
            while pending.queue.len() >= self.max_pending {
                match pending.queue.pop_front() {
                    Some((_, oldest)) => oldest.cancel(),
                    None => break,
                }
            }
            pending.queue.push_back((id, evicted.clone()));
        }
        Admission(Arc::new(AdmissionInner {
            pools: self.clone(),
            id,
            evicted,
            slot: Mutex::new(None),
        }))
    }

    /// Connections waiting to authenticate.
    pub fn pending_count(&self) -> usize {
        self.pending().queue.len()
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
}

impl Drop for AdmissionInner {
    fn drop(&mut self) {
        let id = self.id;
        self.pools.pending().queue.retain(|(queued, _)| *queued != id);
    }
}

/// A place in the authenticated pool; held by whatever outlives the connection task
/// (a WebSocket session).
#[derive(Clone)]
pub struct Slot(#[expect(dead_code, reason = "held, never read")] Arc<OwnedSemaphorePermit>);

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
        let mut pending = self.0.pools.pending();
        if self.0.evicted.is_cancelled() {
            return Err(Busy::Evicted);
        }
        let permit =
            self.0.pools.authenticated.clone().try_acquire_owned().map_err(|_| Busy::Full)?;
        let id = self.0.id;
        pending.queue.retain(|(queued, _)| *queued != id);
        let granted = Slot(Arc::new(permit));
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
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                // EMFILE and friends: log, breathe, and keep serving.
                tracing::warn!(%err, "accept failed on an HTTP listener");
                tokio::time::sleep(Duration::from_millis(50)).await;
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
        let pools = Pools::new(&limits(4, 2));
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
        let pools = Pools::new(&limits(1, 8));
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
        let pools = Pools::new(&limits(2, 2));
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
}
