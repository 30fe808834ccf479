//! The call sites a report shows, with their names: gathers the sites of an analysis, of a
//! daemon's phase snapshot, of run signatures or of bursts, and resolves them from the binaries of
//! the job that ran them ([`crate::symbols`]).

use std::collections::BTreeMap;

use crate::{
    analysis::{online::PhasesSnapshot, tracking::RunSignature, Analysis, ClusterStats},
    model::{Burst, CallSite},
    store::JobMeta,
    symbols::{SiteNames, SiteResolver},
};

/// Where the files of a job's modules are: what the daemon saw, and for recordings made before it
/// kept that, the executable under its build-id.
pub fn module_paths(meta: &JobMeta) -> BTreeMap<String, String> {
    let mut paths = meta.modules.clone();
    if let Some(id) = &meta.build_id {
        if !meta.executable.is_empty() {
            paths
                .entry(id.clone())
                .or_insert_with(|| meta.executable.clone());
        }
    }
    paths
}

/// The names of `sites`, from the binaries of the jobs `metas` describe.
pub fn names<'a>(
    resolver: &mut SiteResolver,
    metas: &[&JobMeta],
    sites: impl IntoIterator<Item = &'a CallSite>,
) -> SiteNames {
    let mut paths = BTreeMap::new();
    for meta in metas {
        paths.extend(module_paths(meta));
    }
    resolver.names(sites, &paths)
}

fn cluster_sites(c: &ClusterStats) -> impl Iterator<Item = &CallSite> {
    c.regions.iter().flat_map(|r| [&r.start, &r.end])
}

/// The sites of clusters and their noise.
fn clusters_sites<'a>(
    clusters: impl Iterator<Item = &'a ClusterStats>,
    noise: Option<&'a ClusterStats>,
) -> impl Iterator<Item = &'a CallSite> {
    clusters.chain(noise).flat_map(cluster_sites)
}

/// The sites of an analysis's clusters and noise.
pub fn analysis_sites(a: &Analysis) -> impl Iterator<Item = &CallSite> {
    clusters_sites(a.clusters.iter(), a.noise.as_ref())
}

/// The sites of a daemon's snapshot: its last window's phases and the whole job's clusters.
pub fn snapshot_sites(s: &PhasesSnapshot) -> impl Iterator<Item = &CallSite> {
    let window = s
        .last_window
        .iter()
        .flat_map(|w| clusters_sites(w.phases.iter().map(|p| &p.stats), w.noise.as_ref()));
    let cumulative = s
        .cumulative
        .iter()
        .flat_map(|c| clusters_sites(c.clusters.iter().map(|k| &k.stats), c.noise.as_ref()));
    window.chain(cumulative)
}

/// The sites of a run signature's clusters.
pub fn signature_sites(s: &RunSignature) -> impl Iterator<Item = &CallSite> {
    s.frame
        .clusters
        .iter()
        .flat_map(|c| c.regions.iter().flat_map(|r| [&r.start, &r.end]))
}

/// The sites of bursts.
pub fn burst_sites(bursts: &[Burst]) -> impl Iterator<Item = &CallSite> {
    bursts.iter().flat_map(|b| [&b.start_site, &b.end_site])
}
