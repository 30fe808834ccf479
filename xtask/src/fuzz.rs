//! `cargo xtask fuzz`: the cargo-fuzz targets of fuzz/ (docs/fuzzing.md), built with the nightly
//! pinned in profiler-ebpf/rust-toolchain.toml, and their short run in `cargo xtask test`, where
//! each target counts as one test of a binary named `fuzz`.

use std::{
    io::BufRead,
    path::PathBuf,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use super::{install_toolchain, nightly, output, root, status, TestRun};

/// cargo-fuzz from crates.io; 0.13.2 builds with the stable toolchain of the workspace.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Seconds each target runs in `cargo xtask test`.
const TEST_SECONDS: u32 = 4;

/// Seconds each target runs in `cargo xtask fuzz` without `--seconds`.
pub const DEFAULT_SECONDS: u32 = 60;

/// Seconds one input may take before libFuzzer reports it as a hang.
const INPUT_TIMEOUT_SECONDS: u32 = 10;

/// `cargo xtask fuzz [TARGET...] [--seconds N]`: runs the `chosen` targets (all when none is
/// named) one after another, each for `seconds`; fails at the first target that crashes.
pub fn fuzz(chosen: &[String], seconds: u32) -> Result<()> {
    let all = targets()?;
    if let Some(unknown) = chosen.iter().find(|t| !all.contains(t)) {
        bail!(
            "no fuzz target {unknown:?}; the targets are {}",
            all.join(", ")
        );
    }
    let chosen = if chosen.is_empty() {
        all
    } else {
        chosen.to_vec()
    };
    let toolchain = prepare()?;
    build(&toolchain, Build::Search)?;
    for target in &chosen {
        let run = run(&toolchain, target, seconds, Build::Search)?;
        eprintln!("xtask: fuzz target {target}: {}", run.summary());
        if let Some(crash) = run.crash {
            bail!("fuzz target {target} crashed; {crash}");
        }
    }
    Ok(())
}

/// The short run of every target in `cargo xtask test`, reported to `test_run` as the tests of
/// a binary `fuzz` in libtest's words: passed without a crash, failed with one, skipped (with the
/// reason) when the fuzz targets cannot be built here.
pub fn test(test_run: &mut TestRun) {
    let started = Instant::now();
    let (names, verdicts): (Vec<String>, Vec<Result<(), String>>) = match targets() {
        Ok(targets) => {
            // Without cargo-fuzz or the nightly the targets cannot run here: skipped. A target
            // that does not compile is a failure.
            let ready = prepare()
                .map_err(|e| format!("ignored, cargo-fuzz cannot run here: {e:#}"))
                .and_then(|toolchain| match build(&toolchain, Build::Check) {
                    Ok(()) => Ok(toolchain),
                    Err(e) => Err(format!("FAILED\nxtask: {e:#}")),
                });
            let verdicts = targets
                .iter()
                .map(|target| match &ready {
                    Err(e) => Err(e.clone()),
                    Ok(toolchain) => match run(toolchain, target, TEST_SECONDS, Build::Check) {
                        Ok(run) => {
                            eprintln!("xtask: fuzz target {target}: {}", run.summary());
                            match run.crash {
                                None => Ok(()),
                                Some(crash) => Err(format!("FAILED\nxtask: {crash}")),
                            }
                        }
                        Err(e) => Err(format!("FAILED\nxtask: {e:#}")),
                    },
                })
                .collect();
            (targets, verdicts)
        }
        Err(e) => (
            vec!["targets".to_string()],
            vec![Err(format!("FAILED\nxtask: {e:#}"))],
        ),
    };
    let lines = libtest_lines(&names, &verdicts, started.elapsed());
    let mut binary = String::new();
    for line in lines.iter().flat_map(|l| l.split('\n')) {
        println!("{line}");
        test_run.read_line(line, &mut binary);
    }
}

/// libtest's report of the targets' verdicts, as the test binary `fuzz`: `Err` holds what follows `test NAME ... `, either
/// `ignored, REASON` or `FAILED` and lines on the failure.
fn libtest_lines(
    names: &[String],
    verdicts: &[Result<(), String>],
    took: std::time::Duration,
) -> Vec<String> {
    let mut lines = vec![
        "     Running fuzz/fuzz_targets (fuzz/target/release/fuzz)".to_string(),
        String::new(),
        format!("running {} tests", names.len()),
    ];
    let mut failed = Vec::new();
    let mut ignored = 0;
    for (name, verdict) in names.iter().zip(verdicts) {
        match verdict {
            Ok(()) => lines.push(format!("test {name} ... ok")),
            Err(text) => {
                lines.push(format!("test {name} ... {text}"));
                if text.starts_with("ignored") {
                    ignored += 1;
                } else {
                    failed.push(name.as_str());
                }
            }
        }
    }
    lines.push(String::new());
    if !failed.is_empty() {
        lines.push("failures:".into());
        lines.extend(failed.iter().map(|name| format!("    {name}")));
        lines.push(String::new());
    }
    lines.push(format!(
        "test result: {}. {} passed; {} failed; {ignored} ignored; 0 measured; 0 filtered out; \
         finished in {:.2}s",
        if failed.is_empty() { "ok" } else { "FAILED" },
        names.len() - failed.len() - ignored,
        failed.len(),
        took.as_secs_f64()
    ));
    lines
}

/// The targets, as fuzz/Cargo.toml names its binaries.
fn targets() -> Result<Vec<String>> {
    let path = fuzz_dir().join("Cargo.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut in_bin = false;
    let mut names = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if let Some(name) = line.strip_prefix("name = ").filter(|_| in_bin) {
            names.push(name.trim_matches('"').to_string());
        }
    }
    if names.is_empty() {
        bail!("{} names no fuzz target ([[bin]])", path.display());
    }
    Ok(names)
}

fn fuzz_dir() -> PathBuf {
    root().join("fuzz")
}

/// Installs what the fuzz targets need: the pinned nightly and cargo-fuzz. Returns the nightly.
fn prepare() -> Result<String> {
    install_toolchain()?;
    let installed = output(Command::new("cargo").args(["fuzz", "--version"])).unwrap_or_default();
    if !installed.contains(CARGO_FUZZ_VERSION) {
        eprintln!("xtask: installing cargo-fuzz {CARGO_FUZZ_VERSION} (about 60 s)");
        status(Command::new("cargo").args([
            "install",
            &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
            "--locked",
            "--force",
        ]))
        .context("installing cargo-fuzz from crates.io failed")?;
    }
    nightly()
}

/// How the targets are compiled.
#[derive(Clone, Copy)]
enum Build {
    /// Optimised: for runs long enough to search (`cargo xtask fuzz`).
    Search,
    /// Unoptimised (`--dev`), built in a fraction of the time: for the short run of
    /// `cargo xtask test`, which checks that the targets build and that the seeds and the inputs
    /// derived from them in a few seconds crash nothing.
    Check,
}

/// `cargo fuzz SUBCOMMAND` with the nightly. The BPF object is not built: no target loads it.
fn cargo_fuzz(toolchain: &str, subcommand: &str, build: Build) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", toolchain, "cargo", "fuzz", subcommand]);
    if let Build::Check = build {
        cmd.arg("--dev");
    }
    cmd.current_dir(root())
        // The stable cargo that runs xtask announces itself; the nightly's must be used.
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env("AYA_BUILD_SKIP", "1");
    cmd
}

