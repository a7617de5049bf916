//! The `toolgate` command line.

fn main() -> anyhow::Result<()> {
    Ok(())
}
