//! The `toolgate` command line.

fn main() -> anyhow::Result<()> {
    // The per-call process supervisor is this binary re-executed in a hidden mode; it
    // must take over before anything else starts (no runtime, no logging).
    if let Some(code) = toolgate::tools::process::supervise_if_requested() {
        std::process::exit(code);
    }
    Ok(())
}
