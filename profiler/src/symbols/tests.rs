//! Symbolization of real binaries: small programs compiled here with gcc, g++ and gfortran report
//! the call sites of their own calls (file offset of the return address, read from
//! /proc/self/maps as the daemon reads it), and the names are checked against binutils'
//! addr2line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSegment};

use super::{NameSource, SiteNames, SiteResolver};
use crate::model::{CallSite, Name};

/// `record_site()` prints the file offset of its return address: the call site of its caller,
/// as the daemon computes one for an MPI call.
const RECORDER: &str = r#"
#include <stdint.h>
#include <stdio.h>
__attribute__((noinline)) void record_site(void) {
    uintptr_t ra = (uintptr_t)__builtin_return_address(0);
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long start, end, offset;
        if (sscanf(line, "%lx-%lx %*s %lx", &start, &end, &offset) == 3 && ra >= start && ra < end) {
            printf("site %lx\n", (unsigned long)(ra - start + offset));
            break;
        }
    }
    if (maps) fclose(maps);
}
"#;

const C_PROGRAM: &str = r#"
void record_site(void);
volatile int sink;
static inline __attribute__((always_inline)) void exchange(void) {
    record_site();
    sink++;
}
__attribute__((noinline)) static void smooth(void) {
    record_site();
    sink++;
    exchange();
    sink++;
}
int main(void) {
    smooth();
    record_site();
    sink++;
    return 0;
}
"#;

const CPP_PROGRAM: &str = r#"
extern "C" void record_site(void);
volatile int sink;
namespace solver {
template <typename T> struct Grid {
    __attribute__((noinline)) void relax(T x) {
        record_site();
        sink += static_cast<int>(x);
    }
};
}
int main() {
    solver::Grid<int>().relax(1);
    solver::Grid<double>().relax(2.0);
    return 0;
}
"#;

const FORTRAN_PROGRAM: &str = r#"
module solver
  implicit none
  interface
    subroutine record_site() bind(c, name="record_site")
    end subroutine record_site
  end interface
  integer :: sink = 0
contains
  subroutine smooth()
    call record_site()
    sink = sink + 1
  end subroutine smooth
end module solver

subroutine jacobi_sweep()
  use solver
  call record_site()
  sink = sink + 2
end subroutine jacobi_sweep

program main
  use solver
  call smooth()
  call jacobi_sweep()
  print *, sink
end program main
"#;

const RUST_PROGRAM: &str = r#"
extern "C" {
    fn record_site();
}
mod solver {
    #[inline(never)]
    pub fn relax<T: Into<f64>>(x: T) -> f64 {
        unsafe { super::record_site() };
        std::hint::black_box(x.into()) * 2.0
    }
}
fn main() {
    println!("{}", solver::relax(1i32) + solver::relax(2.0f32));
}
"#;

/// A tool the tests need; a missing one fails the test with what to install.
fn tool(name: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{name} is not installed: `apt-get install gcc g++ gfortran binutils`"
    );
    Command::new(name)
}

