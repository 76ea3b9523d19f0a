//! The console's pages, as maud templates (everything interpolated is escaped). Each view
//! renders the `<main>` of its page; [`page`] wraps it with the navigation. Live pages mark their
//! `<main>` with `data-live`: the shipped script reloads just that part every few seconds.

use std::time::{Duration, UNIX_EPOCH};

use maud::{DOCTYPE, Markup, html};

use crate::actions::Action;
use crate::charts::{Point, line_chart};
use crate::model::*;

/// Which navigation entry is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Cluster,
    Jobs,
    Workers,
    None,
}

/// A whole page around `main`.
pub fn page(title: &str, nav: Nav, live: bool, logged_in: bool, main: Markup) -> Markup {
    let item = |n: Nav, href: &str, label: &str| {
        html! { a href=(href) class=[(nav == n).then_some("current")] { (label) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Cairn" }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/console.js" defer {}
            }
            body {
                header {
                    a.brand href="/cluster" { "Cairn" }
                    nav {
                        (item(Nav::Cluster, "/cluster", "Cluster"))
                        (item(Nav::Jobs, "/jobs", "Jobs"))
                        (item(Nav::Workers, "/workers", "Workers"))
                    }
                    span.session {
                        @if live { span #live-status { "live" } " · " }
                        @if logged_in {
                            form.inline method="post" action="/logout" { button type="submit" { "Log out" } }
                        } @else {
                            a href="/login" { "Log in" }
                        }
                    }
                }
                main data-live=[live.then_some("2000")] { (main) }
            }
        }
    }
}

pub fn fmt_ms(ms: u64) -> String {
    if ms < 1000 { format!("{ms} ms") } else { format!("{:.2} s", ms as f64 / 1000.0) }
}

pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{b} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

pub fn fmt_time(ms: u64) -> String {
    if ms == 0 {
        return "–".into();
    }
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "–".into())
}

fn status_class(s: &str) -> &'static str {
    match s {
        "running" | "completed" | "healthy" | "finished" | "attached" => "ok",
        "failed" | "failing" | "unreachable" | "lagging" | "disconnected" => "bad",
        "cancelled" | "canceled" | "suspended" | "restarting" | "in_progress" => "warn",
        _ => "",
    }
}

/// A backpressure level (`ok`, `low`, `high`) as a badge coloured like Flink's.
fn backpressure_badge(level: &str) -> Markup {
    let class = match level {
        "ok" => "ok",
        "low" => "warn",
        "high" => "bad",
        _ => "",
    };
    html! { span class=(format!("badge {class}")) { (level) } }
}

fn badge(s: &str) -> Markup {
    html! { span class=(format!("badge {}", status_class(s))) { (s) } }
}

pub fn cluster(v: &ClusterView) -> Markup {
    html! {
        h1 { "Cluster" }
        @if let Some(e) = &v.error { p.error { "Latest read failed: " (e) } }
        dl.figures {
            div { dt { "Leader" } dd #leader { "node " (v.leader_id) " (" (v.leader_addr) ")" } }
            div { dt { "Term" } dd #term { (v.term) } }
            div { dt { "Last log index" } dd { (v.last_log_index) } }
            div { dt { "Committed" } dd { (v.commit_index) } }
            div { dt { "Applied" } dd { (v.applied_index) } }
            div { dt { "Snapshot" } dd { (v.snapshot_index) } }
            div { dt { "Quorum ack" } dd { (opt(v.millis_since_quorum_ack.map(fmt_ms))) " ago" } }
            div { dt { "Read at" } dd { (v.observed_at_ms.map(fmt_time).unwrap_or_else(|| "not yet".into())) } }
        }
        h2 { "Members" }
        table #members {
            thead { tr { th { "Node" } th { "Address" } th { "Role" } th { "Matched index" } th { "Lag" } th { "Health" } } }
            tbody {
                @for n in &v.nodes {
                    tr data-node=(n.id) {
                        td { (n.id) @if n.is_leader { " " span.badge.ok { "leader" } } }
                        td { (n.addr) }
                        td { (n.role) }
                        td.num { (opt(n.matched_index)) }
                        td.num { (opt(n.lag)) }
                        td { (badge(&n.health)) }
                    }
                }
            }
        }
        h2 { "Leader history" }
        p.hint {
            "Terms that had a leader, newest first, as replicated through the log (kept across \
             restarts, the newest 64); \"seen at\" is when this console first saw the term."
        }
        table #leader-history {
            thead { tr { th { "Term" } th { "Leader" } th { "From log index" } th { "Seen at" } } }
            tbody {
                @for c in &v.leader_history {
                    tr data-term=(c.term) {
                        td.num { (c.term) }
                        td { "node " (c.leader_id) }
                        td.num { (opt(c.first_log_index)) }
                        td { (opt(c.observed_at_ms.map(fmt_time))) }
                    }
                }
            }
        }
    }
}

