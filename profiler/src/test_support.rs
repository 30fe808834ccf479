//! Fixtures that the unit tests of the library and the integration tests (profiler/tests, the
//! tests crate) share: a builder of the [`JobMeta`] a test needs, saying only what matters to it.
//!
//! Public and hidden from the documentation rather than `#[cfg(test)]`: the integration tests
//! link the library as an ordinary dependency, built without `cfg(test)`, so they would not see
//! it. A cargo feature would do too, but only through the crate depending on itself to turn the
//! feature on for its own integration tests; the daemon binary pays nothing for these few
//! functions, which it never calls.

use crate::{model::JobId, store::JobMeta};

/// Builds a [`JobMeta`] for a test. Unless set, the job runs 2 ranks on node `n`, was found by
/// the `test` source running `/bin/app` (no build-id, no Slurm job or cgroup, no modules), was first seen at
/// time 0 and has not ended.
#[derive(Clone, Debug)]
pub struct JobMetaBuilder {
    meta: JobMeta,
}

impl JobMetaBuilder {
    /// The job `id` with the defaults above.
    pub fn new(id: impl Into<String>) -> Self {
        JobMetaBuilder {
            meta: JobMeta {
                id: JobId(id.into()),
                node: "n".into(),
                size: 2,
                source: "test".into(),
                executable: "/bin/app".into(),
                build_id: None,
                scheduler_job: None,
                cgroup: None,
                modules: Default::default(),
                first_seen_ns: 0,
                ended_ns: None,
            },
        }
    }

    pub fn node(mut self, node: impl Into<String>) -> Self {
        self.meta.node = node.into();
        self
    }

    /// Ranks in the job's world.
    pub fn size(mut self, size: u32) -> Self {
        self.meta.size = size;
        self
    }

    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.meta.source = source.into();
        self
    }

    pub fn executable(mut self, executable: impl Into<String>) -> Self {
        self.meta.executable = executable.into();
        self
    }

    /// The executable's GNU build-id in hex.
    pub fn build_id(mut self, build_id: impl Into<String>) -> Self {
        self.meta.build_id = Some(build_id.into());
        self
    }

    /// The Slurm job the job ran in.
    pub fn scheduler_job(mut self, scheduler_job: impl Into<String>) -> Self {
        self.meta.scheduler_job = Some(scheduler_job.into());
        self
    }

    pub fn first_seen_ns(mut self, first_seen_ns: u64) -> Self {
        self.meta.first_seen_ns = first_seen_ns;
        self
    }

    pub fn ended_ns(mut self, ended_ns: Option<u64>) -> Self {
        self.meta.ended_ns = ended_ns;
        self
    }

    pub fn build(self) -> JobMeta {
        self.meta
    }
}
