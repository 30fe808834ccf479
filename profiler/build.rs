//! Builds the BPF object from `profiler-ebpf` with aya-build, using the nightly pinned in
//! profiler-ebpf/rust-toolchain.toml, and leaves it in OUT_DIR for the daemon to embed.
//!
//! `AYA_BUILD_SKIP=1` skips the BPF build (for clippy and the analysis tests on a machine without
//! the BPF toolchain): the daemon then embeds an empty object and refuses to load it, telling the
//! user to build with `cargo xtask build`.

use std::{env, fs, path::PathBuf};

/// The bin target of profiler-ebpf; aya-build copies it to OUT_DIR under this name.
const OBJECT: &str = "profiler";

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let ebpf_dir = manifest.join("../profiler-ebpf");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    // aya-build watches profiler-ebpf; the BPF programs also compile profiler-common.
    println!(
        "cargo:rerun-if-changed={}",
        manifest.join("../profiler-common/src").display()
    );

    let toolchain_file = ebpf_dir.join("rust-toolchain.toml");
    let nightly = pinned_channel(&toolchain_file);
    let object = out_dir.join(OBJECT);
    // A skipped build leaves no object behind, not the one of an earlier build.
    let _ = fs::remove_file(&object);
    let ebpf_package = aya_build::Package {
        name: "profiler-ebpf",
        root_dir: ebpf_dir.to_str().expect("a UTF-8 path to profiler-ebpf"),
        features: &["bpf"],
        ..Default::default()
    };
    if let Err(e) = aya_build::build_ebpf([ebpf_package], aya_build::Toolchain::Custom(&nightly)) {
        panic!(
            "building the BPF programs (profiler-ebpf) failed: {e:#}\n`cargo xtask build` \
             installs what they need ({nightly} with rust-src, and bpf-linker); to build without \
             them, for clippy or the analysis tests, set AYA_BUILD_SKIP=1"
        );
    }
    if !object.exists() {
        fs::write(&object, []).expect("write the empty BPF object of a skipped build");
    }
}

/// The `toolchain.channel` of a rust-toolchain.toml.
fn pinned_channel(path: &std::path::Path) -> String {
    let text =
        fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let table: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("{} is not TOML: {e}", path.display()));
    table
        .get("toolchain")
        .and_then(|t| t.get("channel"))
        .and_then(|c| c.as_str())
        .unwrap_or_else(|| panic!("no toolchain.channel in {}", path.display()))
        .to_string()
}
