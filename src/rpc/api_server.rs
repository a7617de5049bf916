//! The native API served by jsonrpsee: [`DaemonApi`] implements the definition's
//! server trait ([`super::api::NativeApiServer`]) over the daemon's client API, and
//! [`Requests`] is the JSON-RPC layer (tower style) that gives every request what the
//! hand-written dispatch core gives it: the connection's [`Scope`], a cancel token
//! (`$/cancelRequest` and `notifications/cancelled` fire it), the request id as the
//! default call id, and a bound on requests in flight.
//!
//! A face serving through it puts an `Arc<Scope>` into each HTTP request's extensions
//! (one per POST, one per WebSocket for its whole life); jsonrpsee hands those
//! extensions to every method.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use jsonrpsee::core::middleware::{Batch, BatchEntry, Notification, RpcServiceT};
use jsonrpsee::core::server::{BatchResponseBuilder, MethodResponse};
use jsonrpsee::types::{ErrorObjectOwned, Request};
use jsonrpsee::{Extensions, PendingSubscriptionSink, SubscriptionMessage};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::api::{NativeApiServer, NoParams, rpc_error};
use super::connection::{MAX_BATCH_CALLS, MAX_REQUESTS_IN_FLIGHT};
use super::jsonrpc;
use crate::agent::{ApprovalAnswer, Event};
use crate::daemon::events::Subscriber;
use crate::daemon::{Client, Daemon, SessionError};
use crate::protocol::*;
use crate::tools::Call;

/// One connection of a jsonrpsee-served face: the daemon's client (its identity and
/// sessions) and its requests in flight. Dropping the last reference ends the
/// connection: its requests are canceled, its sessions closed.
pub struct Scope {
    client: Client,
    closed: CancellationToken,
    /// Running requests by JSON-RPC id, for `$/cancelRequest`; the number tells a
    /// request from a later one that reused its id.
    requests: DashMap<String, (u64, CancellationToken)>,
    next_request: AtomicU64,
    limiter: Arc<Semaphore>,
}

impl Scope {
    /// A connection with its default session, for `identity`.
    pub fn open(daemon: &Arc<Daemon>, identity: impl Into<String>) -> Result<Scope, SessionError> {
        Ok(Scope {
            client: Client::open(daemon, identity)?,
            closed: daemon.shutdown_token().child_token(),
            requests: DashMap::new(),
            next_request: AtomicU64::new(0),
            limiter: Arc::new(Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
        })
    }

    /// Ends the connection now: its requests are canceled, its sessions closed.
    pub fn close(&self) {
        self.closed.cancel();
        self.client.close();
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        self.close();
    }
}

/// Subscription ids as every native face names them (`sub-` and a number unique in
/// the daemon), for jsonrpsee's server.
#[derive(Debug, Default)]
pub struct SubscriptionIds(AtomicU64);

impl jsonrpsee::core::traits::IdProvider for SubscriptionIds {
    fn next_id(&self) -> jsonrpsee::types::SubscriptionId<'static> {
        let number = self.0.fetch_add(1, Ordering::Relaxed);
        jsonrpsee::types::SubscriptionId::Str(format!("sub-{number}").into())
    }
}

/// What [`Requests`] puts into one request's extensions.
#[derive(Clone)]
struct RequestContext {
    /// The request id as text: the default call id.
    id: String,
    cancel: CancellationToken,
}

/// The native API over the daemon's client API; stateless, the connection is the
/// request's [`Scope`].
#[derive(Clone, Copy, Debug, Default)]
pub struct DaemonApi;

fn scope(extensions: &Extensions) -> Result<&Arc<Scope>, ErrorObjectOwned> {
    extensions
        .get::<Arc<Scope>>()
        .ok_or_else(|| rpc_error(jsonrpc::INTERNAL_ERROR, "no connection for this request"))
}