fn build(toolchain: &str, build: Build) -> Result<()> {
    let started = Instant::now();
    status(&mut cargo_fuzz(toolchain, "build", build))
        .context("building the fuzz targets failed")?;
    eprintln!(
        "xtask: fuzz targets built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What one run of a target did.
struct FuzzRun {
    /// Inputs executed, from libFuzzer's final statistics.
    executions: Option<u64>,
    /// Inputs in the target's corpus at the end.
    corpus: Option<u64>,
    seconds: f64,
    /// What crashed and where the input that did it was saved.
    crash: Option<String>,
}

impl FuzzRun {
    fn summary(&self) -> String {
        let count = |n: Option<u64>| n.map_or("?".into(), |n| n.to_string());
        format!(
            "{} inputs executed in {:.0} s, corpus of {} inputs{}",
            count(self.executions),
            self.seconds,
            count(self.corpus),
            if self.crash.is_some() {
                ", CRASHED"
            } else {
                ""
            }
        )
    }
}

/// Runs `target` for `seconds` on its corpus (fuzz/corpus/TARGET, which keeps the inputs found,
/// and the checked-in seeds in fuzz/seeds/TARGET), echoing libFuzzer's output.
fn run(toolchain: &str, target: &str, seconds: u32, build: Build) -> Result<FuzzRun> {
    let corpus = fuzz_dir().join("corpus").join(target);
    std::fs::create_dir_all(&corpus)?;
    let mut cmd = cargo_fuzz(toolchain, "run", build);
    cmd.arg(target)
        .arg(&corpus)
        .arg(fuzz_dir().join("seeds").join(target))
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECONDS}"))
        .arg("-print_final_stats=1")
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().context("cannot start cargo fuzz run")?;
    let stderr = child.stderr.take().expect("piped");
    let mut executions = None;
    let mut corpus_size = None;
    let mut artifact = None;
    let mut panic = None;
    for line in std::io::BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
    {
        eprintln!("{line}");
        if let Some(n) = line.strip_prefix("stat::number_of_executed_units: ") {
            executions = n.trim().parse().ok();
        } else if let Some((_, rest)) = line.split_once(" corp: ") {
            // "#123	NEW    cov: 45 ft: 67 corp: 8/1024b ..."
            corpus_size = rest.split('/').next().and_then(|n| n.parse().ok());
        } else if let Some((_, path)) = line.split_once("Test unit written to ") {
            artifact = Some(path.trim().to_string());
        } else if line.starts_with("thread '") && line.contains("panicked at") {
            panic = Some(line.clone());
        }
    }
    let exit = child.wait()?;
    let crash = (!exit.success()).then(|| {
        format!(
            "{}; the input is {}; `cargo +{toolchain} fuzz run {target} INPUT` (with \
             AYA_BUILD_SKIP=1) runs it again, and it belongs in a regression test of the parser",
            panic.unwrap_or_else(|| format!("cargo fuzz run exited with {exit}")),
            artifact
                .as_deref()
                .unwrap_or("not saved (see the output above)")
        )
    });
    Ok(FuzzRun {
        executions,
        corpus: corpus_size,
        seconds: started.elapsed().as_secs_f64(),
        crash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdicts_count_in_the_summary_as_tests_of_a_binary_fuzz() {
        let names = ["a", "b", "c"].map(String::from);
        let verdicts = [
            Ok(()),
            Err("FAILED\nxtask: thread '<unnamed>' panicked at src/x.rs:1:1".to_string()),
            Err("ignored, cargo-fuzz cannot run here: no network".to_string()),
        ];
        let lines = libtest_lines(&names, &verdicts, std::time::Duration::ZERO);
        let mut run = TestRun::default();
        let mut binary = String::new();
        for line in lines.iter().flat_map(|l| l.split('\n')) {
            run.read_line(line, &mut binary);
        }
        assert_eq!(run.binaries, ["fuzz"]);
        assert_eq!(run.passed, 1);
        assert_eq!(run.failed, ["fuzz::b"]);
        assert_eq!(
            run.skipped,
            [(
                "fuzz::c".to_string(),
                "cargo-fuzz cannot run here: no network".to_string()
            )]
        );
        assert!(run.results[0].starts_with("test result: FAILED. 1 passed; 1 failed; 1 ignored"));
    }
}