fn run(mut cmd: Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Compiles `source` (with the recorder) by `compiler` with `flags` into `dir/name`.
fn build(
    dir: &Path,
    compiler: &str,
    name: &str,
    ext: &str,
    source: &str,
    flags: &[&str],
) -> PathBuf {
    let recorder = dir.join("recorder.c");
    std::fs::write(&recorder, RECORDER).unwrap();
    let recorder_obj = dir.join(format!("{name}-recorder.o"));
    let mut cc = tool("gcc");
    cc.args(["-O2", "-c", "-o"])
        .arg(&recorder_obj)
        .arg(&recorder);
    run(cc);
    let src = dir.join(format!("{name}.{ext}"));
    std::fs::write(&src, source).unwrap();
    let bin = dir.join(name);
    let mut cmd = tool(compiler);
    // gfortran writes module files into its working directory.
    cmd.current_dir(dir)
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(&src);
    if compiler == "rustc" {
        cmd.arg(format!("-Clink-arg={}", recorder_obj.display()));
    } else {
        cmd.arg(&recorder_obj);
    }
    run(cmd);
    bin
}

/// The call sites the program reports, in the order it makes its calls.
fn sites_of(bin: &Path, module: &str) -> Vec<CallSite> {
    run(Command::new(bin))
        .lines()
        .filter_map(|l| u64::from_str_radix(l.strip_prefix("site ")?, 16).ok())
        .map(|offset| CallSite {
            module: Name::new(module),
            offset,
        })
        .collect()
}

/// The build-id as readelf prints it.
fn build_id(bin: &Path) -> String {
    let mut cmd = tool("readelf");
    cmd.arg("-n").arg(bin);
    run(cmd)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .expect("the compiler wrote a build-id")
}

/// The program's call sites, named from `bin` at `path_for_names` (the path the job saw).
fn resolve(resolver: &mut SiteResolver, sites: &[CallSite], path: &Path) -> SiteNames {
    let modules: BTreeMap<String, String> = sites
        .iter()
        .map(|s| (s.module.to_string(), path.display().to_string()))
        .collect();
    resolver.names(sites, &modules)
}

/// addr2line's frames for a call site (the instruction before the return address), outermost
/// first as [`super::SiteName::frames`] holds them: (function, `file:line`).
fn addr2line(bin: &Path, site: &CallSite) -> Vec<(String, String)> {
    let data = std::fs::read(bin).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let offset = site.offset - 1;
    let address = elf
        .segments()
        .find_map(|s| {
            let (start, size) = s.file_range();
            (start <= offset && offset < start + size).then(|| offset - start + s.address())
        })
        .unwrap();
    let mut cmd = tool("addr2line");
    cmd.args(["-f", "-i", "-C", "-e"])
        .arg(bin)
        .arg(format!("{address:#x}"));
    let text = run(cmd);
    let lines: Vec<&str> = text.lines().collect();
    let mut frames: Vec<(String, String)> = lines
        .chunks(2)
        .map(|pair| {
            let location = pair[1].split(" (discriminator").next().unwrap();
            let name = location.rsplit('/').next().unwrap();
            (pair[0].to_string(), name.to_string())
        })
        .collect();
    frames.reverse();
    frames
}

/// Our frames of a site as (function, `file:line`).
fn frames(names: &SiteNames, site: &CallSite) -> Vec<(String, String)> {
    names
        .name(site)
        .frames
        .iter()
        .map(|f| (f.function.clone(), f.location().unwrap_or_default()))
        .collect()
}

/// The C program built with debug information in `dir`: the binary, its build-id and the call
/// sites it reported.
fn c_program(dir: &Path) -> (PathBuf, String, Vec<CallSite>) {
    let bin = build(dir, "gcc", "prog", "c", C_PROGRAM, &["-O2", "-g"]);
    let id = build_id(&bin);
    let sites = sites_of(&bin, &id);
    (bin, id, sites)
}

#[test]
fn c_with_debug_info_gives_the_lines_addr2line_gives_with_inlined_frames() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, _, sites) = c_program(dir.path());
    assert_eq!(sites.len(), 3, "smooth, exchange inlined into smooth, main");
    let names = resolve(&mut SiteResolver::new(), &sites, &bin);
    for site in &sites {
        let name = names.name(site);
        assert_eq!(name.source, NameSource::DebugInfo, "{name:?}");
        assert_eq!(frames(&names, site), addr2line(&bin, site), "{name:?}");
    }
    assert_eq!(names.label(&sites[0]), "prog.c:9 smooth");
    assert_eq!(names.label(&sites[1]), "prog.c:5 exchange in smooth");
    assert_eq!(names.name(&sites[1]).frames.len(), 2);
    assert_eq!(names.label(&sites[2]), "prog.c:16 main");
    assert_eq!(
        names.region(&sites[0], &sites[1]),
        "prog.c:9 smooth → prog.c:5 exchange in smooth"
    );
    // The same function of the same file: the end is its line alone.
    let again = CallSite {
        offset: sites[0].offset,
        ..sites[0].clone()
    };
    assert_eq!(
        names.region(&sites[0], &again),
        "prog.c:9 smooth → prog.c:9"
    );
}

#[test]
fn cpp_template_functions_are_demangled() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build(
        dir.path(),
        "g++",
        "grid",
        "cpp",
        CPP_PROGRAM,
        &["-O2", "-g"],
    );
    let sites = sites_of(&bin, &build_id(&bin));
    assert_eq!(sites.len(), 2);
    let names = resolve(&mut SiteResolver::new(), &sites, &bin);
    let functions: Vec<String> = sites
        .iter()
        .map(|s| names.name(s).frames.last().unwrap().function.clone())
        .collect();
    assert!(
        functions[0].contains("solver::Grid<int>::relax"),
        "{functions:?}"
    );
    assert!(
        functions[1].contains("solver::Grid<double>::relax"),
        "{functions:?}"
    );
    for site in &sites {
        let ours = frames(&names, site);
        let theirs = addr2line(&bin, site);
        assert_eq!(ours.len(), theirs.len());
        for ((f, l), (g, m)) in ours.iter().zip(&theirs) {
            assert_eq!(l, m);
            // addr2line prints the parameter list too.
            assert!(g.starts_with(f.as_str()), "{f} vs {g}");
        }
    }
    // Without debug information, from the symbol table: demangled as well.
    let stripped = build(
        dir.path(),
        "g++",
        "grid-nodebug",
        "cpp",
        CPP_PROGRAM,
        &["-O2"],
    );
    let sites = sites_of(&stripped, &build_id(&stripped));
    let names = resolve(&mut SiteResolver::new(), &sites, &stripped);
    let name = names.name(&sites[0]);
    assert_eq!(name.source, NameSource::SymbolTable);
    assert!(
        name.label().starts_with("solver::Grid<int>::relax(int)+0x"),
        "{}",
        name.label()
    );
}

