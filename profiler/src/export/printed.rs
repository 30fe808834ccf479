//! The reports the daemon prints on standard output: every running job's report each
//! `daemon.report_interval_s`, and, once a job has ended and its bursts are clustered, its
//! report, phases and bottlenecks together.

use std::{io::Write as _, time::Instant};

use crate::{
    export::{bottlenecks, report},
    properties::LiveProperties,
    store::{Job, JobStore},
};

/// When the running jobs' reports are due, and what they say of the counters.
pub struct PrintedReports {
    /// Seconds between two prints of the running jobs' reports; 0 for none but the last.
    interval_s: f64,
    last: Instant,
    counters_note: String,
}

/// An ended job's report and bottlenecks, rendered when it ended, printed with its phases once
/// they are clustered.
pub struct JobEndReport {
    report: String,
    bottlenecks: Option<String>,
}

impl PrintedReports {
    pub fn new(interval_s: f64, counters_note: String) -> Self {
        PrintedReports {
            interval_s,
            last: Instant::now(),
            counters_note,
        }
    }

    /// Prints every running job's report when they are due, and at the daemon's last update.
    pub fn print_running(&mut self, store: &JobStore, now_ns: u64, last_update: bool) {
        let due = self.interval_s > 0.0 && self.last.elapsed().as_secs_f64() >= self.interval_s;
        if !(last_update || due) {
            return;
        }
        self.last = Instant::now();
        for job in store.jobs.values().filter(|j| !j.is_ended()) {
            print(&format!(
                "{}\n",
                report::render(job, now_ns, &self.counters_note)
            ));
        }
    }

    /// The report of a job that ended at `now_ns`, with its bottlenecks over its life here.
    pub fn job_end(
        &self,
        job: &Job,
        properties: Option<&LiveProperties>,
        now_ns: u64,
    ) -> JobEndReport {
        JobEndReport {
            report: report::render(job, now_ns, &self.counters_note),
            bottlenecks: properties
                .map(|live| bottlenecks::render(&live.job, "over its life on this node")),
        }
    }
}

impl JobEndReport {
    /// Prints the report, the job's `phases` table, then its bottlenecks, together.
    pub fn print(&self, phases: &str) {
        let mut text = format!("{}\n{phases}\n", self.report);
        if let Some(bottlenecks) = &self.bottlenecks {
            text.push_str(&format!("{bottlenecks}\n"));
        }
        print(&text);
    }
}

/// Prints a report on standard output; a reader that went away (`mpiburst run | head`) is not
/// an error of the daemon, which goes on with its metrics and API.
fn print(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