fn context(extensions: &Extensions) -> Result<(&Arc<Scope>, RequestContext), ErrorObjectOwned> {
    let scope = scope(extensions)?;
    let context = extensions.get::<RequestContext>().cloned().unwrap_or_else(|| RequestContext {
        id: "call".to_owned(),
        cancel: scope.closed.child_token(),
    });
    Ok((scope, context))
}

fn session_error(err: SessionError) -> ErrorObjectOwned {
    rpc_error(jsonrpc::INVALID_PARAMS, err.to_string())
}

fn call_of(call_id: String, name: String, arguments: &Value) -> Call {
    match arguments {
        Value::String(raw) => Call::new(call_id, name, raw.clone()),
        other => Call::from_value(call_id, name, other),
    }
}

#[async_trait::async_trait]
impl NativeApiServer for DaemonApi {
    async fn session_open(
        &self,
        extensions: &Extensions,
        params: SessionOpenParams,
    ) -> Result<SessionOpenResult, ErrorObjectOwned> {
        let state =
            scope(extensions)?.client.open_session(&params.spec()).map_err(session_error)?;
        Ok(SessionInfo::from(state))
    }

    async fn session_update(
        &self,
        extensions: &Extensions,
        params: SessionUpdateParams,
    ) -> Result<SessionUpdateResult, ErrorObjectOwned> {
        let client = &scope(extensions)?.client;
        let state =
            client.update(params.session_id.as_deref(), &params.spec()).map_err(session_error)?;
        Ok(SessionInfo::from(state))
    }

    async fn session_close(
        &self,
        extensions: &Extensions,
        params: SessionCloseParams,
    ) -> Result<SessionCloseResult, ErrorObjectOwned> {
        let closed =
            scope(extensions)?.client.close_session(&params.session_id).map_err(session_error)?;
        Ok(SessionCloseResult { closed })
    }

    async fn tools_list(
        &self,
        extensions: &Extensions,
        params: ToolsListParams,
    ) -> Result<ToolsListResult, ErrorObjectOwned> {
        let (tools, sources) =
            scope(extensions)?.client.list(params.session_id.as_deref()).map_err(session_error)?;
        Ok(ToolsListResult { tools, sources })
    }

    async fn tools_call(
        &self,
        extensions: &Extensions,
        params: ToolsCallParams,
    ) -> Result<ToolsCallResult, ErrorObjectOwned> {
        let (scope, context) = context(extensions)?;
        let call_id = params.call_id.unwrap_or(context.id);
        let call = call_of(call_id, params.name, &params.arguments);
        let result = scope
            .client
            .call(params.session_id.as_deref(), call, &context.cancel)
            .await
            .map_err(session_error)?;
        Ok(Arc::unwrap_or_clone(result))
    }

    async fn tools_call_batch(
        &self,
        extensions: &Extensions,
        params: ToolsCallBatchParams,
    ) -> Result<ToolsCallBatchResult, ErrorObjectOwned> {
        let (scope, context) = context(extensions)?;
        if params.calls.len() > MAX_BATCH_CALLS {
            return Err(rpc_error(
                jsonrpc::SERVER_BUSY,
                format!("a batch holds at most {MAX_BATCH_CALLS} calls"),
            ));
        }
        let calls: Vec<Call> = params
            .calls
            .iter()
            .map(|call| call_of(call.id.clone(), call.name.clone(), &call.arguments))
            .collect();
        let results = scope
            .client
            .batch(params.session_id.as_deref(), &calls, &context.cancel)
            .await
            .map_err(session_error)?;
        Ok(ToolsCallBatchResult { results })
    }

    async fn tools_cancel(
        &self,
        extensions: &Extensions,
        params: ToolsCancelParams,
    ) -> Result<ToolsCancelResult, ErrorObjectOwned> {
        let canceled = scope(extensions)?
            .client
            .cancel(params.session_id.as_deref(), &params.call_id)
            .map_err(session_error)?;
        Ok(ToolsCancelResult { canceled })
    }

