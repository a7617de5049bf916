//! search_code against ripgrep and find_files against fd, on the same tree.
//!
//! The tree is `$TOOLGATE_BENCH_TREE` when set (any real source tree, e.g. the Rust
//! docs at `$(rustc --print sysroot)/share/doc/rust/html`), otherwise a deterministic
//! corpus of about 30 000 source-like files (~300 MB) generated once under
//! `target/bench-corpus` and reused by later runs. The corpus has a `.gitignore` with
//! ignored directories and files, hidden directories and binary files, so that both
//! sides must apply the same filters to agree.
//!
//! Each case first checks that both sides report the same results (per-file counts for
//! search, the path set for find), then times a few warm runs of each and prints the
//! medians and the ratio toolgate/external. Our side runs through
//! `Registry::execute`, as every client reaches it. The external side is skipped with
//! a message when `rg` or `fdfind`/`fd` is not installed.
//!
//! Run with `cargo bench --bench search`; `TOOLGATE_BENCH_RUNS` sets the number of
//! timed runs per side (default 7).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolgate::tools::{Call, Env, Registry};

/// Bumped whenever the generator changes, so a stale corpus is rebuilt.
const CORPUS_VERSION: &str = "toolgate-bench-corpus v1";
/// Top-level directories of the generated corpus (one "crate" each).
const N_CRATES: usize = 30;
/// Module directories per crate.
const N_MODULES: usize = 10;
/// Source files per module directory: 30 × 10 × 100 = 30 000 files.
const N_FILES: usize = 100;
/// The ratio toolgate/external we aim for.
const TARGET_RATIO: f64 = 1.25;

