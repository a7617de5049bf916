//! WebSocket framing of the native protocol: one JSON-RPC message per text frame.
//!
//! Both WebSocket paths (the Unix socket's upgrade, the TCP listener's `/ws`) end in
//! [`serve_frames`], which works on any stream of text frames, so the two behave alike.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use super::{Connection, connection, jsonrpc};
use crate::daemon::Daemon;

/// How often an idle WebSocket peer is pinged; a peer that misses two pings in a row
/// is considered dead and its calls are canceled.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);

/// What a transport's WebSocket gives us, reduced to what matters.
pub enum WsIn {
    Text(String),
    Binary(Vec<u8>),
    Pong,
    Close,
    /// Pings (answered by the library) and other control frames.
    Other,
}

/// What we send.
pub enum WsOut {
    Text(String),
    Ping,
}

/// Serves a WebSocket connection until the peer closes it or stops answering pings.
pub async fn serve_frames<S, E>(
    daemon: &Arc<Daemon>,
    identity: String,
    socket: S,
    max_message_bytes: usize,
) where
    S: Stream<Item = Result<WsIn, E>> + Sink<WsOut> + Send + Unpin + 'static,
    E: std::fmt::Display,
{
    let (outbound, mut outbound_rx) = connection::outbound_queue();
    let connection = match Connection::open(daemon, identity, outbound) {
        Ok(connection) => connection,
        Err(err) => {
            tracing::warn!(%err, "websocket connection refused");
            return;
        }
    };
    let (mut sink, mut stream) = socket.split();
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    let writer_done = tokio_util::sync::CancellationToken::new();
    let done_guard = writer_done.clone().drop_guard();
    let writer = tokio::spawn(async move {
        let _done = done_guard;
        let mut ticker = tokio::time::interval(PING_INTERVAL);
        ticker.tick().await;
        let mut missed = 0u32;
        loop {
            tokio::select! {
                line = outbound_rx.recv() => match line {
                    Some(line) => if sink.send(WsOut::Text(line)).await.is_err() { return },
                    None => return,
                },
                _ = ticker.tick() => {
                    if missed >= 2 {
                        tracing::debug!("websocket peer stopped answering pings");
                        return;
                    }
                    missed += 1;
                    if sink.send(WsOut::Ping).await.is_err() { return }
                }
                Some(()) = alive_rx.recv() => missed = 0,
            }
        }
    });
    let shutdown = daemon.shutdown_token().clone();
    loop {
        let frame = tokio::select! {
            frame = stream.next() => frame,
            () = shutdown.cancelled() => break,
            () = writer_done.cancelled() => break,
        };
        let _ = alive_tx.try_send(());
        match frame {
            None | Some(Ok(WsIn::Close)) => break,
            Some(Err(err)) => {
                tracing::debug!(%err, "websocket read failed");
                break;
            }
            Some(Ok(WsIn::Text(text))) => {
                if text.len() > max_message_bytes {
                    let error = jsonrpc::too_large(max_message_bytes);
                    connection
                        .send_line(jsonrpc::error_response(&serde_json::Value::Null, &error))
                        .await;
                    continue;
                }
                connection.handle_frame(&text).await;
            }
            Some(Ok(WsIn::Binary(bytes))) => match String::from_utf8(bytes) {
                Ok(text) => connection.handle_frame(&text).await,
                Err(_) => {
                    let error = jsonrpc::not_utf8();
                    connection
                        .send_line(jsonrpc::error_response(&serde_json::Value::Null, &error))
                        .await;
                }
            },
            Some(Ok(WsIn::Pong | WsIn::Other)) => {}
        }
    }
    connection.close();
    drop(connection);
    writer.abort();
}

/// Completes the HTTP upgrade on a raw stream (the Unix socket) and serves it.
pub async fn serve_upgrade<S>(
    daemon: &Arc<Daemon>,
    stream: S,
    identity: String,
    max_message_bytes: usize,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

    let config = WebSocketConfig::default()
        .max_message_size(Some(max_message_bytes.saturating_add(1)))
        .max_frame_size(Some(max_message_bytes.saturating_add(1)));
    let socket = match tokio_tungstenite::accept_async_with_config(stream, Some(config)).await {
        Ok(socket) => socket,
        Err(err) => {
            tracing::debug!(%err, "websocket handshake failed");
            return;
        }
    };
    let socket = socket
        .map(|message| {
            message.map(|message| match message {
                Message::Text(text) => WsIn::Text(text.to_string()),
                Message::Binary(bytes) => WsIn::Binary(bytes.to_vec()),
                Message::Pong(_) => WsIn::Pong,
                Message::Close(_) => WsIn::Close,
                Message::Ping(_) | Message::Frame(_) => WsIn::Other,
            })
        })
        .with(|out: WsOut| {
            futures::future::ok::<Message, tokio_tungstenite::tungstenite::Error>(match out {
                WsOut::Text(text) => Message::text(text),
                WsOut::Ping => Message::Ping(Default::default()),
            })
        });
    serve_frames(daemon, identity, Box::pin(socket), max_message_bytes).await;
}

/// A stream with some bytes already read from it put back in front.
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    offset: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Prefixed<S> {
        Prefixed { prefix, offset: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.offset < self.prefix.len() {
            let remaining = &self.prefix[self.offset..];
            let n = remaining.len().min(buf.remaining());
            buf.put_slice(&remaining[..n]);
            self.offset += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