    async fn tools_explain(
        &self,
        extensions: &Extensions,
        params: ToolsExplainParams,
    ) -> Result<ToolsExplainResult, ErrorObjectOwned> {
        let call = call_of("explain".to_owned(), params.name, &params.arguments);
        let (decision, explanation, layers) = scope(extensions)?
            .client
            .explain(params.session_id.as_deref(), &call)
            .map_err(session_error)?;
        Ok(ToolsExplainResult { decision, explanation, layers })
    }

    async fn events_unsubscribe(
        &self,
        extensions: &Extensions,
        params: EventsUnsubscribeParams,
    ) -> Result<bool, ErrorObjectOwned> {
        Ok(scope(extensions)?.client.unsubscribe(&params.subscription))
    }

    async fn permission_respond(
        &self,
        extensions: &Extensions,
        params: PermissionRespondParams,
    ) -> Result<PermissionRespondResult, ErrorObjectOwned> {
        let answer = ApprovalAnswer {
            decision: params.decision,
            scope: params.scope,
            reason: params.reason,
        };
        match scope(extensions)?.client.respond(&params.request_id, answer) {
            Ok(resolved) => Ok(PermissionRespondResult { resolved }),
            Err(_) => Err(rpc_error(
                jsonrpc::INVALID_PARAMS,
                "that request belongs to a session of another connection",
            )),
        }
    }

    async fn daemon_status(
        &self,
        extensions: &Extensions,
        _params: NoParams,
    ) -> Result<DaemonStatusResult, ErrorObjectOwned> {
        Ok(DaemonStatusResult::from(scope(extensions)?.client.status()))
    }

    async fn events_subscribe(
        &self,
        extensions: Extensions,
        params: EventsSubscribeParams,
        pending: PendingSubscriptionSink,
    ) {
        let scope = match scope(&extensions) {
            Ok(scope) => scope.clone(),
            Err(error) => return pending.reject(error).await,
        };
        drop(extensions);
        let entry = match scope.client.session(params.session_id.as_deref()) {
            Ok(entry) if entry.events.is_some() => entry,
            Ok(_) => return pending.reject(session_error(SessionError::NotSubscribable)).await,
            Err(err) => return pending.reject(session_error(err)).await,
        };
        // The response reaches the client before the backlog: accept, then subscribe.
        let Ok(sink) = pending.accept().await else { return };
        let subscription = match sink.subscription_id() {
            jsonrpsee::types::SubscriptionId::Num(number) => number.to_string(),
            jsonrpsee::types::SubscriptionId::Str(text) => text.into_owned(),
        };
        let subscriber = Arc::new(Sink(Mutex::new(sink)));
        if let Err(err) = scope.client.subscribe(&entry, subscription, subscriber) {
            tracing::debug!(%err, "subscription refused after it was accepted");
        }
    }
}

/// Delivers a subscription's events through jsonrpsee's bounded connection buffer; a
/// full buffer loses the event (counted by the hub), as on the hand-written faces.
struct Sink(Mutex<jsonrpsee::SubscriptionSink>);

impl Subscriber for Sink {
    fn deliver(&self, _subscription: &str, event: &Event) -> bool {
        let Ok(json) = serde_json::value::to_raw_value(event) else { return false };
        let Ok(mut sink) = self.0.lock() else { return false };
        sink.try_send(SubscriptionMessage::from(json)).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.0.lock().map_or(true, |sink| sink.is_closed())
    }
}

/// The JSON-RPC layer in front of [`DaemonApi`]: each request of a connection gets a
/// cancel token registered under its id, its id as the default call id, and a place
/// among the connection's [`MAX_REQUESTS_IN_FLIGHT`]; `$/cancelRequest` and
/// `notifications/cancelled` cancel by id. Elements of a batch run at the same time,
/// answered in order.
#[derive(Clone)]
pub struct Requests<S> {
    inner: S,
}

/// The [`Requests`] layer, for `RpcServiceBuilder::layer`.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestsLayer;

