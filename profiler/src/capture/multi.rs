//! uprobe_multi links (kernel ≥ 6.6): one link attaches a program at every entry point of a
//! library file, each with its own cookie.
//!
//! Why not one perf-event uprobe per entry point, as aya attaches them: releasing each such
//! event waits for an RCU tasks-trace grace period under a global mutex (about 0.1 s here), so
//! the 150–700 probes of an MPI installation took up to minutes to detach, even after `kill -9`.
//! A uprobe_multi link waits once for all its probes. aya 0.14 cannot load a program for this
//! attach type, so the probe programs are relocated with aya-obj against the maps aya created
//! and loaded here with `expected_attach_type = BPF_TRACE_UPROBE_MULTI`, or
//! `BPF_TRACE_UPROBE_SESSION` for a session program (one program at entry and return, kernel
//! ≥ 6.13).

use std::{
    collections::HashSet,
    ffi::CString,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use aya::{maps::Map, Ebpf};
use aya_obj::generated::bpf_insn;

use super::CaptureError;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_TRACE_UPROBE_SESSION: u32 = 57;
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// Where a uprobe_multi program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    Entry,
    Return,
    /// At the entry, and at the return of each call whose entry run returned 0.
    Session,
}

impl ProbeKind {
    fn attach_type(self) -> u32 {
        match self {
            ProbeKind::Entry | ProbeKind::Return => BPF_TRACE_UPROBE_MULTI,
            ProbeKind::Session => BPF_TRACE_UPROBE_SESSION,
        }
    }
}

/// `union bpf_attr` for BPF_PROG_LOAD, up to `expected_attach_type`.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}
const _: () = assert!(std::mem::size_of::<ProgLoadAttr>() == 72);

/// `union bpf_attr` for BPF_LINK_CREATE with the uprobe_multi arguments.
#[repr(C)]
struct UprobeMultiLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<UprobeMultiLinkAttr>() == 64);

fn bpf(cmd: libc::c_long, attr: *const u8, size: usize) -> std::io::Result<OwnedFd> {
    // SAFETY: attr points at a bpf_attr prefix of `size` bytes whose pointers are live.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr, size) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn map_fd(map: &Map) -> Option<BorrowedFd<'_>> {
    let data = match map {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerfEventArray(d)
        | Map::RingBuf(d) => d,
        _ => return None,
    };
    Some(data.fd().as_fd())
}

/// Loads the named programs of `object` for uprobe_multi links of their kind, using the maps
/// `ebpf` already created (so they share state with everything else aya loaded).
pub fn load_programs(
    object: &[u8],
    ebpf: &Ebpf,
    programs: &[(&'static str, ProbeKind)],
) -> Result<Vec<OwnedFd>, CaptureError> {
    let invalid = |what: String| CaptureError::Io {
        what: "relocating the BPF object for uprobe_multi".into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, what),
    };
    let mut obj = aya_obj::Object::parse(object).map_err(|e| invalid(e.to_string()))?;
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    let maps: Vec<(String, aya_obj::Map)> = obj
        .maps
        .iter()
        .map(|(n, m)| (n.clone(), m.clone()))
        .collect();
    let mut fds = Vec::new();
    for (name, _) in &maps {
        let fd = ebpf
            .map(name)
            .and_then(map_fd)
            .ok_or_else(|| invalid(format!("map {name} was not created")))?;
        fds.push(fd.as_raw_fd());
    }
    obj.relocate_maps(
        maps.iter()
            .zip(&fds)
            .map(|((n, m), fd)| (n.as_str(), *fd, m)),
        &text_sections,
    )
    .map_err(|e| invalid(e.to_string()))?;
    obj.relocate_calls(&text_sections)
        .map_err(|e| invalid(e.to_string()))?;
    programs
        .iter()
        .map(|&(name, kind)| {
            let program = obj
                .programs
                .get(name)
                .ok_or_else(|| invalid(format!("no program {name}")))?;
            let function = &obj.functions[&program.function_key()];
            load(name, kind, &function.instructions, &program.license)
        })
        .collect()
}

fn load(
    name: &'static str,
    kind: ProbeKind,
    insns: &[bpf_insn],
    license: &CString,
) -> Result<OwnedFd, CaptureError> {
    let mut log = vec![0u8; 1 << 20];
    let mut prog_name = [0u8; 16];
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name,
        prog_ifindex: 0,
        expected_attach_type: kind.attach_type(),
    };
    match bpf(
        BPF_PROG_LOAD,
        &attr as *const _ as *const u8,
        std::mem::size_of::<ProgLoadAttr>(),
    ) {
        Ok(fd) => Ok(fd),
        Err(_) => {
            // Load again with the verifier log on, to say why.
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let err = bpf(
                BPF_PROG_LOAD,
                &attr as *const _ as *const u8,
                std::mem::size_of::<ProgLoadAttr>(),
            )
            .err()
            .unwrap_or_else(|| std::io::Error::other("failed once, then loaded"));
            let text = String::from_utf8_lossy(
                &log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())],
            )
            .into_owned();
            let tail: String = text
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            Err(CaptureError::Io {
                what: format!(
                    "loading BPF program {name} for uprobe_multi (kernel ≥ 6.6 needed{}); \
                     verifier says:\n{tail}\n",
                    if kind == ProbeKind::Session {
                        ", ≥ 6.13 for a session"
                    } else {
                        ""
                    }
                ),
                source: err,
            })
        }
    }
}

/// Attaches `program`, loaded for `kind`, at `offsets` of the file at `path`, with one cookie
/// per offset, for process `pid`, or for every process when it is 0. Closing the returned link
/// detaches all of them.
pub fn attach(
    program: BorrowedFd<'_>,
    kind: ProbeKind,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let attr = UprobeMultiLinkAttr {
        prog_fd: program.as_raw_fd() as u32,
        target_fd: 0,
        attach_type: kind.attach_type(),
        flags: 0,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        ref_ctr_offsets: 0,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        multi_flags: if kind == ProbeKind::Return {
            BPF_F_UPROBE_MULTI_RETURN
        } else {
            0
        },
        pid,
        _pad: 0,
    };
    bpf(
        BPF_LINK_CREATE,
        &attr as *const _ as *const u8,
        std::mem::size_of::<UprobeMultiLinkAttr>(),
    )
}

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// Offsets of run_time_ns, run_cnt and recursion_misses in `struct bpf_prog_info`.
const RUN_TIME_NS: usize = 192;
const RUN_CNT: usize = 200;
const RECURSION_MISSES: usize = 208;

/// Run time, run count and skipped runs of a program (kernel BPF statistics).
pub fn run_stats(program: BorrowedFd<'_>) -> Option<(std::time::Duration, u64, u64)> {
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let mut info = [0u8; 256];
    let attr = InfoAttr {
        bpf_fd: program.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: attr points at a live buffer of info_len bytes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &attr as *const InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    if rc != 0 {
        return None;
    }
    let word = |at: usize| {
        info[at..]
            .first_chunk::<8>()
            .map_or(0, |w| u64::from_ne_bytes(*w))
    };
    Some((
        std::time::Duration::from_nanos(word(RUN_TIME_NS)),
        word(RUN_CNT),
        word(RECURSION_MISSES),
    ))
}
