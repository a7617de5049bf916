//! The native JSON-RPC face: the dispatch core ([`connection`]) and the transports
//! that feed it — newline-delimited JSON on a Unix socket or stdio, and WebSocket
//! (on the same Unix socket, and over TCP for remote agents).
//!
//! Invariant: transports only move frames; every method behaves the same on each.

pub mod api;
pub mod connection;
pub mod jsonrpc;
pub mod memory;
pub mod requests;
pub mod tcp;
pub mod unix;
pub mod ws;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use connection::Connection;

use crate::daemon::Daemon;
use crate::tools::scratch;

pub use crate::protocol::DEFAULT_MAX_MESSAGE_BYTES;

/// Serves one NDJSON connection until the peer closes it or the daemon shuts down.
///
/// One task does a connection's work: it reads requests, answers those that complete
/// without waiting (most calls) on the spot, and writes every line the client must
/// receive. Requests already read are answered before the next read, and their
/// answers leave in one write. Calls that wait (for a process, an approval, the
/// blocking pool) continue in tasks of their own and answer through the connection's
/// queue, as events do; reading goes on while they run. So do small `tools/call`s
/// read with more requests behind them (a pipelining client), so that its calls run
/// on every core rather than one after the other on this task.
pub async fn serve_lines<R, W>(
    daemon: &Arc<Daemon>,
    identity: String,
    reader: R,
    mut writer: W,
    max_message_bytes: usize,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (outbound, mut queued) = connection::outbound_queue();
    let connection = match Connection::open(daemon, identity, outbound) {
        Ok(connection) => connection,
        Err(err) => {
            tracing::warn!(%err, "connection refused");
            return;
        }
    };
    let mut lines = LineReader::new(reader, max_message_bytes);
    let mut out = Outgoing::default();
    let shutdown = daemon.shutdown_token().clone();
    loop {
        // Every complete line already read, answered in order, without I/O. At the
        // limit of requests in flight, reading waits, but writing goes on: the
        // requests in flight may need room in the queue to finish.
        while out.has_room() && connection.has_capacity() {
            let pipelined = lines.holds_two_lines();
            let Some(line) = lines.buffered() else { break };
            if let Some(answer) = answer_line(&connection, line, pipelined, max_message_bytes).await
            {
                // What the call emitted meanwhile (its events) goes first, as it
                // would for a call answered from its own task.
                out.take_queued(&mut queued);
                out.push(answer);
            }
        }
        out.take_queued(&mut queued);
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            written = writer.write(out.unwritten()), if !out.is_empty() => match written {
                Ok(n) if n > 0 => {
                    if out.advance(n) && writer.flush().await.is_err() {
                        break;
                    }
                }
                _ => break,
            },
            line = queued.recv(), if out.has_room() => match line {
                Some(line) => out.push(line),
                None => break,
            },
            () = connection.capacity(), if !connection.has_capacity() => {}
            more = lines.fill(), if out.has_room() && connection.has_capacity() => match more {
                Ok(true) => {}
                Ok(false) => {
                    // End of input: a last line without its newline still counts.
                    let answer = match lines.rest() {
                        Some(line) => {
                            answer_line(&connection, line, false, max_message_bytes).await
                        }
                        None => None,
                    };
                    if let Some(answer) = answer {
                        out.take_queued(&mut queued);
                        out.push(answer);
                    }
                    break;
                }
                Err(err) => {
                    tracing::debug!(%err, "connection read failed");
                    break;
                }
            },
        }
    }
    // The peer is gone (or we are stopping): cancel its calls and close its sessions,
    // then deliver what they still answer, until the last of them lets go of the queue.
    connection.settle_hand_offs().await;
    connection.close();
    drop(connection);
    drop(lines);
    // However the drain below ends, what the connection held goes back to the system.
    let _release = memory::ReleaseOnDrop;
    loop {
        out.take_queued(&mut queued);
        if !out.is_empty() {
            match writer.write(out.unwritten()).await {
                Ok(n) if n > 0 => {
                    out.advance(n);
                    continue;
                }
                _ => return,
            }
        }
        let _ = writer.flush().await;
        match queued.recv().await {
            Some(line) => out.push(line),
            None => return,
        }
    }
}

