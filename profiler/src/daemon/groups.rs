//! Each job's rank groups, kept on the daemon's thread: fed the exact per-rank counts at every
//! stats update (cheap: one subtraction per rank and function, and a clustering of the ranks'
//! signatures when a window closes), finished when the job ends.

use std::{collections::BTreeMap, sync::Arc};

use crate::{
    analysis::groups::{GroupParams, RankGroupTracker, RankGroupsView},
    export::groups::job_counts,
    model::JobId,
    store::JobStore,
};

#[derive(Default)]
pub struct GroupTrackers {
    trackers: BTreeMap<JobId, RankGroupTracker>,
    /// What the last update found, for publication.
    pub views: BTreeMap<JobId, Arc<RankGroupsView>>,
}

impl GroupTrackers {
    /// Reads every job's counts at `now_ns` (Unix); a job that ended is finished. Returns the
    /// jobs whose window closed, whose readings belong in the recording.
    pub fn update(
        &mut self,
        store: &JobStore,
        now_ns: u64,
        params: &GroupParams,
        window_s: f64,
    ) -> Vec<JobId> {
        let mut closed = Vec::new();
        for (id, job) in &store.jobs {
            let tracker = self.trackers.entry(id.clone()).or_insert_with(|| {
                RankGroupTracker::for_job(params.clone(), window_s, job.meta.first_seen_ns)
            });
            let counts = job_counts(job);
            match job.meta.ended_ns {
                Some(end) => tracker.finish(end, &counts),
                None if tracker.observe(now_ns, &counts) => closed.push(id.clone()),
                None => {}
            }
            self.views
                .insert(id.clone(), Arc::new(tracker.view().clone()));
        }
        closed
    }

    /// Drops an evicted job's groups.
    pub fn forget(&mut self, id: &JobId) {
        self.trackers.remove(id);
        self.views.remove(id);
    }
}