impl<S> tower::Layer<S> for RequestsLayer {
    type Service = Requests<S>;

    fn layer(&self, inner: S) -> Requests<S> {
        Requests { inner }
    }
}

impl<S> Requests<S>
where
    S: RpcServiceT<
            MethodResponse = MethodResponse,
            BatchResponse = MethodResponse,
            NotificationResponse = MethodResponse,
        > + Clone
        + Send
        + Sync
        + 'static,
{
    async fn run(inner: S, mut request: Request<'_>) -> MethodResponse {
        let Some(scope) = request.extensions.get::<Arc<Scope>>().cloned() else {
            return inner.call(request).await;
        };
        // At the limit, this request waits for one in flight to end.
        let Ok(_permit) = scope.limiter.clone().acquire_owned().await else {
            return inner.call(request).await;
        };
        let key = serde_json::to_string(&request.id).unwrap_or_default();
        let id = match &request.id {
            jsonrpsee::types::Id::Str(text) => text.to_string(),
            jsonrpsee::types::Id::Number(number) => number.to_string(),
            jsonrpsee::types::Id::Null => "null".to_owned(),
        };
        let cancel = scope.closed.child_token();
        let number = scope.next_request.fetch_add(1, Ordering::Relaxed);
        scope.requests.insert(key.clone(), (number, cancel.clone()));
        request.extensions.insert(RequestContext { id, cancel });
        let response = inner.call(request).await;
        scope.requests.remove_if(&key, |_, (registered, _)| *registered == number);
        response
    }
}

impl<S> RpcServiceT for Requests<S>
where
    S: RpcServiceT<
            MethodResponse = MethodResponse,
            BatchResponse = MethodResponse,
            NotificationResponse = MethodResponse,
        > + Clone
        + Send
        + Sync
        + 'static,
{
    type MethodResponse = MethodResponse;
    type BatchResponse = MethodResponse;
    type NotificationResponse = MethodResponse;

    fn call<'a>(&self, request: Request<'a>) -> impl Future<Output = MethodResponse> + Send + 'a {
        Self::run(self.inner.clone(), request)
    }

    fn batch<'a>(&self, batch: Batch<'a>) -> impl Future<Output = MethodResponse> + Send + 'a {
        let this = self.clone();
        async move {
            let mut notified = false;
            let mut answers = Vec::new();
            for entry in batch {
                match entry {
                    Ok(BatchEntry::Call(request)) => {
                        answers.push(futures::future::Either::Left(Self::run(
                            this.inner.clone(),
                            request,
                        )));
                    }
                    Ok(BatchEntry::Notification(notification)) => {
                        notified = true;
                        this.notification(notification).await;
                    }
                    Err(err) => {
                        let (error, id) = err.into_parts();
                        answers.push(futures::future::Either::Right(std::future::ready(
                            MethodResponse::error(id, error),
                        )));
                    }
                }
            }
            if answers.is_empty() && notified {
                return MethodResponse::notification();
            }
            let mut builder = BatchResponseBuilder::new_with_limit(usize::MAX);
            for answer in futures::future::join_all(answers).await {
                if let Err(too_large) = builder.append(answer) {
                    return too_large;
                }
            }
            MethodResponse::from_batch(builder.finish())
        }
    }

    fn notification<'a>(
        &self,
        notification: Notification<'a>,
    ) -> impl Future<Output = MethodResponse> + Send + 'a {
        if matches!(
            notification.method_name(),
            method::CANCEL_REQUEST | method::NOTIFICATIONS_CANCELLED
        ) && let Some(scope) = notification.extensions.get::<Arc<Scope>>()
            && let Some(params) = notification.params.as_ref()
            && let Ok(params) = serde_json::from_str::<CancelRequestParams>(params.get())
            && let Some(id) = params.id.or(params.request_id)
            && let Some(entry) = scope.requests.get(&id.to_string())
        {
            entry.1.cancel();
        }
        self.inner.notification(notification)
    }
}
