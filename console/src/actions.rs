//! The console's actions: what each one is, how its form is validated, and running it through
//! the admin API with the form's request id, so a repeated submission (a double click, a
//! reload, a retry after a lost answer) is applied once, as with `cairnctl --request-id`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::source::{Source, SourceError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Checkpoint,
    Savepoint,
    Stop,
    Cancel,
    Interval,
}

/// Shortest and longest periodic interval the console sets.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
pub const MAX_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

impl Action {
    pub const ALL: [Action; 5] =
        [Self::Checkpoint, Self::Savepoint, Self::Stop, Self::Cancel, Self::Interval];

    pub fn slug(self) -> &'static str {
        match self {
            Self::Checkpoint => "checkpoint",
            Self::Savepoint => "savepoint",
            Self::Stop => "stop",
            Self::Cancel => "cancel",
            Self::Interval => "interval",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|a| a.slug() == s).ok_or_else(|| {
            format!(
                "unknown action `{}`; the actions are {}",
                s.escape_debug(),
                Self::ALL.map(Self::slug).join(", ")
            )
        })
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::Checkpoint => "Trigger checkpoint",
            Self::Savepoint => "Trigger savepoint",
            Self::Stop => "Stop with savepoint",
            Self::Cancel => "Cancel job",
            Self::Interval => "Change checkpoint interval",
        }
    }

    pub fn explain(self) -> &'static str {
        match self {
            Self::Checkpoint => "Triggers a checkpoint now, besides the periodic ones.",
            Self::Savepoint => {
                "Takes a savepoint into the job's savepoint directory and waits until it is written."
            }
            Self::Stop => "Takes a savepoint, then stops the job. It can be resubmitted from that savepoint.",
            Self::Cancel => "Cancels the job without a savepoint. Its retained checkpoints stay on disk.",
            Self::Interval => "Changes the periodic checkpoint interval of the running job.",
        }
    }

    pub fn is_destructive(self) -> bool {
        matches!(self, Self::Stop | Self::Cancel)
    }
}

/// The fields an action's form posts.
#[derive(Debug, Default, Deserialize)]
pub struct ActionForm {
    pub request_id: Option<String>,
    pub confirm: Option<String>,
    pub interval: Option<String>,
}

/// A validated action request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRequest {
    pub action: Action,
    pub request_id: String,
    /// Humantime text of the new interval (`Interval` only).
    pub interval: Option<String>,
}

/// `cairnctl`'s rule for request ids.
pub fn check_request_id(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok { Ok(()) } else { Err("request_id must be 1 to 128 characters of [A-Za-z0-9._:-]".into()) }
}

/// A fresh request id for one confirmation form.
pub fn new_request_id() -> String {
    format!("console-{:016x}", rand::random::<u64>())
}

impl ActionRequest {
    pub fn validate(action: Action, form: &ActionForm) -> Result<Self, String> {
        if form.confirm.as_deref() != Some("yes") {
            return Err("the action is not confirmed: post confirm=yes (the confirmation form does)".into());
        }
        let request_id = form.request_id.as_deref().map(str::trim).unwrap_or_default();
        if request_id.is_empty() {
            return Err("request_id is missing: post the confirmation form's request id".into());
        }
        check_request_id(request_id)?;
        let interval = match action {
            Action::Interval => {
                let raw = form.interval.as_deref().map(str::trim).unwrap_or_default();
                if raw.is_empty() {
                    return Err("interval is missing: give a duration such as 5s or 1m".into());
                }
                if raw.len() > 32 {
                    return Err("interval is longer than 32 characters".into());
                }
                let d = humantime::parse_duration(raw).map_err(|e| {
                    format!("interval `{}` is not a duration such as 5s or 1m: {e}", raw.escape_debug())
                })?;
                if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
                    return Err(format!(
                        "interval `{raw}` is out of range: from {} to {}",
                        humantime::format_duration(MIN_INTERVAL),
                        humantime::format_duration(MAX_INTERVAL)
                    ));
                }
                Some(humantime::format_duration(d).to_string())
            }
            _ => {
                if form.interval.as_deref().is_some_and(|i| !i.trim().is_empty()) {
                    return Err(format!(
                        "interval applies to the interval action only, not to `{}`",
                        action.slug()
                    ));
                }
                None
            }
        };
        Ok(Self { action, request_id: request_id.to_owned(), interval })
    }
}

