//! Where capture meets an MPI library: the file offsets of the MPI functions' entry points, which
//! uprobes attach to, and where Open MPI's datatype objects keep their size, which BPF reads.

use std::collections::HashSet;

use super::elf::DynamicSymbols;
use super::error::DiscoveryError;
use super::libraries::{Binding, MpiLibrary};
use crate::capture::probe_offset;
use crate::model::ProbePoint;

/// The probe points of one library, and the requested functions it does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePoints {
    pub points: Vec<ProbePoint>,
    pub missing: Vec<String>,
}

/// Finds the entry points of `functions` (canonical C names such as `MPI_Send`) in `lib`.
///
/// Every address gets one probe point even when several symbols alias it (`MPI_Send` and
/// `PMPI_Send`, `mpi_send_` and `mpi_send__`), since two uprobes on one address would count each
/// call twice. Distinct code for one function (`mpi_send_` and `mpi_send_f08_`) gets a point each.
pub fn probe_points(lib: &MpiLibrary, functions: &[String]) -> Result<ProbePoints, DiscoveryError> {
    let symbols = DynamicSymbols::read(&lib.path)?;
    let world = symbols.got_slot("ompi_mpi_comm_world");
    let mut taken = HashSet::new();
    let mut points = Vec::new();
    let mut missing = Vec::new();
    for function in functions {
        let mut found = false;
        for symbol in symbol_names(lib.binding, function) {
            let Some(file_offset) = symbols.function_offset(&symbol) else {
                continue;
            };
            found = true;
            if taken.insert(file_offset) {
                // A function whose code cannot be read keeps its probes at the entry.
                let probe_offset = symbols
                    .data(&symbol)
                    .map_or(file_offset, |code| probe_offset(&code, file_offset));
                let world_slot_distance =
                    world.zip(symbols.address(&symbol)).map(|(slot, entry)| {
                        slot.wrapping_sub(entry + (probe_offset - file_offset)) as i64
                    });
                points.push(ProbePoint {
                    function: function.clone(),
                    symbol,
                    file_offset,
                    probe_offset,
                    world_slot_distance,
                });
            }
        }
        if !found {
            missing.push(function.clone());
        }
    }
    Ok(ProbePoints { points, missing })
}

/// The exported names under which a binding may implement `function`, preferred name first.
///
/// Fortran compilers decorate names differently: gfortran appends `_` (or `__` to names that
/// already contain one under -fsecond-underscore), some compilers use no suffix or upper case.
/// The `mpi_f08` module has its own entry points: `mpi_send_f08_` and `pmpi_send_f08_` in Open
/// MPI, `mpi_send_f08ts_` (and `_large_` for MPI-4 large counts, which Fortran reaches through the
/// same generic name) in MPICH, whose profiling versions are `pmpir_send_f08ts_`.
fn symbol_names(binding: Binding, function: &str) -> Vec<String> {
    match binding {
        Binding::C => vec![function.to_string(), format!("P{function}")],
        // Its PMPI_* calls lead into the MPI library, which is probed there.
        Binding::Interposer => vec![function.to_string()],
        Binding::Fortran => {
            const SUFFIXES: [&str; 7] = [
                "_",
                "__",
                "",
                "_f08_",
                "_f08ts_",
                "_f08_large_",
                "_f08ts_large_",
            ];
            let lower = function.to_ascii_lowercase();
            let upper = function.to_ascii_uppercase();
            let mut stems = vec![lower.clone(), format!("p{lower}")];
            if let Some((prefix, rest)) = lower.split_once('_') {
                stems.push(format!("p{prefix}r_{rest}"));
            }
            let mut names: Vec<String> = stems
                .iter()
                .flat_map(|stem| SUFFIXES.iter().map(move |suffix| format!("{stem}{suffix}")))
                .collect();
            names.push(format!("P{upper}"));
            names.push(upper);
            names
        }
    }
}