/// Handles one line read from the client; the answer when it is ready at once.
/// `pipelined`: more lines wait behind this one.
async fn answer_line(
    connection: &Arc<Connection>,
    line: Line<'_>,
    pipelined: bool,
    max_message_bytes: usize,
) -> Option<String> {
    let error = match line {
        Line::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) if pipelined => return connection.handle_pipelined_line(text).await,
            Ok(text) => return connection.handle_line(text).await,
            Err(_) => jsonrpc::not_utf8(),
        },
        Line::TooLong => jsonrpc::too_large(max_message_bytes),
    };
    Some(jsonrpc::error_response(&serde_json::Value::Null, &error))
}

/// Lines waiting to be written to one connection, newline-terminated, in order.
#[derive(Default)]
struct Outgoing {
    bytes: Vec<u8>,
    /// How much of `bytes` the peer already has.
    written: usize,
}

impl Outgoing {
    fn is_empty(&self) -> bool {
        self.written == self.bytes.len()
    }

    /// Whether more may be read and queued: past [`WRITE_BATCH`] bytes waiting, the
    /// connection stops reading until the client takes them (backpressure).
    fn has_room(&self) -> bool {
        self.bytes.len() - self.written < WRITE_BATCH
    }

    /// Takes a line to write; the buffers it leaves go back to [`scratch::LINES`]
    /// for the next answers.
    fn push(&mut self, line: String) {
        if self.bytes.is_empty() {
            // The common case (one answer at a time) moves the line, without a copy.
            let emptied = std::mem::replace(&mut self.bytes, line.into_bytes());
            scratch::LINES.give_back(emptied);
        } else {
            // Answers pile up (pipelined calls, events): a batch buffer, with room for
            // the whole batch and the line that ends it, rather than doubling (and
            // copying what is there) on the way.
            let needed = line.len() + 1;
            if self.bytes.capacity() - self.bytes.len() < needed && self.written > 0 {
                // What the client already has makes room first.
                self.bytes.drain(..self.written);
                self.written = 0;
            }
            if self.bytes.capacity() - self.bytes.len() < needed {
                if self.bytes.capacity() < WRITE_BATCH {
                    let mut batch = BATCHES.take(BATCH_CAPACITY.max(self.bytes.len() + needed));
                    batch.extend_from_slice(&self.bytes);
                    scratch::LINES.give_back(std::mem::replace(&mut self.bytes, batch));
                } else {
                    self.bytes.reserve(needed);
                }
            }
            self.bytes.extend_from_slice(line.as_bytes());
            scratch::LINES.give_back(line.into_bytes());
        }
        self.bytes.push(b'\n');
    }

    /// Moves lines waiting in the queue here, while there is room.
    fn take_queued(&mut self, queued: &mut connection::OutboundQueue) {
        while self.has_room() {
            match queued.try_recv() {
                Some(line) => self.push(line),
                None => return,
            }
        }
    }

    fn unwritten(&self) -> &[u8] {
        &self.bytes[self.written..]
    }

    /// Records `n` more bytes written; true once everything is. The buffer is then
    /// emptied; a batch buffer goes back to [`BATCHES`] for the next batch (a larger
    /// one, grown for a long answer, is freed), so that an idle connection holds no
    /// large write buffer.
    fn advance(&mut self, n: usize) -> bool {
        self.written += n;
        if self.written < self.bytes.len() {
            return false;
        }
        self.written = 0;
        if self.bytes.capacity() >= WRITE_BATCH {
            BATCHES.give_back(std::mem::take(&mut self.bytes));
        } else {
            self.bytes.clear();
        }
        true
    }
}

/// How many bytes of answers may wait for the client before the connection stops
/// reading: enough to carry a burst of answers and events in one system call, small
/// enough not to hold a large copy.
const WRITE_BATCH: usize = 64 * 1024;

/// Room of a batch buffer: a full batch and the answer that crosses its end (answers
/// are a few KiB; a longer one grows the buffer once).
const BATCH_CAPACITY: usize = WRITE_BATCH + WRITE_BATCH / 2;