/// What an action did, for the page and the JSON answer.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub job_id: String,
    pub action: Action,
    pub request_id: String,
    pub checkpoint_id: Option<u64>,
    pub path: Option<String>,
    pub status: Option<String>,
    pub interval_ms: Option<u64>,
    pub message: String,
}

/// Runs a validated action.
pub async fn run(source: &Source, job: &str, req: &ActionRequest) -> Result<Outcome, SourceError> {
    let mut out = Outcome {
        job_id: job.to_owned(),
        action: req.action,
        request_id: req.request_id.clone(),
        checkpoint_id: None,
        path: None,
        status: None,
        interval_ms: None,
        message: String::new(),
    };
    let rid = req.request_id.as_str();
    match req.action {
        Action::Checkpoint => {
            let r = source.trigger_checkpoint(job, rid).await?;
            out.checkpoint_id = Some(r.checkpoint_id);
            out.message = format!("checkpoint {} of job {job} triggered", r.checkpoint_id);
        }
        Action::Savepoint => {
            let r = source.trigger_savepoint(job, rid).await?;
            out.message = format!("savepoint {} of job {job} written to {}", r.checkpoint_id, r.path);
            out.checkpoint_id = Some(r.checkpoint_id);
            out.path = Some(r.path);
        }
        Action::Stop => {
            let r = source.stop_with_savepoint(job, rid).await?;
            out.message = format!("job {job} stopped with savepoint {}: {}", r.checkpoint_id, r.path);
            out.checkpoint_id = Some(r.checkpoint_id);
            out.path = Some(r.path);
        }
        Action::Cancel => {
            let r = source.cancel_job(job, rid).await?;
            out.message = format!("job {job} cancelled (status {})", r.status);
            out.status = Some(r.status);
        }
        Action::Interval => {
            let interval = req.interval.as_deref().unwrap_or_default();
            let r = source.set_interval(job, interval, rid).await?;
            let ms = r.checkpoint_config.map(|c| c.interval_ms);
            out.interval_ms = ms;
            out.message = format!("checkpoint interval of job {job} set to {interval}");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(rid: &str, confirm: bool, interval: Option<&str>) -> ActionForm {
        ActionForm {
            request_id: Some(rid.into()),
            confirm: confirm.then(|| "yes".into()),
            interval: interval.map(Into::into),
        }
    }

    #[test]
    fn actions_parse_by_slug() {
        for a in Action::ALL {
            assert_eq!(Action::parse(a.slug()), Ok(a));
        }
        let e = Action::parse("nuke<script>").err().unwrap_or_default();
        assert!(e.contains("unknown action") && e.contains("savepoint"), "{e}");
    }

    #[test]
    fn forms_are_validated() {
        assert!(ActionRequest::validate(Action::Savepoint, &form("r-1", true, None)).is_ok());
        let unconfirmed = ActionRequest::validate(Action::Savepoint, &form("r-1", false, None));
        assert!(unconfirmed.err().unwrap_or_default().contains("not confirmed"));
        let bad_id = ActionRequest::validate(Action::Cancel, &form("a b", true, None));
        assert!(bad_id.err().unwrap_or_default().contains("request_id"));
        let missing = ActionRequest::validate(
            Action::Cancel,
            &ActionForm { confirm: Some("yes".into()), ..Default::default() },
        );
        assert!(missing.err().unwrap_or_default().contains("missing"));
        let ok = ActionRequest::validate(Action::Interval, &form("r", true, Some(" 2s ")));
        assert_eq!(ok.map(|r| r.interval), Ok(Some("2s".into())));
        let bad = ActionRequest::validate(Action::Interval, &form("r", true, Some("soon")));
        assert!(bad.err().unwrap_or_default().contains("not a duration"));
        let tiny = ActionRequest::validate(Action::Interval, &form("r", true, Some("1ms")));
        assert!(tiny.err().unwrap_or_default().contains("out of range"));
        let stray = ActionRequest::validate(Action::Checkpoint, &form("r", true, Some("5s")));
        assert!(stray.err().unwrap_or_default().contains("interval action only"));
    }

    #[test]
    fn fresh_request_ids_are_valid_and_differ() {
        let (a, b) = (new_request_id(), new_request_id());
        assert_eq!(check_request_id(&a), Ok(()));
        assert_ne!(a, b);
    }
}
