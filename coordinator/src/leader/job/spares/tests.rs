use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use cairn_protocol::checkpoint::metadata::METADATA_VERSION;
use cairn_protocol::checkpoint::read_metadata;

use super::*;

fn meta(id: u64, padding: usize) -> CheckpointMetadata {
    CheckpointMetadata {
        version: METADATA_VERSION,
        job: "j".into(),
        checkpoint_id: id,
        kind: "checkpoint".into(),
        trigger_time_ms: id,
        completion_time_ms: id + 1,
        vertices: BTreeMap::new(),
        subtasks: BTreeMap::new(),
        master_states: BTreeMap::from([("offsets".into(), vec![7; padding])]),
    }
}

struct Job {
    _root: tempfile::TempDir,
    dir: PathBuf,
}

impl Job {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("j");
        Self { _root: root, dir }
    }

    /// A job whose checkpoints 1 to `last` completed through a fresh `Spares` (no spare yet).
    fn with_completed(last: u64) -> (Self, Spares) {
        let (job, spares) = (Self::new(), Spares::default());
        for id in 1..=last {
            job.complete(&spares, id, 10);
        }
        (job, spares)
    }

    fn chk(&self, id: u64) -> PathBuf {
        self.dir.join(format!("chk-{id}"))
    }

    fn metadata(&self, id: u64) -> PathBuf {
        self.chk(id).join(METADATA_FILE)
    }

    /// The names in the job's directory, sorted.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn ino(&self, path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().ino()
    }

    /// Checkpoint `id` completed: its `_metadata` written through `spares`, then verified
    /// against the returned pointer, as a restore does.
    fn complete(&self, spares: &Spares, id: u64, padding: usize) {
        let m = meta(id, padding);
        let pointer = spares.write_metadata(&self.metadata(id), &m).unwrap();
        assert_eq!(pointer.path, self.metadata(id));
        assert_eq!(read_metadata(&pointer).unwrap(), m);
    }
}

#[test]
fn a_subsumed_checkpoint_directory_becomes_the_next_one() {
    let job = Job::new();
    let spares = Spares::default();
    job.complete(&spares, 1, 3000);
    let inodes = (job.ino(&job.chk(1)), job.ino(&job.metadata(1)));

    spares.discard(&[job.chk(1)]);
    assert_eq!(job.names(), [".spare-chk-1"]);

    job.complete(&spares, 2, 10);
    assert_eq!(job.names(), ["chk-2"], "the spare is now checkpoint 2's directory");
    assert_eq!((job.ino(&job.chk(2)), job.ino(&job.metadata(2))), inodes, "no inode allocated");

    // Steady state, retaining one: every completion reuses the one it subsumes.
    for id in 3..10 {
        spares.discard(&[job.chk(id - 1)]);
        job.complete(&spares, id, 100 * id as usize);
        assert_eq!(job.names(), [format!("chk-{id}")]);
        assert_eq!(job.ino(&job.metadata(id)), inodes.1);
    }
}

#[test]
fn directories_holding_more_than_metadata_are_deleted_and_at_most_two_are_kept() {
    let (job, spares) = Job::with_completed(4);
    std::fs::write(job.chk(1).join("count-0.state"), b"state").unwrap();
    std::fs::create_dir(job.chk(4).join("nested")).unwrap();
    std::fs::create_dir(job.chk(5)).unwrap();

    spares.discard(&[job.chk(1), job.chk(2), job.chk(3), job.chk(4), job.chk(5)]);

    // 1 holds a state file, 4 a directory, 5 nothing: deleted; 2 and 3 kept.
    assert_eq!(job.names(), [".spare-chk-2", ".spare-chk-3"]);

    job.complete(&spares, 6, 10);
    job.complete(&spares, 7, 10);
    job.complete(&spares, 8, 10);
    assert_eq!(job.names(), ["chk-6", "chk-7", "chk-8"]);
}

#[test]
fn a_checkpoint_whose_tasks_wrote_into_its_directory_gets_a_fresh_metadata_file() {
    let (job, spares) = Job::with_completed(1);
    spares.discard(&[job.chk(1)]);
    std::fs::create_dir_all(job.chk(2)).unwrap();
    std::fs::write(job.chk(2).join("count-0.state"), b"state").unwrap();

    job.complete(&spares, 2, 10);

    assert_eq!(job.names(), [".spare-chk-1", "chk-2"], "the spare stays for a later checkpoint");
    assert!(job.chk(2).join("count-0.state").exists());
}

#[test]
fn paths_that_are_not_a_checkpoint_directory_are_written_and_deleted_as_before() {
    let (job, spares) = Job::with_completed(1);
    spares.discard(&[job.chk(1)]);

    let savepoint = job.dir.join("savepoint-j-2-00000000abcd");
    let pointer = spares.write_metadata(&savepoint.join(METADATA_FILE), &meta(2, 10)).unwrap();
    assert_eq!(read_metadata(&pointer).unwrap(), meta(2, 10));
    assert!(job.dir.join(".spare-chk-1").exists(), "a savepoint never takes a spare");

    spares.discard(std::slice::from_ref(&savepoint));
    assert_eq!(job.names(), [".spare-chk-1"], "and is deleted, never kept");
}

#[test]
fn a_new_leader_adopts_the_spares_it_finds_and_deletes_the_surplus() {
    let (job, earlier) = Job::with_completed(3);
    earlier.discard(&[job.chk(1), job.chk(2)]);
    // A crash between claiming a spare and renaming it into place leaves one more; a leader
    // that kept more (or an older build) may leave others, possibly not holding only metadata.
    std::fs::rename(job.chk(3), job.dir.join(".spare-chk-3")).unwrap();
    std::fs::create_dir(job.dir.join(".spare-chk-9")).unwrap();
    std::fs::write(job.dir.join(".spare-chk-9/other"), b"x").unwrap();

    let later = Spares::default();
    job.complete(&later, 10, 10);

    let names = job.names();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"chk-10".to_owned()), "{names:?}");
    assert!(names[0].starts_with(".spare-chk-"), "one adopted spare is left: {names:?}");
    assert_ne!(names[0], ".spare-chk-9", "{names:?}");
}

#[test]
fn two_leaders_holding_one_spare_never_write_into_it_both() {
    let (job, deposed) = Job::with_completed(1);
    deposed.discard(&[job.chk(1)]);
    let leader = Spares::default();

    // The new leader adopts the spare the deposed one still holds; the first to write takes it.
    job.complete(&leader, 20, 10);
    let reused = job.ino(&job.metadata(20));
    job.complete(&deposed, 2, 50);

    assert_eq!(job.names(), ["chk-2", "chk-20"]);
    assert_ne!(job.ino(&job.metadata(2)), reused, "the deposed leader wrote a fresh file");
    let pointer = MetadataPointer::of(&job.metadata(20), &std::fs::read(job.metadata(20)).unwrap());
    assert_eq!(read_metadata(&pointer).unwrap(), meta(20, 10));
}

#[test]
fn after_the_job_ends_spares_are_deleted_and_none_is_kept() {
    let (job, spares) = Job::with_completed(3);
    spares.discard(&[job.chk(1)]);
    std::fs::rename(job.chk(2), job.dir.join(".spare-chk-2")).unwrap();

    spares.remove_all(&job.dir);
    assert_eq!(job.names(), ["chk-3"], "kept and leftover spares are gone");

    spares.discard(&[job.chk(3)]);
    assert!(job.names().is_empty());
}
