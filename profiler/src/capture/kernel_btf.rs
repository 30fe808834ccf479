//! The offsets of the kernel fields the scheduler program reads (profiler-ebpf's oncpu.rs), from
//! the kernel's BTF: a task's run time as the scheduler accounts it, the way from a task to its
//! CPU's run queue, and the run queue's two clocks. They move between kernel versions and
//! configurations, and the BPF programs, built without the kernel's types, take them as globals.

use btf_rs::{Backend, Btf, Type};

/// The kernel's own BTF, world-readable where the kernel has one (CONFIG_DEBUG_INFO_BTF).
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum KernelBtfError {
    #[error(
        "cannot read the kernel's BTF at {VMLINUX_BTF} ({0}); mpiburst needs a kernel built with \
         CONFIG_DEBUG_INFO_BTF=y, as the kernels of current distributions are"
    )]
    Unreadable(btf_rs::Error),
    #[error(
        "the kernel's BTF ({VMLINUX_BTF}) has no {0}: mpiburst does not know this kernel's \
         scheduler; please report the kernel (`uname -r`) to the mpiburst maintainers"
    )]
    Missing(String),
}

/// Byte offsets in `struct task_struct`, `struct cfs_rq` and `struct rq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SchedOffsets {
    /// task_struct.se.sum_exec_runtime.
    pub task_runtime: u64,
    /// task_struct.se.cfs_rq and cfs_rq.rq, which only kernels with group scheduling
    /// (CONFIG_FAIR_GROUP_SCHED) have: without them the run queue is out of reach.
    pub rq_path: Option<(u64, u64)>,
    /// rq.clock and rq.clock_task.
    pub rq_clock: u64,
    pub rq_clock_task: u64,
}

impl SchedOffsets {
    /// The offsets on the running kernel.
    pub(super) fn of_running_kernel() -> Result<SchedOffsets, KernelBtfError> {
        let btf = Btf::from_file_with_backend(VMLINUX_BTF, Backend::Mmap)
            .map_err(KernelBtfError::Unreadable)?;
        SchedOffsets::of(&btf)
    }

    fn of(btf: &Btf) -> Result<SchedOffsets, KernelBtfError> {
        let rq_path = match (
            member_offset(btf, "task_struct", &["se", "cfs_rq"]),
            member_offset(btf, "cfs_rq", &["rq"]),
        ) {
            (Ok(task_cfs_rq), Ok(cfs_rq_rq)) => Some((task_cfs_rq, cfs_rq_rq)),
            _ => None,
        };
        Ok(SchedOffsets {
            task_runtime: member_offset(btf, "task_struct", &["se", "sum_exec_runtime"])?,
            rq_path,
            rq_clock: member_offset(btf, "rq", &["clock"])?,
            rq_clock_task: member_offset(btf, "rq", &["clock_task"])?,
        })
    }
}

/// Byte offset of the member at `path` (a member of a member of …) in `struct name`.
fn member_offset(btf: &Btf, name: &str, path: &[&str]) -> Result<u64, KernelBtfError> {
    let missing = || KernelBtfError::Missing(format!("struct {name} member {}", path.join(".")));
    let structs = btf.resolve_types_by_name(name).map_err(|_| missing())?;
    let Some(Type::Struct(mut current)) = structs
        .into_iter()
        .find(|t| matches!(t, Type::Struct(s) if !s.members.is_empty()))
    else {
        return Err(missing());
    };
    let mut offset = 0;
    for (i, member) in path.iter().enumerate() {
        let (bits, ty) = find_member(btf, &current, member).ok_or_else(missing)?;
        offset += bits;
        if i + 1 < path.len() {
            current = match ty {
                Type::Struct(s) | Type::Union(s) => s,
                _ => return Err(missing()),
            };
        }
    }
    if offset % 8 != 0 {
        return Err(missing());
    }
    Ok(u64::from(offset / 8))
}

/// The bit offset and type of member `name` of `st`, looking into its anonymous structs and
/// unions (a randomized task_struct keeps its fields in one).
fn find_member(btf: &Btf, st: &btf_rs::Struct, name: &str) -> Option<(u32, Type)> {
    for member in &st.members {
        let ty = resolved(btf, btf.resolve_chained_type(member).ok()?)?;
        let member_name = btf.resolve_name(member).unwrap_or_default();
        if member_name == name {
            return Some((member.bit_offset(), ty));
        }
        if member_name.is_empty() {
            if let Type::Struct(inner) | Type::Union(inner) = &ty {
                if let Some((bits, found)) = find_member(btf, inner, name) {
                    return Some((member.bit_offset() + bits, found));
                }
            }
        }
    }
    None
}

/// `ty` through its typedefs and qualifiers.
fn resolved(btf: &Btf, mut ty: Type) -> Option<Type> {
    loop {
        ty = match &ty {
            Type::Typedef(t) => btf.resolve_chained_type(t).ok()?,
            Type::Volatile(t) | Type::Const(t) | Type::Restrict(t) => {
                btf.resolve_chained_type(t).ok()?
            }
            Type::TypeTag(t) => btf.resolve_chained_type(t).ok()?,
            _ => return Some(ty),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's offsets, checked against what its fields must satisfy: the two rq
    /// clocks are distinct aligned u64s, and the task's run time is its scheduling entity's.
    #[test]
    fn the_running_kernel_s_scheduler_fields_are_found() {
        let offsets = SchedOffsets::of_running_kernel().unwrap();
        assert_ne!(offsets.rq_clock, offsets.rq_clock_task);
        assert_eq!((offsets.rq_clock % 8, offsets.rq_clock_task % 8), (0, 0));
        let btf = Btf::from_file_with_backend(VMLINUX_BTF, Backend::Mmap).unwrap();
        let se = member_offset(&btf, "task_struct", &["se"]).unwrap();
        let runtime = member_offset(&btf, "sched_entity", &["sum_exec_runtime"]).unwrap();
        assert_eq!(offsets.task_runtime, se + runtime);
        assert!(member_offset(&btf, "task_struct", &["no_such_field"]).is_err());
    }
}
