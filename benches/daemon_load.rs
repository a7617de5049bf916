//! A load generator for the daemon: `tools/call read_file` of a 4 KiB file over each
//! transport (Unix socket NDJSON, Unix socket WebSocket, TCP WebSocket, TCP POST),
//! reporting the latency with one call in flight (p50/p99) and the throughput with
//! many in flight (one call on each of 64 connections; for Unix NDJSON also 64 calls
//! pipelined on one connection), plus the daemon's startup time and memory (idle, and
//! with 1,000 idle Unix-socket connections).
//!
//! The Unix NDJSON numbers come with two floors measured in the same run, each a
//! process that does the least a tool daemon can (it reads the request as JSON, reads
//! the file and answers a result of the same shape; no schema, guard, event or
//! audit): one with a thread per connection, blocking (as the side-by-side scripts'
//! `uds-echo`), and one with a task per connection on a Tokio multi-thread runtime
//! (what the same work costs on the runtime toolgate is built on). The binary's rows
//! are then given as ratios of both.
//!
//! The daemon runs in a process of its own, so that its memory can be read from
//! `/proc/PID/status` and client and server do not share a runtime: this benchmark
//! re-executes itself as a daemon (the library's `rpc::unix` and `rpc::tcp` listeners
//! over a `Daemon` with the built-in tools). When the `toolgate` binary's `serve`
//! command creates its socket, the real binary is measured as well (startup to a
//! listening socket, memory, and the Unix NDJSON load); otherwise that part is
//! reported as skipped. That binary is `TOOLGATE_BIN`, else the bench profile's build,
//! whose code is not laid out by `link/text-order.txt` (the list names the release
//! build's symbols): for the shipped binary's memory, give `target/release/toolgate`.
//!
//! Run: `cargo bench --bench daemon_load`. Knobs (environment):
//! `TOOLGATE_LOAD_SECONDS` (measured seconds per throughput run, default 3),
//! `TOOLGATE_LOAD_CALLS` (calls timed for latency, default 5000),
//! `TOOLGATE_LOAD_IN_FLIGHT` (concurrent callers for throughput, default 64),
//! `TOOLGATE_LOAD_IDLE` (idle connections for the memory test, default 1000),
//! `TOOLGATE_LOAD_TRANSPORTS` (comma-separated subset of
//! `unix-ndjson,unix-ws,tcp-ws,tcp-post`), `TOOLGATE_LOAD_METHOD` (`read_file`, or
//! `noop` to time the transport and dispatch alone with a `tools/cancel` of no call). Without `--bench` (as under `cargo test
//! --benches`) it runs a few calls of each kind as a smoke test.

use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Set in the environment of the re-executed daemon process.
const CHILD_ENV: &str = "TOOLGATE_LOAD_DAEMON";
const ROOT_ENV: &str = "TOOLGATE_LOAD_ROOT";
const SOCKET_ENV: &str = "TOOLGATE_LOAD_SOCKET";
/// Set (to a [`Floor`]'s name) in the environment of a re-executed floor process.
const FLOOR_ENV: &str = "TOOLGATE_LOAD_FLOOR";
/// The bearer token of the benchmark's TCP listener (local to this run).
const TOKEN: &str = "load-benchmark-token-0123456789";
/// In every successful `read_file` answer.
const SUCCESS_MARKER: &str = r#""ok":true,"tool":"read_file""#;
/// The file every call reads.
const FILE_NAME: &str = "data.txt";
/// Its size: a typical source file.
const FILE_BYTES: usize = 4096;
/// The longest anything here may take to come up or answer before the run is
/// abandoned as broken.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// Calls made before measuring, so that allocators and caches are warm.
const WARMUP_CALLS: usize = 500;
/// Seconds of load before the throughput count starts.
const WARMUP_LOAD: Duration = Duration::from_millis(500);

/// What each call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    /// `tools/call read_file` of the 4 KiB file: the number that matters.
    ReadFile,
    /// `tools/cancel` of a call that does not exist: the cheapest real method, to time
    /// the transport and the dispatch core without the tool pipeline.
    Noop,
}

