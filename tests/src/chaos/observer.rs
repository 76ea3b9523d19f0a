//! The observer: one task that polls the cluster every 100 ms and records the history.
//!
//! Each cycle asks every replica for its status directly (only a leader with a quorum
//! answers), then reads the job's record from the replica that answered. Every tenth cycle it
//! scans the volumes: the output's committed files (then the store), and every retained
//! checkpoint's `_metadata` and state files (between two store reads). Progress is published on
//! a watch channel for the nemesis, which waits on it for recovery.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_proto::v1::{ClusterStatus, JobRecord};
use cairn_protocol::checkpoint::layout::METADATA_FILE;
use cairn_protocol::checkpoint::read_metadata_unverified;
use cairn_taskrt::demo::sink::{COMMITTED_DIR, PartName};
use tokio::sync::watch;

use super::history::{
    Completion, JobView, Observation, RestoreView, RetainedProblem, RetainedScan, SinkScan, StatusAnswer,
    now_ms,
};
use super::probe::{Probe, Timed};

const POLL_INTERVAL: Duration = Duration::from_millis(100);
const SCAN_EVERY: u64 = 10;
const REFRESH_ADDRESSES_EVERY: u64 = 20;

/// Where the job's data is on the host.
#[derive(Debug, Clone)]
pub struct HostPaths {
    /// The checkpoint storage root as the containers see it (e.g. `/checkpoints`).
    pub checkpoint_root_in_container: PathBuf,
    /// The checkpoint storage root on the host (the volume's directory).
    pub checkpoint_root: PathBuf,
    /// `<checkpoint root>/<job>`: `chk-<id>/` and `shared/` of the job.
    pub job_checkpoints: PathBuf,
    /// Id of the demo job's source vertex (its offsets are in every checkpoint).
    pub source_vertex: String,
    /// The demo sink's output directory (holding `committed/`).
    pub output: PathBuf,
}

/// What the nemesis needs to know, as of the latest cycle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Node id and term of the replica that answered as leader last.
    pub leader: Option<(u64, u64)>,
    pub latest_checkpoint: u64,
    /// Highest trigger time among completed checkpoints seen (first sighting when `_metadata`
    /// could not be read).
    pub latest_trigger_ms: u64,
    pub job_status: String,
}

/// Everything the observer recorded.
#[derive(Debug, Default)]
pub struct Recorded {
    pub observations: Vec<Observation>,
    pub statuses: Vec<StatusAnswer>,
    pub completions: Vec<Completion>,
    pub sink_scans: Vec<SinkScan>,
    pub retained_scans: Vec<RetainedScan>,
}

pub struct Observer {
    probe: Probe,
    job: String,
    paths: HostPaths,
    rec: Recorded,
    progress: watch::Sender<Progress>,
    seen: BTreeSet<u64>,
}

/// Starts the observer; it runs until `stop` turns true, then returns what it recorded.
pub fn spawn(
    probe: Probe,
    job: &str,
    paths: HostPaths,
    stop: watch::Receiver<bool>,
) -> (tokio::task::JoinHandle<Recorded>, watch::Receiver<Progress>) {
    let (tx, rx) = watch::channel(Progress::default());
    let obs = Observer {
        probe,
        job: job.to_owned(),
        paths,
        rec: Recorded::default(),
        progress: tx,
        seen: BTreeSet::new(),
    };
    (tokio::spawn(obs.run(stop)), rx)
}

impl Observer {
    async fn run(mut self, mut stop: watch::Receiver<bool>) -> Recorded {
        self.probe.refresh_addresses().await;
        let mut cycle = 0u64;
        loop {
            if *stop.borrow() {
                break;
            }
            if cycle % REFRESH_ADDRESSES_EVERY == REFRESH_ADDRESSES_EVERY - 1 {
                self.probe.refresh_addresses().await;
            }
            self.poll().await;
            if cycle % SCAN_EVERY == SCAN_EVERY / 2 {
                self.scan_output().await;
                self.scan_retained().await;
            }
            cycle += 1;
            tokio::select! {
                _ = stop.changed() => {}
                _ = tokio::time::sleep(POLL_INTERVAL) => {}
            }
        }
        // A last look, after the final stop.
        self.poll().await;
        self.scan_output().await;
        self.scan_retained().await;
        self.rec
    }

