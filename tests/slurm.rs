//! Slurm: the test starts a real munged, slurmctld and slurmd on this machine, each with a
//! configuration it writes into a temporary directory, and runs MPI jobs with srun under Open MPI
//! (`--mpi=pmix`) and MPICH (`--mpi=pmi2`). The daemon names each job by its Slurm job and step
//! ids, counts every rank's calls exactly, records the job's cgroup, profiles that job alone when
//! `--cgroup` names it, and sees the job end. A job that mpirun or Hydra's mpiexec launches
//! inside an allocation is named by its launcher, with the allocation's Slurm job beside.
//!
//! The epilog's test adds accounting: a MariaDB server on a data directory and a loopback port of
//! its own, and slurmdbd, so that the epilog stores the job's summary in its AdminComment.
//!
//! Where the cluster cannot start on this machine (Slurm or munge not installed, a Slurm daemon
//! that exits or never brings the node up, e.g. cgroup v2 without systemd's delegation), the test
//! prints why and is reported skipped.

use std::{
    cell::RefCell,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, MutexGuard, PoisonError},
    thread,
    time::{Duration, Instant},
};

use mpiburst_tests::*;

/// The tests start one cluster at a time: Slurm names its cgroups by node and job id, and the
/// clusters of one test process start at the same job id.
static CLUSTER_LOCK: Mutex<()> = Mutex::new(());

/// Ranks of every MPI job here: more than two cores' worth, so srun must overcommit.
const RANKS: u32 = 3;

/// A Slurm cluster: this machine as its one node, or simulated nodes ([`SimulatedNodes`]) with
/// a slurmd each. Its daemons are stopped by pid, in reverse order of start, when it is dropped
/// (also when a test panics), after its jobs are cancelled.
struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    daemons: Vec<(String, Child)>,
    /// The job cgroups its jobs ran in: slurmd leaves the empty directories above them.
    cgroups: RefCell<Vec<String>>,
}

/// Where slurmctld sends its accounting: slurmdbd's port, and the munge socket (slurmctld and the
/// accounting commands authenticate to slurmdbd through AccountingStoragePass).
struct Accounting {
    dbd_port: String,
}

impl Accounting {
    /// slurm.conf's accounting lines.
    fn settings(&self, munge_socket: &Path) -> String {
        format!(
            "AccountingStorageType=accounting_storage/slurmdbd\n\
             AccountingStorageHost=127.0.0.1\n\
             AccountingStoragePort={}\n\
             AccountingStoragePass={}\n",
            self.dbd_port,
            munge_socket.display()
        )
    }
}

