//! Attaching to one MPI library: its probe points and each one's attach cookie (function id,
//! where the bytes and the peer are, the region flags).

use std::sync::Arc;

use profiler_common::cookie;

use super::library_reads::{LibraryRead, SharedFiles};

use crate::{
    capture::{
        config::{FunctionClass, FunctionSpec},
        AttachPoint, Capture,
    },
    discovery::{Binding, DiscoveryError, MpiFlavor, MpiLibrary},
    model::{ProbePoint, FINALIZE_FUNCTION, INIT_FUNCTIONS},
};

/// Attaches MPI libraries: the probes of every configured function a library has, each with the
/// cookie that tells the BPF programs what the call is.
pub(super) struct Attacher {
    /// The probed functions, by id.
    functions: Vec<String>,
    /// Their classes and arguments, by id.
    specs: Vec<FunctionSpec>,
    /// Library files attached.
    pub(super) attached: usize,
    /// Where Open MPI datatypes keep their size, once an Open MPI library is attached.
    ompi_dtype_offset: Option<u64>,
    /// What the reads of files found at run time share with the loop: they skip a file attached.
    files: Arc<SharedFiles>,
}

impl Attacher {
    pub(super) fn new(
        functions: Vec<String>,
        specs: Vec<FunctionSpec>,
        files: Arc<SharedFiles>,
    ) -> Self {
        Attacher {
            functions,
            specs,
            attached: 0,
            ompi_dtype_offset: None,
            files,
        }
    }

    /// Reads `lib` on the loop's thread and attaches it, once per file: for the libraries known
    /// at start.
    pub(super) fn attach(&mut self, capture: &mut Capture, lib: &MpiLibrary) {
        if !capture.is_attached((lib.dev, lib.inode)) {
            let read = LibraryRead::read(lib.clone(), &self.functions);
            self.attach_read(capture, &read);
        }
    }