    /// Every replica's status, then the job's record from the one that leads.
    async fn poll(&mut self) {
        let mut leader: Option<(usize, Timed<ClusterStatus>)> = None;
        for i in 0..self.probe.len() {
            if let Some(st) = self.probe.status(i).await {
                self.rec.statuses.push(StatusAnswer {
                    sent_ms: st.sent_ms,
                    at_ms: st.at_ms,
                    asked: self.probe.container(i).to_owned(),
                    node: st.value.node_id,
                    term: st.value.term,
                    leader_id: st.value.leader_id,
                });
                if leader.as_ref().is_none_or(|(_, l)| l.value.term <= st.value.term) {
                    leader = Some((i, st));
                }
            }
        }
        let Some((i, st)) = leader else { return };
        self.probe.set_leader(i);
        if let Some(rec) = self.probe.get_job(i, &self.job).await {
            self.observe(&st, rec);
        }
    }

    fn observe(&mut self, st: &Timed<ClusterStatus>, rec: Timed<JobRecord>) {
        let job = job_view(&rec.value);
        for id in &job.completed_ids {
            if self.seen.insert(*id) {
                let (trigger, done) = self.checkpoint_times(*id);
                self.rec.completions.push(Completion {
                    id: *id,
                    first_seen_ms: rec.at_ms,
                    seen_in_term: st.value.term,
                    trigger_time_ms: trigger,
                    completion_time_ms: done,
                });
            }
        }
        let latest_trigger_ms = self
            .rec
            .completions
            .iter()
            .map(|c| c.trigger_time_ms.unwrap_or(c.first_seen_ms))
            .max()
            .unwrap_or(0);
        self.progress.send_replace(Progress {
            leader: Some((st.value.node_id, st.value.term)),
            latest_checkpoint: job.latest_checkpoint(),
            latest_trigger_ms,
            job_status: job.status.clone(),
        });
        self.rec.observations.push(Observation {
            sent_ms: st.sent_ms,
            at_ms: rec.at_ms,
            node: st.value.node_id,
            term: st.value.term,
            leader_id: st.value.leader_id,
            job,
        });
    }

    fn checkpoint_times(&self, id: u64) -> (Option<u64>, Option<u64>) {
        let path = self.paths.job_checkpoints.join(format!("chk-{id}")).join(METADATA_FILE);
        match read_metadata_unverified(&path) {
            Ok(m) => (Some(m.trigger_time_ms), Some(m.completion_time_ms)),
            Err(_) => (None, None),
        }
    }

    /// The job's record from the leader, for the scans (`None` when no leader answers).
    async fn store(&mut self) -> Option<JobView> {
        self.probe.leader_read(&self.job).await.map(|(_, _, rec)| job_view(&rec.value))
    }

    /// Lists the committed output, then reads the store.
    async fn scan_output(&mut self) {
        let at_ms = now_ms();
        let (files, max_committed) = committed_ids(&self.paths.output);
        let Some(store) = self.store().await else { return };
        self.rec.sink_scans.push(SinkScan {
            at_ms,
            files,
            max_committed,
            store_latest_after: store.latest(),
        });
    }

    /// Reads the store, checks every retained checkpoint's files, reads the store again.
    async fn scan_retained(&mut self) {
        let Some(before) = self.store().await else { return };
        let at_ms = now_ms();
        let mut problems = Vec::new();
        let mut files_checked = 0;
        for id in &before.completed_ids {
            match check_checkpoint_files(&self.paths.job_checkpoints, *id) {
                Ok(n) => files_checked += n,
                Err(what) => problems.push(RetainedProblem { id: *id, what }),
            }
        }
        let Some(after) = self.store().await else { return };
        self.rec.retained_scans.push(RetainedScan {
            at_ms,
            job_status: after.status.clone(),
            retained_before: before.completed_ids,
            retained_after: after.completed_ids,
            files_checked,
            problems,
        });
    }
}

/// The record as the history keeps it; the restore comes from the leader's statistics summary.
pub fn job_view(r: &JobRecord) -> JobView {
    let stats: serde_json::Value = serde_json::from_str(&r.stats_json).unwrap_or_default();
    let restored = &stats["latest_restored"];
    let latest_restored = match (restored["id"].as_u64(), restored["restore_time_ms"].as_u64()) {
        (Some(id), Some(restore_time_ms)) => Some(RestoreView { id, restore_time_ms }),
        _ => None,
    };
    JobView {
        status: r.status.clone(),
        next_checkpoint_id: r.next_checkpoint_id,
        completed_ids: r.completed_checkpoint_ids.clone(),
        num_completed: r.num_completed,
        savepoint_ids: r.savepoint_ids.clone(),
        attempts: r.attempts,
        latest_restored,
    }
}

/// Number of committed files and the highest checkpoint id among their names.
pub fn committed_ids(output: &Path) -> (usize, Option<u64>) {
    let Ok(entries) = std::fs::read_dir(output.join(COMMITTED_DIR)) else { return (0, None) };
    let ids: Vec<u64> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| PartName::parse(&e.file_name().to_string_lossy()).map(|p| p.checkpoint_id))
        .collect();
    (ids.len(), ids.iter().copied().max())
}