impl Workload {
    fn request(self, id: u64) -> String {
        match self {
            Workload::ReadFile => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"read_file","arguments":{{"path":"{FILE_NAME}"}}}}}}"#
            ),
            Workload::Noop => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/cancel","params":{{"call_id":"none"}}}}"#
            ),
        }
    }

    /// Whether `response` is the successful answer to call `id`.
    fn succeeded(self, id: u64, response: &str) -> bool {
        let expected = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"#);
        if !response.starts_with(&expected) {
            return false;
        }
        match self {
            // The result's fields come in name order; the file's text is escaped inside
            // `content`, so the marker cannot come from it.
            Workload::ReadFile => response.contains(SUCCESS_MARKER),
            Workload::Noop => response.contains(r#""canceled":0"#),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    UnixNdjson,
    UnixWs,
    TcpWs,
    TcpPost,
}

impl Transport {
    const ALL: [Transport; 4] =
        [Transport::UnixNdjson, Transport::UnixWs, Transport::TcpWs, Transport::TcpPost];

    fn name(self) -> &'static str {
        match self {
            Transport::UnixNdjson => "unix-ndjson",
            Transport::UnixWs => "unix-ws",
            Transport::TcpWs => "tcp-ws",
            Transport::TcpPost => "tcp-post",
        }
    }
}

/// Where a daemon listens.
#[derive(Clone)]
struct Target {
    socket: PathBuf,
    tcp: Option<SocketAddr>,
    /// The daemon's process, whose CPU time is read around the throughput run.
    pid: u32,
}

/// How much to measure.
struct Plan {
    seconds: f64,
    latency_calls: usize,
    in_flight: usize,
    idle_connections: usize,
    transports: Vec<Transport>,
    workload: Workload,
}

impl Plan {
    fn from_env(smoke: bool) -> anyhow::Result<Plan> {
        let number = |name: &str, default: f64| -> anyhow::Result<f64> {
            match std::env::var(name) {
                Ok(text) => text.parse().with_context(|| format!("{name}={text}")),
                Err(_) => Ok(default),
            }
        };
        let transports = match std::env::var("TOOLGATE_LOAD_TRANSPORTS") {
            Ok(list) => list
                .split(',')
                .map(|name| {
                    Transport::ALL
                        .into_iter()
                        .find(|transport| transport.name() == name.trim())
                        .ok_or_else(|| anyhow!("unknown transport {name:?}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
            Err(_) => Transport::ALL.to_vec(),
        };
        let workload = match std::env::var("TOOLGATE_LOAD_METHOD").as_deref() {
            Ok("read_file") | Err(_) => Workload::ReadFile,
            Ok("noop") => Workload::Noop,
            Ok(other) => bail!("unknown TOOLGATE_LOAD_METHOD {other:?} (read_file or noop)"),
        };
        if smoke {
            return Ok(Plan {
                seconds: 0.2,
                latency_calls: 50,
                in_flight: 4,
                idle_connections: 20,
                transports,
                workload,
            });
        }
        Ok(Plan {
            seconds: number("TOOLGATE_LOAD_SECONDS", 3.0)?,
            latency_calls: number("TOOLGATE_LOAD_CALLS", 5000.0)? as usize,
            in_flight: number("TOOLGATE_LOAD_IN_FLIGHT", 64.0)? as usize,
            idle_connections: number("TOOLGATE_LOAD_IDLE", 1000.0)? as usize,
            transports,
            workload,
        })
    }
}

fn main() -> anyhow::Result<()> {
    if std::env::var_os(CHILD_ENV).is_some() {
        return daemon_child();
    }
    if let Ok(name) = std::env::var(FLOOR_ENV) {
        let floor = Floor::ALL
            .into_iter()
            .find(|floor| floor.name() == name)
            .ok_or_else(|| anyhow!("unknown floor {name:?}"))?;
        return floor_child(floor);
    }
    let smoke = !std::env::args().any(|arg| arg == "--bench");
    let plan = Plan::from_env(smoke)?;
    raise_file_limit();

    let scratch = tempfile::tempdir()?;
    let root = std::fs::canonicalize(scratch.path())?.join("root");
    std::fs::create_dir(&root)?;
    std::fs::write(root.join(FILE_NAME), file_text())?;
    let client = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;

    println!("toolgate daemon load ({} cores)", available_cores());
    let asked = match plan.workload {
        Workload::ReadFile => format!("tools/call read_file of a {FILE_BYTES}-byte file"),
        Workload::Noop => "tools/cancel of no call (no tool)".to_owned(),
    };
    println!(
        "{asked}; latency: {} sequential calls; throughput: {} callers for {:.1} s",
        plan.latency_calls, plan.in_flight, plan.seconds
    );

    // The library daemon in a process of its own, over every transport.
    let socket = scratch.path().join("run").join("toolgate.sock");
    let started = Instant::now();
    let (mut child, target, registry) = spawn_library_daemon(&root, &socket)?;
    let startup = started.elapsed();
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(200));
    let idle_rss = rss_kib(pid)?;
    println!();
    println!("library daemon (this benchmark re-executed as a daemon, pid {pid})");
    println!(
        "  startup to listening sockets: {} (building the registry: {}, {} of RSS)",
        millis(startup),
        millis(registry.built_in),
        mib(registry.rss_kib)
    );
    println!("  idle RSS: {}", memory_breakdown(pid, idle_rss)?);
    let (with_idle, per_connection) =
        client.block_on(idle_connections_rss(&target.socket, pid, plan.idle_connections))?;
    println!(
        "  RSS with {} idle unix connections: {} ({:.1} KiB per connection)",
        plan.idle_connections,
        mib(with_idle),
        per_connection
    );
    println!();
    print_header();
    let mut results = Vec::new();
    for transport in &plan.transports {
        let row = client.block_on(measure(*transport, &target, &plan))?;
        row.print();
        results.push(row);
        if *transport == Transport::UnixNdjson {
            let row = client.block_on(measure_pipelined(&target, &plan))?;
            row.print();
            results.push(row);
        }
    }
    println!();
    println!(
        "  RSS after the load: {} (peak {})",
        mib(rss_kib(pid)?),
        mib(status_kib(pid, "VmHWM:")?)
    );
    stop_child(&mut child);

    // The floors, over Unix NDJSON.
    let mut floors = Vec::new();
    if plan.transports.contains(&Transport::UnixNdjson) {
        println!();
        println!("floors (the least a tool daemon can do, over Unix NDJSON)");
        print_header();
        for floor in Floor::ALL {
            let socket = scratch.path().join(format!("floor-{}.sock", floor.name()));
            let (mut child, target) = spawn_floor(floor, &root, &socket)?;
            let measured = client.block_on(async {
                let mut unix = measure(Transport::UnixNdjson, &target, &plan).await?;
                let mut pipelined = measure_pipelined(&target, &plan).await?;
                unix.name = format!("floor {}", floor.name());
                pipelined.name = format!("floor {} 1×{}", floor.name(), plan.in_flight);
                anyhow::Ok((unix, pipelined))
            });
            stop_child(&mut child);
            let (unix, pipelined) = measured?;
            unix.print();
            pipelined.print();
            floors.push((floor, unix, pipelined));
        }
    }

    // The real binary, when its `serve` command is wired.
    println!();
    let binary = std::env::var_os("TOOLGATE_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_toolgate")), PathBuf::from);
    match client.block_on(measure_binary(&binary, &root, scratch.path(), &plan))? {
        Some(real) => {
            real.print();
            for (floor, unix, pipelined) in &floors {
                println!(
                    "  against the {} floor: p50 {:.2}× its time, {}×1 {:.2}× its calls/s, \
                     1×{} {:.2}× its calls/s",
                    floor.name(),
                    real.unix.p50.as_secs_f64() / unix.p50.as_secs_f64().max(1e-9),
                    plan.in_flight,
                    real.unix.calls_per_second / unix.calls_per_second.max(1e-9),
                    plan.in_flight,
                    real.pipelined.calls_per_second / pipelined.calls_per_second.max(1e-9),
                );
            }
        }
        None => println!(
            "toolgate binary: `{} serve` created no socket; startup and memory of the real \
             binary skipped",
            binary.display()
        ),
    }

    let floor_rows = floors.iter().flat_map(|(_, unix, pipelined)| [unix, pipelined]);
    let failed: u64 = results.iter().chain(floor_rows).map(|row| row.errors).sum();
    if failed > 0 {
        bail!("{failed} calls failed; the numbers above do not measure successful calls");
    }
    Ok(())
}

fn print_header() {
    println!(
        "  {:<16} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>7}",
        "transport", "p50", "p99", "max", "calls/s", "daemon cpu", "client cpu", "errors"
    );
    println!(
        "  {:<16} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11}",
        "", "", "", "", "", "/call", "/call"
    );
}

/// One transport's numbers.
struct Row {
    name: String,
    p50: Duration,
    p99: Duration,
    max: Duration,
    calls_per_second: f64,
    /// The daemon's CPU time per call under load (all its threads): unlike calls/s, it
    /// does not depend on what else the machine is running.
    daemon_cpu: Duration,
    /// The same for this process, the load generator.
    client_cpu: Duration,
    errors: u64,
    first_error: Option<String>,
}

impl Row {
    fn print(&self) {
        println!(
            "  {:<16} {:>10} {:>10} {:>10} {:>10.0} {:>11} {:>11} {:>7}",
            self.name,
            micros(self.p50),
            micros(self.p99),
            micros(self.max),
            self.calls_per_second,
            micros(self.daemon_cpu),
            micros(self.client_cpu),
            self.errors
        );
        if let Some(error) = &self.first_error {
            println!("    first error: {error}");
        }
    }
}

async fn measure(transport: Transport, target: &Target, plan: &Plan) -> anyhow::Result<Row> {
    let workload = plan.workload;
    // Latency: one caller, one call at a time.
    let mut client = Client::connect(transport, target).await?;
    let mut errors = 0u64;
    let mut first_error = None;
    let mut id = 0u64;
    for _ in 0..WARMUP_CALLS.min(plan.latency_calls) {
        id += 1;
        if let Err(err) = client.call(id, workload).await {
            errors += 1;
            first_error.get_or_insert_with(|| err.to_string());
        }
    }
    let mut samples = Vec::with_capacity(plan.latency_calls);
    for _ in 0..plan.latency_calls {
        id += 1;
        let started = Instant::now();
        let outcome = client.call(id, workload).await;
        samples.push(started.elapsed());
        if let Err(err) = outcome {
            errors += 1;
            first_error.get_or_insert_with(|| err.to_string());
        }
    }
    drop(client);
    samples.sort_unstable();
    let percentile = |fraction: f64| {
        let index = ((samples.len() as f64 * fraction).ceil() as usize).saturating_sub(1);
        samples.get(index).copied().unwrap_or_default()
    };
    let (p50, p99) = (percentile(0.50), percentile(0.99));
    let max = samples.last().copied().unwrap_or_default();

    // Throughput: many callers, each with one call in flight on its own connection.
    let completed = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::with_capacity(plan.in_flight);
    for _ in 0..plan.in_flight {
        let mut client = Client::connect(transport, target).await?;
        let (completed, failed, stop) = (completed.clone(), failed.clone(), stop.clone());
        callers.push(tokio::spawn(async move {
            let mut id = 0u64;
            let mut first_error = None;
            while !stop.load(Ordering::Relaxed) {
                id += 1;
                match client.call(id, workload).await {
                    Ok(()) => completed.fetch_add(1, Ordering::Relaxed),
                    Err(err) => {
                        first_error.get_or_insert_with(|| err.to_string());
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            first_error
        }));
    }
    tokio::time::sleep(WARMUP_LOAD).await;
    let start_count = completed.load(Ordering::Relaxed);
    let daemon_cpu_before = cpu_time(target.pid)?;
    let client_cpu_before = cpu_time(std::process::id())?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(plan.seconds)).await;
    let end_count = completed.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    let daemon_cpu = cpu_time(target.pid)?.saturating_sub(daemon_cpu_before);
    let client_cpu = cpu_time(std::process::id())?.saturating_sub(client_cpu_before);
    let calls = (end_count - start_count).max(1);
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        if let Some(error) = tokio::time::timeout(STEP_TIMEOUT, caller).await??
            && first_error.is_none()
        {
            first_error = Some(error);
        }
    }
    errors += failed.load(Ordering::Relaxed);
    Ok(Row {
        name: transport.name().to_owned(),
        p50,
        p99,
        max,
        calls_per_second: (end_count - start_count) as f64 / elapsed.as_secs_f64(),
        daemon_cpu: daemon_cpu / u32::try_from(calls).unwrap_or(u32::MAX),
        client_cpu: client_cpu / u32::try_from(calls).unwrap_or(u32::MAX),
        errors,
        first_error,
    })
}

/// Throughput with all `in_flight` calls pipelined on one Unix NDJSON connection, as
/// an agent sends the calls of one turn: a new request goes out for every answer, and
/// the requests for answers that arrived together leave in one write. p50/p99 are the
/// round trips of calls under that load.
async fn measure_pipelined(target: &Target, plan: &Plan) -> anyhow::Result<Row> {
    let workload = plan.workload;
    let (reader, mut writer) = UnixStream::connect(&target.socket).await?.into_split();
    let mut reader = BufReader::with_capacity(256 * 1024, reader);
    let mut pending: std::collections::HashMap<u64, Instant> = Default::default();
    let mut batch = String::new();
    let mut next_id = 0u64;
    let mut queue = |batch: &mut String, pending: &mut std::collections::HashMap<u64, Instant>| {
        next_id += 1;
        batch.push_str(&workload.request(next_id));
        batch.push('\n');
        pending.insert(next_id, Instant::now());
    };
    for _ in 0..plan.in_flight.max(1) {
        queue(&mut batch, &mut pending);
    }
    writer.write_all(batch.as_bytes()).await?;
    batch.clear();

    let (mut errors, mut first_error) = (0u64, None);
    let mut samples = Vec::new();
    let mut line = String::new();
    let load_started = Instant::now();
    let mut measuring: Option<(Instant, Duration, Duration)> = None;
    let mut completed = 0u64;
    let outcome = loop {
        line.clear();
        let read = tokio::time::timeout(STEP_TIMEOUT, reader.read_line(&mut line)).await;
        match read {
            Ok(Ok(0)) => bail!("connection closed"),
            Ok(Ok(_)) => {}
            Ok(Err(err)) => return Err(err.into()),
            Err(_) => bail!("no answer within {STEP_TIMEOUT:?}"),
        }
        let id = answer_id(&line);
        let sent = id.and_then(|id| pending.remove(&id));
        match (id, sent) {
            (Some(id), Some(sent)) if workload.succeeded(id, &line) => {
                if measuring.is_some() {
                    samples.push(sent.elapsed());
                    completed += 1;
                }
            }
            _ => {
                errors += 1;
                first_error.get_or_insert_with(|| line.chars().take(300).collect::<String>());
            }
        }
        let now = Instant::now();
        match measuring {
            None if now - load_started >= WARMUP_LOAD => {
                measuring = Some((now, cpu_time(target.pid)?, cpu_time(std::process::id())?));
            }
            Some((started, daemon_before, client_before))
                if now - started >= Duration::from_secs_f64(plan.seconds) =>
            {
                let daemon = cpu_time(target.pid)?.saturating_sub(daemon_before);
                let client = cpu_time(std::process::id())?.saturating_sub(client_before);
                break (now - started, daemon, client);
            }
            _ => {}
        }
        queue(&mut batch, &mut pending);
        // Answers already here get their follow-ups in the same write.
        if !reader.buffer().contains(&b'\n') {
            writer.write_all(batch.as_bytes()).await?;
            batch.clear();
        }
    };
    // Let the calls still in flight finish, so that the next run starts clean.
    if !batch.is_empty() {
        writer.write_all(batch.as_bytes()).await?;
    }
    while !pending.is_empty() {
        line.clear();
        match tokio::time::timeout(STEP_TIMEOUT, reader.read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 => {
                if let Some(id) = answer_id(&line) {
                    pending.remove(&id);
                }
            }
            _ => bail!("the calls still in flight were not answered"),
        }
    }
    let (elapsed, daemon_cpu, client_cpu) = outcome;
    samples.sort_unstable();
    let percentile = |fraction: f64| {
        let index = ((samples.len() as f64 * fraction).ceil() as usize).saturating_sub(1);
        samples.get(index).copied().unwrap_or_default()
    };
    let calls = u32::try_from(completed.max(1)).unwrap_or(u32::MAX);
    Ok(Row {
        name: format!("unix-ndjson 1×{}", plan.in_flight),
        p50: percentile(0.50),
        p99: percentile(0.99),
        max: samples.last().copied().unwrap_or_default(),
        calls_per_second: completed as f64 / elapsed.as_secs_f64(),
        daemon_cpu: daemon_cpu / calls,
        client_cpu: client_cpu / calls,
        errors,
        first_error,
    })
}

/// The numeric id of a response line (`{"jsonrpc":"2.0","id":N,...`).
fn answer_id(line: &str) -> Option<u64> {
    let rest = line.strip_prefix(r#"{"jsonrpc":"2.0","id":"#)?;
    let end = rest.find(|c: char| !c.is_ascii_digit())?;
    rest[..end].parse().ok()
}

/// A client of one transport, making one call at a time.
enum Client {
    Lines {
        reader: BufReader<tokio::net::unix::OwnedReadHalf>,
        writer: tokio::net::unix::OwnedWriteHalf,
        line: String,
    },
    UnixWs(Box<WebSocketStream<UnixStream>>),
    TcpWs(Box<WebSocketStream<TcpStream>>),
    Post {
        stream: TcpStream,
        host: String,
        buffer: Vec<u8>,
    },
}

impl Client {
    async fn connect(transport: Transport, target: &Target) -> anyhow::Result<Client> {
        let connecting = async {
            match transport {
                Transport::UnixNdjson => {
                    let (reader, writer) = UnixStream::connect(&target.socket).await?.into_split();
                    Ok(Client::Lines {
                        reader: BufReader::with_capacity(64 * 1024, reader),
                        writer,
                        line: String::new(),
                    })
                }
                Transport::UnixWs => {
                    let stream = UnixStream::connect(&target.socket).await?;
                    let (socket, _) =
                        tokio_tungstenite::client_async("ws://localhost/ws", stream).await?;
                    Ok(Client::UnixWs(Box::new(socket)))
                }
                Transport::TcpWs => {
                    let addr = target.tcp.ok_or_else(|| anyhow!("no tcp listener"))?;
                    let stream = TcpStream::connect(addr).await?;
                    stream.set_nodelay(true)?;
                    let mut request = format!("ws://{addr}/ws").into_client_request()?;
                    request
                        .headers_mut()
                        .insert("authorization", format!("Bearer {TOKEN}").parse()?);
                    let (socket, _) = tokio_tungstenite::client_async(request, stream).await?;
                    Ok(Client::TcpWs(Box::new(socket)))
                }
                Transport::TcpPost => {
                    let addr = target.tcp.ok_or_else(|| anyhow!("no tcp listener"))?;
                    let stream = TcpStream::connect(addr).await?;
                    stream.set_nodelay(true)?;
                    Ok(Client::Post { stream, host: addr.to_string(), buffer: Vec::new() })
                }
            }
        };
        tokio::time::timeout(STEP_TIMEOUT, connecting)
            .await
            .map_err(|_| anyhow!("connecting over {} timed out", transport.name()))?
    }

    /// One call; an error unless it succeeded with the right id.
    async fn call(&mut self, id: u64, workload: Workload) -> anyhow::Result<()> {
        let request = workload.request(id);
        let response = match self {
            Client::Lines { reader, writer, line } => {
                let mut framed = request;
                framed.push('\n');
                writer.write_all(framed.as_bytes()).await?;
                line.clear();
                if reader.read_line(line).await? == 0 {
                    bail!("connection closed");
                }
                std::mem::take(line)
            }
            Client::UnixWs(socket) => ws_call(socket, request).await?,
            Client::TcpWs(socket) => ws_call(socket, request).await?,
            Client::Post { stream, host, buffer } => {
                post_call(stream, host, buffer, &request).await?
            }
        };
        if !workload.succeeded(id, &response) {
            bail!("unexpected answer: {}", response.chars().take(300).collect::<String>());
        }
        Ok(())
    }
}

async fn ws_call<S>(socket: &mut WebSocketStream<S>, request: String) -> anyhow::Result<String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    socket.send(Message::text(request)).await?;
    loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => return Ok(text.as_str().to_owned()),
            Some(Ok(Message::Close(_))) | None => bail!("websocket closed"),
            Some(Ok(_)) => {}
            Some(Err(err)) => return Err(err.into()),
        }
    }
}

/// One keep-alive HTTP/1.1 request and its `Content-Length` response body.
async fn post_call(
    stream: &mut TcpStream,
    host: &str,
    buffer: &mut Vec<u8>,
    body: &str,
) -> anyhow::Result<String> {
    let request = format!(
        "POST /rpc HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    buffer.clear();
    let head_end = loop {
        if let Some(position) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break position + 4;
        }
        if stream.read_buf(buffer).await? == 0 {
            bail!("connection closed");
        }
    };
    let head = std::str::from_utf8(&buffer[..head_end])?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("http status: {}", head.lines().next().unwrap_or_default());
    }
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().ok())?
        })
        .ok_or_else(|| anyhow!("no content-length"))?;
    while buffer.len() < head_end + length {
        if stream.read_buf(buffer).await? == 0 {
            bail!("connection closed");
        }
    }
    Ok(String::from_utf8(buffer[head_end..head_end + length].to_vec())?)
}