impl Cluster {
    /// Starts munged, with `accounting` a MariaDB server and slurmdbd, then slurmctld and a slurmd
    /// for this machine, or for each of `nodes`, and waits for the nodes to be idle; or says why
    /// the cluster cannot run on this machine.
    fn start(nodes: Option<&SimulatedNodes>, accounting: bool) -> Result<Cluster, String> {
        for program in [
            "munged",
            "slurmctld",
            "slurmd",
            "srun",
            "salloc",
            "sbatch",
            "sinfo",
        ] {
            if !on_path(program) {
                return Err(format!(
                    "{program} is not installed: `cargo xtask install-deps` installs Slurm and munge"
                ));
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = Cluster {
            conf: dir.path().join("slurm.conf"),
            dir,
            daemons: Vec::new(),
            cgroups: RefCell::default(),
        };
        let socket = cluster.path("munge.socket");
        cluster.start_munged(&socket)?;
        let accounting = match accounting {
            true => Some(cluster.start_database(&socket)?),
            false => None,
        };
        cluster.write_config(&socket, nodes, accounting.as_ref())?;
        if accounting.is_some() {
            cluster.start_slurmdbd()?;
        }
        let conf = cluster.conf.display().to_string();
        cluster.spawn("slurmctld", &["-D", "-f", &conf])?;
        match nodes {
            None => cluster.spawn("slurmd", &["-D", "-f", &conf])?,
            Some(nodes) => {
                for node in &nodes.nodes {
                    let mut slurmd = Command::new("slurmd");
                    slurmd.args(["-D", "-N", &node.name, "-f", &conf]);
                    let name = format!("slurmd_{}", node.name);
                    cluster.spawn_command(name, nodes.on(&node.name, &slurmd))?;
                }
            }
        }
        cluster.wait_until_idle()?;
        for plugin in [Mpi::OpenMpi, Mpi::Mpich].map(mpi_plugin) {
            let list = cluster.output(cluster.command("srun").arg("--mpi=list"))?;
            if !list.lines().any(|l| l.trim() == plugin) {
                return Err(format!(
                    "srun has no MPI plugin {plugin}: `srun --mpi=list` says {list:?}"
                ));
            }
        }
        Ok(cluster)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// munged with a fresh key, listening on a socket of its own (Slurm finds it by AuthInfo).
    fn start_munged(&mut self, socket: &Path) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt as _;
        let key = self.path("munge.key");
        let mut bytes = vec![0u8; 1024];
        fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .map_err(|e| format!("cannot read /dev/urandom for a munge key: {e}"))?;
        fs::write(&key, &bytes).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        let arg = |option: &str, name: &Path| format!("--{option}={}", name.display());
        self.spawn(
            "munged",
            &[
                "--foreground",
                &arg("key-file", &key),
                &arg("socket", socket),
                &arg("pid-file", &self.path("munged.pid")),
                &arg("log-file", &self.path("munged.log")),
                &arg("seed-file", &self.path("munged.seed")),
            ],
        )?;
        self.wait_for("munged to open its socket", Duration::from_secs(20), |_| {
            Ok(socket.exists())
        })
    }

    /// A MariaDB server on a data directory and a free loopback port of its own (no grant tables:
    /// nothing else can reach it), and slurmdbd's configuration to store there.
    fn start_database(&mut self, munge_socket: &Path) -> Result<Accounting, String> {
        for program in [
            "mariadb-install-db",
            "mariadbd",
            "slurmdbd",
            "sacctmgr",
            "sacct",
        ] {
            if !on_path(program) {
                return Err(format!(
                    "{program} is not installed: `cargo xtask install-deps` installs MariaDB and \
                     slurmdbd"
                ));
            }
        }
        let port = || {
            let addr = free_loopback_addr();
            addr.rsplit_once(':').unwrap().1.to_string()
        };
        let data = self.path("mariadb");
        let arg = |option: &str, value: &Path| format!("--{option}={}", value.display());
        self.output(Command::new("mariadb-install-db").args([
            "--no-defaults",
            &arg("datadir", &data),
            "--user=root",
            "--skip-test-db",
            "--auth-root-authentication-method=normal",
        ]))?;
        let db_port = port();
        let mut mariadbd = Command::new("mariadbd");
        mariadbd.args([
            "--no-defaults",
            &arg("datadir", &data),
            &arg("socket", &self.path("mariadb.socket")),
            &arg("pid-file", &self.path("mariadb.pid")),
            &arg("log-error", &self.path("mariadb.err")),
            &format!("--port={db_port}"),
            "--bind-address=127.0.0.1",
            "--user=root",
            "--skip-grant-tables",
            "--innodb-buffer-pool-size=32M",
        ]);
        self.spawn_command("mariadbd".into(), mariadbd)?;
        let dbd_port = port();
        let d = self.dir.path().display();
        let conf = self.path("slurmdbd.conf");
        fs::write(
            &conf,
            format!(
                "AuthType=auth/munge\n\
                 AuthInfo=socket={socket}\n\
                 DbdAddr=127.0.0.1\n\
                 DbdHost=localhost\n\
                 DbdPort={dbd_port}\n\
                 SlurmUser=root\n\
                 StorageType=accounting_storage/mysql\n\
                 StorageHost=127.0.0.1\n\
                 StoragePort={db_port}\n\
                 StorageUser=root\n\
                 StorageLoc=slurm_acct_db\n\
                 PidFile={d}/slurmdbd.pid\n\
                 LogFile={d}/slurmdbd.log\n",
                socket = munge_socket.display(),
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        // slurmdbd refuses a configuration others can read: it may hold the database password.
        fs::set_permissions(&conf, fs::Permissions::from_mode(0o600)).unwrap();
        Ok(Accounting { dbd_port })
    }

    /// slurmdbd (it reads slurmdbd.conf beside SLURM_CONF), and this cluster registered.
    fn start_slurmdbd(&mut self) -> Result<(), String> {
        self.spawn("slurmdbd", &["-D"])?;
        self.wait_for(
            "slurmdbd to register the cluster",
            Duration::from_secs(60),
            |cluster| {
                let sacctmgr = || cluster.command("sacctmgr");
                // Refused until slurmdbd answers, and once the cluster is there.
                let _ = cluster.output(sacctmgr().args(["-i", "add", "cluster", "mpiburst"]));
                let listed = cluster.output(sacctmgr().args([
                    "-n",
                    "-P",
                    "list",
                    "cluster",
                    "format=cluster",
                ]));
                Ok(listed.is_ok_and(|l| l.lines().any(|c| c.trim() == "mpiburst")))
            },
        )
    }

    /// slurm.conf (and cgroup.conf beside it): this node, as `slurmd -C` finds its hardware,
    /// is the controller and the only compute node, or each simulated node of `nodes` is a
    /// compute node with that hardware (at 127.0.0.1, on a slurmd port of its own);
    /// everything listens on loopback ports that are free now, and all state stays in the
    /// temporary directory.
    fn write_config(
        &self,
        munge_socket: &Path,
        nodes: Option<&SimulatedNodes>,
        accounting: Option<&Accounting>,
    ) -> Result<(), String> {
        let hardware = self.output(Command::new("slurmd").arg("-C"))?;
        let node = hardware
            .lines()
            .find(|l| l.starts_with("NodeName="))
            .ok_or_else(|| format!("`slurmd -C` did not describe this node: {hardware:?}"))?;
        let name = node["NodeName=".len()..]
            .split_whitespace()
            .next()
            .unwrap_or_default();
        let port = || {
            let addr = free_loopback_addr();
            addr.rsplit_once(':').unwrap().1.to_string()
        };
        // With several nodes on one host, srun and slurmd listen on any address: bound to the
        // configured ones (NoInAddrAny), a simulated node's steps could not connect back to
        // srun. slurmctld still listens on loopback only.
        let (node_lines, names, listen) = match nodes {
            None => (
                format!("{node} NodeAddr=127.0.0.1 State=UNKNOWN\n"),
                vec![name],
                "NoInAddrAny,NoCtldInAddrAny",
            ),
            Some(nodes) => {
                let hardware = node.split_once(' ').map_or("", |(_, rest)| rest);
                let lines = nodes
                    .nodes
                    .iter()
                    .map(|n| {
                        format!(
                            "NodeName={name} NodeHostname={name} NodeAddr={address} Port={port} \
                             {hardware} State=UNKNOWN\n",
                            name = n.name,
                            address = n.address,
                            port = port()
                        )
                    })
                    .collect();
                let names = nodes.nodes.iter().map(|n| n.name.as_str()).collect();
                (lines, names, "NoCtldInAddrAny")
            }
        };
        let d = self.dir.path().display();
        let config = format!(
            "ClusterName=mpiburst\n\
             SlurmctldHost={name}(127.0.0.1)\n\
             SlurmctldPort={ctld}\n\
             SlurmdPort={slurmd}\n\
             # Listen on the configured (loopback) addresses only (see above).\n\
             CommunicationParameters={listen}\n\
             AuthType=auth/munge\n\
             CredType=cred/munge\n\
             AuthInfo=socket={socket}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             StateSaveLocation={d}/state\n\
             # %n: the node's name, for each slurmd of a host its own.\n\
             SlurmdSpoolDir={d}/spool_%n\n\
             SlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd_%n.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\n\
             SlurmdLogFile={d}/slurmd_%n.log\n\
             # Each step in a cgroup of its job, which the daemon records and --cgroup selects.\n\
             ProctrackType=proctrack/cgroup\n\
             TaskPlugin=task/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             MpiDefault=none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             {accounting}\
             ReturnToService=2\n\
             # Slurm names cgroups by job id: ids of this test process's own, apart from those\n\
             # of a test run from another checkout at the same time.\n\
             FirstJobId={first_job}\n\
             # The packaged epilog, which stores a job's summary once a test configures it.\n\
             EpilogSlurmctld={d}/epilog\n\
             {node_lines}\
             PartitionName=test Nodes={partition} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE\n",
            ctld = port(),
            slurmd = port(),
            partition = names.join(","),
            socket = munge_socket.display(),
            accounting = accounting.map_or_else(
                || "AccountingStorageType=accounting_storage/none\n".to_string(),
                |a| a.settings(munge_socket)
            ),
            // Below Slurm's largest job id (67043328) for any pid (at most 2^22).
            first_job = std::process::id() * 8,
        );
        fs::create_dir(self.path("state")).unwrap();
        for name in &names {
            fs::create_dir(self.path(&format!("spool_{name}"))).unwrap();
        }
        fs::write(&self.conf, config).unwrap();
        let epilog = self.path("epilog");
        fs::write(
            &epilog,
            format!(
                "#!/bin/sh\nexport SLURM_CONF={conf} MPIBURST_EPILOG_CONF={d}/mpiburst-epilog.conf\n\
                 exec {packaged}\n",
                conf = self.conf.display(),
                packaged = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../packaging/slurm/mpiburst-epilog.sh")
                    .canonicalize()
                    .unwrap()
                    .display(),
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&epilog, fs::Permissions::from_mode(0o755)).unwrap();
        // cgroup v1 or v2, whichever this machine mounts.
        fs::write(self.path("cgroup.conf"), "CgroupPlugin=autodetect\n").unwrap();
        Ok(())
    }

    /// From now on the epilog stores the summary of each job that ends, from the daemon or
    /// aggregator at `url`, as a file in the cluster's directory and, with `admin_comment` (a
    /// cluster with accounting), in the job's AdminComment.
    fn store_summaries_from(&self, url: &str, admin_comment: bool) {
        fs::write(
            self.path("mpiburst-epilog.conf"),
            format!(
                "MPIBURST_URL={url}\nMPIBURST={}\nMPIBURST_SUMMARY_DIR={}\nMPIBURST_ADMIN_COMMENT={}\n",
                daemon_binary().display(),
                self.path("summaries").display(),
                if admin_comment { "yes" } else { "no" }
            ),
        )
        .unwrap();
    }

    /// The summary the epilog stored in job `job`'s AdminComment (after the file), once there,
    /// read back with the command the epilog's header gives.
    fn admin_comment_summary(&self, job: u32) -> serde_json::Value {
        let read = format!(
            "sacct -j {job} -n -P -o AdminComment | sed -n 's/^mpiburst2://p' | tr a-z A-Z | \
             base32 -d | gunzip"
        );
        let mut last = String::new();
        for _ in 0..60 {
            match self.output(self.command("sh").args(["-c", &read])) {
                Ok(json) => {
                    return serde_json::from_str(&json).unwrap_or_else(|e| {
                        panic!("job {job}'s AdminComment is no summary ({e}): {json:?}")
                    })
                }
                Err(e) => last = e,
            }
            thread::sleep(Duration::from_millis(500));
        }
        panic!("no AdminComment of job {job}: {last}; {}", self.logs());
    }

    /// The summary the epilog stored of job `job`, once there.
    fn stored_summary(&self, job: u32) -> serde_json::Value {
        let file = self.path(&format!("summaries/{job}.json.gz"));
        for _ in 0..60 {
            if file.exists() {
                let json = self
                    .output(Command::new("gunzip").arg("-c").arg(&file))
                    .expect("decompress the stored summary");
                return serde_json::from_str(&json).expect("the stored summary is JSON");
            }
            thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "no mpiburst summary stored of Slurm job {job}; {}",
            self.logs()
        );
    }

    fn wait_until_idle(&mut self) -> Result<(), String> {
        self.wait_for("the nodes to be idle", Duration::from_secs(60), |cluster| {
            let state = cluster.output(cluster.command("sinfo").args(["-h", "-N", "-o", "%T"]));
            Ok(state.is_ok_and(|s| s.lines().all(|node| node.trim() == "idle")))
        })
    }

    /// A Slurm command for this cluster.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// Starts daemon `name` in the foreground, logging to `<name>.out` in the temporary
    /// directory.
    fn spawn(&mut self, name: &str, args: &[&str]) -> Result<(), String> {
        let mut command = self.command(name);
        command.args(args);
        self.spawn_command(name.to_string(), command)
    }

    /// Starts the daemon that `command` runs in the foreground, as [`Cluster::spawn`] does.
    fn spawn_command(&mut self, name: String, mut command: Command) -> Result<(), String> {
        let out = fs::File::create(self.path(&format!("{name}.out"))).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        self.daemons.push((name, child));
        Ok(())
    }

    /// Polls `ready` until it holds, failing with the daemons' logs if one of them exits or
    /// `limit` passes.
    fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        ready: impl Fn(&Cluster) -> Result<bool, String>,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let exited = self
                .daemons
                .iter_mut()
                .find_map(|(name, child)| Some((name.clone(), child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                return Err(format!(
                    "{name} exited ({status}) while waiting for {what}; {}",
                    self.logs()
                ));
            }
            if ready(self)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("no {what} within {limit:?}; {}", self.logs()));
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of every daemon's log.
    fn logs(&self) -> String {
        let mut text = String::new();
        let mut slurmd: Vec<String> = fs::read_dir(self.dir.path())
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| name.starts_with("slurmd"))
                    .collect()
            })
            .unwrap_or_default();
        slurmd.sort();
        let daemons = [
            "munged.out",
            "munged.log",
            "mariadb.err",
            "slurmctld.out",
            "slurmctld.log",
        ]
        .map(String::from);
        for name in daemons.iter().chain(&slurmd) {
            if let Ok(log) = fs::read_to_string(self.path(name)) {
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(8)..].join("\n");
                text += &format!("{name}:\n{tail}\n");
            }
        }
        text
    }

    /// A command's standard output, or what went wrong with its standard error.
    fn output(&self, cmd: &mut Command) -> Result<String, String> {
        let shown = format!("{cmd:?}");
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {shown}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{shown} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A new job allocation (one core, which its steps overcommit), by its job id.
    fn allocate(&self) -> u32 {
        let out = self
            .command("salloc")
            .args(["--no-shell", "-n", "1", "--overcommit"])
            .stdin(Stdio::null())
            .output()
            .expect("run salloc");
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        granted_job(&said).unwrap_or_else(|| {
            panic!(
                "salloc did not grant an allocation ({}): {said}",
                out.status
            )
        })
    }

    /// `mpi`'s own launcher (mpirun, Hydra's mpiexec) of the `counts` program inside a new
    /// allocation of `RANKS` tasks, which salloc runs on this node as a batch script would: the
    /// allocation's job id, the program and its ranks' own counts.
    fn mpirun_counts_in_allocation(&self, mpi: Mpi) -> (u32, PathBuf, Vec<serde_json::Value>) {
        let out = tempfile::tempdir().unwrap();
        let program = program("counts", mpi);
        let launcher = mpi.launcher(RANKS);
        let said = out.path().join("salloc.err");
        let mut cmd = self.command("salloc");
        cmd.args(["-n", &RANKS.to_string(), "--overcommit"])
            .arg(launcher.get_program())
            .args(launcher.get_args())
            .arg(&program)
            .arg(out.path())
            .stdin(Stdio::null())
            .stderr(fs::File::create(&said).unwrap());
        let status = run_with_timeout(cmd, Duration::from_secs(180));
        let said = fs::read_to_string(&said).unwrap_or_default();
        assert!(
            status.success(),
            "{mpi:?} launcher in salloc failed ({status}): {said}"
        );
        let job = granted_job(&said)
            .unwrap_or_else(|| panic!("salloc did not say its allocation: {said}"));
        (job, program, rank_outputs(out.path(), "counts", RANKS))
    }

    /// A batch job of `tasks` tasks over `nodes` nodes that runs `command` and is waited for
    /// (`sbatch --wait`, at most 2 minutes), writing its output to `out/batch.out`: its job id.
    fn sbatch(&self, command: &Command, nodes: &[&str], tasks: u32, out: &Path) -> u32 {
        let log = out.join("batch.out");
        let said = self
            .output(self.command("sbatch").args([
                "--wait",
                // A job that hangs is ended by Slurm, and the test fails with its output.
                "--time=2",
                "--overcommit",
                &format!("--nodelist={}", nodes.join(",")),
                &format!("--ntasks={tasks}"),
                &format!("--output={}", log.display()),
                &format!("--wrap={}", shell_text(command)),
            ]))
            .unwrap_or_else(|e| {
                let log = fs::read_to_string(&log).unwrap_or_default();
                panic!("{e}; the batch job's output:\n{log}")
            });
        let job =
            submitted_job(&said).unwrap_or_else(|| panic!("sbatch did not say its job: {said:?}"));
        // proctrack/cgroup makes /slurm_<node>/uid_<uid>/job_<id> on each node.
        self.cgroups.borrow_mut().extend(
            nodes
                .iter()
                .map(|node| format!("/slurm_{node}/uid_0/job_{job}")),
        );
        job
    }

    /// The cgroup Slurm puts job `job` in, as its next step (one task) finds in its own
    /// /proc/self/cgroup: the path up to `job_<id>`, the same in every hierarchy that has it.
    fn job_cgroup(&self, job: u32) -> String {
        let text = self
            .output(self.command("srun").args([
                &format!("--jobid={job}"),
                "-n",
                "1",
                "cat",
                "/proc/self/cgroup",
            ]))
            .unwrap_or_else(|e| panic!("{e}"));
        let component = format!("/job_{job}/");
        let mut paths: Vec<&str> = text
            .lines()
            .filter_map(|line| {
                let path = line.splitn(3, ':').nth(2)?;
                let at = path.find(&component)?;
                Some(&path[..at + component.len() - 1])
            })
            .collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), 1, "one cgroup of job {job} in {text}");
        self.cgroups.borrow_mut().push(paths[0].to_string());
        paths[0].to_string()
    }

    /// srun of the `counts` program in job `job` under `mpi`, with where its ranks write their
    /// own counts.
    fn srun_counts(&self, job: u32, mpi: Mpi) -> CountsRun {
        let out = tempfile::tempdir().unwrap();
        let program = program("counts", mpi);
        let mut cmd = self.command("srun");
        cmd.args([
            &format!("--jobid={job}"),
            &format!("--mpi={}", mpi_plugin(mpi)),
            "--overcommit",
            "-n",
            &RANKS.to_string(),
        ])
        .arg(&program)
        .arg(out.path());
        if mpi == Mpi::OpenMpi {
            // What mpirun's --allow-run-as-root and --mca mpi_yield_when_idle 1 set.
            cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .env("OMPI_MCA_mpi_yield_when_idle", "1");
        }
        CountsRun {
            child: cmd.spawn().expect("start srun"),
            shown: format!("{cmd:?}"),
            program,
            out,
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Jobs first, so that no step outlives slurmd.
        if let Ok(jobs) = self.output(self.command("squeue").args(["-h", "-o", "%i"])) {
            for job in jobs.split_whitespace() {
                let _ = self.output(self.command("scancel").arg(job));
            }
            let _ = self.wait_for("the jobs to end", Duration::from_secs(30), |cluster| {
                let left = cluster.output(cluster.command("squeue").args(["-h", "-o", "%i"]));
                Ok(left.is_ok_and(|l| l.trim().is_empty()))
            });
        }
        while let Some((name, mut child)) = self.daemons.pop() {
            // SAFETY: kill has no memory preconditions; the pid is our unreaped child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            if wait_with_timeout(&mut child, Duration::from_secs(20)).is_none() {
                eprintln!("{name} did not stop within 20 s of SIGTERM: killed");
            }
        }
        self.remove_empty_cgroups();
        if thread::panicking() {
            eprintln!("the cluster's logs:\n{}", self.logs());
        }
    }
}

impl Cluster {
    /// Removes the cgroups Slurm made above its jobs' (`/slurm_<node>/uid_0` on cgroup v1) in
    /// every hierarchy, deepest first, up to the first one Slurm did not name. The kernel removes
    /// only empty cgroups, so those another slurmd still uses stay.
    fn remove_empty_cgroups(&self) {
        let mounts: Vec<PathBuf> = fs::read_dir("/sys/fs/cgroup")
            .map(|dirs| dirs.flatten().map(|d| d.path()).collect())
            .unwrap_or_default();
        for job in self.cgroups.borrow().iter() {
            for above in Path::new(job.trim_start_matches('/')).ancestors().skip(1) {
                let name = above.file_name().unwrap_or_default().to_string_lossy();
                if !(name.starts_with("slurm") || name.starts_with("uid_")) {
                    break;
                }
                for mount in mounts
                    .iter()
                    .map(PathBuf::as_path)
                    .chain([Path::new("/sys/fs/cgroup")])
                {
                    let _ = fs::remove_dir(mount.join(above));
                }
            }
        }
    }
}

/// An srun of the `counts` program.
struct CountsRun {
    child: Child,
    shown: String,
    program: PathBuf,
    out: tempfile::TempDir,
}

impl CountsRun {
    /// Waits for srun to succeed and returns the program with its ranks' own counts.
    fn finish(mut self) -> (PathBuf, Vec<serde_json::Value>) {
        let status = wait_with_timeout(&mut self.child, Duration::from_secs(180))
            .unwrap_or_else(|| panic!("{} did not finish within 180 s", self.shown));
        assert!(status.success(), "{} failed: {status}", self.shown);
        let outputs = rank_outputs(self.out.path(), "counts", RANKS);
        (self.program, outputs)
    }
}

/// The srun MPI plugin each implementation starts under: Debian's Open MPI uses PMIx, its MPICH
/// speaks PMI-2.
fn mpi_plugin(mpi: Mpi) -> &'static str {
    match mpi {
        Mpi::OpenMpi => "pmix",
        Mpi::Mpich => "pmi2",
    }
}

