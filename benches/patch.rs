//! apply_patch of a 20-file patch, durably (every staged file fsynced, the journal
//! committed, the directories fsynced), against writing the same 20 files durably one
//! by one (temporary file, fsync, rename, directory fsync each), on the same disk.
//!
//! The patch runs through `Registry::execute`, as every client reaches it; the
//! reference calls the shared atomic write directly, so the ratio is the whole price
//! of the tool (parsing, matching, staleness checks, the journal) over plain durable
//! writes. The target is a ratio of at most 2. Each iteration flips the files between
//! two versions, so every run really changes all 20.
//!
//! Run with `cargo bench --bench patch`. The files live under `target/bench-patch`
//! (a real disk, not a tmpfs `/tmp`, or fsync would cost nothing).

use std::cell::Cell;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolgate::tools::builtin::apply_patch;
use toolgate::tools::{Call, Env, Registry, fs};

const FILES: usize = 20;
/// The ratio apply_patch / one-by-one writes we aim for.
const TARGET_RATIO: f64 = 2.0;

fn content(idx: usize, version: usize) -> String {
    let mut text = format!("// file {idx}\n");
    for line in 0..60 {
        text.push_str(&format!("fn f{line}() -> u32 {{ {} }}\n", line * 7 + idx));
    }
    text.push_str(&format!("const VERSION: u32 = {version};\n"));
    text
}

fn patch(from: usize, to: usize) -> String {
    let mut patch = String::from("*** Begin Patch\n");
    for idx in 0..FILES {
        patch.push_str(&format!(
            "*** Update File: f{idx:02}.rs\n@@\n fn f59() -> u32 {{ {} }}\n-const VERSION: u32 = {from};\n+const VERSION: u32 = {to};\n",
            59 * 7 + idx
        ));
    }
    patch.push_str("*** End Patch\n");
    patch
}

fn bench_dir(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"), PathBuf::from);
    let dir = target.join("bench-patch").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let made = std::fs::create_dir_all(&dir);
    assert!(made.is_ok(), "cannot create {}: {made:?}", dir.display());
    dir
}

/// Mean time per iteration measured by a bench function.
fn measured(total: &Cell<(Duration, u64)>) -> f64 {
    let (time, iters) = total.get();
    time.as_secs_f64() / iters.max(1) as f64
}

fn main() {
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => panic!("cannot start the runtime: {err}"),
    };

    // apply_patch.
    let root = bench_dir("patch");
    apply_patch::set_journal_dir(root.parent().unwrap_or(&root).join("journal"));
    for idx in 0..FILES {
        let _ = std::fs::write(root.join(format!("f{idx:02}.rs")), content(idx, 0));
    }
    let env = match Env::for_root(&root) {
        Ok(env) => Arc::new(env),
        Err(err) => panic!("cannot use {}: {err}", root.display()),
    };
    let registry = Registry::with_builtins();
    let call = |name: &str, args: serde_json::Value| {
        runtime.block_on(registry.execute(
            &Call::from_value("b", name, &args),
            &env,
            &CancellationToken::new(),
        ))
    };
    for idx in 0..FILES {
        let res = call("read_file", json!({"path": format!("f{idx:02}.rs")}));
        assert!(res.ok, "{res:?}");
    }
    let forward = patch(0, 1);
    let back = patch(1, 0);
    let mut version = 0usize;
    let patch_total = Cell::new((Duration::ZERO, 0u64));
    criterion.bench_function("apply_patch 20 files (durable)", |bencher| {
        bencher.iter_custom(|iters| {
            let started = Instant::now();
            for _ in 0..iters {
                let patch = if version == 0 { &forward } else { &back };
                let res = call("apply_patch", json!({"patch": patch}));
                assert!(res.ok, "{res:?}");
                version = 1 - version;
            }
            let elapsed = started.elapsed();
            let (time, count) = patch_total.get();
            patch_total.set((time + elapsed, count + iters));
            elapsed
        });
    });

    // The same 20 files written durably one by one.
    let plain = bench_dir("one-by-one");
    let dir = match std::fs::File::open(&plain) {
        Ok(dir) => dir,
        Err(err) => panic!("cannot open {}: {err}", plain.display()),
    };
    let versions = [
        (0..FILES).map(|idx| content(idx, 0)).collect::<Vec<_>>(),
        (0..FILES).map(|idx| content(idx, 1)).collect::<Vec<_>>(),
    ];
    let names: Vec<String> = (0..FILES).map(|idx| format!("f{idx:02}.rs")).collect();
    let mut flip = 0usize;
    let single_total = Cell::new((Duration::ZERO, 0u64));
    criterion.bench_function("20 atomic writes one by one (durable)", |bencher| {
        bencher.iter_custom(|iters| {
            let started = Instant::now();
            for _ in 0..iters {
                flip = 1 - flip;
                for (name, text) in names.iter().zip(&versions[flip]) {
                    let written = fs::write_atomic(&dir, OsStr::new(name), text.as_bytes(), None);
                    assert!(written.is_ok(), "{written:?}");
                }
            }
            let elapsed = started.elapsed();
            let (time, count) = single_total.get();
            single_total.set((time + elapsed, count + iters));
            elapsed
        });
    });
    criterion.final_summary();
    println!(
        "criterion means: apply_patch of {FILES} files {:.2} ms, {FILES} durable writes one by \
         one {:.2} ms",
        measured(&patch_total) * 1e3,
        measured(&single_total) * 1e3,
    );

    // fsync's cost swings with whatever else the machine writes, so the ratio comes
    // from rounds that run one of each back to back: the median of per-round ratios.
    let rounds: usize =
        std::env::var("TOOLGATE_BENCH_RUNS").ok().and_then(|runs| runs.parse().ok()).unwrap_or(15);
    let mut ratios = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let patch = if version == 0 { &forward } else { &back };
        let started = Instant::now();
        let res = call("apply_patch", json!({"patch": patch}));
        let patched = started.elapsed();
        assert!(res.ok, "{res:?}");
        version = 1 - version;
        flip = 1 - flip;
        let started = Instant::now();
        for (name, text) in names.iter().zip(&versions[flip]) {
            let written = fs::write_atomic(&dir, OsStr::new(name), text.as_bytes(), None);
            assert!(written.is_ok(), "{written:?}");
        }
        let written = started.elapsed();
        ratios.push(patched.as_secs_f64() / written.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "apply_patch / one-by-one, median of {rounds} interleaved rounds: {median:.2} \
         (target ≤ {TARGET_RATIO}; min {:.2}, max {:.2})",
        ratios[0],
        ratios[ratios.len() - 1]
    );
}
