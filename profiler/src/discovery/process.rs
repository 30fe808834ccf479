//! pid → identity: which job a process belongs to, its rank and the job's size, whatever
//! launched it (Open MPI's mpirun, MPICH's Hydra, Slurm's srun, a singleton).

use std::collections::HashMap;

use procfs::ProcessCGroups;
use serde::{Deserialize, Serialize};

use crate::model::JobId;
use crate::proc::{self, read_maps, read_stat, ProcError, ProcStat};

use super::error::DiscoveryError;
use super::libraries::is_mpi_library_name;

/// Where the rank of a [`ProcessIdentity`] came from. The job id's prefix (`slurm:`, `pmix:`,
/// `hydra:` or a launcher name) says where the job came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IdentitySource {
    /// `OMPI_COMM_WORLD_RANK`, set by Open MPI's launchers.
    OpenMpiEnv,
    /// `PMIX_RANK`, set by any PMIx server (Open MPI, PRRTE, Slurm with `--mpi=pmix`).
    PmixEnv,
    /// `PMI_RANK`, set by MPICH's Hydra and other PMI-1/2 launchers.
    HydraEnv,
    /// `SLURM_PROCID`, set by srun.
    SlurmEnv,
    /// No rank variable: the rank is the process's place among the job's MPI processes.
    Launcher,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub job: JobId,
    pub rank: u32,
    pub size: u32,
    pub node: String,
    pub source: IdentitySource,
    /// The Slurm job id (`SLURM_JOB_ID`) the process runs in, whoever launched it: an mpirun
    /// inside an allocation names the job itself, and this is how it is found by its Slurm job.
    pub scheduler_job: Option<String>,
    /// The Slurm job's cgroup (the `job_<id>` directory above the process's step cgroup, as
    /// /proc/PID/cgroup names it), when Slurm's cgroup plugins put the process in one: the path
    /// to give `--cgroup` to profile this job alone.
    pub cgroup: Option<String>,
}

/// Identifies MPI process `pid` on node `node`.
///
/// The job id is the same on every node of the job, for each node's daemon names the job on its
/// own. It is, in this order:
/// 1. the MPI launcher's own: Open MPI's PMIx namespace (`pmix:<ns>`; ORTE names it after its
///    job id, `OMPI_MCA_ess_base_jobid`, which gives the same id), unless srun is the launcher
///    (Slurm's PMIx plugin names it `slurm.pmix.<job>.<step>`);
/// 2. else the Hydra job's (`hydra:<host>:<port>`, mpiexec's control port, which every node's
///    `hydra_pmi_proxy` is given on its command line: Hydra exports no job id);
/// 3. else the Slurm step (`slurm:<job>.<step>`), as under srun;
/// 4. else the outermost launcher process above `pid` (`<comm>:<pid>@<start time>`, so a reused
///    pid is a different job), which is only right on the launching node. A process without
///    any launcher is a singleton: its own job, of size 1.
///
/// The launcher's id comes before Slurm's step: an mpirun or mpiexec inside an allocation passes
/// the batch script's Slurm variables on to the ranks of its own node, and those of the srun that
/// started its remote daemons to the others. The Slurm job is kept beside, as
/// [`ProcessIdentity::scheduler_job`].
pub fn identify(pid: u32, node: &str) -> Result<ProcessIdentity, DiscoveryError> {
    let env = LaunchEnv::read(pid)?;
    let own = read_stat(pid)?;
    // The walk up the process tree is needed only when the environment does not say it all.
    let mut walked = None;
    let mut ancestry = || -> Result<Ancestry, DiscoveryError> {
        if let Some(known) = &walked {
            return Ok(Ancestry::clone(known));
        }
        let found = Ancestry::of(&own)?;
        walked = Some(found.clone());
        Ok(found)
    };
    let root = |ancestry: Ancestry| ancestry.outermost.unwrap_or_else(|| own.clone());
    let job = match env.job(|| ancestry()?.hydra_job())? {
        Some(job) => job,
        None => {
            let root = root(ancestry()?);
            format!("{}:{}@{}", root.comm, root.pid, root.start_time)
        }
    };
    let (rank, size, source) = match env.rank() {
        Some((rank, source)) => {
            let size = match env.size() {
                Some(size) => size,
                None => job_members(&root(ancestry()?))?.len() as u32,
            };
            (rank, size, source)
        }
        None => {
            let members = job_members(&root(ancestry()?))?;
            let rank = members
                .iter()
                .position(|m| m.pid == pid)
                .ok_or(DiscoveryError::NotMpiProcess { pid })?;
            (rank as u32, members.len() as u32, IdentitySource::Launcher)
        }
    };
    let cgroup = env
        .slurm_job_id
        .as_deref()
        .and_then(|job| slurm_job_cgroup(pid, job));
    Ok(ProcessIdentity {
        pid,
        job: JobId(job),
        rank,
        size,
        node: node.to_string(),
        source,
        scheduler_job: env.slurm_job_id,
        cgroup,
    })
}

