//! `cairnctl job ...`: submit, list, describe, cancel, reconfigure and stop jobs.

use std::path::Path;

use cairn_proto::admin::admin_client::AdminClient;
use cairn_proto::admin::{
    CancelJobRequest, JobRequest, ListJobsRequest, StopWithSavepointRequest, SubmitJobRequest,
    UpdateCheckpointConfigRequest,
};
use serde_json::{Map, Value};

use super::Ctx;
use crate::cli::{
    CheckpointFlags, ConfigArgs, Interval, JobCmd, PlacementArg, RestartFlags, RestoreModeArg, StopArgs,
    SubmitArgs,
};
use crate::client::Wait;
use crate::errors::CtlError;
use crate::output;

pub async fn run(ctx: &mut Ctx<'_>, cmd: JobCmd) -> Result<(), CtlError> {
    match cmd {
        JobCmd::Submit(args) => submit(ctx, *args).await,
        JobCmd::List => {
            let reply = ctx
                .session
                .call("list jobs", Wait::Quick, |ch| async move {
                    Ok(AdminClient::new(ch).list_jobs(ListJobsRequest {}).await?.into_inner())
                })
                .await?;
            ctx.emit(&reply, output::job_list)
        }
        JobCmd::Describe { job } => {
            let req = JobRequest { job_id: job };
            let reply = ctx
                .session
                .call("describe job", Wait::Quick, |ch| {
                    let req = req.clone();
                    async move { Ok(AdminClient::new(ch).describe_job(req).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, output::job_details)
        }
        JobCmd::Cancel { job } => {
            let req = CancelJobRequest { job_id: job.clone(), request_id: ctx.request_id.clone() };
            let reply = ctx
                .session
                .call("cancel job", Wait::Quick, |ch| {
                    let req = req.clone();
                    async move { Ok(AdminClient::new(ch).cancel_job(req).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, |r| format!("job {job}: {}\n", r.status))
        }
        JobCmd::Config(args) => config(ctx, args).await,
        JobCmd::Stop(args) => stop(ctx, args).await,
    }
}

async fn submit(ctx: &mut Ctx<'_>, args: SubmitArgs) -> Result<(), CtlError> {
    let graph_json = read_graph(&args.graph)?;
    let checkpoint = checkpoint_json(&args.checkpoint)?;
    if let Some(map) = &checkpoint {
        check_checkpoint_config(map)?;
    }
    let name = match args.name {
        Some(n) if n.trim().is_empty() => {
            return Err(CtlError::Usage("--name must not be empty (leave it out to use the job id)".into()));
        }
        Some(n) => n,
        None => String::new(),
    };
    let req = SubmitJobRequest {
        job_id: args.job.clone(),
        name,
        graph_json,
        checkpoint_json: checkpoint.map(|m| Value::Object(m).to_string()).unwrap_or_default(),
        restore_from: args.from_savepoint.unwrap_or_default(),
        allow_non_restored_state: args.allow_non_restored_state,
        request_id: ctx.request_id.clone(),
        restore_mode: match args.restore_mode {
            None => String::new(),
            Some(RestoreModeArg::NoClaim) => "no_claim".into(),
            Some(RestoreModeArg::Claim) => "claim".into(),
        },
        restart_strategy_json: restart_json(&args.restart)?.map(|v| v.to_string()).unwrap_or_default(),
        placement: match args.placement {
            None => String::new(),
            Some(PlacementArg::Pack) => "pack".into(),
            Some(PlacementArg::Spread) => "spread".into(),
        },
    };
    let reply = ctx
        .session
        .call("submit job", Wait::Quick, |ch| {
            let req = req.clone();
            async move { Ok(AdminClient::new(ch).submit_job(req).await?.into_inner()) }
        })
        .await?;
    ctx.emit(&reply, |r| format!("job {} submitted (log index {})\n", r.job_id, r.log_index))
}

async fn config(ctx: &mut Ctx<'_>, args: ConfigArgs) -> Result<(), CtlError> {
    let Some(map) = checkpoint_json(&args.checkpoint)? else {
        return Err(CtlError::Usage(
            "nothing to change: pass --interval, --checkpoint-timeout, --min-pause, --max-concurrent, \
             --tolerable-failures, --retained, --savepoint-dir, --checkpoint-dir, --unaligned, \
             --aligned-checkpoint-timeout or --checkpoint JSON"
                .into(),
        ));
    };
    check_checkpoint_config(&map)?;
    let req = UpdateCheckpointConfigRequest {
        job_id: args.job.clone(),
        checkpoint_json: Value::Object(map).to_string(),
        request_id: ctx.request_id.clone(),
    };
    let reply = ctx
        .session
        .call("update checkpoint config", Wait::Quick, |ch| {
            let req = req.clone();
            async move { Ok(AdminClient::new(ch).update_checkpoint_config(req).await?.into_inner()) }
        })
        .await?;
    let job = args.job;
    ctx.emit(&reply, |r| {
        let config = r.checkpoint_config.as_ref().map(output::checkpoint_config).unwrap_or_default();
        format!("job {job}: checkpoint configuration updated\n{config}")
    })
}

async fn stop(ctx: &mut Ctx<'_>, args: StopArgs) -> Result<(), CtlError> {
    let req = StopWithSavepointRequest {
        job_id: args.job.clone(),
        target_dir: args.dir.unwrap_or_default(),
        drain: args.drain,
        request_id: ctx.request_id.clone(),
    };
    let reply = ctx
        .session
        .call("stop job with savepoint", Wait::Long, |ch| {
            let req = req.clone();
            async move { Ok(AdminClient::new(ch).stop_with_savepoint(req).await?.into_inner()) }
        })
        .await?;
    let job = args.job;
    ctx.emit(&reply, |r| format!("job {job} stopped with savepoint {}: {}\n", r.checkpoint_id, r.path))
}

/// Reads and decodes the job graph file, so a typo is reported here rather than by the cluster.
pub fn read_graph(path: &Path) -> Result<String, CtlError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CtlError::Usage(format!(
            "cannot read the job graph {}: {e}; pass a JSON file with --graph",
            path.display()
        ))
    })?;
    if let Err(e) = cairn_protocol::graph::JobGraph::from_json(&text) {
        let whole_spec = serde_json::from_str::<Value>(&text).is_ok_and(|v| v.get("graph").is_some());
        let hint = if whole_spec {
            "; the file looks like a whole job spec: --graph takes only its \"graph\" object"
        } else {
            "; it must be an object with \"vertices\" and \"edges\""
        };
        return Err(CtlError::Usage(format!("the job graph in {} is invalid: {e}{hint}", path.display())));
    }
    Ok(text)
}

/// The checkpoint configuration fields given: `--checkpoint` JSON (inline or `@file`), then the
/// flags on top. `None` when nothing was given.
pub fn checkpoint_json(flags: &CheckpointFlags) -> Result<Option<Map<String, Value>>, CtlError> {
    let mut map = match &flags.json {
        None => Map::new(),
        Some(arg) => {
            let (text, from) = match arg.strip_prefix('@') {
                Some(path) => {
                    let text = std::fs::read_to_string(path).map_err(|e| {
                        CtlError::Usage(format!("cannot read the checkpoint configuration file {path}: {e}"))
                    })?;
                    (text, format!("file {path}"))
                }
                None => (arg.clone(), "--checkpoint".to_owned()),
            };
            match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(m)) => m,
                Ok(_) => {
                    return Err(CtlError::Usage(format!(
                        "the checkpoint configuration in {from} must be a JSON object, e.g. \
                         '{{\"interval\":\"10s\",\"retained\":3}}'"
                    )));
                }
                Err(e) => {
                    return Err(CtlError::Usage(format!(
                        "the checkpoint configuration in {from} is not valid JSON: {e}"
                    )));
                }
            }
        }
    };
    if let Some(i) = flags.interval {
        map.insert(
            "interval".into(),
            match i {
                Interval::Every(d) => duration(d),
                Interval::Off => Value::Null,
            },
        );
    }
    if let Some(d) = flags.checkpoint_timeout {
        map.insert("timeout".into(), duration(d));
    }
    if let Some(d) = flags.min_pause {
        map.insert("min_pause".into(), duration(d));
    }
    if let Some(u) = flags.unaligned {
        map.insert("unaligned".into(), Value::Bool(u));
    }
    if let Some(d) = flags.aligned_checkpoint_timeout {
        map.insert("aligned_checkpoint_timeout".into(), duration(d));
    }
    for (key, v) in [
        ("max_concurrent", flags.max_concurrent),
        ("tolerable_failures", flags.tolerable_failures),
        ("retained", flags.retained),
    ] {
        if let Some(v) = v {
            map.insert(key.into(), Value::from(v));
        }
    }
    for (key, v) in [
        ("savepoint_dir", &flags.savepoint_dir),
        ("storage_dir", &flags.checkpoint_dir),
        ("externalized_retention", &flags.externalized_retention),
    ] {
        if let Some(v) = v {
            map.insert(key.into(), Value::String(v.clone()));
        }
    }
    Ok((!map.is_empty()).then_some(map))
}

/// A duration as the JSON configuration writes it (humantime).
fn duration(d: std::time::Duration) -> Value {
    Value::String(humantime::format_duration(d).to_string())
}

/// The restart strategy of `flags` as JSON, checked as the cluster will check it; `None` when
/// no strategy was given (the cluster's default applies).
pub fn restart_json(flags: &RestartFlags) -> Result<Option<Value>, CtlError> {
    let Some(raw) = &flags.restart_strategy else { return Ok(None) };
    let raw = raw.trim();
    let mut map = if raw.starts_with('{') || raw.starts_with('@') {
        let text = match raw.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| CtlError::Usage(format!("cannot read the restart strategy file {path}: {e}")))?,
            None => raw.to_owned(),
        };
        serde_json::from_str::<Map<String, Value>>(&text)
            .map_err(|e| CtlError::Usage(format!("--restart-strategy is not a JSON object: {e}")))?
    } else {
        Map::from_iter([("type".to_owned(), Value::String(raw.to_owned()))])
    };
    if let Some(n) = flags.restart_attempts {
        map.insert("attempts".into(), Value::from(n));
    }
    if let Some(d) = flags.restart_delay {
        map.insert("delay".into(), duration(d));
    }
    let value = Value::Object(map);
    let strategy: cairn_protocol::restart::RestartStrategy =
        serde_json::from_value(value.clone()).map_err(|e| {
            CtlError::Usage(format!(
                "invalid restart strategy: {e} (types: none, fixed-delay, failure-rate, exponential-delay; \
                 --restart-attempts applies to fixed-delay, --restart-delay to fixed-delay and failure-rate)"
            ))
        })?;
    strategy.validate().map_err(|e| CtlError::Usage(e.to_string()))?;
    Ok(Some(value))
}

