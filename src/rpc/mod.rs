//! The native JSON-RPC face: the dispatch core ([`connection`]) and the transports
//! that feed it — newline-delimited JSON on a Unix socket or stdio, and WebSocket
//! (on the same Unix socket, and over TCP for remote agents).
//!
//! Invariant: transports only move frames; every method behaves the same on each.

pub mod connection;
pub mod jsonrpc;
pub mod unix;
pub mod ws;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

pub use connection::Connection;

use crate::daemon::Daemon;

/// The largest message accepted by default (a longer line is refused with an error and
/// skipped; the connection stays usable). Tool arguments are small; file contents
/// written by write_file are the largest legitimate payloads.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Serves one NDJSON connection until the peer closes it or the daemon shuts down.
pub async fn serve_lines<R, W>(
    daemon: &Arc<Daemon>,
    identity: String,
    reader: R,
    writer: W,
    max_message_bytes: usize,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (outbound, outbound_rx) = mpsc::channel(connection::OUTBOUND_CAPACITY);
    let connection = match Connection::open(daemon, identity, outbound) {
        Ok(connection) => connection,
        Err(err) => {
            tracing::warn!(%err, "connection refused");
            return;
        }
    };
    let writer_task = tokio::spawn(write_lines(writer, outbound_rx));
    let mut lines = LineReader::new(reader, max_message_bytes);
    let shutdown = daemon.shutdown_token().clone();
    loop {
        let frame = tokio::select! {
            frame = lines.next_line() => frame,
            () = shutdown.cancelled() => break,
        };
        match frame {
            Ok(Frame::Line(line)) => match std::str::from_utf8(&line) {
                Ok(text) => connection.handle_frame(text).await,
                Err(_) => {
                    let error =
                        jsonrpc::RpcError::new(jsonrpc::PARSE_ERROR, "parse error: not UTF-8");
                    connection
                        .send_line(jsonrpc::error_response(&serde_json::Value::Null, &error))
                        .await;
                }
            },
            Ok(Frame::TooLong) => {
                // The rest of the line is skipped; the connection stays usable.
                let error = jsonrpc::RpcError::new(
                    jsonrpc::INVALID_REQUEST,
                    format!("message larger than {max_message_bytes} bytes refused"),
                );
                connection
                    .send_line(jsonrpc::error_response(&serde_json::Value::Null, &error))
                    .await;
            }
            Ok(Frame::Eof) => break,
            Err(err) => {
                tracing::debug!(%err, "connection read failed");
                break;
            }
        }
    }
    // The peer is gone (or we are stopping): cancel its calls and close its sessions.
    connection.close();
    drop(connection);
    let _ = writer_task.await;
}

/// Drains a connection's outbound queue into the writer, one line per message,
/// flushing whenever the queue runs dry.
async fn write_lines<W: AsyncWrite + Unpin>(writer: W, mut lines: mpsc::Receiver<String>) {
    let mut writer = BufWriter::new(writer);
    while let Some(line) = lines.recv().await {
        if write_line(&mut writer, &line).await.is_err() {
            return;
        }
        while let Ok(line) = lines.try_recv() {
            if write_line(&mut writer, &line).await.is_err() {
                return;
            }
        }
        if writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.flush().await;
}

async fn write_line<W: AsyncWrite + Unpin>(writer: &mut W, line: &str) -> std::io::Result<()> {
    writer.write_all(line.as_bytes()).await?;
    writer.write_all(b"\n").await
}

/// One result of reading a line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    Line(Vec<u8>),
    /// A line longer than the limit; its bytes were discarded up to its newline.
    TooLong,
    Eof,
}

/// Reads newline-delimited frames with a size limit, never holding more than the limit
/// (plus one read) in memory: an oversized line is skipped, not buffered.
pub(crate) struct LineReader<R> {
    reader: R,
    buffer: Vec<u8>,
    /// Bytes of `buffer` already scanned for a newline.
    scanned: usize,
    max: usize,
    discarding: bool,
}

/// Bytes asked of the reader at a time.
const READ_CHUNK: usize = 64 * 1024;

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(reader: R, max: usize) -> LineReader<R> {
        LineReader { reader, buffer: Vec::with_capacity(8192), scanned: 0, max, discarding: false }
    }

    pub(crate) async fn next_line(&mut self) -> std::io::Result<Frame> {
        loop {
            if let Some(offset) = memchr::memchr(b'\n', &self.buffer[self.scanned..]) {
                let end = self.scanned + offset;
                let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
                line.pop();
                self.scanned = 0;
                if std::mem::take(&mut self.discarding) {
                    return Ok(Frame::TooLong);
                }
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(Frame::Line(line));
            }
            self.scanned = self.buffer.len();
            if self.buffer.len() > self.max {
                // Forget what we have; remember to report the line when it ends.
                self.buffer.clear();
                self.scanned = 0;
                self.discarding = true;
            }
            let start = self.buffer.len();
            self.buffer.resize(start + READ_CHUNK, 0);
            let read = self.reader.read(&mut self.buffer[start..]).await;
            let n = match read {
                Ok(n) => n,
                Err(err) => {
                    self.buffer.truncate(start);
                    return Err(err);
                }
            };
            self.buffer.truncate(start + n);
            if n == 0 {
                if self.discarding {
                    self.discarding = false;
                    return Ok(Frame::TooLong);
                }
                if self.buffer.is_empty() {
                    return Ok(Frame::Eof);
                }
                self.scanned = 0;
                return Ok(Frame::Line(std::mem::take(&mut self.buffer)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn line_reader_skips_oversized_lines_and_keeps_going() {
        let mut input = Vec::new();
        input.extend_from_slice(b"first\n");
        input.extend(std::iter::repeat_n(b'x', 300_000));
        input.extend_from_slice(b"\nsecond\r\nlast");
        let mut reader = LineReader::new(&input[..], 1000);
        assert_eq!(reader.next_line().await.unwrap(), Frame::Line(b"first".to_vec()));
        assert_eq!(reader.next_line().await.unwrap(), Frame::TooLong);
        assert_eq!(reader.next_line().await.unwrap(), Frame::Line(b"second".to_vec()));
        assert_eq!(reader.next_line().await.unwrap(), Frame::Line(b"last".to_vec()));
        assert_eq!(reader.next_line().await.unwrap(), Frame::Eof);
    }
}
