//! The properties of every job on the node, evaluated at each statistics update over the job's
//! life and its last complete window: one [`LiveEvaluator`] per job, which keeps what a window
//! needs between updates.

use std::{collections::BTreeMap, sync::Arc};

use crate::{
    analysis::online::PhasesSnapshot,
    capture::{node_usage::NodeUsage, usage::UsageTotals},
    model::JobId,
    properties::{LiveEvaluator, LiveProperties, PropertyConfig},
    store::JobStore,
};

/// Each job's evaluator, and what they all share.
pub struct NodeProperties {
    config: PropertyConfig,
    evaluators: BTreeMap<JobId, LiveEvaluator>,
    /// Length of the windows, in ns (the analysis's windows).
    window_ns: u64,
    /// The counter slots hold instructions and cycles.
    hardware_counters: bool,
    /// The node's physical memory: what a job may use when nothing else says.
    memory_available_bytes: u64,
}

/// What an update found: each job's usage totals and properties.
pub struct Evaluated {
    pub usage: BTreeMap<JobId, UsageTotals>,
    pub properties: BTreeMap<JobId, Arc<LiveProperties>>,
}

impl NodeProperties {
    pub fn new(
        config: PropertyConfig,
        window_ns: u64,
        hardware_counters: bool,
        memory_available_bytes: u64,
    ) -> Self {
        NodeProperties {
            config,
            evaluators: BTreeMap::new(),
            window_ns,
            hardware_counters,
            memory_available_bytes,
        }
    }

    /// Evaluates every job's properties at `now_ns` from the store, the jobs' usage and their
    /// last closed analysis window.
    pub fn evaluate(
        &mut self,
        store: &JobStore,
        usage: &NodeUsage,
        phases: &BTreeMap<JobId, Arc<PhasesSnapshot>>,
        now_ns: u64,
    ) -> Evaluated {
        let mut evaluated = Evaluated {
            usage: BTreeMap::new(),
            properties: BTreeMap::new(),
        };
        for (id, job) in &store.jobs {
            let usage = usage.totals(id);
            let window = phases.get(id).and_then(|p| p.last_window.as_ref());
            let live = self
                .evaluators
                .entry(id.clone())
                .or_insert_with(|| LiveEvaluator::new(self.window_ns, self.hardware_counters))
                .update(
                    job,
                    usage.as_ref(),
                    self.memory_available_bytes,
                    window,
                    now_ns,
                    &self.config,
                );
            if let Some(u) = usage {
                evaluated.usage.insert(id.clone(), u);
            }
            evaluated.properties.insert(id.clone(), Arc::new(live));
        }
        evaluated
    }

    /// Drops an evicted job's evaluator.
    pub fn forget(&mut self, job: &JobId) {
        self.evaluators.remove(job);
    }
}