/// The job id in what sbatch said (`Submitted batch job <id>`).
fn submitted_job(said: &str) -> Option<u32> {
    said.split("Submitted batch job ")
        .nth(1)
        .and_then(|id| id.trim().parse().ok())
}

/// The job id in what salloc said (`salloc: Granted job allocation <id>`).
fn granted_job(said: &str) -> Option<u32> {
    said.lines()
        .find_map(|l| l.split("Granted job allocation ").nth(1))
        .and_then(|id| id.trim().parse().ok())
}

fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .any(|dir| dir.join(program).is_file())
}

/// The calling test's turn and cluster, or `None` when the cluster cannot run here and the test
/// has reported itself skipped.
fn cluster_for_this_test(
    nodes: Option<&SimulatedNodes>,
) -> Option<(MutexGuard<'static, ()>, Cluster)> {
    start_cluster_for_this_test(nodes, false)
}

/// [`cluster_for_this_test`] with accounting (slurmdbd).
fn accounted_cluster_for_this_test() -> Option<(MutexGuard<'static, ()>, Cluster)> {
    start_cluster_for_this_test(None, true)
}

fn start_cluster_for_this_test(
    nodes: Option<&SimulatedNodes>,
    accounting: bool,
) -> Option<(MutexGuard<'static, ()>, Cluster)> {
    require_root();
    let turn = CLUSTER_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    match Cluster::start(nodes, accounting) {
        Ok(cluster) => Some((turn, cluster)),
        Err(reason) => {
            // libtest runs each test on a thread named after it.
            let current = thread::current();
            let test = current.name().unwrap_or("a Slurm test");
            skip_at_run_time(test, &format!("Slurm cannot run here: {reason}"));
            None
        }
    }
}

