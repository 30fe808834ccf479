//! Call site names on a real MPI job: tests/mpi/phases (built with -g) under the real daemon, its
//! call sites named from the binary and checked against binutils' addr2line and against the
//! program's source (each call site's line holds the MPI call that the daemon saw there); a copy
//! of the program replaced by another binary after its job gives unresolved sites, never a name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mpiburst::{
    export::{
        recording::{RecordedBurst, Recording, RecordingWriter},
        sites,
    },
    model::CallSite,
    store::Job,
    symbols::{NameSource, SiteResolver},
};
use mpiburst_tests::*;

/// A command's standard output; panics with its error output when it fails.
fn output(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The virtual address of a file offset, from the loadable segments `readelf -lW` lists.
fn address_of(bin: &Path, offset: u64) -> u64 {
    let segments = output(Command::new("readelf").arg("-lW").arg(bin));
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    segments
        .lines()
        .filter_map(|l| l.trim().strip_prefix("LOAD"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .map(|f| (hex(f[0]), hex(f[1]), hex(f[3])))
        .find(|&(start, _, size)| start <= offset && offset < start + size)
        .map(|(start, address, _)| offset - start + address)
        .unwrap_or_else(|| {
            panic!(
                "offset {offset:#x} is in no loadable segment of {}",
                bin.display()
            )
        })
}

/// addr2line's frames of a call site (the call is the instruction before the return address),
/// outermost first: (function, file name, line).
fn addr2line(bin: &Path, site: &CallSite) -> Vec<(String, String, Option<u32>)> {
    let address = address_of(bin, site.offset - 1);
    let text = output(
        Command::new("addr2line")
            .args(["-f", "-i", "-C", "-e"])
            .arg(bin)
            .arg(format!("{address:#x}")),
    );
    let lines: Vec<&str> = text.lines().collect();
    let mut frames: Vec<_> = lines
        .chunks(2)
        .map(|pair| {
            let location = pair[1].split(" (discriminator").next().unwrap();
            let (file, line) = location.rsplit_once(':').unwrap();
            let file = file.rsplit('/').next().unwrap().to_string();
            (pair[0].to_string(), file, line.parse().ok())
        })
        .collect();
    frames.reverse();
    frames
}

/// `mpiburst report ARGS`: its standard output; panics with its error output when it fails.
fn mpiburst_report(args: &[&str]) -> String {
    let bin = std::env::var_os("MPIBURST_BIN")
        .expect("MPIBURST_BIN is not set: run the tests through `cargo xtask test`");
    output(Command::new(bin).arg("report").args(args))
}

/// The recording written again to `path` (the daemon's own file goes with its temporary
/// directory), for `mpiburst report`.
fn write_recording(recording: &Recording, path: &Path) {
    let mut w = RecordingWriter::create(path, recording.header.clone()).unwrap();
    for (id, job) in &recording.jobs {
        w.job(&job.meta).unwrap();
        for burst in &job.bursts {
            w.burst(RecordedBurst {
                job: id.clone(),
                burst: burst.clone(),
                event_counts: None,
            })
            .unwrap();
        }
        for rank in job.ranks.values() {
            w.rank(id, rank).unwrap();
        }
    }
    w.finish(recording.end.clone().unwrap()).unwrap();
}

/// Each call site of the job's bursts with the MPI functions whose calls the daemon saw there.
fn sites_with_functions(job: &Job) -> BTreeMap<CallSite, BTreeSet<String>> {
    let mut sites: BTreeMap<CallSite, BTreeSet<String>> = BTreeMap::new();
    for b in &job.bursts {
        sites
            .entry(b.start_site.clone())
            .or_default()
            .insert(b.start_func.to_string());
        sites
            .entry(b.end_site.clone())
            .or_default()
            .insert(b.end_func.to_string());
    }
    sites
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn call_sites_of_a_real_job_are_named_by_function_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    // Short windows, so that the daemon's API has clustered one by the time the job ends.
    let daemon = Daemon::with_config("[analysis]\nwindow_s = 1.0\nlateness_s = 0.5\n", &[]);
    let program = program("phases", Mpi::OpenMpi);
    run_mpi(Mpi::OpenMpi, 2, &program, &["iters=150", "ms=2,6,12"]);
    // A copy of the program that is replaced by another binary once its job has run.
    let replaced = dir.path().join("phases-copy");
    std::fs::copy(&program, &replaced).unwrap();
    run_mpi(Mpi::OpenMpi, 2, &replaced, &["iters=20", "ms=2,6,12"]);
    std::fs::copy(program.with_file_name("counts.openmpi"), &replaced).unwrap();

    // The daemon's API names the call sites of its last window (resolved on its HTTP thread).
    std::thread::sleep(Duration::from_secs(2));
    let exe = program.canonicalize().unwrap();
    let id = job_id(&daemon.addr, &exe, &[]);
    let api = get_json(
        &daemon.addr,
        &format!("/api/jobs/{}/phases", id.replace(':', "%3A")),
    );
    let api_sites = api["call_sites"].as_array().expect("call_sites in the API");
    assert!(!api_sites.is_empty(), "{api}");
    for s in api_sites {
        assert_eq!(s["source"], "debug_info", "{s}");
        assert!(s["label"].as_str().unwrap().contains("phases.c:"), "{s}");
    }
    let recording = daemon.stop();

    let job = job_of(&recording, &program);
    let build_id = job
        .meta
        .build_id
        .clone()
        .expect("the executable's build-id");
    assert_eq!(
        job.meta.modules.get(&build_id).map(String::as_str),
        exe.to_str(),
        "the daemon kept where the executable was"
    );
    let seen = sites_with_functions(job);
    let names = sites::names(&mut SiteResolver::new(), &[&job.meta], seen.keys());
    let source =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("mpi/phases.c"))
            .unwrap();
    let source_lines: Vec<&str> = source.lines().collect();
    for (site, functions) in &seen {
        assert_eq!(
            *site.module, *build_id,
            "every MPI call is made by the program"
        );
        let name = names.name(site);
        assert_eq!(name.source, NameSource::DebugInfo, "{name:?}");
        let ours: Vec<_> = name
            .frames
            .iter()
            .map(|f| {
                let file = f.file.as_deref().unwrap().rsplit('/').next().unwrap();
                (f.function.clone(), file.to_string(), f.line)
            })
            .collect();
        assert_eq!(ours, addr2line(&exe, site), "{name:?}");
        // The line of the call holds the MPI call the daemon saw return or start there.
        let call = name.frames.last().unwrap();
        assert!(call.file.as_deref().unwrap().ends_with("phases.c"));
        let text = source_lines[call.line.unwrap() as usize - 1];
        assert!(
            functions.iter().all(|f| text.contains(f.as_str())),
            "{} holds {functions:?}: {text}",
            name.label()
        );
    }
    eprintln!(
        "{} call sites named like addr2line: {:?}",
        seen.len(),
        names
            .entries()
            .iter()
            .map(|n| n.label())
            .collect::<Vec<_>>()
    );

    let file = dir.path().join("recording.jsonl");
    write_recording(&recording, &file);
    let file = file.to_str().unwrap();
    let text = mpiburst_report(&[file, "--phases", "--job", &id]);
    eprintln!("{text}");
    let regions: Vec<&str> = text.lines().filter(|l| l.contains("regions:")).collect();
    assert!(regions.len() >= 3, "{text}");
    // Each phase of `phases` ends in end_phase (the start may be in it or in main).
    assert!(
        regions
            .iter()
            .all(|l| l.contains("phases.c:") && l.contains(" → phases.c:")),
        "{text}"
    );
    // The HTML page: the legend names each cluster by its main region, tooltips name the sites.
    let html = dir.path().join("page.html");
    mpiburst_report(&[file, "--html", html.to_str().unwrap(), "--job", &id]);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains(" · phases.c:"),
        "the legend names the clusters"
    );
    assert!(
        page.contains("end_phase"),
        "tooltips and legend name end_phase"
    );
    // `mpiburst compare` names each matched phase by its main code region.
    let bin = std::env::var_os("MPIBURST_BIN").unwrap();
    let compared = output(Command::new(bin).args([
        "compare",
        file,
        file,
        "--job-before",
        &id,
        "--job-after",
        &id,
    ]));
    let rows: Vec<&str> = compared
        .lines()
        .filter(|l| l.trim_start().starts_with(char::is_numeric))
        .collect();
    assert!(
        !rows.is_empty() && rows.iter().all(|l| l.contains("phases.c:")),
        "{compared}"
    );
    let json: serde_json::Value = serde_json::from_str(&mpiburst_report(&[
        file, "--phases", "--format", "json", "--job", &id,
    ]))
    .unwrap();
    let named = json["jobs"][0]["phases"]["call_sites"].as_array().unwrap();
    assert!(!named.is_empty());
    eprintln!("{}", serde_json::to_string_pretty(&named[0]).unwrap());
    for s in named {
        assert_eq!(s["module"], build_id.as_str(), "{s}");
        assert!(s["offset"].is_u64() && s["source"] == "debug_info", "{s}");
    }

    // The replaced copy: another build-id at its path, so no name at all.
    let copy = job_of(&recording, &replaced);
    let text = mpiburst_report(&[file, "--phases", "--job", &copy.meta.id.0]);
    let regions: Vec<&str> = text.lines().filter(|l| l.contains("regions:")).collect();
    assert!(!regions.is_empty(), "{text}");
    assert!(
        regions
            .iter()
            .all(|l| l.contains("phases-copy+0x") && l.ends_with("(unresolved)")),
        "{text}"
    );
}