    /// Attaches the probes of every configured function a library has, once per file; whether
    /// they were attached now.
    pub(super) fn attach_read(&mut self, capture: &mut Capture, read: &LibraryRead) -> bool {
        let lib = &read.lib;
        if capture.is_attached((lib.dev, lib.inode)) {
            return false;
        }
        let points = match &read.points {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("skipping {}: {e}", lib.path.display());
                return false;
            }
        };
        let dtype = match (lib.binding, lib.flavor) {
            // Fortran wrappers pass pointers, and an interposer's arguments are also read at its
            // PMPI call: the C call inside them accounts the bytes.
            (Binding::Fortran | Binding::Interposer, _) => cookie::DTYPE_NONE,
            (Binding::C, MpiFlavor::Mpich) => cookie::DTYPE_MPICH,
            (Binding::C, MpiFlavor::OpenMpi) => {
                self.openmpi_datatypes(capture, lib, read.dtype_size_offset.as_ref())
            }
        };
        let attach_points: Vec<AttachPoint> = points
            .points
            .iter()
            .filter_map(|p| {
                let id = self.functions.iter().position(|f| *f == p.function)?;
                let spec = &self.specs[id];
                let (count, dt, kind) = match (spec.count_arg, spec.datatype_arg) {
                    (Some(c), Some(d)) if dtype != cookie::DTYPE_NONE => {
                        (c as u64, d as u64, dtype)
                    }
                    _ => (cookie::NO_ARG, cookie::NO_ARG, cookie::DTYPE_NONE),
                };
                let wrapper = if matches!(lib.binding, Binding::Fortran | Binding::Interposer) {
                    cookie::WRAPPER
                } else {
                    0
                };
                let cookie =
                    cookie::encode(id as u16, count, dt, kind, cookie_flags(spec) | wrapper);
                Some(AttachPoint {
                    function: p.function.clone(),
                    file_offset: p.probe_offset,
                    cookie: with_peer(cookie, spec, lib, p),
                })
            })
            .collect();
        let attached = capture.attach_library(&lib.path, (lib.dev, lib.inode), &attach_points);
        self.files.attached((lib.dev, lib.inode));
        match attached {
            Ok(n) => {
                self.attached += 1;
                let frees = |p: &AttachPoint| p.cookie & cookie::DTYPE_FREE != 0;
                if dtype == cookie::DTYPE_OPENMPI && attach_points.iter().any(frees) {
                    if let Err(e) = capture.reuse_datatype_sizes() {
                        tracing::warn!("{e}: every call reads its datatype's size");
                    }
                }
                tracing::info!(
                    "attached {n} entry points of {} ({:?} {:?}); {} functions not in this library",
                    lib.path.display(),
                    lib.flavor,
                    lib.binding,
                    points.missing.len()
                );
                true
            }
            Err(e) => {
                tracing::warn!("{e}");
                false
            }
        }
    }

    /// How the attach points of Open MPI's C library `lib` read a datatype's size: through the
    /// size offset of the first Open MPI library attached, which the BPF programs hold; a library
    /// whose datatypes keep their size elsewhere (another Open MPI version) counts no bytes.
    fn openmpi_datatypes(
        &mut self,
        capture: &mut Capture,
        lib: &MpiLibrary,
        size_offset: Option<&Result<u64, DiscoveryError>>,
    ) -> u64 {
        let this = match size_offset {
            Some(Ok(offset)) => *offset,
            None => return cookie::DTYPE_NONE,
            Some(Err(e)) => {
                tracing::warn!(
                    "{}: bytes per call are not counted: {e}",
                    lib.path.display()
                );
                return cookie::DTYPE_NONE;
            }
        };
        match self.ompi_dtype_offset {
            Some(loaded) if loaded == this => cookie::DTYPE_OPENMPI,
            Some(loaded) => {
                tracing::warn!(
                    "{}: its datatypes keep their size at byte {this}, those of the Open MPI \
                     attached first at byte {loaded}; bytes per call are not counted for it",
                    lib.path.display()
                );
                cookie::DTYPE_NONE
            }
            None => match capture.set_ompi_dtype_size_offset(this) {
                Ok(()) => {
                    self.ompi_dtype_offset = Some(this);
                    cookie::DTYPE_OPENMPI
                }
                Err(e) => {
                    tracing::warn!(
                        "{}: bytes per call are not counted: {e}",
                        lib.path.display()
                    );
                    cookie::DTYPE_NONE
                }
            },
        }
    }
}

/// Adds the peer fields to an attach point's cookie where the function has a peer rank and the
/// binding passes it by value (Fortran wrappers pass pointers; the C call inside them has it).
fn with_peer(cookie: u64, spec: &FunctionSpec, lib: &MpiLibrary, point: &ProbePoint) -> u64 {
    let (Some(peer), Some(comm)) = (spec.peer_arg, spec.comm_arg) else {
        return cookie;
    };
    let (kind, distance) = match (lib.binding, lib.flavor, point.world_slot_distance) {
        (Binding::C, MpiFlavor::Mpich, _) => (cookie::COMM_MPICH, 0),
        (Binding::C, MpiFlavor::OpenMpi, Some(d))
            if d % 8 == 0 && d.abs() <= cookie::MAX_WORLD_DISTANCE =>
        {
            (cookie::COMM_OPENMPI, d)
        }
        _ => return cookie,
    };
    cookie::with_peer(cookie, peer as u64, comm as u64, kind, distance)
}

fn cookie_flags(spec: &FunctionSpec) -> u64 {
    if spec.class == FunctionClass::Polling {
        cookie::POLLING
    } else if spec.class == FunctionClass::Datatype {
        cookie::DTYPE_FREE
    } else if INIT_FUNCTIONS.contains(&spec.name.as_str()) {
        cookie::REGION_START
    } else if spec.name == FINALIZE_FUNCTION {
        cookie::REGION_END
    } else {
        0
    }
}
