//! Builds the BPF object from `profiler-ebpf` with its pinned nightly toolchain and embeds it in
//! the daemon. The BPF build uses its own target directory so it never invalidates this one.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let ebpf_dir = manifest.join("../profiler-ebpf");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    let target_dir = out_dir.join("bpf-target");
    for path in ["src", "Cargo.toml", "Cargo.lock", "rust-toolchain.toml"] {
        println!("cargo:rerun-if-changed={}", ebpf_dir.join(path).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        manifest.join("../profiler-common/src").display()
    );

    // `cargo` here is the rustup proxy, which reads profiler-ebpf/rust-toolchain.toml. Variables
    // the outer build sets for its own toolchain must not leak into the nested one.
    let mut cmd = Command::new("cargo");
    cmd.current_dir(&ebpf_dir)
        .args([
            "build",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
        "CARGO_PROFILE_RELEASE_DEBUG",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run cargo for the BPF build ({e}); run `cargo xtask build`, which installs the toolchain")
    });
    if !status.success() {
        panic!(
            "building profiler-ebpf failed; `cargo xtask build` installs what it needs \
             (nightly rust-src from profiler-ebpf/rust-toolchain.toml and bpf-linker)"
        );
    }
    let object = target_dir.join("bpfel-unknown-none/release/profiler");
    std::fs::copy(&object, out_dir.join("profiler-ebpf.o")).expect("copy the BPF object");
}