#[test]
fn rust_functions_are_demangled() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["-O", "-g", "--edition=2021"];
    let bin = build(dir.path(), "rustc", "relax", "rs", RUST_PROGRAM, &flags);
    let sites = sites_of(&bin, &build_id(&bin));
    assert_eq!(sites.len(), 2);
    let names = resolve(&mut SiteResolver::new(), &sites, &bin);
    for site in &sites {
        let name = names.name(site);
        assert_eq!(name.source, NameSource::DebugInfo, "{name:?}");
        let call = name.frames.last().unwrap();
        assert!(
            call.function.starts_with("relax::solver::relax"),
            "{name:?}"
        );
        assert_eq!(call.location().as_deref(), Some("relax.rs:8"), "{name:?}");
        let theirs = addr2line(&bin, site);
        assert_eq!(theirs.last().unwrap().1, "relax.rs:8");
    }
}

#[test]
fn fortran_routines_get_their_fortran_names_with_and_without_debug_info() {
    let dir = tempfile::tempdir().unwrap();
    for (name, flags, source) in [
        (
            "solver-g",
            &["-O2", "-fno-inline", "-g"][..],
            NameSource::DebugInfo,
        ),
        (
            "solver",
            &["-O2", "-fno-inline"][..],
            NameSource::SymbolTable,
        ),
    ] {
        let bin = build(dir.path(), "gfortran", name, "f90", FORTRAN_PROGRAM, flags);
        let sites = sites_of(&bin, &build_id(&bin));
        assert_eq!(sites.len(), 2, "{name}");
        let names = resolve(&mut SiteResolver::new(), &sites, &bin);
        let functions: Vec<String> = sites
            .iter()
            .map(|s| names.name(s).frames.last().unwrap().function.clone())
            .collect();
        assert_eq!(functions, ["solver::smooth", "jacobi_sweep"], "{name}");
        for site in &sites {
            assert_eq!(names.name(site).source, source, "{name}");
        }
        if source == NameSource::DebugInfo {
            let lines: Vec<String> = sites
                .iter()
                .map(|s| addr2line(&bin, s)[0].1.clone())
                .collect();
            assert_eq!(lines, [format!("{name}.f90:11"), format!("{name}.f90:18")]);
            let ours: Vec<String> = sites
                .iter()
                .map(|s| frames(&names, s)[0].1.clone())
                .collect();
            assert_eq!(ours, lines);
            assert_eq!(
                names.label(&sites[0]),
                format!("{name}.f90:11 solver::smooth")
            );
        } else {
            assert!(names.label(&sites[1]).starts_with("jacobi_sweep+0x"));
        }
    }
}

#[test]
fn a_stripped_binary_gives_no_wrong_name() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, id, sites) = c_program(dir.path());
    let truth = resolve(&mut SiteResolver::new(), &sites, &bin);
    let mut strip = tool("strip");
    strip.arg(&bin);
    run(strip);
    assert_eq!(build_id(&bin), id, "strip keeps the build-id");
    let names = resolve(&mut SiteResolver::new(), &sites, &bin);
    for site in &sites {
        let name = names.name(site);
        match name.source {
            NameSource::Unresolved => {
                assert_eq!(
                    name.label(),
                    format!("prog+{:#x} (unresolved)", site.offset)
                );
            }
            // Only what the symbol table still says, and then the right function.
            _ => assert_eq!(
                name.frames[0].function,
                truth.name(site).frames[0].function,
                "{name:?}"
            ),
        }
    }
    // The static functions and main are not in the dynamic symbol table.
    assert!(sites.iter().all(|s| !names.name(s).is_resolved()));
}

/// `bin` without its symbols and debug information, at `out`, with a debug link to `debug_file`.
fn strip_with_link(bin: &Path, debug_file: &Path, out: &Path) {
    let mut strip = tool("objcopy");
    strip
        .arg("--strip-all")
        .arg(format!("--add-gnu-debuglink={}", debug_file.display()))
        .arg(bin)
        .arg(out);
    run(strip);
}

