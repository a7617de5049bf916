//! MCP over stdio: newline-delimited JSON-RPC, one compact message per line.
//!
//! stdout carries protocol lines and nothing else (logs go to stderr). The line
//! framing is toolgate's own rather than rmcp's so that bad input is answered the
//! JSON-RPC way and the connection survives it: text that is not JSON gets a
//! `-32700` parse error, JSON that is not a message gets `-32600` (with its id when
//! it has one; never for something shaped like a notification), and a line over the
//! size limit is skipped with a `-32600`, without ever being held in memory whole.
//!
//! When stdin and stdout are pipes (as MCP hosts start servers), they are driven by
//! the runtime's event loop in non-blocking mode rather than through blocking reads
//! and writes on helper threads, which would add two thread hand-offs to every
//! call; their flags are put back when the conversation ends. Anything else (a
//! terminal, a file) is read and written the blocking way.

use std::borrow::Cow;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequest, CallToolRequestMethod, CallToolRequestParams, ClientJsonRpcMessage,
    ClientRequest, ConstString, JsonRpcMessage, JsonRpcResponse, ListToolsResult, RequestId,
    ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::ServiceExt;
use rmcp::transport::Transport;
use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::mapping;
use super::server::McpHandler;
use super::{Face, McpOptions, McpServeError};
use crate::daemon::Daemon;
use crate::rpc::{Line, LineReader, jsonrpc};
use crate::tools::{ToolResult, json_text, scratch};

mod direct;
use direct::{Direct, Taken};

/// Parsed messages waiting for the protocol engine; the reader stops reading (the
/// client's writes block) when it is full.
const INBOUND_CAPACITY: usize = 256;
/// Bytes of lines waiting for stdout: past them, whoever sends waits (rmcp's loop, and
/// with it the calls' progress), so a host that stops reading costs at most this much.
const OUTBOUND_BYTES: usize = 4 * 1024 * 1024;
/// What a queued line costs beyond its bytes, so that many short lines are bounded too.
const LINE_OVERHEAD: usize = 64;
/// Bytes gathered before a write to stdout (a pipe holds 64 KiB).
const WRITE_BUFFER: usize = 64 * 1024;
/// Lines handed to one vectored write at most.
const WRITE_LINES: usize = 64;
/// How long calls still running at end of input get to wind down after being
/// canceled (their process trees are killed at once; this covers the reaping).
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Serves one MCP conversation on the process's stdin and stdout until stdin ends
/// or the daemon shuts down (`toolgate mcp`).
pub async fn run_stdio(daemon: Arc<Daemon>, options: McpOptions) -> Result<(), McpServeError> {
    let _restore = RestoreFlags::save();
    serve_stream(daemon, options, stdin_stream(), stdout_stream()).await
}

/// stdin as a non-blocking pipe when it is one, else tokio's blocking reader.
fn stdin_stream() -> Box<dyn AsyncRead + Unpin + Send> {
    let pipe = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(tokio::net::unix::pipe::Receiver::from_owned_fd);
    match pipe {
        Ok(pipe) => Box::new(pipe),
        Err(err) => {
            tracing::debug!(%err, "stdin is not a pipe; reading it the blocking way");
            Box::new(tokio::io::stdin())
        }
    }
}

/// stdout as a non-blocking pipe when it is one, else tokio's blocking writer.
fn stdout_stream() -> Box<dyn AsyncWrite + Unpin + Send> {
    let pipe = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .and_then(tokio::net::unix::pipe::Sender::from_owned_fd);
    match pipe {
        Ok(pipe) => Box::new(pipe),
        Err(err) => {
            tracing::debug!(%err, "stdout is not a pipe; writing it the blocking way");
            Box::new(tokio::io::stdout())
        }
    }
}

/// The file status flags of stdin and stdout as they were, put back on drop: the
/// pipes' open file descriptions may be shared with other processes, which must not
/// find them left non-blocking.
struct RestoreFlags {
    stdin: Option<OFlags>,
    stdout: Option<OFlags>,
}

impl RestoreFlags {
    fn save() -> RestoreFlags {
        RestoreFlags {
            stdin: fcntl_getfl(std::io::stdin()).ok(),
            stdout: fcntl_getfl(std::io::stdout()).ok(),
        }
    }
}

impl Drop for RestoreFlags {
    fn drop(&mut self) {
        if let Some(flags) = self.stdin {
            let _ = fcntl_setfl(std::io::stdin(), flags);
        }
        if let Some(flags) = self.stdout {
            let _ = fcntl_setfl(std::io::stdout(), flags);
        }
    }
}