pub fn jobs(v: &JobsView) -> Markup {
    html! {
        h1 { "Jobs" }
        p.hint { (v.jobs.len()) " jobs" }
        table #jobs {
            thead { tr {
                th { "Job" } th { "Name" } th { "Status" } th { "Attempts" } th { "Restarts" }
                th { "Completed checkpoints" } th { "Latest checkpoint" } th { "Completed at" }
            } }
            tbody {
                @for j in &v.jobs {
                    tr data-job=(j.job_id) {
                        td { a href=(format!("/jobs/{}", j.job_id)) { (j.job_id) } }
                        td { (j.name) }
                        td { (badge(&j.status)) @if !j.status_reason.is_empty() { " " span.reason { (j.status_reason) } } }
                        td.num { (j.attempts) }
                        td.num { (j.restarts) }
                        td.num { (j.completed_checkpoints) }
                        td.num {
                            @if let Some(id) = j.latest_checkpoint_id {
                                a href=(format!("/jobs/{}/checkpoints/{id}", j.job_id)) { "#" (id) }
                            } @else { "–" }
                        }
                        td { (opt(j.latest_checkpoint_time_ms.map(fmt_time))) }
                    }
                }
            }
        }
    }
}

fn job_tabs(job: &str, current: &str) -> Markup {
    html! {
        nav.tabs {
            a href=(format!("/jobs/{job}")) class=[(current == "overview").then_some("current")] { "Overview" }
            a href=(format!("/jobs/{job}/checkpoints")) class=[(current == "checkpoints").then_some("current")] { "Checkpoints" }
            @for a in Action::ALL {
                a.action href=(format!("/jobs/{job}/actions/{}", a.slug())) { (a.title()) }
            }
        }
    }
}

