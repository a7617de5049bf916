//! The native JSON-RPC face: the dispatch core ([`connection`]) and the transports
//! that feed it — newline-delimited JSON on a Unix socket or stdio, and WebSocket
//! (on the same Unix socket, and over TCP for remote agents).
//!
//! Invariant: transports only move frames; every method behaves the same on each.

pub mod connection;
pub mod jsonrpc;
pub mod tcp;
pub mod unix;
pub mod ws;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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

/// Drains a connection's outbound queue into the writer, one line per message. A lone
/// line goes out in one write; lines that queued up meanwhile are gathered (up to
/// [`WRITE_BATCH`] bytes) into one. Nothing is kept between writes, so an idle
/// connection holds no write buffer.
async fn write_lines<W: AsyncWrite + Unpin>(mut writer: W, mut lines: mpsc::Receiver<String>) {
    while let Some(mut line) = lines.recv().await {
        line.push('\n');
        let written = if lines.is_empty() {
            writer.write_all(line.as_bytes()).await
        } else {
            let mut batch = line.into_bytes();
            while batch.len() < WRITE_BATCH {
                let Ok(next) = lines.try_recv() else { break };
                batch.extend_from_slice(next.as_bytes());
                batch.push(b'\n');
            }
            writer.write_all(&batch).await
        };
        // A no-op on sockets; stdout needs it to hand the bytes on.
        if written.is_err() || (lines.is_empty() && writer.flush().await.is_err()) {
            return;
        }
    }
    let _ = writer.flush().await;
}

/// How many bytes of queued lines are gathered into one write: enough to carry a burst
/// of events in one system call, small enough not to hold a large copy.
const WRITE_BATCH: usize = 64 * 1024;

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
///
/// The buffer starts small and grows (doubling) only as long lines need it, and goes
/// back to its initial size once a large message has been consumed: an idle
/// connection costs a few KiB, not the largest message it ever sent. Reads go into the
/// buffer's spare capacity, so nothing is zero-filled.
pub(crate) struct LineReader<R> {
    reader: R,
    buffer: Vec<u8>,
    /// Start of the bytes not yet returned.
    start: usize,
    /// Bytes from `start` already scanned for a newline.
    scanned: usize,
    max: usize,
    discarding: bool,
}