/// Opens idle connections (each has made one request, so it has its framing chosen and
/// its default session open), reads the daemon's RSS, and closes them.
async fn idle_connections_rss(socket: &Path, pid: u32, count: usize) -> anyhow::Result<(u64, f64)> {
    let before = rss_kib(pid)?;
    let mut connections = Vec::with_capacity(count);
    for index in 0..count {
        let stream = UnixStream::connect(socket).await?;
        let mut stream = BufReader::new(stream);
        let request = Workload::Noop.request(index as u64);
        stream.get_mut().write_all(format!("{request}\n").as_bytes()).await?;
        let mut line = String::new();
        tokio::time::timeout(STEP_TIMEOUT, stream.read_line(&mut line)).await??;
        if !Workload::Noop.succeeded(index as u64, &line) {
            bail!("a request on an idle connection failed: {line}");
        }
        connections.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let with_idle = rss_kib(pid)?;
    drop(connections);
    let per_connection = with_idle.saturating_sub(before) as f64 / count.max(1) as f64;
    Ok((with_idle, per_connection))
}

/// The real binary's numbers.
struct Binary {
    startup: Duration,
    /// Rendered with its breakdown while the process was alive.
    idle_rss: String,
    idle_connections: usize,
    with_idle: u64,
    per_connection: f64,
    unix: Row,
    pipelined: Row,
}

impl Binary {
    fn print(&self) {
        println!("toolgate binary (`toolgate serve`, no configuration file)");
        println!("  startup to a listening socket: {}", millis(self.startup));
        println!("  idle RSS: {}", self.idle_rss);
        println!(
            "  RSS with {} idle unix connections: {} ({:.1} KiB per connection)",
            self.idle_connections,
            mib(self.with_idle),
            self.per_connection
        );
        print_header();
        self.unix.print();
        self.pipelined.print();
    }
}

/// Starts `toolgate serve` with a private runtime directory and home, and polls for
/// its socket; `None` when the command exits without ever listening.
async fn measure_binary(
    binary: &Path,
    root: &Path,
    scratch: &Path,
    plan: &Plan,
) -> anyhow::Result<Option<Binary>> {
    let runtime_dir = scratch.join("xdg-runtime");
    let home = scratch.join("home");
    for dir in [&runtime_dir, &home] {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    }
    let socket = runtime_dir.join("toolgate").join("toolgate.sock");
    let started = Instant::now();
    let mut child = Command::new(binary)
        .arg("serve")
        .current_dir(root)
        .env("XDG_RUNTIME_DIR", &runtime_dir)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {}", binary.display()))?;
    let listening = loop {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            break Some(started.elapsed());
        }
        if child.try_wait()?.is_some() || started.elapsed() > STEP_TIMEOUT {
            break None;
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    let Some(startup) = listening else {
        stop_child(&mut child);
        return Ok(None);
    };
    let pid = child.id();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle_rss = memory_breakdown(pid, rss_kib(pid)?)?;
    let (with_idle, per_connection) =
        idle_connections_rss(&socket, pid, plan.idle_connections).await?;
    let target = Target { socket, tcp: None, pid };
    let unix = measure(Transport::UnixNdjson, &target, plan).await?;
    let pipelined = measure_pipelined(&target, plan).await?;
    terminate(&mut child);
    Ok(Some(Binary {
        startup,
        idle_rss,
        idle_connections: plan.idle_connections,
        with_idle,
        per_connection,
        unix,
        pipelined,
    }))
}

/// Re-executes this benchmark as the daemon and waits for it to say where it listens.
fn spawn_library_daemon(
    root: &Path,
    socket: &Path,
) -> anyhow::Result<(Child, Target, RegistryCost)> {
    let mut child = Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, "1")
        .env(ROOT_ENV, root)
        .env(SOCKET_ENV, socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let ["ready", addr, registry_micros, registry_kib] = fields[..] else {
        stop_child(&mut child);
        bail!("the daemon did not start: {line:?}");
    };
    let tcp = Some(addr.parse()?);
    let pid = child.id();
    let registry = RegistryCost {
        built_in: Duration::from_micros(registry_micros.parse()?),
        rss_kib: registry_kib.parse()?,
    };
    Ok((child, Target { socket: socket.to_path_buf(), tcp, pid }, registry))
}

/// A server that does the least a tool daemon can over Unix NDJSON: the reference
/// the binary's numbers are read against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Floor {
    /// A blocking thread per connection.
    Threads,
    /// A task per connection on a Tokio multi-thread runtime (one worker per core).
    Tasks,
}

impl Floor {
    const ALL: [Floor; 2] = [Floor::Threads, Floor::Tasks];

    fn name(self) -> &'static str {
        match self {
            Floor::Threads => "threads",
            Floor::Tasks => "tasks",
        }
    }
}

