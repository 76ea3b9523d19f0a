//! How replies are printed: aligned tables and key/value blocks for people (`--output table`),
//! or the reply message itself as JSON for scripts (`--output json`, done by the caller with
//! serde). Renderers are pure functions from a reply to text, so they are tested directly.

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use cairn_proto::admin::{
    CheckpointConfig, CheckpointDetails, CheckpointOutcome, CheckpointOverview, CheckpointSummary,
    ClusterStatusReply, DurationSizeSummary, JobDetails, ListJobsReply, ListSavepointsReply,
    ListWorkersReply, MembershipReply, NodeStatus,
};

/// Left-aligned columns separated by two spaces; no trailing spaces.
#[derive(Debug, Clone)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Self { rows: vec![headers.iter().map(|h| h.to_string()).collect()] }
    }

    pub fn row(&mut self, cells: Vec<String>) -> &mut Self {
        self.rows.push(cells);
        self
    }

    /// Rows without the header.
    pub fn len(&self) -> usize {
        self.rows.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; cols];
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count()));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `key:  value` lines with the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        let _ = writeln!(out, "{:width$}  {v}", format!("{k}:"), width = width + 1);
    }
    out
}

/// Milliseconds since the epoch as UTC RFC 3339; `-` for 0 (unknown).
pub fn time(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A duration in milliseconds, short: `850ms`, `12.3s`, `4m 10s`.
pub fn millis(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms}ms"),
        1000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => humantime::format_duration(Duration::from_secs(ms / 1000)).to_string(),
    }
}

/// A byte count in binary units: `512 B`, `1.5 KiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn or_dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.to_owned() }
}

fn id_or_dash(id: u64) -> String {
    if id == 0 { "-".into() } else { id.to_string() }
}

fn nodes_table(nodes: &[NodeStatus]) -> String {
    let mut t = Table::new(&["ID", "ADDRESS", "ROLE", "LEADER", "MATCHED", "LAG", "HEALTH"]);
    for n in nodes {
        t.row(vec![
            n.id.to_string(),
            n.addr.clone(),
            n.role.clone(),
            if n.is_leader { "*".into() } else { String::new() },
            opt(n.matched_index),
            opt(n.lag),
            n.health.clone(),
        ]);
    }
    t.render()
}

/// Terms of the leader history `cluster status` prints (`-o json` has them all).
const RECENT_LEADERS: usize = 3;

pub fn cluster_status(s: &ClusterStatusReply) -> String {
    let mut pairs = vec![
        ("leader", format!("{} ({})", s.leader_id, or_dash(&s.leader_addr))),
        ("term", s.term.to_string()),
        (
            "log",
            format!(
                "last {}, committed {}, applied {}, snapshot {}",
                s.last_log_index, s.commit_index, s.applied_index, s.snapshot_index
            ),
        ),
    ];
    if let Some(ms) = s.millis_since_quorum_ack {
        pairs.push(("quorum ack", format!("{} ago", millis(ms))));
    }
    if !s.leader_history.is_empty() {
        let recent: Vec<String> = s
            .leader_history
            .iter()
            .take(RECENT_LEADERS)
            .map(|t| format!("term {} node {} (from index {})", t.term, t.leader_id, t.first_log_index))
            .collect();
        pairs.push(("leaders", recent.join(", ")));
    }
    format!("{}\n{}", fields(&pairs), nodes_table(&s.nodes))
}

pub fn membership(change: &str, r: &MembershipReply) -> String {
    format!("{change}; membership committed at log index {}\n\n{}", r.log_index, nodes_table(&r.nodes))
}