/// The cgroup of Slurm job `job` that process `pid` is in: its cgroup path up to the `job_<job>`
/// component (proctrack/cgroup and task/cgroup make `…/job_<id>/step_<id>/…`, on cgroup v1 in
/// each controller's hierarchy, on v2 in the unified one). The unified hierarchy's path comes
/// first when both have one, as it is the one cgroup v2 tools show.
fn slurm_job_cgroup(pid: u32, job: &str) -> Option<String> {
    // The cgroup is extra: a process whose file cannot be read is still identified, without it.
    let cgroups = proc::cgroups(pid).ok()?;
    job_cgroup_of(&cgroups, job)
}

pub(crate) fn job_cgroup_of(cgroups: &ProcessCGroups, job: &str) -> Option<String> {
    let component = format!("job_{job}");
    let mut cgroups: Vec<_> = cgroups.into_iter().collect();
    cgroups.sort_by_key(|cgroup| cgroup.hierarchy);
    cgroups.iter().find_map(|cgroup| {
        let parts: Vec<&str> = cgroup.pathname.split('/').collect();
        let at = parts.iter().position(|part| *part == component)?;
        Some(parts[..=at].join("/"))
    })
}

/// True when one of the process's cgroups (any hierarchy of /proc/PID/cgroup) is `scope` or
/// below it. A process that is gone is in no cgroup.
pub fn in_cgroup(pid: u32, scope: &str) -> bool {
    proc::cgroups(pid).is_ok_and(|cgroups| cgroups_match(&cgroups, scope))
}