/// Serves one MCP conversation over any byte stream pair (tests use an in-memory
/// duplex). Returns when the input ends or the daemon shuts down; every call of the
/// conversation is canceled and its processes killed before it returns.
pub async fn serve_stream<R, W>(
    daemon: Arc<Daemon>,
    options: McpOptions,
    reader: R,
    writer: W,
) -> Result<(), McpServeError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let max_message_bytes = options.max_message_bytes;
    let face = Face::new(daemon.clone(), options);
    let handler = McpHandler::new(face);

    let (outbound, outbound_rx) = line_queue();
    let (inbound, inbound_rx) = mpsc::channel::<ClientJsonRpcMessage>(INBOUND_CAPACITY);
    let listing = Arc::new(Listing::default());
    let direct = Arc::new(Direct::new(handler.clone(), outbound.clone(), listing.clone()));
    let writer_task = tokio::spawn(write_lines(writer, outbound_rx));
    let reader_task = tokio::spawn(read_messages(
        reader,
        max_message_bytes,
        inbound,
        outbound.clone(),
        direct.clone(),
    ));
    let transport = LineTransport {
        inbound: inbound_rx,
        outbound,
        encoder: LineEncoder { size_hint: 0, listing },
    };

    let shutdown = daemon.shutdown_token().child_token();
    let outcome = match handler.clone().serve_with_ct(transport, shutdown.clone()).await {
        Ok(running) => {
            direct.open(running.peer().clone());
            let served = CancellationToken::new();
            let serving = async {
                let _served = served.clone().drop_guard();
                running.waiting().await
            };
            let (outcome, ()) = tokio::join!(serving, direct.wind_down(&shutdown, &served));
            outcome.map(|_| ()).map_err(|err| McpServeError::Join(err.to_string()))
        }
        Err(err) => Err(McpServeError::Start(err.to_string())),
    };

    // The client is gone (or we are stopping): cancel what still runs and wait, a
    // bounded time, for the calls to wind down.
    direct.close();
    handler.close().await;
    handler.drain(DRAIN_GRACE).await;
    reader_task.abort();
    drop(handler);
    drop(direct);
    let _ = writer_task.await;
    outcome
}

/// The transport handed to rmcp: parsed messages in, serialized lines out.
struct LineTransport {
    inbound: mpsc::Receiver<ClientJsonRpcMessage>,
    outbound: LineSender,
    encoder: LineEncoder,
}

impl Transport<RoleServer> for LineTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let outbound = self.outbound.clone();
        let line = self.encoder.encode(&item);
        async move {
            outbound.send(line?).await.map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout is closed")
            })
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        self.inbound.recv().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inbound.close();
        Ok(())
    }
}

/// Serializes outgoing messages into lines.
#[derive(Default)]
struct LineEncoder {
    /// The size of the last line: the next one is serialized into a buffer of that
    /// capacity, so that a stream of similar answers is not regrown each time.
    size_hint: usize,
    listing: Arc<Listing>,
}

impl LineEncoder {
    fn encode(&mut self, item: &ServerJsonRpcMessage) -> std::io::Result<Vec<u8>> {
        let line = self.listing.encode(item, self.size_hint)?;
        self.size_hint = line.len();
        Ok(line)
    }
}

/// The last `tools/list` result and its JSON, for the lines of rmcp's loop and of the
/// direct path alike. A conversation's listing only changes with the tools, and
/// serializing it (every tool's input schema) is most of what answering `tools/list`
/// costs; comparing it to the last one is cheap, since the tools share their schemas
/// (`Arc`s compared by address first).
#[derive(Default)]
struct Listing(std::sync::Mutex<Option<(ListToolsResult, Vec<u8>)>>);

impl Listing {
    /// `message` as one line: a listing from the last one's JSON when it has not
    /// changed, anything else as [`encode_line`] writes it.
    fn encode(&self, message: &ServerJsonRpcMessage, size_hint: usize) -> std::io::Result<Vec<u8>> {
        match message {
            JsonRpcMessage::Response(JsonRpcResponse {
                id,
                result: ServerResult::ListToolsResult(listed),
                ..
            }) => self.line(id, listed),
            _ => encode_line(message, size_hint),
        }
    }