/// The recorded job's identity and end, and its calls against the ranks' own counts.
fn assert_slurm_job(
    job: &mpiburst::store::Job,
    slurm_job: u32,
    cgroup: &str,
    outputs: &[serde_json::Value],
    what: &str,
) {
    // Step 0 read the job's cgroup; the MPI program is step 1.
    assert_eq!(
        job.meta.id.0,
        format!("slurm:{slurm_job}.1"),
        "{what}: job id"
    );
    assert_eq!(job.meta.size, RANKS, "{what}: job size");
    assert_eq!(
        job.meta.cgroup.as_deref(),
        Some(cgroup),
        "{what}: job cgroup"
    );
    assert!(job.meta.ended_ns.is_some(), "{what}: job seen to end");
    assert_calls_exact(job, outputs, what);
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn srun_jobs_are_named_by_slurm_job_and_step_counted_exactly_and_seen_to_end() {
    let Some((_turn, cluster)) = cluster_for_this_test(None) else {
        return;
    };
    let daemon = Daemon::start(&[]);
    let mut runs = Vec::new();
    for mpi in Mpi::ALL {
        let job = cluster.allocate();
        let cgroup = cluster.job_cgroup(job);
        let (program, outputs) = cluster.srun_counts(job, mpi).finish();
        runs.push((mpi, job, cgroup, program, outputs));
    }
    // The API shows each job's Slurm ids and cgroup.
    let listed = get_json(&daemon.addr, "/api/jobs");
    for (mpi, job, cgroup, ..) in &runs {
        let id = format!("slurm:{job}.1");
        let entry = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["meta"]["id"] == id.as_str())
            .unwrap_or_else(|| panic!("{mpi:?}: no job {id} in /api/jobs: {listed}"));
        assert_eq!(entry["meta"]["cgroup"], cgroup.as_str(), "{mpi:?}: {entry}");
    }
    let recording = daemon.stop();
    for (mpi, job, cgroup, program, outputs) in &runs {
        let what = format!("counts under {mpi:?} with srun in Slurm job {job} ({cgroup})");
        assert_slurm_job(job_of(&recording, program), *job, cgroup, outputs, &what);
        let meta = &job_of(&recording, program).meta;
        eprintln!("{what}: recorded as {} ({})", meta.id, meta.source);
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn with_cgroup_set_to_a_slurm_jobs_cgroup_the_daemon_profiles_that_job_alone() {
    let Some((_turn, cluster)) = cluster_for_this_test(None) else {
        return;
    };
    let chosen = cluster.allocate();
    let other = cluster.allocate();
    let cgroup = cluster.job_cgroup(chosen);
    cluster.job_cgroup(other);
    let daemon = Daemon::start(&["--cgroup", &cgroup]);
    // Both jobs run at the same time: the other job's ranks are MPI processes the daemon sees
    // and must leave out.
    let other_run = cluster.srun_counts(other, Mpi::OpenMpi);
    let (program, outputs) = cluster.srun_counts(chosen, Mpi::Mpich).finish();
    let (_, other_outputs) = other_run.finish();
    assert_eq!(other_outputs.len(), RANKS as usize, "the other job ran");
    let recording = daemon.stop();
    let ids: Vec<&str> = recording.jobs.keys().map(|id| id.0.as_str()).collect();
    assert_eq!(
        ids,
        [format!("slurm:{chosen}.1")],
        "jobs recorded with --cgroup {cgroup}"
    );
    let what =
        format!("counts under MPICH in Slurm job {chosen} ({cgroup}), job {other} beside it");
    assert_slurm_job(
        job_of(&recording, &program),
        chosen,
        &cgroup,
        &outputs,
        &what,
    );
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn mpirun_inside_an_allocation_names_the_job_itself_and_keeps_the_slurm_job() {
    let Some((_turn, cluster)) = cluster_for_this_test(None) else {
        return;
    };
    let daemon = Daemon::start(&[]);
    // Open MPI's mpirun starts the ranks itself; Hydra's mpiexec starts its proxy with srun, so
    // its ranks have the Slurm variables of that step, and mpirun's those of the allocation.
    let runs: Vec<_> = [(Mpi::OpenMpi, "pmix:"), (Mpi::Mpich, "hydra:")]
        .into_iter()
        .map(|(mpi, prefix)| (mpi, prefix, cluster.mpirun_counts_in_allocation(mpi)))
        .collect();
    let listed = get_json(&daemon.addr, "/api/jobs");
    let recording = daemon.stop();
    for (mpi, prefix, (slurm_job, program, outputs)) in &runs {
        let what = format!("counts under {mpi:?}'s own launcher in Slurm job {slurm_job}");
        // One job for all ranks (job_of), each counted exactly under its world rank.
        let job = job_of(&recording, program);
        eprintln!("{what}: recorded as {} ({})", job.meta.id, job.meta.source);
        assert!(
            job.meta.id.0.starts_with(prefix),
            "{what}: job id {}",
            job.meta.id
        );
        assert_eq!(job.meta.size, RANKS, "{what}: job size");
        let slurm_job = slurm_job.to_string();
        assert_eq!(
            job.meta.scheduler_job.as_deref(),
            Some(slurm_job.as_str()),
            "{what}: Slurm job"
        );
        assert_calls_exact(job, outputs, &what);
        let entry = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["meta"]["id"] == job.meta.id.0.as_str())
            .unwrap_or_else(|| panic!("{what}: no job {} in /api/jobs: {listed}", job.meta.id));
        assert_eq!(
            entry["meta"]["scheduler_job"],
            slurm_job.as_str(),
            "{what}: {entry}"
        );
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn mpirun_in_a_batch_job_over_two_nodes_is_one_job_on_both() {
    const NODES: [&str; 2] = ["n1", "n2"];
    const TASKS: u32 = 4;
    require_root();
    let nodes = SimulatedNodes::start(&NODES);
    let Some((turn, cluster)) = cluster_for_this_test(Some(&nodes)) else {
        return;
    };
    // The batch script runs on n1: Open MPI's mpirun starts the ranks there itself, with the
    // script's Slurm variables, and those of n2 through an orted that srun starts. Hydra's
    // mpiexec starts a proxy on each node with srun.
    let runs: Vec<_> = Mpi::ALL
        .into_iter()
        .map(|mpi| {
            let out = tempfile::tempdir().unwrap();
            let mut launch = mpi.launcher(TASKS);
            let program = SimulatedNodes::counts_noting_node(&mut launch, mpi, out.path());
            let job = cluster.sbatch(&launch, &NODES, TASKS, out.path());
            (mpi, job, program, out)
        })
        .collect();
    // Slurm's daemons leave the nodes' cgroups before they are removed.
    drop(cluster);
    drop(turn);
    let checked: Vec<(&Path, &Path)> = runs
        .iter()
        .map(|(_, _, program, out)| (program.as_path(), out.path()))
        .collect();
    let jobs = nodes.stop_and_check_counts(&checked, TASKS);
    for ((mpi, slurm_job, ..), job) in runs.iter().zip(&jobs) {
        let prefix = match mpi {
            Mpi::OpenMpi => "pmix:".to_string(),
            Mpi::Mpich => format!("hydra:{}:", NODES[0]),
        };
        assert!(
            job.meta.id.0.starts_with(&prefix),
            "{mpi:?}: job id {}",
            job.meta.id
        );
        assert_eq!(
            job.meta.scheduler_job,
            Some(slurm_job.to_string()),
            "{mpi:?}: Slurm job"
        );
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn the_epilog_stores_the_jobs_summary_with_the_slurm_job() {
    let Some((_turn, cluster)) = accounted_cluster_for_this_test() else {
        return;
    };
    let daemon = Daemon::start(&[]);
    cluster.store_summaries_from(&format!("http://{}", daemon.addr), true);
    let job = cluster.allocate();
    let (program, outputs) = cluster.srun_counts(job, Mpi::OpenMpi).finish();
    // The allocation ends: slurmctld runs the epilog.
    cluster
        .output(cluster.command("scancel").arg(job.to_string()))
        .unwrap();
    let summary = cluster.stored_summary(job);
    let jobs = summary["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{summary}");
    let stored = &jobs[0];
    assert_eq!(
        stored["meta"]["scheduler_job"],
        job.to_string().as_str(),
        "{stored}"
    );
    let pop = &stored["bottlenecks"]["properties"]["pop"];
    assert_eq!(pop["ranks"], RANKS, "{pop}");
    assert_eq!(pop["parallel_efficiency"]["status"], "measured", "{pop}");
    // The same summary is in the job's accounting record, one command away by job id.
    assert_eq!(cluster.admin_comment_summary(job), summary);
    let recording = daemon.stop();
    assert_calls_exact(
        job_of(&recording, &program),
        &outputs,
        "counts under the epilog",
    );
}