pub(crate) fn cgroups_match(cgroups: &ProcessCGroups, scope: &str) -> bool {
    let scope = scope.trim_end_matches('/');
    cgroups.into_iter().any(|cgroup| {
        let path = cgroup.pathname.as_str();
        scope.is_empty()
            || path == scope
            || path
                .strip_prefix(scope)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// This machine's host name, the default node name.
pub fn hostname() -> Result<String, DiscoveryError> {
    let mut buf = [0u8; 256];
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Err(DiscoveryError::Hostname(std::io::Error::last_os_error()));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// The launcher variables of a process's environment, and nothing else: the environment of a
/// user's process may hold credentials, so each variable is matched against this allow-list and
/// every other one is dropped unseen, together with the bytes read from /proc/PID/environ. There
/// is deliberately no field that could hold an arbitrary variable.
#[derive(Debug, Default)]
pub(crate) struct LaunchEnv {
    ompi_rank: Option<u32>,
    ompi_size: Option<u32>,
    ompi_jobid: Option<String>,
    pmix_rank: Option<u32>,
    pmix_namespace: Option<String>,
    pmi_rank: Option<u32>,
    pmi_size: Option<u32>,
    slurm_job_id: Option<String>,
    slurm_step_id: Option<String>,
    slurm_procid: Option<u32>,
    slurm_ntasks: Option<u32>,
    slurm_step_num_tasks: Option<u32>,
}

impl LaunchEnv {
    fn read(pid: u32) -> Result<Self, DiscoveryError> {
        Ok(LaunchEnv::parse(&proc::environ(pid)?))
    }

    /// The launcher variables of an environment as /proc/PID/environ holds it: `NAME=value`
    /// entries, each ended by a NUL byte. An entry without `=` is no variable. Where a name comes
    /// twice the first counts, as for getenv(3).
    pub(crate) fn parse(environ: &[u8]) -> Self {
        let mut env = LaunchEnv::default();
        let mut seen = std::collections::HashSet::new();
        for entry in environ.split(|&b| b == 0) {
            if let Some(at) = entry.iter().position(|&b| b == b'=') {
                let (name, value) = (&entry[..at], &entry[at + 1..]);
                if seen.insert(name) {
                    env.keep(name, value);
                }
            }
        }
        env
    }

    fn keep(&mut self, name: &[u8], value: &[u8]) {
        let text = || {
            std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let number = || std::str::from_utf8(value).ok()?.parse::<u32>().ok();
        match name {
            b"OMPI_COMM_WORLD_RANK" => self.ompi_rank = number(),
            b"OMPI_COMM_WORLD_SIZE" => self.ompi_size = number(),
            b"OMPI_MCA_ess_base_jobid" => self.ompi_jobid = text(),
            b"PMIX_RANK" => self.pmix_rank = number(),
            b"PMIX_NAMESPACE" => self.pmix_namespace = text(),
            b"PMI_RANK" => self.pmi_rank = number(),
            b"PMI_SIZE" => self.pmi_size = number(),
            b"SLURM_JOB_ID" => self.slurm_job_id = text(),
            // Slurm sets both; releases before 15.08 only SLURM_STEPID.
            b"SLURM_STEP_ID" | b"SLURM_STEPID" => self.slurm_step_id = text(),
            b"SLURM_PROCID" => self.slurm_procid = number(),
            b"SLURM_NTASKS" => self.slurm_ntasks = number(),
            b"SLURM_STEP_NUM_TASKS" => self.slurm_step_num_tasks = number(),
            _ => {}
        }
    }

    /// The job id by the first three rules of [`identify`], with `hydra_job` finding the id of
    /// the Hydra job above the process; `None` when they name no job, which is then named by
    /// its launcher.
    pub(crate) fn job(
        &self,
        hydra_job: impl FnOnce() -> Result<Option<String>, DiscoveryError>,
    ) -> Result<Option<String>, DiscoveryError> {
        let slurm_step = match (&self.slurm_job_id, &self.slurm_step_id) {
            (Some(job), Some(step)) => Some(format!("slurm:{job}.{step}")),
            _ => None,
        };
        if let Some(namespace) = self.pmix_namespace.as_ref().or(self.ompi_jobid.as_ref()) {
            let srun_launched = namespace.starts_with("slurm.pmix.") && slurm_step.is_some();
            if !srun_launched {
                return Ok(Some(format!("pmix:{namespace}")));
            }
            return Ok(slurm_step);
        }
        Ok(hydra_job()?.or(slurm_step))
    }

    /// MPI launchers' variables come before Slurm's: an mpirun inside a batch script passes the
    /// script's `SLURM_PROCID=0` on to every rank it starts.
    pub(crate) fn rank(&self) -> Option<(u32, IdentitySource)> {
        None.or(self.ompi_rank.map(|r| (r, IdentitySource::OpenMpiEnv)))
            .or(self.pmix_rank.map(|r| (r, IdentitySource::PmixEnv)))
            .or(self.pmi_rank.map(|r| (r, IdentitySource::HydraEnv)))
            .or(self.slurm_procid.map(|r| (r, IdentitySource::SlurmEnv)))
    }

    pub(crate) fn size(&self) -> Option<u32> {
        self.ompi_size
            .or(self.pmi_size)
            .or(self.slurm_step_num_tasks)
            .or(self.slurm_ntasks)
    }
}

/// Launchers by the name the kernel reports for them (`comm`).
const LAUNCHERS: [&str; 11] = [
    "mpirun",
    "mpiexec",
    "orterun",
    "prterun",
    "prte",
    "orted",
    "prted",
    "mpiexec.hydra",
    HYDRA_PROXY,
    "srun",
    "slurmstepd",
];

pub(crate) fn is_launcher(comm: &str) -> bool {
    // Distributions install launchers under alternative names (mpirun.openmpi, mpirun.mpich),
    // and `comm` is the name that was executed.
    LAUNCHERS.iter().any(|l| {
        comm.strip_prefix(l)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    })
}

/// What the walk up the process tree finds above a process.
#[derive(Clone, Debug, Default)]
struct Ancestry {
    /// The outermost known launcher: on the launching node that is mpirun or mpiexec rather than
    /// the per-node proxy below it, so all local ranks of a job share it.
    outermost: Option<ProcStat>,
    /// The innermost Hydra proxy (`hydra_pmi_proxy`), the one that started the process.
    hydra_proxy: Option<u32>,
}

impl Ancestry {
    fn of(process: &ProcStat) -> Result<Ancestry, DiscoveryError> {
        let mut found = Ancestry::default();
        let mut ppid = process.ppid;
        while ppid > 1 {
            let parent = match read_stat(ppid) {
                Ok(parent) => parent,
                // A parent that exited leaves the child to a reaper; the chain above is gone.
                Err(ProcError::ProcessGone { .. }) => break,
                Err(e) => return Err(e.into()),
            };
            ppid = parent.ppid;
            if is_launcher(&parent.comm) {
                if parent.comm == HYDRA_PROXY && found.hydra_proxy.is_none() {
                    found.hydra_proxy = Some(parent.pid);
                }
                found.outermost = Some(parent);
            }
        }
        Ok(found)
    }

    /// The id of the Hydra job the process belongs to, from its proxy's command line; `None`
    /// without a proxy, or one that has exited.
    fn hydra_job(&self) -> Result<Option<String>, DiscoveryError> {
        let Some(proxy) = self.hydra_proxy else {
            return Ok(None);
        };
        match proc::cmdline(proxy) {
            Ok(cmdline) => Ok(hydra_job_of(&cmdline)),
            Err(ProcError::ProcessGone { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// The name the kernel reports for Hydra's per-node proxy, which starts the ranks of a node.
const HYDRA_PROXY: &str = "hydra_pmi_proxy";

/// The job id of a Hydra job from the command line of one of its proxies: every node's proxy
/// gets the same `--control-port HOST:PORT`, mpiexec's, so `hydra:HOST:PORT` names the job alike
/// on every node. The processes of a later MPI_Comm_spawn get proxies of their own process group
/// (`--pgid N`, 0 for the job's first), with ranks of their own: `hydra:HOST:PORT.N` for them.
fn hydra_job_of(cmdline: &[u8]) -> Option<String> {
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let value = |option: &[u8]| {
        let at = args.iter().position(|arg| *arg == option)?;
        let value = std::str::from_utf8(args.get(at + 1)?).ok()?;
        Some(value).filter(|v| !v.is_empty())
    };
    let control = value(b"--control-port")?;
    Some(match value(b"--pgid") {
        None | Some("0") => format!("hydra:{control}"),
        Some(group) => format!("hydra:{control}.{group}"),
    })
}

/// The MPI processes of the job under `root`, in rank order. They are the topmost processes in
/// root's tree that map an MPI library; their own children (a rank that forks) are not ranks.
/// Ranks are started in rank order, so ordering by (start time, pid) reproduces the ranks.
fn job_members(root: &ProcStat) -> Result<Vec<ProcStat>, DiscoveryError> {
    let maps_mpi = |pid: u32| {
        read_maps(pid)
            .map(|maps| {
                maps.iter()
                    .any(|m| m.path.as_deref().is_some_and(is_mpi_library_name))
            })
            .unwrap_or(false)
    };
    let mut members = Vec::new();
    if maps_mpi(root.pid) {
        members.push(root.clone());
    } else {
        let mut children: HashMap<u32, Vec<ProcStat>> = HashMap::new();
        for stat in proc::pids()?
            .into_iter()
            .filter_map(|pid| read_stat(pid).ok())
        {
            children.entry(stat.ppid).or_default().push(stat);
        }
        let mut pending = vec![root.pid];
        while let Some(parent) = pending.pop() {
            for child in children.remove(&parent).unwrap_or_default() {
                if maps_mpi(child.pid) {
                    members.push(child);
                } else {
                    pending.push(child.pid);
                }
            }
        }
    }
    members.sort_by_key(|m| (m.start_time, m.pid));
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::test_support::Spawned;
    use std::collections::BTreeSet;
    use std::process::Command;

    /// Whether the cgroups listed in `text` (a /proc/PID/cgroup file) include `scope`.
    fn cgroup_lines_match(text: &str, scope: &str) -> bool {
        cgroups_match(&proc::parse_cgroups(text.as_bytes()).unwrap(), scope)
    }

    /// The processes named `comm` below `root`.
    fn descendants(root: u32, comm: &str) -> Vec<u32> {
        let mut all: Vec<ProcStat> = proc::pids()
            .unwrap()
            .into_iter()
            .filter_map(|pid| read_stat(pid).ok())
            .collect();
        let mut tree = BTreeSet::from([root]);
        loop {
            let before = tree.len();
            tree.extend(
                all.iter()
                    .filter(|p| tree.contains(&p.ppid))
                    .map(|p| p.pid)
                    .collect::<Vec<_>>(),
            );
            if tree.len() == before {
                break;
            }
        }
        all.retain(|p| p.pid != root && tree.contains(&p.pid) && p.comm == comm);
        all.iter().map(|p| p.pid).collect()
    }

    /// Whether `pid` runs `comm` with its environment in place: exec sets the name before the
    /// new environment, and a process read in between looks as if it had none.
    fn started(pid: u32, comm: &str) -> bool {
        read_stat(pid).is_ok_and(|s| s.comm == comm)
            && proc::environ(pid).is_ok_and(|e| !e.is_empty())
    }

    fn wait_for_ranks(launch: &Spawned, comm: &str, n: usize) -> Vec<u32> {
        launch.wait_until(|| {
            let pids = descendants(launch.pid(), comm);
            Some(pids).filter(|p| p.len() == n && p.iter().all(|&pid| started(pid, comm)))
        })
    }

    fn openmpi(args: &[&str]) -> Command {
        let mut cmd = Command::new("mpirun.openmpi");
        cmd.args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--mca",
            "mpi_yield_when_idle",
            "1",
        ])
        .args(args);
        cmd
    }

    /// A process with exactly `vars` as its environment and no launcher above it.
    fn with_env(vars: &[(&str, &str)]) -> Spawned {
        let mut cmd = Command::new("/bin/sleep");
        cmd.arg("10").env_clear().envs(vars.iter().copied());
        Spawned::start(cmd)
    }

    fn identify_when_started(process: &Spawned) -> ProcessIdentity {
        process.wait_until(|| started(process.pid(), "sleep").then_some(()));
        identify(process.pid(), "node-a").unwrap()
    }

    #[test]
    fn concurrent_open_mpi_and_mpich_jobs_are_separate_jobs() {
        let ompi = Spawned::start(openmpi(&["-np", "2", "sleep", "10"]));
        let mpich = Spawned::start({
            let mut cmd = Command::new("mpirun.mpich");
            cmd.args(["-np", "2", "sleep", "10"]);
            cmd
        });
        let ompi_ranks = wait_for_ranks(&ompi, "sleep", 2);
        let mpich_ranks = wait_for_ranks(&mpich, "sleep", 2);

        let identify_all = |pids: &[u32]| -> Vec<ProcessIdentity> {
            pids.iter()
                .map(|&pid| identify(pid, "node-a").unwrap())
                .collect()
        };
        let ompi_ids = identify_all(&ompi_ranks);
        let mpich_ids = identify_all(&mpich_ranks);
        for (ids, source) in [
            (&ompi_ids, IdentitySource::OpenMpiEnv),
            (&mpich_ids, IdentitySource::HydraEnv),
        ] {
            assert_eq!(ids[0].job, ids[1].job, "{ids:?}");
            assert_eq!(
                ids.iter().map(|i| i.rank).collect::<BTreeSet<_>>(),
                BTreeSet::from([0, 1])
            );
            assert!(
                ids.iter()
                    .all(|i| i.size == 2 && i.source == source && i.node == "node-a"),
                "{ids:?}"
            );
        }
        assert_ne!(ompi_ids[0].job, mpich_ids[0].job);
        assert!(ompi_ids[0].job.0.starts_with("pmix:"), "{:?}", ompi_ids[0]);
        // mpiexec's control port, which Hydra's proxy between it and the ranks was given.
        let expected = format!("hydra:{}:", hostname().unwrap());
        assert!(
            mpich_ids[0].job.0.starts_with(&expected),
            "{:?}",
            mpich_ids[0]
        );
    }

    #[test]
    fn without_rank_variables_ranks_follow_start_order_under_the_launcher() {
        let mut cmd = Command::new("mpirun.mpich");
        cmd.args([
            "-np",
            "2",
            "env",
            "-u",
            "PMI_RANK",
            "-u",
            "PMI_SIZE",
            "LD_PRELOAD=libmpich.so.12",
            "sleep",
            "10",
        ]);
        let launch = Spawned::start(cmd);
        let pids = wait_for_ranks(&launch, "sleep", 2);
        let ids = launch.wait_until(|| {
            let ids: Vec<_> = pids
                .iter()
                .map(|&pid| identify(pid, "n").ok())
                .collect::<Option<_>>()?;
            Some(ids).filter(|ids: &Vec<ProcessIdentity>| ids.iter().all(|i| i.size == 2))
        });
        let mut by_start: Vec<ProcStat> = pids.iter().map(|&pid| read_stat(pid).unwrap()).collect();
        by_start.sort_by_key(|p| (p.start_time, p.pid));
        for id in &ids {
            assert_eq!(id.source, IdentitySource::Launcher);
            assert_eq!(id.job, ids[0].job);
            let expected = by_start.iter().position(|p| p.pid == id.pid).unwrap() as u32;
            assert_eq!(id.rank, expected, "{ids:?}");
        }
    }

    #[test]
    fn sruns_pmix_namespace_gives_way_to_its_slurm_step() {
        let process = with_env(&[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "7"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("PMIX_NAMESPACE", "slurm.pmix.4242.7"),
        ]);
        let id = identify_when_started(&process);
        assert_eq!(id.job, JobId("slurm:4242.7".into()));
        assert_eq!(
            (id.rank, id.size, id.source),
            (3, 8, IdentitySource::SlurmEnv)
        );
        assert_eq!(id.scheduler_job.as_deref(), Some("4242"));
    }

    /// The job id `environ` names, with `hydra` as the Hydra job above the process.
    fn job_with(environ: &[u8], hydra: Option<&str>) -> Option<String> {
        LaunchEnv::parse(environ)
            .job(|| Ok(hydra.map(str::to_owned)))
            .unwrap()
    }

    #[test]
    fn an_mpi_launchers_job_id_comes_before_the_slurm_step_it_runs_in() {
        // Open MPI's mpirun in an allocation: its own node's ranks have the batch script's Slurm
        // variables, those of the other nodes the srun that started their orted.
        let open_mpi = b"OMPI_MCA_ess_base_jobid=1371602945\0PMIX_NAMESPACE=1371602945\0";
        for slurm in [
            &b"SLURM_JOB_ID=42\0SLURM_STEP_ID=4294967291\0"[..],
            b"SLURM_JOB_ID=42\0SLURM_STEP_ID=0\0",
            b"SLURM_JOB_ID=42\0",
        ] {
            let environ = [open_mpi, slurm].concat();
            assert_eq!(
                job_with(&environ, Some("hydra:not-asked:1")).as_deref(),
                Some("pmix:1371602945")
            );
            // Hydra's mpiexec there: its ranks have PMI variables only.
            let environ = [b"PMI_RANK=1\0PMI_SIZE=4\0", slurm].concat();
            assert_eq!(
                job_with(&environ, Some("hydra:n1:43419")).as_deref(),
                Some("hydra:n1:43419")
            );
            assert_eq!(
                LaunchEnv::parse(&environ).slurm_job_id.as_deref(),
                Some("42")
            );
        }
    }

    #[test]
    fn where_srun_is_the_launcher_its_step_names_the_job() {
        // MPICH under srun's PMI-2: no Hydra proxy above the ranks.
        let pmi2 = b"PMI_RANK=2\0PMI_SIZE=3\0SLURM_JOB_ID=42\0SLURM_STEP_ID=1\0";
        assert_eq!(job_with(pmi2, None).as_deref(), Some("slurm:42.1"));
        // Open MPI under srun's PMIx: the namespace is Slurm's own.
        let pmix =
            b"PMIX_NAMESPACE=slurm.pmix.42.1\0PMIX_RANK=0\0SLURM_JOB_ID=42\0SLURM_STEP_ID=1\0";
        assert_eq!(job_with(pmix, None).as_deref(), Some("slurm:42.1"));
        // Without the step it names, Slurm's namespace is still an id of the job.
        let bare = b"PMIX_NAMESPACE=slurm.pmix.42.1\0";
        assert_eq!(
            job_with(bare, None).as_deref(),
            Some("pmix:slurm.pmix.42.1")
        );
        // Hydra outside Slurm, and nothing at all.
        assert_eq!(
            job_with(b"PMI_RANK=0\0", Some("hydra:n1:1")).as_deref(),
            Some("hydra:n1:1")
        );
        assert_eq!(job_with(b"PMI_RANK=0\0", None), None);
    }

    #[test]
    fn a_hydra_job_is_named_by_the_control_port_every_proxy_is_given() {
        // The arguments of a real `mpiexec.mpich -bootstrap-exec … -hosts n1,n2`.
        let proxy = |id: &str, group: &str| {
            [
                "/usr/bin/hydra_pmi_proxy",
                "--control-port",
                "vm:43419",
                "--rmk",
                "user",
                "--launcher",
                "ssh",
                "--demux",
                "poll",
                "--pgid",
                group,
                "--retries",
                "10",
                "--proxy-id",
                id,
                "",
            ]
            .join("\0")
        };
        for id in ["0", "1"] {
            assert_eq!(
                hydra_job_of(proxy(id, "0").as_bytes()).as_deref(),
                Some("hydra:vm:43419")
            );
        }
        assert_eq!(
            hydra_job_of(proxy("0", "2").as_bytes()).as_deref(),
            Some("hydra:vm:43419.2"),
            "the processes of an MPI_Comm_spawn"
        );
        for args in [
            &["/usr/bin/hydra_pmi_proxy", "--pgid", "0"][..],
            &["/usr/bin/hydra_pmi_proxy", "--control-port"],
            &["/usr/bin/hydra_pmi_proxy", "--control-port", ""],
            &[],
        ] {
            let cmdline: String = args.iter().map(|arg| format!("{arg}\0")).collect();
            assert_eq!(hydra_job_of(cmdline.as_bytes()), None, "{args:?}");
        }
    }

    #[test]
    fn pmix_namespace_names_the_job_without_slurm() {
        let process = with_env(&[
            ("PMIX_NAMESPACE", "prterun-x-1@1"),
            ("PMIX_RANK", "1"),
            ("SLURM_JOB_ID", "9"),
            ("SLURM_NTASKS", "4"),
        ]);
        let id = identify_when_started(&process);
        assert_eq!(id.job, JobId("pmix:prterun-x-1@1".into()));
        assert_eq!(
            (id.rank, id.size, id.source),
            (1, 4, IdentitySource::PmixEnv)
        );
    }

    #[test]
    fn variables_outside_the_allow_list_are_never_kept() {
        let secret = "s3cr3t-value-that-must-not-leak";
        let process = with_env(&[
            ("OMPI_MCA_ess_base_jobid", "1208680449"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("SECRET_TOKEN", secret),
        ]);
        let id = identify_when_started(&process);
        assert_eq!(id.job, JobId("pmix:1208680449".into()));
        assert_eq!(
            (id.rank, id.size, id.source),
            (2, 3, IdentitySource::OpenMpiEnv)
        );
        let env = LaunchEnv::read(process.pid()).unwrap();
        for text in [
            format!("{id:?}"),
            format!("{env:?}"),
            serde_json::to_string(&id).unwrap(),
        ] {
            assert!(!text.contains("SECRET") && !text.contains(secret), "{text}");
        }
    }

    #[test]
    fn a_process_without_launcher_or_variables_is_a_singleton_if_it_maps_mpi() {
        let mut cmd = Command::new("/bin/sleep");
        cmd.arg("10").env_clear().env("LD_PRELOAD", "libmpi.so.40");
        let singleton = Spawned::start(cmd);
        let pid = singleton.pid();
        let id = singleton.wait_until(|| identify(pid, "n").ok());
        let stat = read_stat(pid).unwrap();
        assert_eq!(id.job, JobId(format!("sleep:{pid}@{}", stat.start_time)));
        assert_eq!(
            (id.rank, id.size, id.source),
            (0, 1, IdentitySource::Launcher)
        );

        let plain = with_env(&[]);
        plain.wait_until(|| (read_stat(plain.pid()).ok()?.comm == "sleep").then_some(()));
        let err = identify(plain.pid(), "n").unwrap_err();
        assert!(matches!(err, DiscoveryError::NotMpiProcess { .. }), "{err}");
    }

    #[test]
    fn environ_entries_are_split_at_their_first_equals_sign_and_the_first_name_counts() {
        let environ =
            b"PMIX_RANK=3\0NOT A VARIABLE\0PMIX_NAMESPACE=ns=1\0PMIX_RANK=9\0PMI_SIZE=x\0=\0";
        let env = LaunchEnv::parse(environ);
        assert_eq!(env.rank(), Some((3, IdentitySource::PmixEnv)));
        assert_eq!(job_with(environ, None).as_deref(), Some("pmix:ns=1"));
        assert_eq!(env.size(), None, "a size that is no number is no size");
        let slurm = b"SLURM_JOB_ID=42\0SLURM_STEPID=0\0SLURM_PROCID=1";
        assert_eq!(job_with(slurm, None).as_deref(), Some("slurm:42.0"));
        assert_eq!(
            LaunchEnv::parse(slurm).rank(),
            Some((1, IdentitySource::SlurmEnv))
        );
        assert!(job_with(b"", None).is_none());
    }

    #[test]
    fn cgroup_files_that_are_not_procfs_are_errors() {
        assert!(matches!(
            proc::parse_cgroups(b"no colon here\n"),
            Err(ProcError::Format { .. })
        ));
    }

    #[test]
    fn launcher_names_include_distribution_alternatives() {
        for comm in [
            "mpirun",
            "mpirun.openmpi",
            "mpirun.mpich",
            "mpiexec.hydra",
            "hydra_pmi_proxy",
            "slurmstepd",
            "prterun",
        ] {
            assert!(is_launcher(comm), "{comm}");
        }
        for comm in ["mpirunner", "bash", "sleep", "srun_helper"] {
            assert!(!is_launcher(comm), "{comm}");
        }
    }

    #[test]
    fn exited_processes_and_the_host_name() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(matches!(
            identify(pid, "n"),
            Err(DiscoveryError::Proc(ProcError::ProcessGone { .. }))
        ));
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(hostname().unwrap(), kernel.trim());
    }

    #[test]
    fn cgroup_scope_matches_whole_path_components() {
        let v1 = "4:memory:/slurm/uid_0/job_42/step_0\n0::/\n";
        assert!(cgroup_lines_match(v1, "/slurm/uid_0/job_42"));
        assert!(cgroup_lines_match(v1, "/slurm/uid_0/job_42/"));
        assert!(!cgroup_lines_match(v1, "/slurm/uid_0/job_4"));
        let v2 = "0::/system.slice/mpiburst-a\n";
        assert!(cgroup_lines_match(v2, "/system.slice/mpiburst-a"));
        assert!(!cgroup_lines_match(v2, "/system.slice/mpiburst-ab"));
        assert!(cgroup_lines_match(v2, "/"));
        assert!(in_cgroup(std::process::id(), "/"));
        assert!(!in_cgroup(u32::MAX, "/"));
    }

    #[test]
    fn slurm_job_cgroup_is_the_job_directory_above_the_step() {
        let of = |text: &str, job: &str| {
            job_cgroup_of(&proc::parse_cgroups(text.as_bytes()).unwrap(), job)
        };
        let v1 = "6:freezer:/slurm_vm/uid_0/job_12/step_0\n4:memory:/other\n0::/\n";
        assert_eq!(of(v1, "12").as_deref(), Some("/slurm_vm/uid_0/job_12"));
        assert_eq!(of(v1, "1"), None);
        let v2 = "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_1\n";
        assert_eq!(
            of(v2, "7").as_deref(),
            Some("/system.slice/slurmstepd.scope/job_7")
        );
        let both =
            "6:freezer:/slurm/uid_0/job_7/step_0\n0::/system.slice/slurmstepd.scope/job_7/step_0\n";
        assert_eq!(
            of(both, "7").as_deref(),
            Some("/system.slice/slurmstepd.scope/job_7")
        );
    }
}