fn main() -> ExitCode {
    let runs: usize =
        std::env::var("TOOLGATE_BENCH_RUNS").ok().and_then(|runs| runs.parse().ok()).unwrap_or(7);
    let tree = match std::env::var_os("TOOLGATE_BENCH_TREE") {
        Some(tree) => PathBuf::from(tree),
        None => match generated_corpus() {
            Ok(tree) => tree,
            Err(err) => {
                eprintln!("cannot build the benchmark corpus: {err}");
                return ExitCode::FAILURE;
            }
        },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let bench = match Bench::new(&tree, runtime) {
        Ok(bench) => bench,
        Err(err) => {
            eprintln!("cannot open {}: {err}", tree.display());
            return ExitCode::FAILURE;
        }
    };
    println!("tree: {} ({})", tree.display(), describe_tree(&tree));
    println!(
        "threads: {}, runs per side: {runs}\n",
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    );

    // `TOOLGATE_BENCH_ONLY=search` or `=find` runs one half (for profiling).
    let only = std::env::var("TOOLGATE_BENCH_ONLY").unwrap_or_default();
    let rg = find_binary(&["rg"]);
    let fd = find_binary(&["fdfind", "fd"]);
    let mut all_agree = true;
    let mut rows = Vec::new();
    let search_cases: &[(&str, &str)] =
        if only == "find" { &[] } else { &[("literal", "TODO"), ("regex", r"fn [a-z]+_[a-z]+\(")] };
    for &(label, pattern) in search_cases {
        let case = SearchCase { label, pattern };
        match case.run(&bench, rg.as_deref(), runs) {
            Ok(row) => rows.push(row),
            Err(err) => {
                eprintln!("{err}");
                all_agree = false;
            }
        }
        if label == "literal" {
            match case.run_content(&bench, rg.as_deref(), runs) {
                Ok(row) => rows.push(row),
                Err(err) => {
                    eprintln!("{err}");
                    all_agree = false;
                }
            }
        }
    }
    let find_patterns: &[&str] = if only == "search" { &[] } else { &["*.rs", "*.md", "*.html"] };
    for &pattern in find_patterns {
        match find_case(&bench, fd.as_deref(), pattern, runs) {
            Ok(row) => rows.push(row),
            Err(err) => {
                eprintln!("{err}");
                all_agree = false;
            }
        }
    }

    println!(
        "\n{:<48} {:>9} {:>9} {:>6}   {:>9} {:>9} {:>6}  {:>7}",
        "case", "toolgate", "external", "ratio", "cpu ours", "cpu ext", "ratio", "results"
    );
    for row in &rows {
        let wall = |timing: Option<Timing>| timing.map(|timing| timing.wall);
        let cpu = |timing: Option<Timing>| timing.and_then(|timing| timing.cpu);
        println!(
            "{:<48} {:>9} {:>9} {:>6}   {:>9} {:>9} {:>6}  {:>7}",
            row.name,
            show_ms(wall(Some(row.toolgate))),
            show_ms(wall(row.external)),
            show_ratio(wall(Some(row.toolgate)), wall(row.external)),
            show_ms(cpu(Some(row.toolgate))),
            show_ms(cpu(row.external)),
            show_ratio(cpu(Some(row.toolgate)), cpu(row.external)),
            row.results
        );
    }
    println!(
        "\nwall: median of warm runs; cpu: mean user+system time per run. \
         Target: wall ratio <= {TARGET_RATIO:.2}x"
    );
    if all_agree { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// One line of the final table.
struct Row {
    name: String,
    toolgate: Timing,
    external: Option<Timing>,
    results: usize,
}

/// The tree, an Env on it and a Registry to run calls through.
struct Bench {
    root: PathBuf,
    env: Arc<Env>,
    registry: Registry,
    runtime: tokio::runtime::Runtime,
}

impl Bench {
    fn new(root: &Path, runtime: tokio::runtime::Runtime) -> std::io::Result<Bench> {
        let mut env = Env::for_root(root)?;
        // Whole results, never cut by the session's output cap: the point is to
        // compare complete answers.
        env.max_output_bytes = 1 << 30;
        env.timeout = toolgate::tools::MAX_TIMEOUT;
        Ok(Bench {
            root: env.cwd.clone(),
            env: Arc::new(env),
            registry: Registry::with_builtins(),
            runtime,
        })
    }

    /// Runs one call and returns its content, or the failure as an error.
    fn call(&self, tool: &str, args: &Value) -> Result<String, String> {
        let call = Call::from_value("bench", tool, args);
        let res = self.runtime.block_on(self.registry.execute(
            &call,
            &self.env,
            &CancellationToken::new(),
        ));
        if !res.ok {
            return Err(format!("{tool} {args} failed: {:?} {:?}", res.error_type, res.error));
        }
        if res.metadata.get("truncated") == Some(&Value::Bool(true)) {
            return Err(format!("{tool} {args} was truncated; raise the limit"));
        }
        Ok(res.content)
    }

    fn external(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let output = Command::new(program)
            .args(args)
            .current_dir(&self.root)
            .output()
            .map_err(|err| format!("{program}: {err}"))?;
        // rg exits 1 when nothing matched; anything else non-zero is a failure.
        if !output.status.success() && output.status.code() != Some(1) {
            return Err(format!(
                "{program} {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        String::from_utf8(output.stdout).map_err(|err| format!("{program}: {err}"))
    }
}

struct SearchCase<'a> {
    label: &'a str,
    pattern: &'a str,
}

impl SearchCase<'_> {
    /// Count mode against `rg -c`, then content mode against `rg -n`.
    fn run(&self, bench: &Bench, rg: Option<&str>, runs: usize) -> Result<Row, String> {
        let count_args = json!({"pattern": self.pattern, "output_mode": "count", "limit": 100_000});
        let ours = parse_counts(&bench.call("search_code", &count_args)?)?;
        let total_matches: u64 = ours.values().sum();
        println!(
            "search {:<8} {:<24} {} files, {} matching lines",
            self.label,
            format!("{:?}", self.pattern),
            ours.len(),
            total_matches
        );
        let rg_args = ["--no-config", "-c", self.pattern];
        if let Some(rg) = rg {
            let theirs = parse_counts(&bench.external(rg, &rg_args)?)?;
            if ours != theirs {
                return Err(format!(
                    "search {:?}: counts differ from rg: {}",
                    self.pattern,
                    describe_difference(&ours, &theirs)
                ));
            }
            println!("  per-file counts agree with rg -c");
        } else {
            println!("  rg not installed: external side skipped (apt-get install ripgrep)");
        }
        let (toolgate, external) = time_both(
            runs,
            || bench.call("search_code", &count_args).map(drop),
            rg.map(|rg| move || bench.external(rg, &rg_args).map(drop)),
        )?;
        Ok(Row {
            name: format!("search_code count {:?} vs rg -c", self.pattern),
            toolgate,
            external,
            results: ours.len(),
        })
    }

    /// Content mode against `rg -n`: the same `path:line` locations (rg's come in its
    /// threads' order, so both are compared sorted; the text is left out because ours
    /// clips very long lines and rg does not).
    fn run_content(&self, bench: &Bench, rg: Option<&str>, runs: usize) -> Result<Row, String> {
        let args = json!({"pattern": self.pattern, "limit": 100_000});
        let ours = locations_sorted(&bench.call("search_code", &args)?);
        println!(
            "search {:<8} {:<24} {} lines (content)",
            self.label,
            format!("{:?}", self.pattern),
            ours.len()
        );
        let rg_args = ["--no-config", "-n", self.pattern];
        if let Some(rg) = rg {
            let theirs = locations_sorted(&bench.external(rg, &rg_args)?);
            if ours != theirs {
                return Err(format!(
                    "search {:?}: {} content lines vs rg's {}",
                    self.pattern,
                    ours.len(),
                    theirs.len()
                ));
            }
            println!("  content lines agree with rg -n");
        }
        let (toolgate, external) = time_both(
            runs,
            || bench.call("search_code", &args).map(drop),
            rg.map(|rg| move || bench.external(rg, &rg_args).map(drop)),
        )?;
        Ok(Row {
            name: format!("search_code content {:?} vs rg -n", self.pattern),
            toolgate,
            external,
            results: ours.len(),
        })
    }
}

fn find_case(bench: &Bench, fd: Option<&str>, pattern: &str, runs: usize) -> Result<Row, String> {
    let args = json!({"pattern": pattern, "limit": 100_000});
    let ours = lines_sorted(&bench.call("find_files", &args)?);
    println!("find   {:<33} {} paths", format!("{pattern:?}"), ours.len());
    // fd: glob on the file name, case-sensitive, files and symlinks (what find_files
    // lists), ignore files and hidden filtering by default like ours.
    let fd_args = ["--glob", "--case-sensitive", "--type", "f", "--type", "l", pattern];
    if let Some(fd) = fd {
        let theirs = lines_sorted(&bench.external(fd, &fd_args)?);
        if ours != theirs {
            let only_ours: Vec<&String> =
                ours.iter().filter(|path| !theirs.contains(path)).take(5).collect();
            let only_theirs: Vec<&String> =
                theirs.iter().filter(|path| !ours.contains(path)).take(5).collect();
            return Err(format!(
                "find {pattern:?}: {} paths vs fd's {}; only ours: {only_ours:?}; only fd's: {only_theirs:?}",
                ours.len(),
                theirs.len()
            ));
        }
        println!("  path set agrees with fd");
    } else {
        println!("  fd not installed: external side skipped (apt-get install fd-find)");
    }
    let (toolgate, external) = time_both(
        runs,
        || bench.call("find_files", &args).map(drop),
        fd.map(|fd| move || bench.external(fd, &fd_args).map(drop)),
    )?;
    Ok(Row {
        name: format!("find_files {pattern:?} vs fd -g"),
        toolgate,
        external,
        results: ours.len(),
    })
}

/// Median wall time and mean CPU time (user + system) of one side.
#[derive(Clone, Copy, Debug)]
struct Timing {
    wall: Duration,
    cpu: Option<Duration>,
}

/// One warm-up run of each side, then `runs` runs of each, alternating so that both
/// sides see the same machine load. Wall time is what the targets are about; CPU time
/// is shown too because on a busy machine it varies much less than wall time.
fn time_both<Ours, Theirs>(
    runs: usize,
    mut ours: Ours,
    mut theirs: Option<Theirs>,
) -> Result<(Timing, Option<Timing>), String>
where
    Ours: FnMut() -> Result<(), String>,
    Theirs: FnMut() -> Result<(), String>,
{
    let runs = runs.max(1);
    let (mut ours_wall, mut theirs_wall) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    let (mut ours_cpu, mut theirs_cpu) = (Some(Duration::ZERO), Some(Duration::ZERO));
    for run_idx in 0..=runs {
        let cpu_before = cpu_times();
        let start = Instant::now();
        ours()?;
        let ours_elapsed = start.elapsed();
        let cpu_between = cpu_times();
        let theirs_elapsed = match &mut theirs {
            Some(theirs) => {
                let start = Instant::now();
                theirs()?;
                Some(start.elapsed())
            }
            None => None,
        };
        let cpu_after = cpu_times();
        // Run 0 only warms the page cache and the allocators.
        if run_idx == 0 {
            continue;
        }
        ours_wall.push(ours_elapsed);
        theirs_wall.extend(theirs_elapsed);
        ours_cpu = match (ours_cpu, cpu_before, cpu_between) {
            (Some(sum), Some(before), Some(after)) => {
                Some(sum + after.own.saturating_sub(before.own))
            }
            _ => None,
        };
        theirs_cpu = match (theirs_cpu, cpu_between, cpu_after) {
            (Some(sum), Some(before), Some(after)) => {
                Some(sum + after.children.saturating_sub(before.children))
            }
            _ => None,
        };
    }
    let n_runs = u32::try_from(runs).unwrap_or(u32::MAX);
    let ours = Timing { wall: median(ours_wall), cpu: ours_cpu.map(|sum| sum / n_runs) };
    let theirs = (!theirs_wall.is_empty())
        .then(|| Timing { wall: median(theirs_wall), cpu: theirs_cpu.map(|sum| sum / n_runs) });
    Ok((ours, theirs))
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

/// CPU time used so far by this process and by its waited-for children.
#[derive(Clone, Copy)]
struct CpuTimes {
    own: Duration,
    children: Duration,
}

/// Reads `/proc/self/stat` (Linux): utime, stime, cutime, cstime in clock ticks of
/// 1/100 s (`USER_HZ`, fixed by the kernel ABI). `None` where /proc is unavailable.
fn cpu_times() -> Option<CpuTimes> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may contain spaces; the fields after it are plain.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let tick = |idx: usize| -> Option<u64> { fields.get(idx)?.parse().ok() };
    // Fields 14-17 of the man page, counted from field 3 (the one after the name).
    let (utime, stime, cutime, cstime) = (tick(11)?, tick(12)?, tick(13)?, tick(14)?);
    let ticks = |n: u64| Duration::from_millis(n * 10);
    Some(CpuTimes { own: ticks(utime + stime), children: ticks(cutime + cstime) })
}

fn show_ms(duration: Option<Duration>) -> String {
    duration.map_or_else(
        || "-".to_owned(),
        |duration| format!("{:.1}ms", duration.as_secs_f64() * 1000.0),
    )
}

fn show_ratio(ours: Option<Duration>, theirs: Option<Duration>) -> String {
    match (ours, theirs) {
        (Some(ours), Some(theirs)) if !theirs.is_zero() => {
            format!("{:.2}x", ours.as_secs_f64() / theirs.as_secs_f64())
        }
        _ => "-".to_owned(),
    }
}

/// `path:N` lines (ours and rg's) as a map.
fn parse_counts(output: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut counts = BTreeMap::new();
    for line in output.lines() {
        if line == "No matches found." {
            continue;
        }
        let Some((path, count)) = line.rsplit_once(':') else {
            return Err(format!("not a count line: {line:?}"));
        };
        let count = count.parse().map_err(|_| format!("not a count line: {line:?}"))?;
        counts.insert(path.trim_start_matches("./").to_owned(), count);
    }
    Ok(counts)
}

fn describe_difference(ours: &BTreeMap<String, u64>, theirs: &BTreeMap<String, u64>) -> String {
    let mut notes = vec![format!("{} files vs rg's {}", ours.len(), theirs.len())];
    for (path, count) in ours {
        if theirs.get(path) != Some(count) {
            notes.push(format!("{path}: {count} vs {:?}", theirs.get(path)));
        }
    }
    for path in theirs.keys().filter(|path| !ours.contains_key(*path)) {
        notes.push(format!("{path}: only rg"));
    }
    notes.truncate(8);
    notes.join("; ")
}

fn lines_sorted(output: &str) -> Vec<String> {
    let mut lines: Vec<String> = output
        .lines()
        .filter(|line| *line != "No files found." && *line != "No matches found.")
        .map(|line| line.trim_start_matches("./").to_owned())
        .collect();
    lines.sort_unstable();
    lines
}

/// The `path:line` of every `path:line:text` line, sorted.
fn locations_sorted(output: &str) -> Vec<String> {
    let mut locations: Vec<String> = output
        .lines()
        .filter(|line| *line != "No matches found.")
        .map(|line| {
            let mut fields = line.splitn(3, ':');
            let path = fields.next().unwrap_or_default().trim_start_matches("./");
            format!("{path}:{}", fields.next().unwrap_or_default())
        })
        .collect();
    locations.sort_unstable();
    locations
}

/// The first of `names` found on `PATH`.
fn find_binary(names: &[&str]) -> Option<String> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
            .map(|candidate| candidate.display().to_string())
    })
}

/// "N files, M MB" (everything, ignored and hidden included).
fn describe_tree(root: &Path) -> String {
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(file_type) = entry.file_type() else { continue };
            if file_type.is_dir() {
                stack.push(entry.path());
            } else if file_type.is_file() {
                files += 1;
                bytes += entry.metadata().map_or(0, |meta| meta.len());
            }
        }
    }
    format!("{files} files, {} MB", bytes / 1_000_000)
}