pub fn job(v: &JobView) -> Markup {
    let j = &v.job;
    html! {
        h1 { "Job " (j.job_id) @if !j.name.is_empty() { " · " (j.name) } }
        (job_tabs(&j.job_id, "overview"))
        dl.figures {
            div { dt { "Status" } dd #job-status { (badge(&j.status)) } }
            div { dt { "Phase" } dd { (v.phase) } }
            div { dt { "Attempt" } dd { (v.attempt) } }
            div { dt { "Restarts" } dd { (j.restarts) } }
            div { dt { "Completed checkpoints" } dd { (j.completed_checkpoints) } }
            div { dt { "Latest checkpoint" } dd {
                @if let Some(id) = j.latest_checkpoint_id {
                    a href=(format!("/jobs/{}/checkpoints/{id}", j.job_id)) { "#" (id) } " at " (opt(j.latest_checkpoint_time_ms.map(fmt_time)))
                } @else { "none yet" }
            } }
            div { dt { "Pending checkpoints" } dd { (v.pending_checkpoints.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")) } }
            @if !j.status_reason.is_empty() { div { dt { "Reason" } dd { (j.status_reason) } } }
            @if !v.restore_from.is_empty() { div { dt { "Restored from" } dd { (v.restore_from) " (" (v.restore_mode) ")" } } }
        }
        @if let Some(c) = &v.checkpoint_config {
            h2 { "Checkpointing" }
            dl.figures {
                div { dt { "Interval" } dd #interval { @if c.interval_ms == 0 { "off" } @else { (fmt_ms(c.interval_ms)) } } }
                div { dt { "Timeout" } dd { (fmt_ms(c.timeout_ms)) } }
                div { dt { "Min pause" } dd { (fmt_ms(c.min_pause_ms)) } }
                div { dt { "Max concurrent" } dd { (c.max_concurrent) } }
                div { dt { "Tolerable failures" } dd { (c.tolerable_failures) } }
                div { dt { "Retained" } dd { (c.retained) } }
                div { dt { "Checkpoint dir" } dd { (c.checkpoint_dir) } }
                div { dt { "Savepoint dir" } dd { (c.savepoint_dir) } }
            }
        }
        @if let Some(r) = &v.restart {
            h2 { "Restarts" }
            dl.figures {
                div { dt { "Strategy" } dd { code { (r.strategy_json) } } }
                div { dt { "Failures" } dd { (r.failures) } }
                div { dt { "Last failure" } dd { (opt(r.last_failure_time_ms.map(fmt_time))) " " (r.last_failure_cause) } }
                @if let Some(t) = r.next_restart_time_ms { div { dt { "Next restart" } dd { (fmt_time(t)) } } }
            }
        }
        h2 { "Tasks" }
        table #tasks {
            thead { tr {
                th { "Vertex" } th { "Subtask" } th { "Worker" } th { "Status" }
                th title="ms per second over the last ~10 s" { "Back-pressured" }
                th title="ms per second over the last ~10 s" { "Busy" }
                th title="ms per second over the last ~10 s" { "Idle" }
                th { "Backpressure" }
            } }
            tbody {
                @for t in &v.tasks {
                    tr {
                        td { (t.vertex) } td.num { (t.subtask) "/" (t.parallelism) } td { (t.worker) } td { (badge(&t.status)) }
                        td.num { (opt(t.load.as_ref().map(|l| l.back_pressured_ms_per_second))) }
                        td.num { (opt(t.load.as_ref().map(|l| l.busy_ms_per_second))) }
                        td.num { (opt(t.load.as_ref().map(|l| l.idle_ms_per_second))) }
                        td { @match &t.load { Some(l) => (backpressure_badge(&l.backpressure)), None => "–" } }
                    }
                }
            }
        }
        h2 { "Workers" }
        (workers_table(&v.workers))
    }
}

fn workers_table(workers: &[Worker]) -> Markup {
    html! {
        table #workers {
            thead { tr { th { "Worker" } th { "Slots" } th { "Used" } th { "Free" } } }
            tbody {
                @for w in workers {
                    tr data-worker=(w.worker_id) {
                        td { (w.worker_id) }
                        td.num { (w.slots) }
                        td.num { (w.slots_used) }
                        td.num { (w.slots.saturating_sub(w.slots_used)) }
                    }
                }
            }
        }
    }
}

pub fn workers(v: &WorkersView) -> Markup {
    html! {
        h1 { "Workers" }
        p.hint {
            "Every worker the leader knows: attached ones, and those whose connection dropped \
             but whose tasks are kept until their heartbeat timeout. "
            (v.used_slots) " of " (v.total_slots) " slots in use."
        }
        @if v.workers.is_empty() {
            p.hint { "No worker is attached." }
        } @else {
            table #workers {
                thead { tr {
                    th { "Worker" } th { "State" } th { "Slots" } th { "Used" } th { "Free" }
                    th { "Jobs" } th { "Authenticated by" } th { "Data address" }
                } }
                tbody {
                    @for r in &v.workers {
                        @let w = &r.worker;
                        tr data-worker=(w.worker_id) data-state=(r.state) {
                            td { (w.worker_id) }
                            td { (badge(&r.state)) }
                            td.num { (w.slots) }
                            td.num { (w.slots_used) }
                            td.num { (w.slots.saturating_sub(w.slots_used)) }
                            td {
                                @for (i, j) in w.jobs.iter().enumerate() {
                                    @if i > 0 { ", " }
                                    a href=(format!("/jobs/{j}")) { (j) }
                                }
                            }
                            td { (r.authenticated_by) }
                            td { @if r.data_addr.is_empty() { "-" } @else { (r.data_addr) } }
                        }
                    }
                }
            }
        }
    }
}

/// One checkpoint as a table row, after a heading cell when `label` is given.
fn checkpoint_row(job: &str, c: &Checkpoint, label: Option<&str>) -> Markup {
    html! {
        tr data-checkpoint=(c.id) {
            @if let Some(l) = label { th { (l) } }
            td { a href=(format!("/jobs/{job}/checkpoints/{}", c.id)) { "#" (c.id) } }
            td { (c.kind) }
            td { (badge(&c.status)) }
            td { (fmt_time(c.trigger_time_ms)) }
            td.num { (fmt_ms(c.duration_ms)) }
            td.num { (c.num_acknowledged) "/" (c.num_subtasks) }
            td.num { (fmt_bytes(c.state_size)) }
            td.num { (fmt_bytes(c.bytes_persisted)) }
            td { @if !c.failure_reason.is_empty() { (c.failure_reason) } }
        }
    }
}

const HISTORY_HEAD: [&str; 9] =
    ["ID", "Kind", "Status", "Triggered", "End to end", "Acknowledged", "State size", "Persisted", "Failure"];

pub fn checkpoints(v: &CheckpointsView) -> Markup {
    let job = v.job_id.as_str();
    let completed = v.completed_oldest_first();
    let point = |c: &&Checkpoint, value| Point { id: c.id, at_ms: c.trigger_time_ms, value };
    let durations: Vec<Point> = completed.iter().map(|c| point(c, c.duration_ms)).collect();
    let sizes: Vec<Point> = completed.iter().map(|c| point(c, c.state_size)).collect();
    let c = &v.counts;
    html! {
        h1 { "Job " (job) " · checkpoints" }
        (job_tabs(job, "checkpoints"))
        dl.figures #counts {
            div { dt { "Triggered" } dd { (c.triggered) } }
            div { dt { "In progress" } dd { (c.in_progress) } }
            div { dt { "Completed" } dd #completed-count { (c.completed) } }
            div { dt { "Failed" } dd #failed-count { (c.failed) } }
            div { dt { "Restored" } dd { (c.restored) } }
            div { dt { "End to end (min/avg/max)" } dd {
                (fmt_ms(v.end_to_end_duration_ms.min)) " / " (fmt_ms(v.end_to_end_duration_ms.avg)) " / " (fmt_ms(v.end_to_end_duration_ms.max))
            } }
            div { dt { "State size (min/avg/max)" } dd {
                (fmt_bytes(v.state_size.min)) " / " (fmt_bytes(v.state_size.avg)) " / " (fmt_bytes(v.state_size.max))
            } }
        }
        div.charts {
            (line_chart("chart-duration", "End-to-end duration", &durations, fmt_ms))
            (line_chart("chart-size", "State size", &sizes, fmt_bytes))
        }
        h2 { "Latest" }
        table #latest {
            thead { tr { th { "" } @for h in HISTORY_HEAD { th { (h) } } } }
            tbody {
                @for (label, c) in [("completed", &v.latest_completed), ("savepoint", &v.latest_savepoint), ("failed", &v.latest_failed)] {
                    @if let Some(c) = c { (checkpoint_row(job, c, Some(label))) }
                }
            }
        }
        @if let Some(r) = &v.latest_restored {
            p #restored { "Restored from checkpoint #" (r.id) " at " (fmt_time(r.restore_time_ms)) ": " code { (r.external_path) } }
        }
        h2 { "Retained" }
        p #retained {
            @if v.retained_checkpoint_ids.is_empty() { "none" }
            @for (i, id) in v.retained_checkpoint_ids.iter().enumerate() {
                @if i > 0 { ", " }
                a href=(format!("/jobs/{job}/checkpoints/{id}")) { "#" (id) }
            }
        }
        h2 { "Savepoints" }
        table #savepoints {
            thead { tr { th { "ID" } th { "Kind" } th { "Triggered" } th { "Completed" } th { "State size" } th { "Path" } } }
            tbody {
                @for s in &v.savepoints {
                    tr data-savepoint=(s.checkpoint_id) {
                        td { a href=(format!("/jobs/{job}/checkpoints/{}", s.checkpoint_id)) { "#" (s.checkpoint_id) } }
                        td { (s.kind) }
                        td { (fmt_time(s.trigger_time_ms)) }
                        td { (fmt_time(s.completion_time_ms)) }
                        td.num { (fmt_bytes(s.state_size)) }
                        td { code { (s.path) } }
                    }
                }
            }
        }
        h2 { "Failed" }
        table #failed {
            thead { tr { th { "ID" } th { "Triggered" } th { "Reason" } th { "Detail" } } }
            tbody {
                @for c in v.failed() {
                    tr {
                        td { a href=(format!("/jobs/{job}/checkpoints/{}", c.id)) { "#" (c.id) } }
                        td { (fmt_time(c.trigger_time_ms)) }
                        td { (c.failure_reason) }
                        td { (c.failure_detail) }
                    }
                }
            }
        }
        h2 { "History" }
        table #history {
            thead { tr { @for h in HISTORY_HEAD { th { (h) } } } }
            tbody { @for c in &v.history { (checkpoint_row(job, c, None)) } }
        }
    }
}