    /// The line answering request `id` with `listed`.
    fn line(&self, id: &RequestId, listed: &ListToolsResult) -> std::io::Result<Vec<u8>> {
        let mut last = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let json = match &*last {
            Some((seen, json)) if seen == listed => json,
            _ => {
                let json = serde_json::to_vec(listed).map_err(std::io::Error::other)?;
                &last.insert((listed.clone(), json)).1
            }
        };
        let mut line = Vec::with_capacity(json.len() + 64);
        line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        serde_json::to_writer(&mut line, id).map_err(std::io::Error::other)?;
        line.extend_from_slice(br#","result":"#);
        line.extend_from_slice(json);
        line.extend_from_slice(b"}\n");
        Ok(line)
    }

    /// Where the cached JSON lies (tests: the same listing is answered from it).
    #[cfg(test)]
    fn cached(&self) -> Option<usize> {
        let last = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        last.as_ref().map(|(_, json)| json.as_ptr() as usize)
    }
}

/// A message as one line, serialized into a buffer of about `size_hint` bytes.
fn encode_line(message: &ServerJsonRpcMessage, size_hint: usize) -> std::io::Result<Vec<u8>> {
    let mut line = scratch::LINES.take(size_hint.max(256));
    if let JsonRpcMessage::Response(JsonRpcResponse {
        id,
        result: ServerResult::CallToolResult(result),
        ..
    }) = message
        && let Some(parts) = TextResult::of(result)
    {
        parts.write(id, &mut line).map_err(std::io::Error::other)?;
    } else {
        serde_json::to_writer(&mut line, message).map_err(std::io::Error::other)?;
    }
    line.push(b'\n');
    Ok(line)
}

/// A tool's answer as nearly every call has it: one plain text block, and the
/// structured result (an object) holding the same text once more. Escaping that text
/// is most of what serializing the answer costs, so it is escaped once (with
/// [`json_text::escape_into`], faster than serde's escaper on source text) and its
/// JSON copied to the second place; the line is byte for byte what serde writes.
struct TextResult<'a> {
    result: &'a rmcp::model::CallToolResult,
    text: &'a str,
    structured: &'a serde_json::Map<String, Value>,
}

impl<'a> TextResult<'a> {
    /// Texts shorter than this are not worth the special case.
    const MIN_TEXT: usize = 256;