/// Re-executes this benchmark as a floor and waits for its socket.
fn spawn_floor(floor: Floor, root: &Path, socket: &Path) -> anyhow::Result<(Child, Target)> {
    let mut child = Command::new(std::env::current_exe()?)
        .env(FLOOR_ENV, floor.name())
        .env(SOCKET_ENV, socket)
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let started = Instant::now();
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if child.try_wait()?.is_some() || started.elapsed() > STEP_TIMEOUT {
            stop_child(&mut child);
            bail!("the {} floor did not start", floor.name());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let pid = child.id();
    Ok((child, Target { socket: socket.to_path_buf(), tcp: None, pid }))
}

/// The floor side: serves the socket until stdin closes. Its work per line is the
/// same in both kinds: the request parsed into a JSON value, the file named by
/// `params.arguments.path` read whole, the answer written with the fields in the
/// order toolgate writes them (the load generator checks that order).
fn floor_child(floor: Floor) -> anyhow::Result<()> {
    let socket = PathBuf::from(std::env::var_os(SOCKET_ENV).ok_or_else(|| anyhow!("no socket"))?);
    let listener = std::os::unix::net::UnixListener::bind(&socket)?;
    // The process ends when the benchmark closes stdin, however the benchmark ends.
    std::thread::spawn(|| {
        let mut scratch = [0u8; 64];
        while matches!(std::io::stdin().read(&mut scratch), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    match floor {
        Floor::Threads => {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                std::thread::spawn(move || {
                    let Ok(read_half) = stream.try_clone() else { return };
                    let mut reader = std::io::BufReader::with_capacity(64 * 1024, read_half);
                    let mut writer = std::io::BufWriter::with_capacity(64 * 1024, stream);
                    let mut line = Vec::with_capacity(4096);
                    loop {
                        line.clear();
                        match reader.read_until(b'\n', &mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        if let Some(answer) = floor_answer(&line)
                            && writer.write_all(answer.as_bytes()).is_err()
                        {
                            return;
                        }
                        if reader.buffer().is_empty() && writer.flush().is_err() {
                            return;
                        }
                    }
                });
            }
            Ok(())
        }
        Floor::Tasks => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(async {
                listener.set_nonblocking(true)?;
                let listener = tokio::net::UnixListener::from_std(listener)?;
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    tokio::spawn(async move {
                        let (read_half, write_half) = stream.into_split();
                        let mut reader = BufReader::with_capacity(64 * 1024, read_half);
                        let mut writer = tokio::io::BufWriter::with_capacity(64 * 1024, write_half);
                        let mut line = Vec::with_capacity(4096);
                        loop {
                            line.clear();
                            match reader.read_until(b'\n', &mut line).await {
                                Ok(0) | Err(_) => return,
                                Ok(_) => {}
                            }
                            if let Some(answer) = floor_answer(&line)
                                && writer.write_all(answer.as_bytes()).await.is_err()
                            {
                                return;
                            }
                            if reader.buffer().is_empty() && writer.flush().await.is_err() {
                                return;
                            }
                        }
                    });
                }
            })
        }
    }
}

/// A floor's answer to one request line (with its newline); `None` for a line that
/// is not a request.
fn floor_answer(line: &[u8]) -> Option<String> {
    let request: serde_json::Value = serde_json::from_slice(line).ok()?;
    let id = request.get("id")?;
    let result = match request["method"].as_str().unwrap_or("") {
        "tools/call" => {
            let path = request["params"]["arguments"]["path"].as_str().unwrap_or("");
            match std::fs::read_to_string(path) {
                Ok(text) => format!(
                    r#"{{"content":{},"metadata":{{"call_id":{id}}},"ok":true,"tool":"read_file"}}"#,
                    serde_json::Value::String(text)
                ),
                Err(err) => format!(
                    r#"{{"content":"","error":{},"ok":false,"tool":"read_file"}}"#,
                    serde_json::Value::String(err.to_string())
                ),
            }
        }
        "tools/cancel" => r#"{"canceled":0}"#.to_owned(),
        _ => {
            return Some(
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"method not found"}}}}"#
                ) + "\n",
            );
        }
    };
    Some(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#) + "\n")
}

