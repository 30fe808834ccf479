//! tracefs: mounted when missing, and the field offsets of the classic tracepoints read from
//! their `format` files, because fields move between kernel versions (sched_process_exit's
//! `group_dead` did). Attaching a classic tracepoint reads its `id` file there too.
//!
//! tracefs is root's alone (mode 0700): a daemon that is not root reads it with
//! CAP_DAC_READ_SEARCH, and cannot mount it (that takes CAP_SYS_ADMIN, which the service is
//! not given), so the errors tell a missing mount from a missing permission.

use std::{io::ErrorKind, path::Path};

use super::CaptureError;

pub const TRACEFS: &str = "/sys/kernel/tracing";

/// What the daemon needs to read tracefs, for the errors that say it is missing.
const READ_PERMISSION: &str = "reading it takes root or CAP_DAC_READ_SEARCH (docs/deploy.md)";

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error("cannot read tracefs at {TRACEFS} ({0}); {READ_PERMISSION}")]
    Unreadable(std::io::Error),
    #[error(
        "tracefs is not mounted at {TRACEFS} and mounting it failed ({0}); mounting takes root \
         (CAP_SYS_ADMIN), so mount it at boot: `mount -t tracefs nodev {TRACEFS}`, or the fstab \
         line `tracefs {TRACEFS} tracefs defaults 0 0`"
    )]
    NotMounted(std::io::Error),
}

pub fn ensure_mounted() -> Result<(), CaptureError> {
    match std::fs::metadata(Path::new(TRACEFS).join("events")) {
        Ok(events) if events.is_dir() => return Ok(()),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            return Err(TracefsError::Unreadable(e).into())
        }
        _ => {}
    }
    let target = std::ffi::CString::new(TRACEFS).expect("the tracefs path has no NUL byte");
    // SAFETY: all pointers are valid NUL-terminated strings; data may be NULL for tracefs.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TracefsError::NotMounted(std::io::Error::last_os_error()).into());
    }
    tracing::info!("mounted tracefs at {TRACEFS}");
    Ok(())
}

/// Byte offset of `field` in the records of tracepoint `category/event`.
pub fn field_offset(category: &str, event: &str, field: &str) -> Result<u64, CaptureError> {
    let path = Path::new(TRACEFS)
        .join("events")
        .join(category)
        .join(event)
        .join("format");
    let error = |detail: String| CaptureError::TracepointFormat {
        event: format!("{category}/{event}"),
        detail,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        let hint = if e.kind() == ErrorKind::PermissionDenied {
            format!("; {READ_PERMISSION}")
        } else {
            String::new()
        };
        error(format!("cannot read {}: {e}{hint}", path.display()))
    })?;
    parse_field_offset(&text, field).ok_or_else(|| {
        error(format!(
            "{} has no field {field:?} with an offset",
            path.display()
        ))
    })
}

/// The offset of `field` in a tracefs format text, whose field lines read
/// `field:TYPE NAME;<TAB>offset:N;<TAB>size:N;<TAB>signed:N;` (NAME may carry an array suffix).
fn parse_field_offset(format: &str, field: &str) -> Option<u64> {
    format.lines().find_map(|line| {
        let mut parts = line.trim().split(';').map(str::trim);
        let declaration = parts.next()?.strip_prefix("field:")?;
        let name = declaration.rsplit(' ').next()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        parts.find_map(|p| p.strip_prefix("offset:"))?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::parse_field_offset;

    // As printed by Linux 6.18 for sched/sched_process_exit.
    const EXIT: &str = "name: sched_process_exit
ID: 369
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:char comm[16];	offset:8;	size:16;	signed:0;
	field:pid_t pid;	offset:24;	size:4;	signed:1;
	field:int prio;	offset:28;	size:4;	signed:1;
	field:bool group_dead;	offset:32;	size:1;	signed:0;

print fmt: \"comm=%s pid=%d prio=%d group_dead=%s\", REC->comm, REC->pid, REC->prio, REC->group_dead ? \"true\" : \"false\"
";

    #[test]
    fn offsets_come_from_the_field_lines() {
        assert_eq!(parse_field_offset(EXIT, "group_dead"), Some(32));
        assert_eq!(parse_field_offset(EXIT, "pid"), Some(24));
        assert_eq!(parse_field_offset(EXIT, "comm"), Some(8));
        // Not a field, only named in the print format.
        assert_eq!(parse_field_offset(EXIT, "REC"), None);
        assert_eq!(parse_field_offset(EXIT, "prev_pid"), None);
    }
}