/// The buffer of a new or idle connection: a request line is usually well under 1 KiB,
/// so this holds several pipelined requests without growing.
const INITIAL_BUFFER: usize = 4 * 1024;
/// A buffer grown past this is given back once the large message is consumed.
const SHRINK_ABOVE: usize = 64 * 1024;
/// Below this much spare room, the buffer grows before the next read, so that a read
/// always has space for a useful amount.
const MIN_READ: usize = 1024;

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(reader: R, max: usize) -> LineReader<R> {
        LineReader {
            reader,
            buffer: Vec::with_capacity(INITIAL_BUFFER),
            start: 0,
            scanned: 0,
            max,
            discarding: false,
        }
    }

    pub(crate) async fn next_line(&mut self) -> std::io::Result<Frame> {
        loop {
            let unscanned = &self.buffer[self.start + self.scanned..];
            if let Some(offset) = memchr::memchr(b'\n', unscanned) {
                let end = self.start + self.scanned + offset;
                let line_start = std::mem::replace(&mut self.start, end + 1);
                self.scanned = 0;
                let discarded = std::mem::take(&mut self.discarding);
                let mut line = &self.buffer[line_start..end];
                if line.last() == Some(&b'\r') {
                    line = &line[..line.len() - 1];
                }
                let frame = if discarded || line.len() > self.max {
                    Frame::TooLong
                } else {
                    Frame::Line(line.to_vec())
                };
                self.reclaim();
                return Ok(frame);
            }
            self.scanned = self.buffer.len() - self.start;
            if self.scanned > self.max {
                // Forget what we have; remember to report the line when it ends.
                self.buffer.clear();
                self.start = 0;
                self.scanned = 0;
                self.discarding = true;
            }
            self.make_room();
            let n = self.reader.read_buf(&mut self.buffer).await?;
            if n == 0 {
                let rest = &self.buffer[self.start..];
                let frame = if std::mem::take(&mut self.discarding) || rest.len() > self.max {
                    Frame::TooLong
                } else if rest.is_empty() {
                    Frame::Eof
                } else {
                    Frame::Line(rest.to_vec())
                };
                self.buffer.clear();
                self.start = 0;
                self.scanned = 0;
                return Ok(frame);
            }
        }
    }

    /// Moves the unreturned bytes to the front and ensures spare room for a read.
    fn make_room(&mut self) {
        if self.start > 0 {
            self.buffer.copy_within(self.start.., 0);
            self.buffer.truncate(self.buffer.len() - self.start);
            self.start = 0;
        }
        if self.buffer.capacity() - self.buffer.len() < MIN_READ {
            self.buffer.reserve(self.buffer.len().max(INITIAL_BUFFER));
        }
    }

    /// Once everything is returned, rewinds the buffer, and shrinks it if a large
    /// message made it grow.
    fn reclaim(&mut self) {
        if self.start < self.buffer.len() {
            return;
        }
        self.buffer.clear();
        self.start = 0;
        if self.buffer.capacity() > SHRINK_ABOVE {
            self.buffer = Vec::with_capacity(INITIAL_BUFFER);
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

    #[tokio::test]
    async fn write_lines_writes_every_line_in_order_then_flushes() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let (outbound, queue) = mpsc::channel(16);
        for index in 0..10 {
            outbound.send(format!("{{\"n\":{index}}}")).await.unwrap();
        }
        drop(outbound);
        write_lines(client, queue).await;
        let mut written = String::new();
        server.read_to_string(&mut written).await.unwrap();
        let expected: String = (0..10).map(|index| format!("{{\"n\":{index}}}\n")).collect();
        assert_eq!(written, expected);
    }

    #[tokio::test]
    async fn line_reader_refuses_a_long_line_that_arrives_in_one_read() {
        let mut input = b"ok\n".to_vec();
        input.extend(std::iter::repeat_n(b'y', 50));
        input.extend_from_slice(b"\nfine\n");
        let mut reader = LineReader::new(&input[..], 10);
        assert_eq!(reader.next_line().await.unwrap(), Frame::Line(b"ok".to_vec()));
        assert_eq!(reader.next_line().await.unwrap(), Frame::TooLong);
        assert_eq!(reader.next_line().await.unwrap(), Frame::Line(b"fine".to_vec()));
        assert_eq!(reader.next_line().await.unwrap(), Frame::Eof);
    }

    #[tokio::test]
    async fn line_reader_reads_lines_split_across_reads_and_shrinks_after_a_large_one() {
        let (mut client, server) = tokio::io::duplex(512);
        let big = "z".repeat(200_000);
        let writer = tokio::spawn(async move {
            client.write_all(b"par").await.unwrap();
            client.write_all(b"tial\n").await.unwrap();
            client.write_all(big.as_bytes()).await.unwrap();
            client.write_all(b"\nsmall\n").await.unwrap();
        });
        let mut reader = LineReader::new(server, 1 << 20);
        assert_eq!(reader.next_line().await.unwrap(), Frame::Line(b"partial".to_vec()));
        match reader.next_line().await.unwrap() {
            Frame::Line(line) => assert_eq!(line.len(), 200_000),
            other => panic!("expected the large line, got {other:?}"),
        }
        assert_eq!(reader.next_line().await.unwrap(), Frame::Line(b"small".to_vec()));
        assert!(reader.buffer.capacity() <= SHRINK_ABOVE, "{}", reader.buffer.capacity());
        writer.await.unwrap();
        assert_eq!(reader.next_line().await.unwrap(), Frame::Eof);
    }
}