/// Every site named from debug information, with addr2line's frames (`expected`, in order).
fn assert_debug_frames(names: &SiteNames, sites: &[CallSite], expected: &[Vec<(String, String)>]) {
    for (site, expected) in sites.iter().zip(expected) {
        let name = names.name(site);
        assert_eq!(name.source, NameSource::DebugInfo, "{name:?}");
        assert_eq!(&frames(names, site), expected);
    }
}

#[test]
fn a_separate_debug_file_is_found_by_debug_link_and_by_build_id() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, id, sites) = c_program(dir.path());
    let expected: Vec<_> = sites.iter().map(|s| addr2line(&bin, s)).collect();

    // Debian's layout: the debug file under a .build-id tree, named by the stripped binary's
    // debug link.
    let debug_root = dir.path().join("debug");
    let by_id = debug_root.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&by_id).unwrap();
    let debug_file = by_id.join(format!("{}.debug", &id[2..]));
    let mut keep = tool("objcopy");
    keep.arg("--only-keep-debug").arg(&bin).arg(&debug_file);
    run(keep);
    let stripped = dir.path().join("stripped");
    strip_with_link(&bin, &debug_file, &stripped);
    let mut resolver = SiteResolver::with_debug_dirs(vec![debug_root]);
    assert_debug_frames(
        &resolve(&mut resolver, &sites, &stripped),
        &sites,
        &expected,
    );

    // Stripped without a debug link: the debug file is found by the build-id alone.
    let unlinked = dir.path().join("unlinked");
    let mut strip = tool("objcopy");
    strip.arg("--strip-all").arg(&bin).arg(&unlinked);
    run(strip);
    let mut resolver = SiteResolver::with_debug_dirs(vec![dir.path().join("debug")]);
    assert_debug_frames(
        &resolve(&mut resolver, &sites, &unlinked),
        &sites,
        &expected,
    );
    // Without that debug file the stripped binary has no name for them.
    let mut resolver = SiteResolver::with_debug_dirs(Vec::new());
    let names = resolve(&mut resolver, &sites, &unlinked);
    assert!(sites.iter().all(|s| !names.name(s).is_resolved()));

    // A debug link to a file next to the binary.
    let linked_dir = dir.path().join("linked");
    std::fs::create_dir(&linked_dir).unwrap();
    let linked = linked_dir.join("prog");
    strip_with_link(&bin, &debug_file, &linked);
    let next_to_it = linked_dir.join(debug_file.file_name().unwrap());
    std::fs::copy(&debug_file, next_to_it).unwrap();
    let mut resolver = SiteResolver::with_debug_dirs(Vec::new());
    assert_debug_frames(&resolve(&mut resolver, &sites, &linked), &sites, &expected);
}

#[test]
fn a_binary_rebuilt_or_deleted_after_the_job_gives_unresolved_sites() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, _, sites) = c_program(dir.path());
    let mut resolver = SiteResolver::new();
    // The binary changes under the same path before the report: another program, another id.
    let other = C_PROGRAM.replace("sink++;\n    return 0;", "sink += 2;\n    return 0;");
    build(dir.path(), "gcc", "prog", "c", &other, &["-O2", "-g"]);
    let names = resolve(&mut resolver, &sites, &bin);
    for site in &sites {
        let name = names.name(site);
        assert!(!name.is_resolved(), "{name:?}");
        assert!(
            name.reason
                .as_deref()
                .unwrap()
                .contains("rebuilt or replaced"),
            "{name:?}"
        );
        assert_eq!(
            name.label(),
            format!("prog+{:#x} (unresolved)", site.offset)
        );
    }
    std::fs::remove_file(&bin).unwrap();
    let names = resolve(&mut resolver, &sites, &bin);
    assert!(names
        .name(&sites[0])
        .reason
        .as_deref()
        .unwrap()
        .contains("is gone"));
    // Nor is a module without a known path resolved.
    let names = resolver.names(&sites, &BTreeMap::new());
    let name = names.name(&sites[0]);
    assert!(!name.is_resolved());
    assert_eq!(name.module_name, sites[0].module[..12]);
}

#[test]
fn a_resolved_name_is_cached_per_build_id_and_survives_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, _, sites) = c_program(dir.path());
    let mut resolver = SiteResolver::new();
    let first = resolve(&mut resolver, &sites, &bin);
    std::fs::remove_file(&bin).unwrap();
    let again = resolve(&mut resolver, &sites, &bin);
    for site in &sites {
        assert_eq!(first.name(site), again.name(site));
        assert!(again.name(site).is_resolved());
    }
}