// -------------------------------------------------------------------------------------
// The generated corpus

/// Builds the corpus under `target/bench-corpus` unless a complete one is there.
fn generated_corpus() -> std::io::Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let root = target.join("bench-corpus");
    let marker = root.join(".corpus-version");
    if std::fs::read_to_string(&marker).is_ok_and(|version| version == CORPUS_VERSION) {
        return Ok(root);
    }
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    println!("generating the corpus under {} (once) ...", root.display());
    let start = Instant::now();
    write_corpus(&root)?;
    // Written last: an interrupted generation is redone next time.
    std::fs::write(&marker, CORPUS_VERSION)?;
    println!("generated in {:.1}s", start.elapsed().as_secs_f64());
    Ok(root)
}

fn write_corpus(root: &Path) -> std::io::Result<()> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut text = Vec::with_capacity(64 * 1024);
    // An empty `.git` makes the corpus a repository root, so every tool applies its
    // `.gitignore` (some only do inside a repository) and no parent's rules leak in.
    std::fs::create_dir_all(root.join(".git"))?;
    std::fs::write(root.join(".gitignore"), "target/\n*.log\n/vendor/\n")?;
    for crate_idx in 0..N_CRATES {
        let crate_dir = root.join(format!("crate_{crate_idx:02}"));
        for module_idx in 0..N_MODULES {
            let module_dir = crate_dir.join(format!("src/mod_{module_idx}"));
            std::fs::create_dir_all(&module_dir)?;
            for file_idx in 0..N_FILES {
                let extension = ["rs", "rs", "rs", "py", "js", "md", "txt"][rng.below(7)];
                // 1 to 19 KiB, about 10 KiB on average.
                let size = 1024 + rng.below(18 * 1024);
                fill_source(&mut rng, &mut text, size);
                std::fs::write(module_dir.join(format!("file_{file_idx:03}.{extension}")), &text)?;
            }
        }
        // Ignored build output, a log, hidden files and binary files: all contain the
        // benchmark patterns, so any filter difference shows up in the counts.
        let build_dir = crate_dir.join("target/debug");
        std::fs::create_dir_all(&build_dir)?;
        for file_idx in 0..20 {
            fill_source(&mut rng, &mut text, 8 * 1024);
            std::fs::write(build_dir.join(format!("gen_{file_idx}.rs")), &text)?;
        }
        fill_source(&mut rng, &mut text, 16 * 1024);
        std::fs::write(crate_dir.join("build.log"), &text)?;
        let hidden_dir = crate_dir.join(".cache");
        std::fs::create_dir_all(&hidden_dir)?;
        for file_idx in 0..5 {
            fill_source(&mut rng, &mut text, 4 * 1024);
            std::fs::write(hidden_dir.join(format!("cached_{file_idx}.rs")), &text)?;
        }
        let assets = crate_dir.join("assets");
        std::fs::create_dir_all(&assets)?;
        for file_idx in 0..3 {
            fill_source(&mut rng, &mut text, 4 * 1024);
            text[10] = 0;
            std::fs::write(assets.join(format!("blob_{file_idx}.bin")), &text)?;
        }
    }
    let vendor = root.join("vendor/dep");
    std::fs::create_dir_all(&vendor)?;
    for file_idx in 0..200 {
        fill_source(&mut rng, &mut text, 8 * 1024);
        std::fs::write(vendor.join(format!("dep_{file_idx}.rs")), &text)?;
    }
    Ok(())
}