pub fn checkpoint(v: &CheckpointView) -> Markup {
    let c = &v.checkpoint;
    let job = v.job_id.as_str();
    html! {
        h1 { "Job " (job) " · checkpoint #" (c.id) }
        (job_tabs(job, ""))
        dl.figures {
            div { dt { "Kind" } dd { (c.kind) } }
            div { dt { "Status" } dd #checkpoint-status { (badge(&c.status)) } }
            div { dt { "Triggered" } dd { (fmt_time(c.trigger_time_ms)) } }
            div { dt { "Latest acknowledgement" } dd { (fmt_time(c.latest_ack_time_ms)) } }
            div { dt { "End to end" } dd { (fmt_ms(c.duration_ms)) } }
            div { dt { "Acknowledged" } dd { (c.num_acknowledged) "/" (c.num_subtasks) } }
            div { dt { "State size" } dd { (fmt_bytes(c.state_size)) } }
            div { dt { "Persisted" } dd { (fmt_bytes(c.bytes_persisted)) } }
            div { dt { "Retained" } dd { @if v.retained { "yes" } @else { "no" } } }
            @if !c.external_path.is_empty() { div { dt { "Location" } dd { code { (c.external_path) } } } }
            @if !v.metadata_path.is_empty() { div { dt { "Metadata" } dd { code { (v.metadata_path) } } } }
            @if !c.failure_reason.is_empty() { div { dt { "Failure" } dd { (c.failure_reason) " " (c.failure_detail) } } }
        }
        h2 { "Subtasks, slowest first" }
        table #subtasks {
            thead { tr {
                th { "Vertex" } th { "Subtask" } th { "End to end" } th { "Sync" } th { "Async" }
                th { "Alignment" } th { "Start delay" } th { "State size" } th { "Persisted" } th { "Acknowledged at" }
            } }
            tbody {
                @for s in &v.subtasks {
                    tr {
                        td { (s.vertex) } td.num { (s.subtask) }
                        td.num { (fmt_ms(s.end_to_end_ms)) } td.num { (fmt_ms(s.sync_duration_ms)) }
                        td.num { (fmt_ms(s.async_duration_ms)) } td.num { (fmt_ms(s.alignment_duration_ms)) }
                        td.num { (fmt_ms(s.start_delay_ms)) } td.num { (fmt_bytes(s.state_size)) }
                        td.num { (fmt_bytes(s.bytes_persisted)) } td { (fmt_time(s.ack_time_ms)) }
                    }
                }
            }
        }
    }
}