    fn of(result: &'a rmcp::model::CallToolResult) -> Option<TextResult<'a>> {
        let [rmcp::model::ContentBlock::Text(block)] = result.content.as_slice() else {
            return None;
        };
        if block.meta.is_some() || block.annotations.is_some() || result.meta.is_some() {
            return None;
        }
        let Some(Value::Object(structured)) = &result.structured_content else {
            return None;
        };
        let text = block.text.as_str();
        let repeated = structured.values().any(|value| value.as_str() == Some(text));
        (text.len() >= Self::MIN_TEXT && repeated).then_some(TextResult {
            result,
            text,
            structured,
        })
    }

    /// Writes `{"jsonrpc":"2.0","id":..,"result":{..}}` in serde's field order.
    fn write(&self, id: &RequestId, line: &mut Vec<u8>) -> serde_json::Result<()> {
        line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        serde_json::to_writer(&mut *line, id)?;
        line.extend_from_slice(br#","result":{"#);
        if let Some(result_type) = &self.result.result_type {
            line.extend_from_slice(br#""resultType":"#);
            serde_json::to_writer(&mut *line, result_type)?;
            line.push(b',');
        }
        line.extend_from_slice(br#""content":[{"type":"text","text":"#);
        let start = line.len();
        json_text::escape_into(line, self.text);
        let escaped = start..line.len();
        line.extend_from_slice(br#"}],"structuredContent":{"#);
        for (index, (key, value)) in self.structured.iter().enumerate() {
            if index > 0 {
                line.push(b',');
            }
            serde_json::to_writer(&mut *line, key)?;
            line.push(b':');
            if value.as_str() == Some(self.text) {
                line.extend_from_within(escaped.clone());
            } else {
                serde_json::to_writer(&mut *line, value)?;
            }
        }
        line.push(b'}');
        if let Some(is_error) = self.result.is_error {
            line.extend_from_slice(if is_error {
                br#","isError":true"#
            } else {
                br#","isError":false"#
            });
        }
        line.extend_from_slice(b"}}");
        Ok(())
    }
}

/// A plain call's answer written straight from the tool's result: the line
/// [`encode_line`] writes for [`mapping::call_result`]'s `CallToolResult` as a peer
/// before 2026-07-28 gets it (no `resultType`), without building that result, the
/// JSON tree of its `structuredContent` (toolgate's Result object, its members in
/// the order of serde_json's maps) or another copy of the text. `None` for a result
/// with attachments, which goes through the mapping.
fn plain_answer_line(
    id: &RequestId,
    result: &ToolResult,
    size_hint: usize,
) -> Option<serde_json::Result<Vec<u8>>> {
    if !result.attachments.is_empty() {
        return None;
    }
    let mut line = scratch::LINES.take(size_hint.max(256));
    let written = write_plain_answer(id, result, &mut line);
    line.push(b'\n');
    Some(written.map(|()| line))
}

fn write_plain_answer(
    id: &RequestId,
    result: &ToolResult,
    line: &mut Vec<u8>,
) -> serde_json::Result<()> {
    line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    serde_json::to_writer(&mut *line, id)?;
    line.extend_from_slice(br#","result":{"content":[{"type":"text","text":"#);
    let text = mapping::result_text(result);
    let start = line.len();
    json_text::escape_into(line, &text);
    let escaped = start..line.len();
    line.extend_from_slice(br#"}],"structuredContent":{"content":"#);
    if std::ptr::eq(&*text, result.content.as_str()) {
        line.extend_from_within(escaped);
    } else {
        json_text::escape_into(line, &result.content);
    }
    if let Some(error) = &result.error {
        line.extend_from_slice(br#","error":"#);
        serde_json::to_writer(&mut *line, error)?;
    }
    if let Some(error_type) = &result.error_type {
        line.extend_from_slice(br#","error_type":"#);
        serde_json::to_writer(&mut *line, error_type)?;
    }
    line.extend_from_slice(br#","metadata":"#);
    serde_json::to_writer(&mut *line, &result.metadata)?;
    line.extend_from_slice(if result.ok { br#","ok":true"# } else { br#","ok":false"# });
    line.extend_from_slice(br#","tool":"#);
    serde_json::to_writer(&mut *line, &result.tool)?;
    line.extend_from_slice(if result.ok {
        br#"},"isError":false}}"#
    } else {
        br#"},"isError":true}}"#
    });
    Ok(())
}

/// Reads lines, hands well-formed messages to the engine and answers bad ones.
async fn read_messages<R: AsyncRead + Unpin>(
    reader: R,
    max_message_bytes: usize,
    inbound: mpsc::Sender<ClientJsonRpcMessage>,
    outbound: LineSender,
    direct: Arc<Direct>,
) {
    let _reading = direct.reading();
    let mut lines = LineReader::new(reader, max_message_bytes);
    loop {
        // Each line is read where it lies in the reader's buffer, not copied out.
        let (handled, last) = match lines.buffered() {
            Some(line) => (handle_line(line, max_message_bytes, &direct), false),
            None => match lines.fill().await {
                Ok(true) => continue,
                Ok(false) => match lines.rest() {
                    // End of input: a last line without its newline still counts.
                    Some(line) => (handle_line(line, max_message_bytes, &direct), true),
                    None => return,
                },
                Err(err) => {
                    tracing::debug!(%err, "stdin read failed");
                    return;
                }
            },
        };
        let sent = match handled {
            Ok(Taken::Engine(message)) => inbound.send(*message).await.is_ok(),
            Ok(Taken::Done) => true,
            Ok(Taken::Answer(line)) => outbound.send(line).await.is_ok(),
            Err(reply) => {
                let mut line = reply.into_bytes();
                line.push(b'\n');
                outbound.send(line).await.is_ok()
            }
        };
        if !sent || last {
            return;
        }
    }
}

/// Takes one line of input: a message for rmcp's engine, a call the direct path
/// started or already answered, or nothing to do; `Err` with the error to answer
/// when it is not a message.
fn handle_line(
    line: Line<'_>,
    max_message_bytes: usize,
    direct: &Arc<Direct>,
) -> Result<Taken, String> {
    let text = match line {
        // The reader only bounds what it buffers; a whole line that arrived in one
        // read can still be over the limit.
        Line::Text(text) if text.len() <= max_message_bytes => text,
        Line::Text(_) | Line::TooLong => {
            return Err(error_line(
                &Value::Null,
                jsonrpc::INVALID_REQUEST,
                &format!("message larger than {max_message_bytes} bytes refused"),
            ));
        }
    };
    let message = match parse_call(text) {
        Some(call) => call,
        None => match parse(text) {
            Parsed::Message(message) => *message,
            Parsed::Blank | Parsed::Reply(None) => return Ok(Taken::Done),
            Parsed::Reply(Some(reply)) => return Err(reply),
        },
    };
    Ok(direct.take(message))
}

enum Parsed {
    Message(Box<ClientJsonRpcMessage>),
    Blank,
    /// Not a message: the error to answer with (`None` when nothing may be answered,
    /// e.g. a malformed notification).
    Reply(Option<String>),
}

/// A line that is not a plain `tools/call` (see [`parse_call`]).
fn parse(line: &[u8]) -> Parsed {
    // A well-formed message (nearly every line) goes straight to its type; only what
    // fails is looked at as JSON to find the right error.
    if let Ok(message) = serde_json::from_slice::<ClientJsonRpcMessage>(line) {
        return Parsed::Message(Box::new(message));
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Parsed::Blank;
    }
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(err) => {
            tracing::debug!(%err, "unparsable input");
            return Parsed::Reply(Some(error_line(
                &Value::Null,
                jsonrpc::PARSE_ERROR,
                "parse error",
            )));
        }
    };
    match serde_json::from_value::<ClientJsonRpcMessage>(value.clone()) {
        Ok(message) => Parsed::Message(Box::new(message)),
        Err(err) => {
            tracing::debug!(%err, "input is JSON but not a valid MCP message");
            let id = value.get("id").cloned();
            let is_request = value.get("method").is_some() && id.is_some();
            let is_notification = value.get("method").is_some() && id.is_none();
            let is_response = value.get("result").is_some() || value.get("error").is_some();
            if is_notification || (is_response && !is_request) {
                // Nothing may answer a notification or a response.
                return Parsed::Reply(None);
            }
            let id = match id {
                Some(id @ (Value::String(_) | Value::Number(_))) => id,
                _ => Value::Null,
            };
            Parsed::Reply(Some(error_line(
                &id,
                jsonrpc::INVALID_REQUEST,
                &format!("invalid request: {err}"),
            )))
        }
    }
}

/// A `tools/call` request, read straight into its type. rmcp reads a message by
/// buffering it, checking its shape and trying the request types in turn, which costs
/// several times what reading one known type does, and nearly every line of a busy
/// conversation is a call. Only a line with exactly the four members of a request
/// is read here, into what rmcp's reading makes of it (the `_meta` of the params in
/// the request's extensions); anything else, or anything this cannot read, is read
/// the general way.
fn parse_call(line: &[u8]) -> Option<ClientJsonRpcMessage> {
    // The version and method are compared where they lie in the line, not copied out.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct CallLine<'a> {
        #[serde(borrow)]
        jsonrpc: Cow<'a, str>,
        id: RequestId,
        #[serde(borrow)]
        method: Cow<'a, str>,
        params: CallToolRequestParams,
    }
    let CallLine { jsonrpc, id, method, mut params } = serde_json::from_slice(line).ok()?;
    if jsonrpc != "2.0" || method != <CallToolRequestMethod as ConstString>::VALUE {
        return None;
    }
    let meta = params.meta.take();
    let mut request = CallToolRequest::new(params);
    if let Some(meta) = meta {
        request.extensions.insert(meta);
    }
    Some(ClientJsonRpcMessage::request(ClientRequest::CallToolRequest(request), id))
}

/// Lines for stdout, each holding its share of [`OUTBOUND_BYTES`] until written.
type LineQueue = mpsc::UnboundedReceiver<(Vec<u8>, OwnedSemaphorePermit)>;

/// The sending side of the stdout queue.
#[derive(Clone)]
struct LineSender {
    tx: mpsc::UnboundedSender<(Vec<u8>, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
}

fn line_queue() -> (LineSender, LineQueue) {
    let (tx, rx) = mpsc::unbounded_channel();
    (LineSender { tx, room: Arc::new(Semaphore::new(OUTBOUND_BYTES)) }, rx)
}

impl LineSender {
    /// Queues a line once there is room for it (a line longer than the whole room
    /// waits for the queue to be empty); an error when stdout is gone.
    async fn send(&self, line: Vec<u8>) -> Result<(), ()> {
        let room = line.len().saturating_add(LINE_OVERHEAD).min(OUTBOUND_BYTES);
        let room = u32::try_from(room).unwrap_or(u32::MAX);
        let permit = self.room.clone().acquire_many_owned(room).await.map_err(|_| ())?;
        self.tx.send((line, permit)).map_err(|_| ())
    }
}

fn error_line(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

/// Drains the outbound queue into the writer: the lines queued by the time it wakes go
/// out together, straight from their buffers in one vectored write where the writer
/// takes one (a pipe does), else through a buffer, and the writer is flushed whenever
/// the queue runs dry.
async fn write_lines<W: AsyncWrite + Unpin>(writer: W, lines: LineQueue) {
    if writer.is_write_vectored() {
        drain_lines(writer, lines).await;
    } else {
        drain_lines(BufWriter::with_capacity(WRITE_BUFFER, writer), lines).await;
    }
}

async fn drain_lines<W: AsyncWrite + Unpin>(mut writer: W, mut lines: LineQueue) {
    let mut batch = Vec::with_capacity(WRITE_LINES);
    while let Some(line) = lines.recv().await {
        let mut bytes = line.0.len();
        batch.push(line);
        while batch.len() < WRITE_LINES && bytes < WRITE_BUFFER {
            let Ok(line) = lines.try_recv() else { break };
            bytes += line.0.len();
            batch.push(line);
        }
        if write_all_lines(&mut writer, &batch).await.is_err() {
            return;
        }
        // The lines' room in the queue goes once they are written, and their buffers
        // to the next answers.
        for (line, _room) in batch.drain(..) {
            scratch::LINES.give_back(line);
        }
        if lines.is_empty() && writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.flush().await;
}

/// Writes every byte of `batch`'s lines, in order, up to [`WRITE_LINES`] of them per
/// vectored write (their slices on the stack).
async fn write_all_lines<W: AsyncWrite + Unpin>(
    writer: &mut W,
    batch: &[(Vec<u8>, OwnedSemaphorePermit)],
) -> std::io::Result<()> {
    let mut slices = [IoSlice::new(&[]); WRITE_LINES];
    for chunk in batch.chunks(WRITE_LINES) {
        for ((line, _), slice) in chunk.iter().zip(slices.iter_mut()) {
            *slice = IoSlice::new(line);
        }
        let mut unwritten = &mut slices[..chunk.len()];
        while !unwritten.is_empty() {
            let written = writer.write_vectored(unwritten).await?;
            if written == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut unwritten, written);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe that takes at most `at_most` bytes per write, wherever they fall among
    /// the buffers it is handed; what it took, and in how many writes, stays readable.
    #[derive(Clone, Default)]
    struct Trickle {
        taken: Arc<std::sync::Mutex<(Vec<u8>, usize)>>,
        at_most: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let mut taken = self.taken.lock().expect("lock");
            let mut room = self.at_most;
            for buf in bufs {
                let part = &buf[..buf.len().min(room)];
                taken.0.extend_from_slice(part);
                room -= part.len();
            }
            taken.1 += 1;
            std::task::Poll::Ready(Ok(self.at_most - room))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn queued_lines_are_written_whole_and_in_order_through_short_writes() {
        let lines: Vec<Vec<u8>> = (0..20)
            .map(|n| format!("{{\"line\":{n},\"pad\":\"{}\"}}\n", "x".repeat(n)).into_bytes())
            .collect();
        let all = lines.concat();

        let room = Arc::new(Semaphore::new(1000));
        let batch: Vec<_> = lines
            .iter()
            .map(|line| (line.clone(), room.clone().try_acquire_owned().expect("room")))
            .collect();
        let mut pipe = Trickle { at_most: 7, ..Trickle::default() };
        write_all_lines(&mut pipe, &batch).await.expect("written");
        let (written, writes) = pipe.taken.lock().expect("lock").clone();
        assert_eq!(written, all);
        // A write spans lines: no more writes than the bytes need.
        assert_eq!(writes, all.len().div_ceil(7));

        // The writer task drains the queue that way and gives the lines' room back.
        let (sender, queue) = line_queue();
        let room = sender.room.clone();
        for line in &lines {
            sender.send(line.clone()).await.expect("queued");
        }
        drop(sender);
        let pipe = Trickle { at_most: 5, ..Trickle::default() };
        write_lines(pipe.clone(), queue).await;
        assert_eq!(pipe.taken.lock().expect("lock").0, all);
        assert_eq!(room.available_permits(), OUTBOUND_BYTES);
    }

    fn reply_of(text: &str) -> Option<Value> {
        match parse(text.as_bytes()) {
            Parsed::Reply(Some(line)) => serde_json::from_str(&line).ok(),
            _ => None,
        }
    }

    #[test]
    fn a_listing_is_serialized_once_and_answered_as_typed() -> Result<(), Box<dyn std::error::Error>>
    {
        use rmcp::model::{JsonRpcVersion2_0, RequestId, Tool};

        let schema = Arc::new(serde_json::Map::from_iter([("type".to_string(), json!("object"))]));
        let tool = |description: &'static str| Tool::new("read", description, schema.clone());
        let response = |id: i64, tools: Vec<Tool>| {
            ServerJsonRpcMessage::Response(JsonRpcResponse {
                jsonrpc: JsonRpcVersion2_0,
                id: RequestId::Number(id),
                result: ServerResult::ListToolsResult(ListToolsResult::with_all_items(tools)),
            })
        };
        let cached = |encoder: &LineEncoder| encoder.listing.cached();

        let mut encoder = LineEncoder::default();
        let mut seen = Vec::new();
        for message in [
            response(1, vec![tool("a")]),
            response(2, vec![tool("a")]),
            response(3, vec![tool("b")]),
            response(4, vec![tool("b"), tool("a")]),
            response(5, vec![tool("b"), tool("a")]),
        ] {
            let mut expected = serde_json::to_vec(&message)?;
            expected.push(b'\n');
            assert_eq!(String::from_utf8(encoder.encode(&message)?)?, String::from_utf8(expected)?);
            seen.push(cached(&encoder));
        }
        // The same listing is answered from the same text; a changed one is serialized again.
        assert_eq!(seen[0], seen[1]);
        assert_ne!(seen[1], seen[2]);
        assert_eq!(seen[3], seen[4]);
        // Anything else is serialized as it is and leaves the listing alone.
        let ping = ServerJsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: JsonRpcVersion2_0,
            id: RequestId::String("p".into()),
            result: ServerResult::EmptyResult(().into()),
        });
        let mut expected = serde_json::to_vec(&ping)?;
        expected.push(b'\n');
        assert_eq!(encoder.encode(&ping)?, expected);
        assert_eq!(cached(&encoder), seen[4]);
        Ok(())
    }

    #[test]
    fn a_text_answer_is_written_as_serde_writes_it() -> Result<(), Box<dyn std::error::Error>> {
        use rmcp::model::{CallToolResult, ContentBlock, JsonRpcVersion2_0, ResultType};

        let long = "     1\tfn main() {\n     2\t    println!(\"\u{e9}\\\\ \u{1}\");\n".repeat(12);
        let answer = |id: RequestId, result: CallToolResult| {
            ServerJsonRpcMessage::Response(JsonRpcResponse {
                jsonrpc: JsonRpcVersion2_0,
                id,
                result: ServerResult::CallToolResult(result),
            })
        };
        let result = |text: &str, structured: Option<Value>, is_error: Option<bool>| {
            let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
            result.structured_content = structured;
            result.is_error = is_error;
            result
        };
        let mut legacy = result(&long, Some(json!({"ok": true, "content": long})), Some(false));
        legacy.result_type = None;
        let cases = [
            // A read: the text in the structured result too, with other fields around.
            result(
                &long,
                Some(json!({"ok": true, "content": long, "tool": "read_file",
                    "metadata": {"path": "a \"b\"", "lines": [1, 2]}, "z": long})),
                Some(false),
            ),
            result(&long, Some(json!({"ok": false, "content": long, "error": "x"})), Some(true)),
            result(&long, Some(json!({"content": long})), None),
            legacy,
            // Not the shape: written by serde as it is.
            result(&long, Some(json!({"content": "other"})), Some(false)),
            result("short", Some(json!({"content": "short"})), Some(false)),
            result(&long, Some(json!([long])), Some(false)),
            result(&long, None, Some(false)),
        ];
        let mut special = 0;
        for (index, result) in cases.into_iter().enumerate() {
            special += usize::from(TextResult::of(&result).is_some());
            for id in
                [RequestId::Number(index as i64), RequestId::String(format!("r\"{index}").into())]
            {
                let message = answer(id, result.clone());
                let mut expected = serde_json::to_vec(&message)?;
                expected.push(b'\n');
                let line = encode_line(&message, 0)?;
                assert_eq!(String::from_utf8(line)?, String::from_utf8(expected)?, "case {index}");
            }
        }
        assert_eq!(special, 4, "the first four cases take the special case");
        assert!(TextResult::of(&result(&long, None, None)).is_none());
        let mut typed = result(&long, Some(json!({"content": long})), None);
        typed.result_type = Some(ResultType::COMPLETE);
        assert!(TextResult::of(&typed).is_some());
        Ok(())
    }

    #[test]
    fn a_plain_answer_is_the_line_rmcp_types_make() -> Result<(), Box<dyn std::error::Error>> {
        use rmcp::model::CallToolResponse;

        use crate::tools::{Attachment, ErrorType};

        let long = "     1\tfn main() {\n     2\t    println!(\"\u{e9}\\\\ \u{1}\");\n".repeat(12);
        let named = |mut result: ToolResult, tool: &str| {
            result.tool = tool.to_owned();
            result.with_meta("call_id", "c\"1")
        };
        let mut failed_with_text = ToolResult::failure(ErrorType::Timeout, "slow");
        failed_with_text.content = "partial\noutput".to_owned();
        let mut code_only = ToolResult::failure(ErrorType::Canceled, "x");
        code_only.error = None;
        let mut bare_failure = ToolResult::success("");
        bare_failure.ok = false;
        let cases = [
            named(ToolResult::success(long.clone()), "read_file")
                .with_meta("path", "a \"b\"")
                .with_meta("lines", json!([1, 2]))
                .with_meta("ratio", json!(0.25))
                .with_meta("nested", json!({"z": null, "a": [true, "\u{7f}"]})),
            named(ToolResult::success("short"), "x"),
            named(ToolResult::success(""), "x"),
            named(ToolResult::success("tab\there\u{1f}\u{2028}"), ""),
            named(ToolResult::failure(ErrorType::PermissionDenied, "no \"way\""), "write_file"),
            named(failed_with_text, "run_command"),
            named(code_only, "x"),
            bare_failure,
        ];
        for (index, result) in cases.iter().enumerate() {
            for id in
                [RequestId::Number(index as i64), RequestId::String(format!("r\"{index}").into())]
            {
                let mut typed =
                    ServerResult::from(CallToolResponse::Complete(mapping::call_result(result)?));
                typed.strip_result_type_for_legacy_peer();
                typed.strip_non_object_output_for_legacy_peer();
                let expected = encode_line(&ServerJsonRpcMessage::response(typed, id.clone()), 0)?;
                let Some(line) = plain_answer_line(&id, result, 0) else {
                    return Err(format!("case {index} not written plainly").into());
                };
                assert_eq!(String::from_utf8(line?)?, String::from_utf8(expected)?, "case {index}");
            }
        }
        // Attachments go through the mapping.
        let attached = ToolResult::success("see").with_attachment(Attachment::Image {
            mime_type: "image/png".to_owned(),
            data: "AA==".to_owned(),
        });
        assert!(plain_answer_line(&RequestId::Number(1), &attached, 0).is_none());
        Ok(())
    }

    #[test]
    fn a_call_is_read_as_rmcp_reads_it() -> Result<(), Box<dyn std::error::Error>> {
        use rmcp::model::GetMeta;

        let lines = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a.txt"}}}"#,
            r#"{"params":{"arguments":{"path":"a"},"name":"x"},"method":"tools/call","id":"s-1","jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":"t","k":[1]}}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x","arguments":{},"requestState":"s","inputResponses":{"a":{"action":"accept"}},"extra":1}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
        ];
        for line in lines {
            let Some(fast) = parse_call(line.as_bytes()) else {
                return Err(format!("not read: {line}").into());
            };
            let general: ClientJsonRpcMessage = serde_json::from_str(line)?;
            assert_eq!(serde_json::to_value(&fast)?, serde_json::to_value(&general)?, "{line}");
            let meta = |message: &ClientJsonRpcMessage| match message {
                JsonRpcMessage::Request(request) => Some(request.request.get_meta().clone()),
                _ => None,
            };
            assert_eq!(meta(&fast), meta(&general), "{line}");
            assert!(meta(&fast).is_some());
        }
        // Anything else is left to the general reading (and its errors).
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"},"result":{}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":7}"#,
        ] {
            assert!(parse_call(line.as_bytes()).is_none(), "{line}");
        }
        let invalid = reply_of(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"},"result":{}}"#,
        );
        assert_eq!(invalid.map(|v| v["error"]["code"].clone()), Some(json!(-32600)));
        Ok(())
    }

    #[test]
    fn bad_input_gets_json_rpc_errors() {
        assert_eq!(reply_of("{nope").map(|v| v["error"]["code"].clone()), Some(json!(-32700)));
        let invalid = reply_of(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":7}"#);
        assert_eq!(invalid.as_ref().map(|v| v["error"]["code"].clone()), Some(json!(-32600)));
        assert_eq!(invalid.map(|v| v["id"].clone()), Some(json!(4)));
        // A malformed notification is never answered.
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{}}}"#),
            Parsed::Reply(None) | Parsed::Message(_)
        ));
        assert!(matches!(parse(b"   "), Parsed::Blank));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Parsed::Message(_)
        ));
    }
}