pub fn workers(r: &ListWorkersReply) -> String {
    if r.workers.is_empty() {
        return "no workers attached\n".into();
    }
    let mut t = Table::new(&["WORKER", "STATE", "SLOTS", "USED", "JOBS", "AUTHENTICATED BY", "DATA ADDRESS"]);
    for w in &r.workers {
        t.row(vec![
            w.worker_id.clone(),
            w.state.clone(),
            w.slots.to_string(),
            w.slots_used.to_string(),
            if w.jobs.is_empty() { "-".into() } else { w.jobs.join(",") },
            w.authenticated_by.clone(),
            if w.data_addr.is_empty() { "-".into() } else { w.data_addr.clone() },
        ]);
    }
    let (slots, used) = r
        .workers
        .iter()
        .fold((0u64, 0u64), |(s, u), w| (s + u64::from(w.slots), u + u64::from(w.slots_used)));
    format!("{}\n{used} of {slots} slots in use\n", t.render())
}

pub fn job_list(r: &ListJobsReply) -> String {
    if r.jobs.is_empty() {
        return "no jobs\n".into();
    }
    let mut t =
        Table::new(&["JOB", "NAME", "STATUS", "COMPLETED", "LATEST", "LATEST AT", "ATTEMPTS", "REASON"]);
    for j in &r.jobs {
        t.row(vec![
            j.job_id.clone(),
            j.name.clone(),
            j.status.clone(),
            j.completed_checkpoints.to_string(),
            id_or_dash(j.latest_checkpoint_id),
            time(j.latest_checkpoint_time_ms),
            j.attempts.to_string(),
            j.status_reason.clone(),
        ]);
    }
    t.render()
}

pub fn checkpoint_config(c: &CheckpointConfig) -> String {
    fields(&[
        ("interval", if c.interval_ms == 0 { "off".into() } else { millis(c.interval_ms) }),
        ("timeout", millis(c.timeout_ms)),
        ("min pause", millis(c.min_pause_ms)),
        ("max concurrent", c.max_concurrent.to_string()),
        ("tolerable failures", c.tolerable_failures.to_string()),
        ("retained", c.retained.to_string()),
        ("savepoint dir", or_dash(&c.savepoint_dir)),
        ("checkpoint dir", or_dash(&c.checkpoint_dir)),
        ("retention on termination", or_dash(&c.externalized_retention)),
        (
            "barriers",
            match (c.unaligned, c.aligned_checkpoint_timeout_ms) {
                (false, _) => "aligned".into(),
                (true, 0) => "unaligned".into(),
                (true, t) => format!("aligned, unaligned after {}", millis(t)),
            },
        ),
    ])
}

