//! The daemon's recording as it is written: on an error (a full disk) the recording stops and
//! says why, and profiling goes on without it instead of ending the daemon.

use crate::{
    export::recording::{RecordedBurst, RecordingEnd, RecordingError, RecordingWriter},
    model::{Burst, JobId},
    store::{ingest::BurstSink, JobMeta},
};

/// The recording being written, if any.
#[derive(Default)]
pub struct RecordingSink(Option<RecordingWriter>);

impl RecordingSink {
    pub fn new(writer: Option<RecordingWriter>) -> Self {
        RecordingSink(writer)
    }

    /// Writes to the recording, if one is still written.
    pub fn write(
        &mut self,
        write: impl FnOnce(&mut RecordingWriter) -> Result<(), RecordingError>,
    ) {
        if let Some(w) = &mut self.0 {
            if let Err(e) = write(w) {
                tracing::error!(
                    "the recording stopped: {e}; profiling goes on without it (make room, then \
                     restart the daemon to record again)"
                );
                self.0 = None;
            }
        }
    }

    /// Writes the recording's end and closes it.
    pub fn finish(&mut self, end: impl FnOnce() -> RecordingEnd) {
        if let Some(w) = self.0.take() {
            if let Err(e) = w.finish(end()) {
                tracing::error!("the recording could not be completed: {e}");
            }
        }
    }
}

impl BurstSink for RecordingSink {
    fn job(&mut self, meta: &JobMeta) {
        self.write(|w| w.job(meta));
    }

    #[inline]
    fn burst(&mut self, job: &JobId, burst: &Burst, event_counts: Option<[u64; 2]>) {
        self.write(|w| {
            w.burst(RecordedBurst {
                job: job.clone(),
                burst: burst.clone(),
                event_counts,
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::export::recording::{RecordingHeader, FORMAT_VERSION};

    /// A full disk: /dev/full takes the file's creation and fails every write.
    #[test]
    fn a_recording_that_cannot_be_written_stops_and_the_daemon_goes_on() {
        let header = RecordingHeader {
            version: FORMAT_VERSION,
            node: "n".into(),
            started_ns: 1,
            min_burst_ns: 1,
            counter_events: None,
            counters_note: String::new(),
            functions: Vec::new(),
            rank_groups: None,
        };
        let mut recording = RecordingSink::new(Some(
            RecordingWriter::create(Path::new("/dev/full"), header).unwrap(),
        ));
        recording.write(|w| w.flush());
        assert!(recording.0.is_none());
        // Nothing more is written, and nothing fails.
        recording.write(|w| w.flush());
    }
}