/// Batch buffers between batches, whichever connection fills them next. A pipelining
/// client would otherwise cost each batch a buffer grown to past 64 KiB, copied on
/// the way and freed once written, and freeing a block that large also makes the
/// allocator merge its small free blocks and give memory back to the system.
static BATCHES: scratch::Spares = scratch::Spares::new(2, BATCH_CAPACITY);

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

/// A line found in a [`LineReader`]'s buffer, borrowed until the next call.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    Text(&'a [u8]),
    /// A line longer than the limit; its bytes were discarded up to its newline.
    TooLong,
}

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

    /// Whether at least two whole lines wait in the buffer (the client pipelines).
    /// Scans only what [`LineReader::buffered`] has not scanned yet (none of it holds
    /// a newline), so that a long line arriving in many reads is not scanned again
    /// on every read.
    pub(crate) fn holds_two_lines(&self) -> bool {
        let unscanned = &self.buffer[self.start + self.scanned..];
        memchr::memchr_iter(b'\n', unscanned).nth(1).is_some()
    }

    /// The next complete line already in the buffer, without reading. An oversized
    /// line being discarded is forgotten as it arrives.
    pub(crate) fn buffered(&mut self) -> Option<Line<'_>> {
        self.reclaim();
        let unscanned = &self.buffer[self.start + self.scanned..];
        let Some(offset) = memchr::memchr(b'\n', unscanned) else {
            self.scanned = self.buffer.len() - self.start;
            if self.scanned > self.max {
                // Forget what we have; remember to report the line when it ends.
                self.buffer.clear();
                self.start = 0;
                self.scanned = 0;
                self.discarding = true;
            }
            return None;
        };
        let end = self.start + self.scanned + offset;
        let line_start = std::mem::replace(&mut self.start, end + 1);
        self.scanned = 0;
        let discarded = std::mem::take(&mut self.discarding);
        let mut line = &self.buffer[line_start..end];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        if discarded || line.len() > self.max {
            return Some(Line::TooLong);
        }
        Some(Line::Text(line))
    }

    /// Reads once into the buffer; false at the end of the input. Cancel-safe: what
    /// a read delivered is kept.
    pub(crate) async fn fill(&mut self) -> std::io::Result<bool> {
        self.make_room();
        Ok(self.reader.read_buf(&mut self.buffer).await? > 0)
    }

    /// At the end of the input: the last line when it had no newline.
    pub(crate) fn rest(&mut self) -> Option<Line<'_>> {
        let start = std::mem::take(&mut self.start);
        self.scanned = 0;
        let discarded = std::mem::take(&mut self.discarding);
        let rest_len = self.buffer.len() - start;
        // Mark everything returned: the next call finds an empty buffer.
        self.start = self.buffer.len();
        if discarded || rest_len > self.max {
            return Some(Line::TooLong);
        }
        if rest_len == 0 {
            return None;
        }
        Some(Line::Text(&self.buffer[start..]))
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
            // A large message was handled: what it cost goes back to the system.
            memory::release_soon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One result of reading a line, owned.
    #[derive(Debug, PartialEq, Eq)]
    enum Frame {
        Line(Vec<u8>),
        TooLong,
        Eof,
    }

    fn frame(line: Option<Line<'_>>) -> Frame {
        match line {
            Some(Line::Text(text)) => Frame::Line(text.to_vec()),
            Some(Line::TooLong) => Frame::TooLong,
            None => Frame::Eof,
        }
    }

    /// The next line as a face reads it (from the buffer, reading as needed, and what is
    /// left at the end of the input), the buffer reclaimed once it is taken.
    async fn next_frame<R: AsyncRead + Unpin>(
        reader: &mut LineReader<R>,
    ) -> std::io::Result<Frame> {
        loop {
            if let Some(line) = reader.buffered() {
                let taken = frame(Some(line));
                reader.reclaim();
                return Ok(taken);
            }
            if !reader.fill().await? {
                let taken = frame(reader.rest());
                reader.reclaim();
                return Ok(taken);
            }
        }
    }

    #[tokio::test]
    async fn line_reader_skips_oversized_lines_and_keeps_going() {
        let mut input = Vec::new();
        input.extend_from_slice(b"first\n");
        input.extend(std::iter::repeat_n(b'x', 300_000));
        input.extend_from_slice(b"\nsecond\r\nlast");
        let mut reader = LineReader::new(&input[..], 1000);
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Line(b"first".to_vec()));
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::TooLong);
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Line(b"second".to_vec()));
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Line(b"last".to_vec()));
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Eof);
    }

    #[test]
    fn outgoing_keeps_lines_in_order_across_partial_writes() {
        let mut out = Outgoing::default();
        assert!(out.is_empty() && out.has_room());
        out.push("{\"n\":1}".to_owned());
        out.push("{\"n\":2}".to_owned());
        assert_eq!(out.unwritten(), b"{\"n\":1}\n{\"n\":2}\n");
        assert!(!out.advance(3));
        assert_eq!(out.unwritten(), b"\":1}\n{\"n\":2}\n");
        out.push("{\"n\":3}".to_owned());
        assert!(out.advance(out.unwritten().len()));
        assert!(out.is_empty());
        // A large answer stops reading until it is written, then its buffer goes.
        out.push("x".repeat(WRITE_BATCH));
        assert!(!out.has_room());
        assert!(out.advance(WRITE_BATCH + 1));
        assert!(out.has_room() && out.bytes.capacity() == 0);
    }

    #[test]
    fn pipelined_answers_fill_one_batch_buffer_that_the_next_batch_takes_again() {
        let answer = "y".repeat(4700);
        let mut out = Outgoing::default();
        out.push(answer.clone());
        let mut capacities = Vec::new();
        while out.has_room() {
            out.push(answer.clone());
            capacities.push(out.bytes.capacity());
        }
        // One buffer from the second answer to the last: never grown, never copied.
        assert!(capacities.len() > 10);
        assert!(capacities.iter().all(|&capacity| capacity == BATCH_CAPACITY), "{capacities:?}");
        let buffer = out.bytes.as_ptr();
        let batch = out.unwritten().len();
        assert_eq!(batch, capacities.len().saturating_add(1) * (answer.len() + 1));
        assert!(out.advance(batch));
        assert_eq!(out.bytes.capacity(), 0, "an idle connection holds no batch buffer");
        // The next batch takes the same buffer again.
        out.push(answer.clone());
        out.push(answer.clone());
        assert_eq!(out.bytes.as_ptr(), buffer);
        assert_eq!(out.unwritten().len(), 2 * (answer.len() + 1));

        // A client that takes its answers a part at a time: what it has makes room
        // for the next ones, in the same buffer, in order.
        let numbered = |n: usize| format!("{n:06}{}", &answer[6..]);
        let mut pushed: Vec<String> = vec![answer.clone(), answer.clone()];
        let mut sent = Vec::new();
        for n in 0..200 {
            let take = out.unwritten().len().min(3000 + n);
            sent.extend_from_slice(&out.unwritten()[..take]);
            out.advance(take);
            while out.has_room() && pushed.len() < 150 {
                let line = numbered(pushed.len());
                out.push(line.clone());
                pushed.push(line);
            }
            let capacity = out.bytes.capacity();
            assert!(capacity < WRITE_BATCH || capacity == BATCH_CAPACITY, "{capacity}");
        }
        sent.extend_from_slice(out.unwritten());
        assert_eq!(
            sent,
            pushed.iter().flat_map(|line| format!("{line}\n").into_bytes()).collect::<Vec<_>>()
        );
    }

    /// Serves one NDJSON connection over an in-memory pipe to a daemon rooted in `root`:
    /// writes `input`, closes it, and returns all that was answered, as text and as
    /// parsed lines.
    async fn exchange_in_memory(
        root: &std::path::Path,
        input: &str,
    ) -> (String, Vec<serde_json::Value>) {
        let root = std::fs::canonicalize(root).unwrap();
        let settings = crate::daemon::Settings::for_roots(vec![root]);
        let registry = Arc::new(crate::tools::registry::Registry::with_builtins());
        let daemon = Daemon::new(registry, settings, None);
        let (client, server) = tokio::io::duplex(1 << 20);
        let (server_read, server_write) = tokio::io::split(server);
        let serving = tokio::spawn(async move {
            serve_lines(&daemon, "test".to_owned(), server_read, server_write, 1 << 20).await
        });
        let (mut client_read, mut client_write) = tokio::io::split(client);
        client_write.write_all(input.as_bytes()).await.unwrap();
        client_write.shutdown().await.unwrap();
        let mut output = String::new();
        client_read.read_to_string(&mut output).await.unwrap();
        serving.await.unwrap();
        let answers = output.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        (output, answers)
    }

    #[tokio::test]
    async fn pipelined_requests_are_all_answered_and_a_last_unterminated_line_counts() {
        let dir = tempfile::tempdir().unwrap();
        let mut input = String::new();
        for id in 1..=200 {
            input.push_str(&format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/cancel","params":{{"call_id":"x"}}}}"#
            ));
            input.push('\n');
        }
        input.push_str("not json\n");
        input.push_str(r#"{"jsonrpc":"2.0","id":"last","method":"daemon/status"}"#);
        let (output, answers) = exchange_in_memory(dir.path(), &input).await;
        assert_eq!(answers.len(), 202, "{output}");
        let mut ids: Vec<u64> = answers.iter().filter_map(|answer| answer["id"].as_u64()).collect();
        ids.sort_unstable();
        assert_eq!(ids, (1..=200).collect::<Vec<_>>());
        assert!(answers.iter().all(|answer| answer["result"]["canceled"] == 0
            || answer["error"]["code"] == jsonrpc::PARSE_ERROR
            || answer["id"] == "last"));
        assert!(answers.iter().any(|answer| answer["error"]["code"] == jsonrpc::PARSE_ERROR));
        let last = answers.iter().find(|answer| answer["id"] == "last").unwrap();
        assert!(last["result"]["version"].is_string(), "{last}");
    }

    #[tokio::test]
    async fn pipelined_tool_calls_handed_to_tasks_are_all_answered_by_their_ids() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "alpha\n").unwrap();
        let mut input = String::new();
        for id in 1..=100 {
            input.push_str(&format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"read_file","arguments":{{"path":"a.txt"}}}}}}"#
            ));
            input.push('\n');
        }
        let (output, answers) = exchange_in_memory(dir.path(), &input).await;
        let mut ids: Vec<u64> = answers.iter().filter_map(|answer| answer["id"].as_u64()).collect();
        ids.sort_unstable();
        assert_eq!(ids, (1..=100).collect::<Vec<_>>(), "{output}");
        for answer in &answers {
            let result = &answer["result"];
            assert_eq!(result["ok"], true, "{answer}");
            assert!(result["content"].as_str().unwrap().contains("alpha"), "{answer}");
        }
    }

    #[tokio::test]
    async fn two_lines_are_seen_only_once_both_are_whole() {
        let (mut client, server) = tokio::io::duplex(4096);
        let mut reader = LineReader::new(server, 1 << 20);
        client.write_all(b"one\ntw").await.unwrap();
        assert!(reader.fill().await.unwrap());
        assert!(!reader.holds_two_lines());
        client.write_all(b"o\nthree").await.unwrap();
        assert!(reader.fill().await.unwrap());
        assert!(reader.holds_two_lines());
        assert_eq!(reader.buffered(), Some(Line::Text(b"one")));
        assert!(!reader.holds_two_lines(), "only one whole line is left");
        assert_eq!(reader.buffered(), Some(Line::Text(b"two")));
        assert_eq!(reader.buffered(), None);
        assert!(!reader.holds_two_lines());
    }

    #[tokio::test]
    async fn line_reader_refuses_a_long_line_that_arrives_in_one_read() {
        let mut input = b"ok\n".to_vec();
        input.extend(std::iter::repeat_n(b'y', 50));
        input.extend_from_slice(b"\nfine\n");
        let mut reader = LineReader::new(&input[..], 10);
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Line(b"ok".to_vec()));
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::TooLong);
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Line(b"fine".to_vec()));
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Eof);
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
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Line(b"partial".to_vec()));
        match next_frame(&mut reader).await.unwrap() {
            Frame::Line(line) => assert_eq!(line.len(), 200_000),
            other => panic!("expected the large line, got {other:?}"),
        }
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Line(b"small".to_vec()));
        assert!(reader.buffer.capacity() <= SHRINK_ABOVE, "{}", reader.buffer.capacity());
        writer.await.unwrap();
        assert_eq!(next_frame(&mut reader).await.unwrap(), Frame::Eof);
    }
}