/// Decodes the fields as the cluster will (unknown names and bad durations are refused) and
/// checks each given value; fields not given take valid defaults.
pub fn check_checkpoint_config(map: &Map<String, Value>) -> Result<(), CtlError> {
    let config: cairn_protocol::config::CheckpointConfig = serde_json::from_value(Value::Object(map.clone()))
        .map_err(|e| {
            CtlError::Usage(format!(
                "invalid checkpoint configuration: {e} (fields: interval, timeout, min_pause, \
                 max_concurrent, tolerable_failures, retained, savepoint_dir, storage_dir, \
                 externalized_retention, unaligned, aligned_checkpoint_timeout)"
            ))
        })?;
    config.validate().map_err(|e| CtlError::Usage(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn flags_override_the_json_and_durations_stay_humantime() {
        let flags = CheckpointFlags {
            json: Some(r#"{"interval":"1m","retained":2,"tolerable_failures":1}"#.into()),
            interval: Some(Interval::Every(Duration::from_millis(1500))),
            retained: Some(5),
            checkpoint_dir: Some("/cp".into()),
            ..Default::default()
        };
        let map = checkpoint_json(&flags).unwrap().unwrap();
        assert_eq!(map["interval"], "1s 500ms");
        assert_eq!(map["retained"], 5);
        assert_eq!(map["tolerable_failures"], 1);
        assert_eq!(map["storage_dir"], "/cp");
        check_checkpoint_config(&map).unwrap();
        let off = CheckpointFlags { interval: Some(Interval::Off), ..Default::default() };
        assert_eq!(checkpoint_json(&off).unwrap().unwrap()["interval"], Value::Null);
        assert!(checkpoint_json(&CheckpointFlags::default()).unwrap().is_none());
    }

    #[test]
    fn unaligned_flags_map_to_the_configuration_and_are_checked() {
        let flags = CheckpointFlags {
            unaligned: Some(true),
            aligned_checkpoint_timeout: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        let map = checkpoint_json(&flags).unwrap().unwrap();
        assert_eq!(
            (map["unaligned"].clone(), map["aligned_checkpoint_timeout"].clone()),
            (true.into(), "2s".into())
        );
        check_checkpoint_config(&map).unwrap();
        let stray = CheckpointFlags {
            aligned_checkpoint_timeout: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        let err =
            check_checkpoint_config(&checkpoint_json(&stray).unwrap().unwrap()).unwrap_err().to_string();
        assert!(err.contains("aligned_checkpoint_timeout") && err.contains("unaligned"), "{err}");
    }

    #[test]
    fn bad_checkpoint_json_is_refused_with_the_reason() {
        let bad = |json: &str| {
            let flags = CheckpointFlags { json: Some(json.into()), ..Default::default() };
            checkpoint_json(&flags).and_then(|m| check_checkpoint_config(&m.unwrap_or_default())).unwrap_err()
        };
        assert!(bad("{").to_string().contains("not valid JSON"));
        assert!(bad("[1]").to_string().contains("must be a JSON object"));
        assert!(bad(r#"{"intervall":"1s"}"#).to_string().contains("unknown field"));
        assert!(bad(r#"{"interval":"soon"}"#).to_string().contains("invalid checkpoint configuration"));
        assert!(bad(r#"{"interval":"1ms"}"#).to_string().contains("`interval`"));
        assert!(matches!(bad(r#"{"retained":0}"#), CtlError::Usage(_)));
    }

    #[test]
    fn checkpoint_json_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        std::fs::write(&path, r#"{"interval":"10s"}"#).unwrap();
        let flags = CheckpointFlags { json: Some(format!("@{}", path.display())), ..Default::default() };
        assert_eq!(checkpoint_json(&flags).unwrap().unwrap()["interval"], "10s");
        let missing = CheckpointFlags { json: Some("@/no/such/file.json".into()), ..Default::default() };
        assert!(checkpoint_json(&missing).unwrap_err().to_string().contains("/no/such/file.json"));
    }

    #[test]
    fn graph_files_are_read_and_decoded_before_submitting() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_graph(&dir.path().join("none.json")).unwrap_err();
        assert!(err.to_string().contains("cannot read the job graph"), "{err}");
        let spec = dir.path().join("spec.json");
        std::fs::write(&spec, r#"{"graph":{"vertices":[],"edges":[]}}"#).unwrap();
        let err = read_graph(&spec).unwrap_err();
        assert!(err.to_string().contains("whole job spec"), "{err}");
        let graph = dir.path().join("graph.json");
        std::fs::write(&graph, r#"{"vertices":[],"edges":[]}"#).unwrap();
        assert_eq!(read_graph(&graph).unwrap(), r#"{"vertices":[],"edges":[]}"#);
    }
}
