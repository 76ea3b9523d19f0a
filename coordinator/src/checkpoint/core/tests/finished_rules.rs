//! Finished tasks (Flink's FLIP-147): a task that finished after its final checkpoint is neither
//! triggered nor waited for, later checkpoints record its state as empty, and once every source
//! finished the tasks they fed take the trigger.

use cairn_protocol::checkpoint::CheckpointMetadata;
use cairn_raft::model::CheckpointConfig;

use super::*;

fn metadata_of(acts: &[Action], id: u64) -> CheckpointMetadata {
    acts.iter()
        .find_map(|a| match a {
            Action::WriteMetadata { checkpoint_id, metadata, .. } if *checkpoint_id == id => {
                Some((**metadata).clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no metadata written for checkpoint {id}: {acts:?}"))
}

fn finish(h: &mut Harness, attempt: TaskAttemptId) -> Vec<Action> {
    h.handle(Event::TaskStatusChanged { attempt, status: TaskStatus::Finished })
}

#[test]
fn a_task_finishing_without_acknowledging_counts_as_acknowledged_with_empty_state() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    h.ack(A1, id);
    h.ack(A3, id);
    let acts = finish(&mut h, A2);
    assert!(aborted(&acts).is_empty(), "a finished task does not fail the checkpoint: {acts:?}");
    let meta = metadata_of(&acts, id);
    assert_eq!(meta.subtasks.len(), 3, "every subtask has an entry");
    assert_eq!(meta.subtasks["src/1"], SubtaskState::default(), "the finished one's is empty");
    assert_ne!(meta.subtasks["src/0"], SubtaskState::default());
}

#[test]
fn a_finished_source_is_neither_triggered_nor_waited_for() {
    let mut h = Harness::new(CheckpointConfig::default());
    finish(&mut h, A1);
    let (_, acts) = h.request(TriggerKind::Checkpoint);
    let acts = h.allocate(&acts);
    let (id, _, tasks) = triggered(&acts).expect("a checkpoint with a finished source is triggered");
    assert_eq!(tasks, vec![A2], "only the running source is triggered");
    assert!(h.ack(A2, id).is_empty());
    let acts = h.ack(A3, id);
    let meta = metadata_of(&acts, id);
    assert_eq!(meta.subtasks["src/0"], SubtaskState::default());
    h.write_metadata(id);
    let acts = h.commit(id);
    assert!(
        acts.iter().any(|a| matches!(a, Action::NotifyComplete { tasks, .. }
            if tasks.len() == 2 && tasks.contains(&A2) && tasks.contains(&A3))),
        "only running tasks are notified: {acts:?}"
    );
}

#[test]
fn once_every_source_finished_the_tasks_they_fed_are_triggered() {
    let mut h = Harness::new(CheckpointConfig::default());
    finish(&mut h, A1);
    finish(&mut h, A2);
    let (_, acts) = h.request(TriggerKind::Checkpoint);
    let acts = h.allocate(&acts);
    let (id, _, tasks) = triggered(&acts).expect("triggered");
    assert_eq!(tasks, vec![A3], "the task whose inputs all finished takes the trigger");
    let acts = h.ack(A3, id);
    assert!(matches!(acts[..], [Action::WriteMetadata { .. }]), "{acts:?}");
}

#[test]
fn nothing_is_triggered_once_every_task_finished() {
    let mut h = Harness::new(CheckpointConfig::default());
    for a in ALL {
        finish(&mut h, a);
    }
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    assert_eq!(
        answer(&acts, request),
        Some(Err(TriggerError::Rejected { reason: CheckpointFailureReason::NotAllRequiredTasksRunning }))
    );
    assert!(allocation_tokens(&acts).is_empty(), "no id is spent");
}

#[test]
fn a_task_stopping_still_aborts_while_a_finished_one_does_not() {
    let mut h = Harness::new(CheckpointConfig { max_concurrent: 2, ..Default::default() });
    let first = h.checkpoint();
    h.ack(A1, first);
    let acts = finish(&mut h, A2);
    assert!(aborted(&acts).is_empty(), "{acts:?}");
    let acts = h.handle(Event::TaskStatusChanged { attempt: A3, status: TaskStatus::Failed });
    assert_eq!(aborted(&acts), vec![(first, CheckpointFailureReason::TaskFailure)]);
}
