//! Types that flow between the stages: capture and recordings produce them, discovery annotates
//! them, analysis and export consume them. Nothing here depends on BPF or on a live system, so every
//! later stage can be driven from a recording.

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock},
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A function name or module id, interned: copying one is copying a pointer. Every burst carries
/// four, and a burst storm of 10⁵ bursts/s went through the reference counts of the same few
/// shared strings from two threads (the loop that makes bursts, the analysis that drops them).
/// The names are few (the probed functions, the modules of the processes profiled) and each is
/// kept once for the process's life.
#[derive(Clone, Copy, Eq)]
pub struct Name(&'static &'static str);

/// Each name is kept once: the same name is the same pointer.
impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Name) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// By the string, so that what is sorted by name comes out the same in every run; a name is
/// equal to itself without reading it (call sites key maps that every burst looks up).
impl Ord for Name {
    fn cmp(&self, other: &Name) -> std::cmp::Ordering {
        if self == other {
            return std::cmp::Ordering::Equal;
        }
        self.as_str().cmp(other.as_str())
    }
}

/// As the string's, which maps keyed by names are looked up with (`Borrow<str>`).
impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl Name {
    pub fn new(name: &str) -> Name {
        static NAMES: OnceLock<Mutex<HashMap<&'static str, Name>>> = OnceLock::new();
        let mut names = NAMES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(&known) = names.get(name) {
            return known;
        }
        // A thin pointer to the string's (pointer, length): a burst carries four names.
        let text: &'static str = Box::leak(name.into());
        let kept = Name(Box::leak(Box::new(text)));
        names.insert(text, kept);
        kept
    }

    pub fn as_str(&self) -> &'static str {
        self.0
    }

    /// What tells this name apart without reading it: its interned string's address. Maps that
    /// every burst looks up hash this rather than the string (a module id is 40 characters).
    pub fn identity(&self) -> usize {
        std::ptr::from_ref(self.0) as usize
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Name {
        Name::new(name)
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.0
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self.0
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.0, f)
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Name, D::Error> {
        Ok(Name::new(&String::deserialize(deserializer)?))
    }
}

/// A code location that compares equal across processes and nodes running the same binary:
/// the module (GNU build-id in hex when the ELF has one, else its path) and the file offset.
/// Raw virtual addresses are never used because of ASLR.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CallSite {
    pub module: Name,
    pub offset: u64,
}

impl CallSite {
    /// The call site of a burst that no MPI call opened (cannot happen after MPI_Init) or whose
    /// address could not be resolved because the process was gone before its maps were read.
    pub fn unknown(address: u64) -> Self {
        CallSite {
            module: Name::new("?"),
            offset: address,
        }
    }

    /// Whether this is an [`CallSite::unknown`] site: a raw address, not comparable between
    /// processes.
    pub fn is_unknown(&self) -> bool {
        self.module.as_ref() == "?"
    }

    /// The site as a key that hashes without reading its module's name (see
    /// [`Name::identity`]); equal for equal sites.
    pub fn identity(&self) -> (usize, u64) {
        (self.module.identity(), self.offset)
    }
}

impl std::fmt::Display for CallSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let module = self.module.rsplit('/').next().unwrap_or(&self.module);
        let short = if module.len() > 12 && module.bytes().all(|b| b.is_ascii_hexdigit()) {
            &module[..12]
        } else {
            module
        };
        write!(f, "{short}+{:#x}", self.offset)
    }
}

/// Hardware counter deltas over one burst. Present only where a PMU delivered them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HwCounters {
    pub instructions: u64,
    pub cycles: u64,
}

/// One CPU burst: the computation of one thread between returning from an MPI call and entering
/// the next one (polling calls such as MPI_Test do not end a burst; their time is excluded).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Burst {
    pub pid: u32,
    pub tid: u32,
    /// MPI rank in the job's world communicator.
    pub rank: u32,
    /// Start time, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// Wall-clock duration without the time spent in polling MPI calls inside the burst.
    pub duration_ns: u64,
    /// Time the thread ran during the burst, as the scheduler accounts it (sum_exec_runtime):
    /// what the thread's own CLOCK_THREAD_CPUTIME_ID counts, without time stolen by a hypervisor.
    pub oncpu_ns: u64,
    pub counters: Option<HwCounters>,
    /// MPI function whose return opened the burst.
    pub start_func: Name,
    /// MPI function whose entry closed the burst.
    pub end_func: Name,
    /// Return address of the outermost MPI call that opened the burst.
    pub start_site: CallSite,
    /// Return address of the outermost MPI call that closed the burst.
    pub end_site: CallSite,
}

impl Burst {
    /// The code region of a burst: the pair of call sites around it.
    pub fn region(&self) -> (&CallSite, &CallSite) {
        (&self.start_site, &self.end_site)
    }
}

/// The calls that bound a rank's region of interest, as the POP methodology defines it: from
/// the return of MPI_Init/MPI_Init_thread to the entry of MPI_Finalize. Their own time is start-up
/// and shut-down, reported apart and never counted as MPI time of the region.
pub const INIT_FUNCTIONS: [&str; 2] = ["MPI_Init", "MPI_Init_thread"];
pub const FINALIZE_FUNCTION: &str = "MPI_Finalize";

/// MPI_Init, MPI_Init_thread or MPI_Finalize.
pub fn is_lifecycle_function(name: &str) -> bool {
    INIT_FUNCTIONS.contains(&name) || name == FINALIZE_FUNCTION
}

/// Now, in nanoseconds since the Unix epoch: CLOCK_REALTIME, the clock burst start times and
/// job times are kept in.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Identity of one MPI job on a node, as discovery found it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobId(pub String);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where one MPI function starts in a library file: made by discovery, attached to by capture.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbePoint {
    /// Canonical C name, e.g. `MPI_Send`, whichever binding the code belongs to.
    pub function: String,
    /// The exported symbol the offset was taken from, e.g. `mpi_send_` or `MPI_Send`.
    pub symbol: String,
    /// File offset of the entry point.
    pub file_offset: u64,
    /// File offset where the entry and return probes go: the entry point, or a later
    /// instruction of the entry block the kernel emulates instead of single-stepping
    /// (capture/placement.rs).
    pub probe_offset: u64,
    /// Open MPI's C library: the distance in bytes from the probe point to the library's global
    /// offset table slot of `ompi_mpi_comm_world`, the object MPI_COMM_WORLD points at. The
    /// slot holds the object's address in the process, in the library or, when the executable
    /// refers to MPI_COMM_WORLD itself, in the executable's copy of it; the distance is the same
    /// in every process, since both move with the library.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_slot_distance: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_kept_once_and_orders_and_serialises_as_its_string() {
        let owned = String::from("MPI_Allreduce");
        let (a, b) = (Name::new("MPI_Allreduce"), Name::new(&owned));
        assert!(std::ptr::eq(a.as_str(), b.as_str()), "one copy per name");
        assert_eq!(a, b);
        assert_ne!(a, Name::new("MPI_Barrier"));
        assert!(
            a < Name::new("MPI_Barrier"),
            "by the string, not the address"
        );
        let mut names = [Name::new("b"), Name::new("c"), Name::new("a")];
        names.sort();
        assert_eq!(
            names.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"MPI_Allreduce\"");
        assert_eq!(serde_json::from_str::<Name>(&json).unwrap(), a);
        let map: std::collections::HashMap<Name, u32> = [(a, 1)].into();
        assert_eq!(
            map.get("MPI_Allreduce"),
            Some(&1),
            "looked up by its string"
        );
    }
}