/// What building the registry of built-in tools cost the daemon at startup (schema
/// validators included): most of its startup time and idle memory.
struct RegistryCost {
    built_in: Duration,
    rss_kib: u64,
}

/// The daemon side: every transport over one `Daemon`, until stdin closes (which it
/// does when the benchmark ends, however it ends).
fn daemon_child() -> anyhow::Result<()> {
    use toolgate::daemon::{Daemon, Settings};
    use toolgate::rpc::{self, tcp};
    use toolgate::tools::Registry;

    let root = PathBuf::from(std::env::var_os(ROOT_ENV).ok_or_else(|| anyhow!("no root"))?);
    let socket = PathBuf::from(std::env::var_os(SOCKET_ENV).ok_or_else(|| anyhow!("no socket"))?);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let rss_before = rss_kib(std::process::id())?;
        let started = Instant::now();
        let registry = Arc::new(Registry::with_builtins());
        let registry_micros = started.elapsed().as_micros();
        let registry_kib = rss_kib(std::process::id())?.saturating_sub(rss_before);
        let daemon = Daemon::new(registry, Settings::for_roots(vec![root]), None);
        let unix = rpc::unix::bind(&socket)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tokens = toolgate::auth::TokenSet::from_pairs([("load", TOKEN)])?;
        let mut options = tcp::TcpOptions::new(tokens);
        options.limits = toolgate::admission::Limits::new(4096);
        let max_message = rpc::DEFAULT_MAX_MESSAGE_BYTES;
        let unix_serving = tokio::spawn(rpc::unix::serve(daemon.clone(), unix, 4096, max_message));
        let tcp_serving = tokio::spawn(tcp::serve(daemon.clone(), listener, options));
        let mut stdout = std::io::stdout();
        writeln!(stdout, "ready {addr} {registry_micros} {registry_kib}")?;
        stdout.flush()?;
        let mut stdin = tokio::io::stdin();
        let mut scratch = [0u8; 64];
        while stdin.read(&mut scratch).await? != 0 {}
        daemon.begin_shutdown();
        let _ = unix_serving.await;
        let _ = tcp_serving.await;
        anyhow::Ok(())
    })
}

