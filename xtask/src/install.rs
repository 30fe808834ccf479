//! `cargo xtask install`: the release daemon, its systemd unit, its sysusers.d entry, its default
//! configuration and docs/deploy.md, laid out as a package would lay them out.
//!
//! PREFIX (default /usr/local) is where the binary, the unit and the documentation go; the
//! configuration goes to /etc/mpiburst whatever the prefix. DESTDIR, when set, is prepended to
//! every path and nothing on the running system is touched: how packagers stage a package.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// The installed configuration file, as the unit's ExecStart names it.
const CONFIG: &str = "/etc/mpiburst/mpiburst.toml";
/// The binary as the unit in the repository names it (a PREFIX of /usr).
const UNIT_BINARY: &str = "/usr/bin/mpiburst";
/// The documentation as the unit in the repository names it.
const UNIT_DOCS: &str = "/usr/share/doc/mpiburst/deploy.md";

/// Where each installed file goes, before DESTDIR.
struct Layout {
    binary: PathBuf,
    unit: PathBuf,
    sysusers: PathBuf,
    docs: PathBuf,
    /// The Slurm epilog that stores a job's summary with the job.
    epilog: PathBuf,
}

impl Layout {
    fn new(prefix: &Path) -> Layout {
        Layout {
            binary: prefix.join("bin/mpiburst"),
            // systemd reads units and sysusers.d entries under /usr/local/lib as well as /usr/lib.
            unit: prefix.join("lib/systemd/system/mpiburst.service"),
            sysusers: prefix.join("lib/sysusers.d/mpiburst.conf"),
            docs: prefix.join("share/doc/mpiburst/deploy.md"),
            epilog: prefix.join("lib/mpiburst/mpiburst-epilog.sh"),
        }
    }
}

/// `path` under `destdir` (an absolute path joined onto another replaces it otherwise).
fn staged(destdir: &Path, path: &Path) -> PathBuf {
    destdir.join(path.strip_prefix("/").unwrap_or(path))
}

/// Writes `contents` to `path` with `mode`, creating the directories above it.
fn write(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().context("an installed file has a directory")?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    println!("installed {}", path.display());
    Ok(())
}

/// The unit with the paths of this prefix.
fn unit_text(unit: &str, layout: &Layout) -> Result<String> {
    for expected in [UNIT_BINARY, UNIT_DOCS, CONFIG] {
        if !unit.contains(expected) {
            bail!("packaging/systemd/mpiburst.service no longer names {expected}: update xtask/src/install.rs with it");
        }
    }
    Ok(unit
        .replace(UNIT_BINARY, &layout.binary.display().to_string())
        .replace(UNIT_DOCS, &layout.docs.display().to_string()))
}

/// Installs the release binary `bin` and the files that make it a service.
pub fn install(bin: &Path) -> Result<()> {
    let prefix = PathBuf::from(std::env::var("PREFIX").unwrap_or_else(|_| "/usr/local".into()));
    if !prefix.is_absolute() {
        bail!("PREFIX={} must be an absolute path", prefix.display());
    }
    let destdir = std::env::var_os("DESTDIR").map(PathBuf::from);
    let target = |path: &Path| match &destdir {
        Some(d) => staged(d, path),
        None => path.to_path_buf(),
    };
    let layout = Layout::new(&prefix);
    let packaging = crate::root().join("packaging");
    let read =
        |path: PathBuf| fs::read(&path).with_context(|| format!("cannot read {}", path.display()));

    // The default configuration comes from the binary itself, so it is the one that binary reads.
    let config = Command::new(bin)
        .args(["config", "--default"])
        .output()
        .with_context(|| format!("cannot run {} config --default", bin.display()))?;
    if !config.status.success() {
        bail!(
            "{} config --default failed: {}",
            bin.display(),
            String::from_utf8_lossy(&config.stderr)
        );
    }
    let unit = String::from_utf8(read(packaging.join("systemd/mpiburst.service"))?)
        .context("packaging/systemd/mpiburst.service is not UTF-8")?;

    write(&target(&layout.binary), &read(bin.to_path_buf())?, 0o755)?;
    write(
        &target(&layout.unit),
        unit_text(&unit, &layout)?.as_bytes(),
        0o644,
    )?;
    write(
        &target(&layout.sysusers),
        &read(packaging.join("sysusers.d/mpiburst.conf"))?,
        0o644,
    )?;
    write(
        &target(&layout.docs),
        &read(crate::root().join("docs/deploy.md"))?,
        0o644,
    )?;
    write(
        &target(&layout.epilog),
        &read(packaging.join("slurm/mpiburst-epilog.sh"))?,
        0o755,
    )?;
    // An administrator's edits are kept: the defaults are always at `mpiburst config --default`.
    let config_path = target(Path::new(CONFIG));
    if config_path.exists() {
        println!(
            "kept {} (the defaults: `mpiburst config --default`)",
            config_path.display()
        );
    } else {
        write(&config_path, &config.stdout, 0o644)?;
    }

    if destdir.is_none() {
        println!(
            "\nnext: create the user, load the unit and start it:\n  \
             systemd-sysusers {}\n  systemctl daemon-reload\n  systemctl enable --now mpiburst\n  \
             curl http://127.0.0.1:9464/healthz\nsee {}",
            layout.sysusers.display(),
            layout.docs.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destdir_prefixes_every_path_and_the_unit_names_the_prefix() {
        let layout = Layout::new(Path::new("/opt/mb"));
        assert_eq!(
            staged(Path::new("/tmp/pkg"), &layout.unit),
            Path::new("/tmp/pkg/opt/mb/lib/systemd/system/mpiburst.service")
        );
        let unit =
            fs::read_to_string(crate::root().join("packaging/systemd/mpiburst.service")).unwrap();
        let text = unit_text(&unit, &layout).unwrap();
        assert!(
            text.contains(
                "ExecStart=/opt/mb/bin/mpiburst run --config /etc/mpiburst/mpiburst.toml"
            ),
            "{text}"
        );
        assert!(text.contains("Documentation=file:/opt/mb/share/doc/mpiburst/deploy.md"));
        assert!(!text.contains("/usr/bin/mpiburst"));
    }
}