pub fn job_details(d: &JobDetails) -> String {
    let mut out = String::new();
    let s = d.summary.clone().unwrap_or_default();
    let status = if s.status_reason.is_empty() {
        s.status.clone()
    } else {
        format!("{} ({})", s.status, s.status_reason)
    };
    let pending = d.pending_checkpoints.iter().map(u64::to_string).collect::<Vec<_>>();
    out.push_str(&fields(&[
        ("job", s.job_id.clone()),
        ("name", s.name.clone()),
        ("status", status),
        ("phase", or_dash(&d.phase)),
        ("attempt", d.attempt.to_string()),
        ("completed checkpoints", s.completed_checkpoints.to_string()),
        (
            "latest checkpoint",
            format!("{} at {}", id_or_dash(s.latest_checkpoint_id), time(s.latest_checkpoint_time_ms)),
        ),
        ("pending checkpoints", if pending.is_empty() { "-".into() } else { pending.join(", ") }),
        ("next checkpoint id", d.next_checkpoint_id.to_string()),
        ("restored from", or_dash(&d.restore_from)),
        ("restore mode", if d.restore_from.is_empty() { "-".into() } else { or_dash(&d.restore_mode) }),
    ]));
    if let Some(r) = &d.restart {
        out.push_str(
            "
restarts
",
        );
        let last = if r.last_failure_cause.is_empty() {
            "-".into()
        } else {
            format!("{} at {}", r.last_failure_cause, time(r.last_failure_time_ms))
        };
        let restart_fields = fields(&[
            ("strategy", or_dash(&r.strategy_json)),
            ("failures", r.failures.to_string()),
            ("restarts", r.restarts.to_string()),
            ("last failure", last),
            ("next restart", r.next_restart_time_ms.map_or_else(|| "-".into(), time)),
        ]);
        for line in restart_fields.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    if let Some(c) = &d.checkpoint_config {
        out.push_str("\ncheckpointing\n");
        for line in checkpoint_config(c).lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    if !d.tasks.is_empty() {
        let mut t = Table::new(&[
            "VERTEX",
            "SUBTASK",
            "WORKER",
            "STATUS",
            "BACKPRESSURED",
            "BUSY",
            "IDLE",
            "BACKPRESSURE",
        ]);
        for task in &d.tasks {
            let mut row = vec![
                task.vertex.clone(),
                format!("{}/{}", task.subtask, task.parallelism),
                or_dash(&task.worker),
                task.status.clone(),
            ];
            row.extend(match &task.load {
                Some(l) => [
                    l.back_pressured_ms_per_second.to_string(),
                    l.busy_ms_per_second.to_string(),
                    l.idle_ms_per_second.to_string(),
                    or_dash(&l.backpressure),
                ],
                None => ["-", "-", "-", "-"].map(String::from),
            });
            t.row(row);
        }
        let _ = write!(out, "\n{}", t.render());
        out.push_str("(BACKPRESSURED, BUSY, IDLE: ms per second over the last ~10 s; BACKPRESSURE: ok ≤ 10%, low ≤ 50%, high)\n");
    }
    if !d.workers.is_empty() {
        let mut t = Table::new(&["WORKER", "SLOTS", "USED"]);
        for w in &d.workers {
            t.row(vec![w.worker_id.clone(), w.slots.to_string(), w.slots_used.to_string()]);
        }
        let _ = write!(out, "\n{}", t.render());
    }
    out
}

pub fn outcome(job: &str, o: &CheckpointOutcome) -> String {
    let kind = if o.kind.is_empty() { "checkpoint" } else { &o.kind };
    match o.status.as_str() {
        "completed" => format!("{kind} {} of job {job} completed: {}\n", o.checkpoint_id, o.location),
        "failed" => format!(
            "{kind} {} of job {job} failed: {} {}\n",
            o.checkpoint_id, o.failure_reason, o.failure_detail
        ),
        other => format!("{kind} {} of job {job}: {other}\n", o.checkpoint_id),
    }
}

fn summary_line(s: &CheckpointSummary) -> String {
    let mut line = format!(
        "{} {} {} at {}, {}/{} acks",
        s.kind,
        s.id,
        s.status,
        time(s.trigger_time_ms),
        s.num_acknowledged,
        s.num_subtasks
    );
    if s.status == "completed" {
        let _ = write!(line, ", {} in {}", bytes(s.state_size), millis(s.duration_ms));
    }
    if !s.external_path.is_empty() {
        let _ = write!(line, ", {}", s.external_path);
    }
    if !s.failure_reason.is_empty() {
        let _ = write!(line, ", {} {}", s.failure_reason, s.failure_detail);
    }
    line
}

fn min_avg_max(s: &DurationSizeSummary, fmt: fn(u64) -> String) -> String {
    if s.count == 0 {
        return "-".into();
    }
    format!("min {} / avg {} / max {} (of {})", fmt(s.min), fmt(s.avg), fmt(s.max), s.count)
}

pub fn overview(o: &CheckpointOverview) -> String {
    let c = o.counts.unwrap_or_default();
    let latest = |s: &Option<CheckpointSummary>| s.as_ref().map_or_else(|| "-".into(), summary_line);
    let mut out = fields(&[
        ("job", o.job_id.clone()),
        (
            "counts",
            format!(
                "triggered {}, in progress {}, completed {}, failed {}, restored {}",
                c.triggered, c.in_progress, c.completed, c.failed, c.restored
            ),
        ),
        ("latest completed", latest(&o.latest_completed)),
        ("latest savepoint", latest(&o.latest_savepoint)),
        ("latest failed", latest(&o.latest_failed)),
        (
            "latest restored",
            o.latest_restored.as_ref().map_or_else(
                || "-".into(),
                |r| format!("{} at {}, {}", r.id, time(r.restore_time_ms), or_dash(&r.external_path)),
            ),
        ),
        ("end-to-end duration", min_avg_max(&o.end_to_end_duration_ms.unwrap_or_default(), millis)),
        ("state size", min_avg_max(&o.state_size.unwrap_or_default(), bytes)),
        (
            "retained",
            if o.retained_checkpoint_ids.is_empty() {
                "-".into()
            } else {
                o.retained_checkpoint_ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            },
        ),
    ]);
    if !o.history.is_empty() {
        let mut t = Table::new(&[
            "ID",
            "KIND",
            "STATUS",
            "TRIGGERED",
            "ACKS",
            "DURATION",
            "SIZE",
            "PERSISTED",
            "DETAIL",
        ]);
        for s in &o.history {
            let detail = if s.failure_reason.is_empty() {
                s.external_path.clone()
            } else {
                format!("{} {}", s.failure_reason, s.failure_detail).trim_end().to_owned()
            };
            t.row(vec![
                s.id.to_string(),
                s.kind.clone(),
                s.status.clone(),
                time(s.trigger_time_ms),
                format!("{}/{}", s.num_acknowledged, s.num_subtasks),
                if s.duration_ms == 0 { "-".into() } else { millis(s.duration_ms) },
                bytes(s.state_size),
                bytes(s.bytes_persisted),
                detail,
            ]);
        }
        let _ = write!(out, "\n{}", t.render());
    }
    out
}

pub fn checkpoint_details(d: &CheckpointDetails) -> String {
    let s = d.summary.clone().unwrap_or_default();
    let mut out = fields(&[
        ("checkpoint", s.id.to_string()),
        ("kind", s.kind.clone()),
        ("status", s.status.clone()),
        ("triggered", time(s.trigger_time_ms)),
        ("latest ack", time(s.latest_ack_time_ms)),
        ("acknowledged", format!("{}/{}", s.num_acknowledged, s.num_subtasks)),
        ("duration", millis(s.duration_ms)),
        ("state size", bytes(s.state_size)),
        ("persisted", bytes(s.bytes_persisted)),
        ("in-flight data", bytes(s.persisted_data)),
        ("path", or_dash(&s.external_path)),
        ("metadata", or_dash(&d.metadata_path)),
        ("retained", if d.retained { "yes".into() } else { "no".into() }),
        (
            "failure",
            if s.failure_reason.is_empty() {
                "-".into()
            } else {
                format!("{} {}", s.failure_reason, s.failure_detail).trim_end().to_owned()
            },
        ),
    ]);
    if !d.subtasks.is_empty() {
        let mut t = Table::new(&[
            "VERTEX",
            "SUBTASK",
            "ACKED",
            "END-TO-END",
            "SYNC",
            "ASYNC",
            "ALIGNMENT",
            "START DELAY",
            "SIZE",
            "PERSISTED",
            "IN-FLIGHT",
        ]);
        for f in &d.subtasks {
            t.row(vec![
                f.vertex.clone(),
                f.subtask.to_string(),
                time(f.ack_time_ms),
                millis(f.end_to_end_ms),
                millis(f.sync_duration_ms),
                millis(f.async_duration_ms),
                millis(f.alignment_duration_ms),
                millis(f.start_delay_ms),
                bytes(f.state_size),
                bytes(f.bytes_persisted),
                bytes(f.persisted_data),
            ]);
        }
        let _ = write!(out, "\n{}", t.render());
    }
    out
}

pub fn savepoints(r: &ListSavepointsReply) -> String {
    if r.savepoints.is_empty() {
        return "no savepoints\n".into();
    }
    let mut t = Table::new(&["ID", "KIND", "TRIGGERED", "COMPLETED", "SIZE", "PATH"]);
    for s in &r.savepoints {
        t.row(vec![
            s.checkpoint_id.to_string(),
            s.kind.clone(),
            time(s.trigger_time_ms),
            time(s.completion_time_ms),
            bytes(s.state_size),
            s.path.clone(),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use cairn_proto::admin::{JobSummary, SavepointInfo};

    use super::*;

    #[test]
    fn job_details_show_each_subtasks_backpressure_or_a_dash() {
        use cairn_proto::admin::{TaskInfo, TaskLoad};
        let task = |vertex: &str, load: Option<TaskLoad>| TaskInfo {
            vertex: vertex.into(),
            subtask: 0,
            parallelism: 1,
            worker: "w1".into(),
            status: "running".into(),
            load,
        };
        let load = TaskLoad {
            back_pressured_ms_per_second: 640,
            busy_ms_per_second: 300,
            idle_ms_per_second: 60,
            backpressure: "high".into(),
        };
        let d =
            JobDetails { tasks: vec![task("source", Some(load)), task("sink", None)], ..Default::default() };
        let text = job_details(&d);
        assert!(text.contains("STATUS   BACKPRESSURED  BUSY  IDLE  BACKPRESSURE"), "{text}");
        assert!(text.contains("source  0/1      w1      running  640            300   60    high"), "{text}");
        assert!(text.contains("sink    0/1      w1      running  -              -     -     -"), "{text}");
    }

    #[test]
    fn table_columns_align_without_trailing_spaces() {
        let mut t = Table::new(&["ID", "ADDRESS", "ROLE"]);
        t.row(vec!["1".into(), "127.0.0.1:7401".into(), "voter".into()]);
        t.row(vec!["12".into(), "h:1".into(), "".into()]);
        assert_eq!(t.render(), "ID  ADDRESS         ROLE\n1   127.0.0.1:7401  voter\n12  h:1\n");
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn units_are_readable() {
        assert_eq!(millis(850), "850ms");
        assert_eq!(millis(12_340), "12.3s");
        assert_eq!(millis(250_000), "4m 10s");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(time(0), "-");
        assert_eq!(time(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(fields(&[("a", "1".into()), ("long", "2".into())]), "a:     1\nlong:  2\n");
    }

    #[test]
    fn cluster_status_lists_members_and_marks_the_leader() {
        let node = |id, leader, health: &str| NodeStatus {
            id,
            addr: format!("127.0.0.1:740{id}"),
            role: "voter".into(),
            is_leader: leader,
            matched_index: Some(40),
            lag: if leader { Some(0) } else { None },
            health: health.into(),
        };
        let s = ClusterStatusReply {
            node_id: 2,
            leader_id: 2,
            leader_addr: "127.0.0.1:7402".into(),
            term: 3,
            last_log_index: 40,
            commit_index: 40,
            applied_index: 40,
            snapshot_index: 0,
            nodes: vec![node(1, false, "unreachable"), node(2, true, "healthy")],
            millis_since_quorum_ack: Some(15),
            leader_history: (1..=4)
                .rev()
                .map(|t| cairn_proto::admin::LeaderTerm {
                    term: t,
                    leader_id: t % 2 + 1,
                    first_log_index: t * 10,
                })
                .collect(),
        };
        let text = cluster_status(&s);
        assert!(text.starts_with("leader:      2 (127.0.0.1:7402)\n"), "{text}");
        assert!(text.contains("quorum ack:  15ms ago"), "{text}");
        assert!(
            text.contains(
                "leaders:     term 4 node 1 (from index 40), term 3 node 2 (from index 30), term 2 node 1 (from index 20)\n"
            ),
            "{text}"
        );
        assert!(text.contains("ID  ADDRESS         ROLE   LEADER  MATCHED  LAG  HEALTH\n"), "{text}");
        assert!(text.contains("1   127.0.0.1:7401  voter          40       -    unreachable\n"), "{text}");
        assert!(text.contains("2   127.0.0.1:7402  voter  *       40       0    healthy\n"), "{text}");
    }

    #[test]
    fn workers_show_state_jobs_and_slot_totals() {
        use cairn_proto::admin::WorkerStatus;
        assert_eq!(workers(&ListWorkersReply { workers: vec![] }), "no workers attached\n");
        let w = |id: &str, state: &str, used, jobs: &[&str]| WorkerStatus {
            worker_id: id.into(),
            slots: 4,
            slots_used: used,
            state: state.into(),
            jobs: jobs.iter().map(|j| j.to_string()).collect(),
            authenticated_by: "worker token".into(),
            data_addr: if state == "attached" { "10.0.0.7:7500".into() } else { String::new() },
        };
        let r = ListWorkersReply {
            workers: vec![w("w-1", "attached", 3, &["a", "b"]), w("w-2", "disconnected", 0, &[])],
        };
        let text = workers(&r);
        assert!(
            text.starts_with("WORKER  STATE         SLOTS  USED  JOBS  AUTHENTICATED BY  DATA ADDRESS\n"),
            "{text}"
        );
        assert!(
            text.contains("w-1     attached      4      3     a,b   worker token      10.0.0.7:7500\n"),
            "{text}"
        );
        assert!(text.contains("w-2     disconnected  4      0     -     worker token      -\n"), "{text}");
        assert!(text.ends_with("\n3 of 8 slots in use\n"), "{text}");
    }

    #[test]
    fn job_list_shows_one_row_per_job() {
        assert_eq!(job_list(&ListJobsReply { jobs: vec![] }), "no jobs\n");
        let r = ListJobsReply {
            jobs: vec![JobSummary {
                job_id: "demo".into(),
                name: "demo".into(),
                status: "running".into(),
                completed_checkpoints: 7,
                latest_checkpoint_id: 9,
                latest_checkpoint_time_ms: 1_700_000_000_000,
                attempts: 1,
                ..Default::default()
            }],
        };
        let lines: Vec<String> = job_list(&r).lines().map(str::to_owned).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1], "demo  demo  running  7          9       2023-11-14T22:13:20Z  1");
    }

    #[test]
    fn overview_and_outcomes_name_ids_and_failures() {
        let o = CheckpointOverview {
            job_id: "j".into(),
            counts: Some(cairn_proto::admin::CheckpointCounts {
                completed: 2,
                failed: 1,
                ..Default::default()
            }),
            history: vec![CheckpointSummary {
                id: 5,
                kind: "checkpoint".into(),
                status: "failed".into(),
                failure_reason: "CHECKPOINT_EXPIRED".into(),
                ..Default::default()
            }],
            retained_checkpoint_ids: vec![3, 4],
            ..Default::default()
        };
        let text = overview(&o);
        assert!(text.contains("completed 2, failed 1"), "{text}");
        assert!(text.contains("retained:             3, 4"), "{text}");
        assert!(text.contains("5   checkpoint  failed"), "{text}");
        assert!(text.contains("CHECKPOINT_EXPIRED"), "{text}");
        let done = CheckpointOutcome {
            checkpoint_id: 5,
            status: "completed".into(),
            kind: "checkpoint".into(),
            location: "/cp/j/chk-5".into(),
            ..Default::default()
        };
        assert_eq!(outcome("j", &done), "checkpoint 5 of job j completed: /cp/j/chk-5\n");
        let sp = ListSavepointsReply {
            savepoints: vec![SavepointInfo {
                checkpoint_id: 6,
                path: "/sp/savepoint-j-6".into(),
                kind: "savepoint".into(),
                ..Default::default()
            }],
        };
        assert!(savepoints(&sp).lines().nth(1).is_some_and(|l| l.ends_with("/sp/savepoint-j-6")));
    }
}