/// Byte offset of the `size` field inside Open MPI's datatype object, read from the predefined
/// datatypes in `lib` (Open MPI's C library). BPF reads a message's datatype size at
/// `handle + offset`; the offset is derived from the real file, so an Open MPI version with a
/// different layout is refused here rather than producing wrong byte counts.
pub fn openmpi_datatype_size_offset(lib: &MpiLibrary) -> Result<u64, DiscoveryError> {
    // Four different sizes, so that no other field can hold all of them by coincidence.
    const REFERENCE: [(&str, u64); 4] = [
        ("ompi_mpi_char", 1),
        ("ompi_mpi_short", 2),
        ("ompi_mpi_int", 4),
        ("ompi_mpi_double", 8),
    ];
    let symbols = DynamicSymbols::read(&lib.path)?;
    let objects = REFERENCE
        .iter()
        .map(|&(name, size)| Ok((symbols.data(name)?, size)))
        .collect::<Result<Vec<_>, DiscoveryError>>()?;
    let len = objects
        .iter()
        .map(|(bytes, _)| bytes.len())
        .min()
        .unwrap_or(0);
    let word = |bytes: &[u8], at: usize| {
        bytes[at..]
            .first_chunk::<8>()
            .map_or(0, |w| u64::from_ne_bytes(*w))
    };
    // opal_datatype_t keeps size before true_lb, true_ub, lb and ub, and for a basic type the
    // upper bounds equal the size too, so the first matching word is the size field.
    (0..len.saturating_sub(7))
        .step_by(8)
        .find(|&at| objects.iter().all(|(bytes, size)| word(bytes, at) == *size))
        .map(|at| at as u64)
        .ok_or_else(|| DiscoveryError::DatatypeLayout {
            path: lib.path.clone(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::test_support::{
        tool, MPICH_C, MPICH_FORT, OPENMPI_C, OPENMPI_F08, OPENMPI_MPIFH, OPENMPI_TKR,
    };
    use std::path::Path;

    fn open(path: &str) -> MpiLibrary {
        MpiLibrary::open(Path::new(path)).unwrap_or_else(|e| {
            panic!("{e} (install Open MPI and MPICH: libopenmpi-dev libmpich-dev)")
        })
    }

    fn functions(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// File offset of a dynamic symbol as binutils computes it: `nm -D` gives the address,
    /// `readelf -lW` the LOAD segment that contains it.
    fn binutils_offset(path: &Path, symbol: &str) -> u64 {
        let path = path.to_str().unwrap();
        let nm = tool("nm", &["-D", "--defined-only", path]);
        let address = nm
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let (addr, _, name) = (f.next()?, f.next()?, f.next()?);
                (name == symbol).then(|| u64::from_str_radix(addr, 16).unwrap())
            })
            .unwrap();
        let readelf = tool("readelf", &["-lW", path]);
        readelf
            .lines()
            .filter(|l| l.trim_start().starts_with("LOAD"))
            .find_map(|l| {
                let f: Vec<u64> = l
                    .split_whitespace()
                    .skip(1)
                    .take(5)
                    .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap())
                    .collect();
                let (offset, vaddr, filesz) = (f[0], f[1], f[3]);
                (vaddr <= address && address < vaddr + filesz).then(|| address - vaddr + offset)
            })
            .unwrap()
    }

    #[test]
    fn c_probe_offsets_match_binutils_and_aliases_give_one_point() {
        for path in [OPENMPI_C, MPICH_C] {
            let lib = open(path);
            let points = probe_points(
                &lib,
                &functions(&["MPI_Send", "MPI_Allreduce", "MPI_Bogus"]),
            )
            .unwrap();
            let send: Vec<_> = points
                .points
                .iter()
                .filter(|p| p.function == "MPI_Send")
                .collect();
            assert_eq!(
                send.len(),
                1,
                "MPI_Send and PMPI_Send alias one address in {path}"
            );
            assert_eq!(send[0].symbol, "MPI_Send");
            assert_eq!(
                send[0].file_offset,
                binutils_offset(&lib.path, "MPI_Send"),
                "{path}"
            );
            assert_eq!(
                send[0].file_offset,
                binutils_offset(&lib.path, "PMPI_Send"),
                "{path}"
            );
            assert!(points.points.iter().any(|p| p.function == "MPI_Allreduce"));
            assert_eq!(points.missing, ["MPI_Bogus"]);
        }
    }

    #[test]
    fn fortran_libraries_give_points_for_each_distinct_entry() {
        let symbols = |path: &str| -> Vec<String> {
            let points = probe_points(&open(path), &functions(&["MPI_Send"])).unwrap();
            assert!(points.points.iter().all(|p| p.function == "MPI_Send"));
            for p in &points.points {
                assert_eq!(
                    p.file_offset,
                    binutils_offset(&open(path).path, &p.symbol),
                    "{p:?}"
                );
            }
            points.points.into_iter().map(|p| p.symbol).collect()
        };
        // mpi_send, mpi_send__, MPI_SEND, pmpi_* and MPI_Send_f08 alias mpi_send_ there.
        assert_eq!(symbols(OPENMPI_MPIFH), ["mpi_send_"]);
        assert_eq!(symbols(OPENMPI_F08), ["mpi_send_f08_", "pmpi_send_f08_"]);
        assert_eq!(
            symbols(MPICH_FORT),
            [
                "mpi_send_",
                "mpi_send_f08ts_",
                "mpi_send_f08ts_large_",
                "pmpir_send_f08ts_",
                "pmpir_send_f08ts_large_"
            ]
        );
        let tkr = probe_points(&open(OPENMPI_TKR), &functions(&["MPI_Send"])).unwrap();
        assert!(
            tkr.points.is_empty(),
            "the ignore-TKR module calls libmpi_mpifh"
        );
        assert_eq!(tkr.missing, ["MPI_Send"]);
    }

    #[test]
    fn open_mpi_datatype_size_offset_is_read_from_the_library() {
        assert_eq!(openmpi_datatype_size_offset(&open(OPENMPI_C)).unwrap(), 24);
        let err = openmpi_datatype_size_offset(&open(MPICH_C)).unwrap_err();
        assert!(matches!(err, DiscoveryError::MissingSymbol { .. }), "{err}");
    }

    /// The file offset of the first instruction objdump shows as push, a relative branch or
    /// nop in the function at `offset` (the libraries' code segments start at the same file
    /// offset and address).
    fn objdump_first_emulated(path: &str, offset: u64) -> u64 {
        let out = tool(
            "objdump",
            &[
                "-d",
                "--no-show-raw-insn",
                &format!("--start-address={offset:#x}"),
                &format!("--stop-address={:#x}", offset + 64),
                path,
            ],
        );
        out.lines()
            .filter_map(|l| {
                let (addr, rest) = l.trim_start().split_once(":\t")?;
                Some((u64::from_str_radix(addr, 16).ok()?, rest.trim()))
            })
            .find(|(_, insn)| {
                let mnemonic = insn.split_whitespace().next().unwrap_or("");
                ["push", "nop", "call"].contains(&mnemonic) || mnemonic.starts_with('j')
            })
            .map(|(addr, _)| addr)
            .expect("an emulated instruction within 64 bytes")
    }

    #[test]
    fn probes_sit_on_the_first_emulated_instruction_objdump_shows() {
        let functions: Vec<String> = ["MPI_Test", "MPI_Iprobe", "MPI_Waitall", "MPI_Finalize"]
            .map(String::from)
            .to_vec();
        let mut moved = Vec::new();
        for path in [OPENMPI_C, MPICH_C] {
            let lib = open(path);
            let real = std::fs::canonicalize(path).unwrap();
            for point in probe_points(&lib, &functions).unwrap().points {
                let expected = objdump_first_emulated(real.to_str().unwrap(), point.file_offset);
                assert_eq!(point.probe_offset, expected, "{path} {}", point.function);
                if point.probe_offset != point.file_offset {
                    moved.push(format!("{path} {}", point.function));
                }
            }
        }
        // Open MPI's MPI_Test, MPI_Waitall and MPI_Finalize and MPICH's MPI_Finalize start with
        // a RIP-relative instruction.
        assert_eq!(moved.len(), 4, "{moved:?}");
    }
}
