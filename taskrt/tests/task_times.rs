//! Where a task's running time goes (busy, idle, back-pressured), seen through its monitor and
//! the worker's `/metrics` text. The clock is paused: waits take virtual time, work takes none.

mod common;

use std::time::Duration;

use cairn_process::metrics::{new_registry, render};
use cairn_protocol::messages::ToTask;
use cairn_taskrt::exchange::StreamElement;
use cairn_taskrt::exporter::TaskMetrics;
use cairn_taskrt::metrics::{TaskCounters, TaskTimes};
use cairn_taskrt::state::storage::CheckpointStorage;
use cairn_taskrt::task::TaskOutcome;
use common::*;

const LABELS: &str = r#"job_id="job",vertex="v",subtask="0""#;

/// The value of `name{LABELS}` in an exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{{LABELS}}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok())
}

fn times(h: &Harness) -> TaskTimes {
    h.monitor.counters.times()
}

#[tokio::test(start_paused = true)]
async fn a_producer_whose_consumer_does_not_drain_is_back_pressured_while_blocked() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut registry = new_registry();
    let metrics = TaskMetrics::register(&mut registry);
    let mut o = producer(CheckpointStorage::new(dir.path(), "job"), 1, None, 8);
    o.metrics = Some(metrics);
    let h = spawn_task(o);
    h.wait_running().await;

    // Nobody reads the output: the channel fills and the producer's next send waits. Its
    // back-pressured time grows while it is still blocked.
    wait_for("the producer to be back-pressured for a second", || {
        times(&h).back_pressured >= Duration::from_secs(1)
    })
    .await;
    let blocked = times(&h);
    wait_for("its back-pressured time to keep growing", || {
        times(&h).back_pressured >= blocked.back_pressured + Duration::from_secs(2)
    })
    .await;
    let t = times(&h);
    assert_eq!(TaskCounters::get(&h.monitor.counters.records_out), 8, "the channel holds 8 records");
    assert_eq!(t.idle, Duration::ZERO, "a source with records to emit is never idle: {t:?}");
    assert!(t.busy < Duration::from_millis(1), "sending took no (virtual) time: {t:?}");

    let text = render(&registry).unwrap();
    let exported = sample(&text, "cairn_task_back_pressured_seconds_total");
    assert!(exported.is_some_and(|s| s >= 3.0), "back-pressured seconds {exported:?}:\n{text}");
    assert_eq!(sample(&text, "cairn_task_idle_seconds_total"), Some(0.0), "{text}");
    assert!(sample(&text, "cairn_task_busy_seconds_total").is_some_and(|s| s < 0.001), "{text}");
    for name in ["busy", "idle", "back_pressured"] {
        let type_line = format!("# TYPE cairn_task_{name}_seconds_total counter");
        assert!(text.contains(&type_line), "{type_line}:\n{text}");
    }

    // A task blocked on its output takes no message; it ends when aborted, and its series with it.
    h.handle.abort();
    assert!(h.handle.await.is_err_and(|e| e.is_cancelled()));
    let text = render(&registry).unwrap();
    assert!(!text.contains(LABELS), "series left after the task ended:\n{text}");
}

#[tokio::test(start_paused = true)]
async fn a_producer_whose_output_is_drained_is_not_back_pressured() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut registry = new_registry();
    let metrics = TaskMetrics::register(&mut registry);
    // One record every 10 ms into a channel of 4 that the test drains every 5 ms.
    let mut o = producer(CheckpointStorage::new(dir.path(), "job"), 1, Some(Duration::from_millis(10)), 4);
    o.metrics = Some(metrics);
    let mut h = spawn_task(o);
    h.wait_running().await;

    let mut received = 0;
    wait_for("a hundred records to flow", || {
        while let Ok(element) = h.output.try_recv() {
            assert!(matches!(element, StreamElement::Record(_)), "{element:?}");
            received += 1;
        }
        received >= 100
    })
    .await;
    let t = times(&h);
    assert_eq!(t.back_pressured, Duration::ZERO, "{t:?}");
    // Between records the source waits for its next poll: idle.
    assert!(t.idle >= Duration::from_millis(900), "{t:?}");
    assert!(t.busy < Duration::from_millis(1), "{t:?}");
    let text = render(&registry).unwrap();
    assert_eq!(sample(&text, "cairn_task_back_pressured_seconds_total"), Some(0.0), "{text}");
    assert!(sample(&text, "cairn_task_idle_seconds_total").is_some_and(|s| s >= 0.9), "{text}");

    h.control(1, ToTask::Cancel).await;
    assert_eq!(h.handle.await.unwrap(), TaskOutcome::Canceled);
}

#[tokio::test(start_paused = true)]
async fn a_task_without_input_is_idle() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let log = CallLog::default();
    let mut h = spawn_task(HarnessOptions::new(
        CheckpointStorage::new(dir.path(), "job"),
        vec![("pass".into(), Box::new(Recorder { name: "pass".into(), log }))],
    ));
    h.wait_running().await;

    wait_for("the task to be idle for two seconds", || times(&h).idle >= Duration::from_secs(2)).await;
    let t = times(&h);
    assert_eq!(t.back_pressured, Duration::ZERO, "{t:?}");
    assert!(t.busy < Duration::from_millis(1), "waiting for input is not busy: {t:?}");

    // A record wakes it; it goes back to waiting after passing it on.
    h.send(0, StreamElement::Record(rec(1, 1))).await;
    assert_eq!(h.next_output().await, StreamElement::Record(rec(1, 1)));
    wait_for("idle time to grow again", || times(&h).idle >= t.idle + Duration::from_secs(1)).await;

    // Once the task ended, its figures stay as they were.
    h.control(1, ToTask::Cancel).await;
    assert_eq!(h.handle.await.unwrap(), TaskOutcome::Canceled);
    let ended = h.monitor.counters.times();
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(h.monitor.counters.times(), ended);
}