fn stop_child(child: &mut Child) {
    drop(child.stdin.take());
    let deadline = Instant::now() + STEP_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn terminate(child: &mut Child) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    stop_child(child);
}

/// A 4 KiB text file of 64-byte lines.
fn file_text() -> String {
    let mut text = String::with_capacity(FILE_BYTES);
    let mut line_number = 0;
    while text.len() < FILE_BYTES {
        line_number += 1;
        let line = format!("line {line_number:04}: the quick brown fox jumps over the lazy dog");
        let room = FILE_BYTES - text.len();
        let mut line = format!("{line:<63}\n");
        line.truncate(room);
        text.push_str(&line);
    }
    text
}

/// The CPU time all threads of a process (live ones) have used: the first field of
/// each `/proc/PID/task/TID/schedstat`, in nanoseconds.
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(stat) = std::fs::read_to_string(task?.path().join("schedstat")) else {
            // The thread ended between the listing and the read.
            continue;
        };
        let on_cpu = stat.split_whitespace().next().unwrap_or("0");
        total += on_cpu.parse::<u64>().unwrap_or(0);
    }
    Ok(Duration::from_nanos(total))
}

/// `total (anonymous A, file F)`: file pages are the executable's code, which depends on
/// the binary (this benchmark's own is larger than `toolgate`), anonymous ones are the
/// daemon's data.
fn memory_breakdown(pid: u32, total: u64) -> anyhow::Result<String> {
    Ok(format!(
        "{} (anonymous {}, file-backed {})",
        mib(total),
        mib(status_kib(pid, "RssAnon:")?),
        mib(status_kib(pid, "RssFile:")?)
    ))
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    status_kib(pid, "VmRSS:")
}

/// A `kB` field of `/proc/PID/status`.
fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|line| line.starts_with(field))
        .ok_or_else(|| anyhow!("no {field} in /proc/{pid}/status"))?;
    let value = line[field.len()..].trim().trim_end_matches("kB").trim();
    Ok(value.parse()?)
}

/// 1,000 idle connections need more descriptors than some default limits allow.
fn raise_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if let Some(maximum) = limit.maximum {
        let _ =
            setrlimit(Resource::Nofile, Rlimit { current: Some(maximum), maximum: Some(maximum) });
    }
}

fn available_cores() -> usize {
    std::thread::available_parallelism().map(usize::from).unwrap_or(1)
}

fn micros(duration: Duration) -> String {
    format!("{:.1} µs", duration.as_secs_f64() * 1e6)
}

fn millis(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}
