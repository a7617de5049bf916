//! The TCP transport framed two ways, side by side: the native dispatch core
//! (`Framing::Native`, shared with the Unix socket) and jsonrpsee's server built from the
//! native API's definition (`Framing::Jsonrpsee`). One daemon (the built-in tools over a
//! temporary root with a 4 KiB file) serves both on two loopback listeners; the same
//! load generator, the typed client (`rpc::api`), drives each in turn, rounds
//! interleaved so that both see the same machine:
//!
//! - latency: `tools/call read_file` with one call in flight on one WebSocket (p50, p99);
//! - throughput: calls/s with 64 WebSockets each keeping one call in flight, and with
//!   16 HTTP clients each posting one call at a time.
//!
//! Run: `cargo bench --bench tcp_framing`. Knobs (environment): `TOOLGATE_TCP_ROUNDS`
//! (rounds per framing, default 3), `TOOLGATE_TCP_SECONDS` (seconds per throughput
//! run, default 3), `TOOLGATE_TCP_CALLS` (calls timed for latency, default 3000).
//! Without `--bench` (as under `cargo test --benches`) it makes a few calls of each
//! kind as a smoke test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tokio::net::TcpListener;
use toolgate::auth::TokenSet;
use toolgate::daemon::{Daemon, Settings};
use toolgate::protocol::ToolsCallParams;
use toolgate::rpc::api::{self, NativeApiClient};
use toolgate::rpc::tcp::{self, Framing, TcpOptions};
use toolgate::tools::Registry;

const TOKEN: &str = "tcp-framing-benchmark-0123456789";
const FILE_NAME: &str = "data.txt";
const FILE_BYTES: usize = 4096;
const WEBSOCKETS: usize = 64;
const HTTP_CLIENTS: usize = 16;
const WARMUP: Duration = Duration::from_millis(500);

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn read_call(id: u64) -> ToolsCallParams {
    ToolsCallParams {
        name: "read_file".to_owned(),
        arguments: json!({"path": FILE_NAME}),
        session_id: None,
        call_id: Some(format!("c{id}")),
    }
}

async fn one_call<C: NativeApiClient>(client: &C, id: u64) -> anyhow::Result<()> {
    let result = client.tools_call(read_call(id)).await?;
    if !result.ok {
        bail!("read_file failed: {}", result.content);
    }
    Ok(())
}

struct Latency {
    p50: Duration,
    p99: Duration,
}

async fn latency(addr: SocketAddr, calls: u64) -> anyhow::Result<Latency> {
    let client = api::connect_ws(&format!("ws://{addr}/ws"), TOKEN).await?;
    for id in 0..calls / 10 {
        one_call(&client, id).await?;
    }
    let mut times = Vec::with_capacity(usize::try_from(calls)?);
    for id in 0..calls {
        let start = Instant::now();
        one_call(&client, id).await?;
        times.push(start.elapsed());
    }
    times.sort_unstable();
    let at = |fraction: f64| {
        let index = ((times.len() as f64 - 1.0) * fraction).round() as usize;
        times[index]
    };
    Ok(Latency { p50: at(0.50), p99: at(0.99) })
}

/// Calls per second with `callers` each keeping one call in flight.
async fn throughput<C, F, Fut>(callers: usize, seconds: u64, connect: F) -> anyhow::Result<f64>
where
    C: NativeApiClient + Send + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<C>>,
{
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let client = connect().await?;
        let (counting, stop, count) = (counting.clone(), stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut id = (caller as u64) << 32;
            while !stop.load(Ordering::Relaxed) {
                one_call(&client, id).await?;
                id += 1;
                if counting.load(Ordering::Relaxed) {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(WARMUP).await;
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let counted = count.load(Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.context("a caller panicked")??;
    }
    Ok(counted as f64 / elapsed.as_secs_f64())
}

#[derive(Default)]
struct Samples {
    p50: Vec<Duration>,
    p99: Vec<Duration>,
    ws: Vec<f64>,
    http: Vec<f64>,
}

fn median<T: PartialOrd + Copy>(values: &[T]) -> T {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    sorted[sorted.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let measuring = std::env::args().any(|arg| arg == "--bench");
    let rounds = if measuring { env_number("TOOLGATE_TCP_ROUNDS", 3) } else { 1 };
    let seconds = if measuring { env_number("TOOLGATE_TCP_SECONDS", 3) } else { 1 };
    let calls = if measuring { env_number("TOOLGATE_TCP_CALLS", 3000) } else { 20 };

    // The daemon on a runtime of its own, the load generator on another.
    let server = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let _entered = server.enter();
    let dir = tempfile::tempdir()?;
    let root = std::fs::canonicalize(dir.path())?;
    std::fs::write(root.join(FILE_NAME), "x".repeat(FILE_BYTES - 1) + "\n")?;
    let daemon =
        Daemon::new(Arc::new(Registry::with_builtins()), Settings::for_roots(vec![root]), None);
    let mut addresses = Vec::new();
    for framing in [Framing::Native, Framing::Jsonrpsee] {
        let mut options = TcpOptions::new(TokenSet::from_pairs([("bench", TOKEN)])?);
        options.framing = framing;
        options.limits = toolgate::admission::Limits::new(1024);
        let listener = server.block_on(TcpListener::bind("127.0.0.1:0"))?;
        addresses.push((framing, listener.local_addr()?));
        server.spawn(tcp::serve(daemon.clone(), listener, options));
    }

    let client = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut samples = [Samples::default(), Samples::default()];
    for round in 0..rounds {
        // Alternate which framing goes first, so neither always runs on a warmer machine.
        let order: Vec<usize> = if round % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
        for index in order {
            let (_, addr) = addresses[index];
            let sample = &mut samples[index];
            client.block_on(async {
                let latency = latency(addr, calls).await?;
                sample.p50.push(latency.p50);
                sample.p99.push(latency.p99);
                let url = format!("ws://{addr}/ws");
                sample.ws.push(
                    throughput(WEBSOCKETS, seconds, || async {
                        Ok(api::connect_ws(&url, TOKEN).await?)
                    })
                    .await?,
                );
                let url = format!("http://{addr}/rpc");
                sample.http.push(
                    throughput(HTTP_CLIENTS, seconds, || async {
                        Ok(api::connect_http(&url, TOKEN)?)
                    })
                    .await?,
                );
                anyhow::Ok(())
            })?;
        }
    }
    daemon.begin_shutdown();

    println!(
        "{:<10} {:>10} {:>10} {:>14} {:>14}",
        "framing", "p50 µs", "p99 µs", "ws calls/s", "post calls/s"
    );
    for (index, (framing, _)) in addresses.iter().enumerate() {
        let sample = &samples[index];
        println!(
            "{:<10} {:>10.1} {:>10.1} {:>14.0} {:>14.0}",
            format!("{framing:?}").to_lowercase(),
            median(&sample.p50).as_secs_f64() * 1e6,
            median(&sample.p99).as_secs_f64() * 1e6,
            median(&sample.ws),
            median(&sample.http),
        );
    }
    let [native, jsonrpsee] = &samples;
    println!(
        "jsonrpsee/native: p50 {:.2}x, ws throughput {:.2}x, post throughput {:.2}x \
         (medians of {rounds} interleaved rounds)",
        median(&jsonrpsee.p50).as_secs_f64() / median(&native.p50).as_secs_f64(),
        median(&jsonrpsee.ws) / median(&native.ws),
        median(&jsonrpsee.http) / median(&native.http),
    );
    Ok(())
}