/// Checks that checkpoint `id`'s `_metadata` decodes and every state file it references exists
/// with the recorded size. Returns the number of files checked, or what is wrong.
pub fn check_checkpoint_files(job_dir: &Path, id: u64) -> Result<usize, String> {
    let path = job_dir.join(format!("chk-{id}")).join(METADATA_FILE);
    let meta = read_metadata_unverified(&path).map_err(|e| e.to_string())?;
    let mut n = 1;
    for (subtask, st) in &meta.subtasks {
        for f in st.files() {
            let p = job_dir.join(&f.path);
            match std::fs::metadata(&p) {
                Ok(m) if m.len() == f.size => n += 1,
                Ok(m) => {
                    return Err(format!(
                        "{subtask}: {} is {} bytes, _metadata says {}",
                        p.display(),
                        m.len(),
                        f.size
                    ));
                }
                Err(e) => return Err(format!("{subtask}: {}: {e}", p.display())),
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_protocol::checkpoint::{
        CheckpointMetadata, KeyGroupSegment, OperatorSubtaskState, StateFile, SubtaskState, write_metadata,
    };
    use std::collections::BTreeMap;

    fn write_checkpoint(job_dir: &Path, id: u64) {
        let rel = format!("chk-{id}/count-0.state");
        std::fs::create_dir_all(job_dir.join(format!("chk-{id}"))).unwrap();
        std::fs::write(job_dir.join(&rel), b"0123456789").unwrap();
        let mut op = OperatorSubtaskState::default();
        let segment = |offset| KeyGroupSegment { file: rel.clone(), offset, length: 5, crc32: 0 };
        op.keyed.key_groups = BTreeMap::from([(0, segment(0)), (1, segment(5))]);
        op.keyed.files.push(StateFile { path: rel.clone(), size: 10, crc32: 0 });
        let mut st = SubtaskState::default();
        st.operators.insert("count".into(), op);
        let meta = CheckpointMetadata {
            version: 1,
            job: "demo".into(),
            checkpoint_id: id,
            kind: "checkpoint".into(),
            trigger_time_ms: 1,
            completion_time_ms: 2,
            vertices: BTreeMap::new(),
            subtasks: BTreeMap::from([("count/0".into(), st)]),
            master_states: BTreeMap::new(),
        };
        write_metadata(&job_dir.join(format!("chk-{id}")).join(METADATA_FILE), &meta).unwrap();
    }

    #[test]
    fn a_checkpoint_with_all_its_files_passes_and_a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(dir.path(), 7);
        // `_metadata` and the one state file holding both key groups.
        assert_eq!(check_checkpoint_files(dir.path(), 7), Ok(2));
        std::fs::write(dir.path().join("chk-7/count-0.state"), b"short").unwrap();
        let err = check_checkpoint_files(dir.path(), 7).unwrap_err();
        assert!(err.contains("5 bytes"), "{err}");
        std::fs::remove_file(dir.path().join("chk-7/count-0.state")).unwrap();
        let err = check_checkpoint_files(dir.path(), 7).unwrap_err();
        assert!(err.contains("count-0.state"), "{err}");
        assert!(check_checkpoint_files(dir.path(), 8).is_err());
    }

    #[test]
    fn committed_ids_reads_the_checkpoint_ids_from_file_names() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(committed_ids(dir.path()), (0, None));
        let committed = dir.path().join(COMMITTED_DIR);
        std::fs::create_dir_all(&committed).unwrap();
        for (id, part) in [(3u64, 0u32), (12, 1), (9, 0)] {
            let name = PartName { checkpoint_id: id, part, of: 2, nonce: "ab12".into() };
            std::fs::write(committed.join(format!("{}.csv", name.stem())), b"").unwrap();
        }
        std::fs::write(committed.join("notes.txt"), b"").unwrap();
        assert_eq!(committed_ids(dir.path()), (3, Some(12)));
    }

    #[test]
    fn the_restore_comes_from_the_statistics_summary() {
        let r = JobRecord {
            status: "running".into(),
            completed_checkpoint_ids: vec![4, 5],
            stats_json: r#"{"latest_restored":{"id":4,"restore_time_ms":99,"external_path":null}}"#.into(),
            ..JobRecord::default()
        };
        let v = job_view(&r);
        assert_eq!(v.latest_restored, Some(RestoreView { id: 4, restore_time_ms: 99 }));
        assert_eq!(v.latest(), 5);
        assert_eq!(
            job_view(&JobRecord { stats_json: "{}".into(), ..JobRecord::default() }).latest_restored,
            None
        );
    }
}
