//! `shoal-chaos`: the network-namespace lab ([`lab::NetLab`]) that puts real `shoal` agents on
//! real, breakable networks, and the benchmarks that drive real agents (`src/bin`).

pub mod lab;

/// The `shoal` binary of this build (`target/<profile>/shoal`, next to the test or bench
/// executable's `deps/` directory), or `$SHOAL_BIN`.
pub fn shoal_binary() -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("SHOAL_BIN") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(std::path::Path::to_path_buf);
    while let Some(d) = dir {
        let candidate = d.join("shoal");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent().map(std::path::Path::to_path_buf);
    }
    anyhow::bail!(
        "no shoal binary near {}: run `cargo build -p shoal-agent` (or set SHOAL_BIN)",
        exe.display()
    )
}