const IDENTS: &[&str] = &[
    "value", "count", "index", "buffer", "parse", "config", "state", "result", "entry", "node",
    "path", "reader", "writer", "token", "span", "scope", "cache", "limit", "offset", "handle",
];
const TYPES: &[&str] =
    &["u32", "usize", "String", "&str", "Vec<u8>", "Option<u64>", "bool", "PathBuf", "Self"];
const WORDS: &[&str] = &[
    "the",
    "walker",
    "keeps",
    "only",
    "what",
    "is",
    "needed",
    "for",
    "output",
    "and",
    "never",
    "follows",
    "links",
    "outside",
    "root",
    "so",
    "results",
    "stay",
    "deterministic",
    "fast",
];

/// Replaces `text` with about `size` bytes of source-like lines.
fn fill_source(rng: &mut Rng, text: &mut Vec<u8>, size: usize) {
    use std::io::Write as _;
    text.clear();
    while text.len() < size {
        let ident = IDENTS[rng.below(IDENTS.len())];
        let other = IDENTS[rng.below(IDENTS.len())];
        let ty = TYPES[rng.below(TYPES.len())];
        // Writing into a Vec cannot fail.
        if rng.below(1000) == 0 {
            let _ = writeln!(
                text,
                "    // TODO: {ident} the {other} before {}",
                WORDS[rng.below(WORDS.len())]
            );
            continue;
        }
        let _ = match rng.below(100) {
            0..=9 => writeln!(text, "fn {ident}_{other}({other}: {ty}) -> {ty} {{"),
            10..=14 => writeln!(text, "pub fn {ident}({other}: {ty}) {{"),
            15..=44 => writeln!(text, "    let {ident} = {other}.{ident}({});", rng.below(1000)),
            45..=59 => {
                let n_words = 3 + rng.below(8);
                let words: Vec<&str> =
                    (0..n_words).map(|_| WORDS[rng.below(WORDS.len())]).collect();
                writeln!(text, "    // {}", words.join(" "))
            }
            60..=74 => writeln!(text, "    if {ident} > {} {{ return {other}; }}", rng.below(100)),
            75..=84 => writeln!(text, "}}"),
            85..=89 => writeln!(text, "use crate::{ident}::{other};"),
            _ => writeln!(text),
        };
    }
}

/// xorshift64*: tiny, fast and deterministic, which is all a corpus needs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}