pub fn login(next: &str, error: Option<&str>) -> Markup {
    html! {
        h1 { "Log in" }
        p { "Enter the cluster's admin token (the one " code { "cairnctl --token-file" } " uses). The console keeps a session cookie, not the token." }
        @if let Some(e) = error { p.error { (e) } }
        form.login method="post" action="/login" {
            input type="hidden" name="next" value=(next);
            label { "Admin token " input type="password" name="token" autocomplete="current-password" required; }
            button type="submit" { "Log in" }
        }
    }
}

/// The confirmation form of an action, with the request id its submissions share.
pub fn confirm(
    job: &str,
    action: Action,
    request_id: &str,
    logged_in: bool,
    current_interval: Option<u64>,
) -> Markup {
    html! {
        h1 { (action.title()) " · job " (job) }
        p { (action.explain()) }
        @if !logged_in {
            p.error { "Actions need the admin token: " a href=(format!("/login?next=/jobs/{job}/actions/{}", action.slug())) { "log in" } " first." }
        } @else {
            form.confirm method="post" action=(format!("/jobs/{job}/actions/{}", action.slug())) {
                input type="hidden" name="request_id" value=(request_id);
                input type="hidden" name="confirm" value="yes";
                @if action == Action::Interval {
                    label { "New interval (e.g. 5s, 1m) "
                        input type="text" name="interval" required pattern="[0-9a-z ]+"
                            value=(current_interval.filter(|ms| *ms > 0).map(|ms| humantime::format_duration(Duration::from_millis(ms)).to_string()).unwrap_or_default());
                    }
                }
                button #confirm type="submit" class=(if action.is_destructive() { "danger" } else { "primary" }) { "Confirm: " (action.title()) }
                " "
                a href=(format!("/jobs/{job}")) { "Back" }
            }
            p.hint { "Request id " code { (request_id) } ": submitting this form again does the action once, like " code { "cairnctl --request-id" } "." }
        }
    }
}

pub fn action_done(job: &str, action: Action, outcome: &str) -> Markup {
    html! {
        h1 { (action.title()) " · job " (job) }
        p #outcome.ok { (outcome) }
        p { a href=(format!("/jobs/{job}/checkpoints")) { "Checkpoints of " (job) } " · " a href=(format!("/jobs/{job}")) { "Job " (job) } }
    }
}

pub fn error(status: u16, message: &str) -> Markup {
    html! {
        h1 { "Error " (status) }
        p #error.error { (message) }
        p { a href="/cluster" { "Cluster" } " · " a href="/jobs" { "Jobs" } }
    }
}

/// The stylesheet and script shipped in the binary.
pub const CSS: &str = include_str!("assets/console.css");
pub const JS: &str = include_str!("assets/console.js");
