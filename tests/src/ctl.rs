//! Running the real `cairnctl` binary in tests, as an operator would: exit code, stdout, stderr.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use cairn_protocol::checkpoint::layout::METADATA_FILE;
use cairn_protocol::checkpoint::read_metadata_unverified;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::demo::verify::Expectation;
use cairn_taskrt::demo::{DemoJob, source_offsets};
use serde_json::Value;

use crate::procs::{ProcCluster, binary};
use crate::wait;

/// Runs `cairnctl` with a clean environment (no `CAIRN_*` variables leak in from the shell).
#[derive(Debug, Clone)]
pub struct Ctl {
    pub bin: PathBuf,
    /// `CAIRN_ENDPOINTS` (a command's `--endpoints` wins over it).
    pub endpoints: String,
    /// `CAIRN_ADMIN_TOKEN_FILE`, when set.
    pub token_file: Option<PathBuf>,
}

impl Ctl {
    /// `cairnctl` against every replica of `cluster`, with its admin token.
    pub fn for_cluster(cluster: &ProcCluster) -> anyhow::Result<Self> {
        Ok(Self {
            bin: binary("cairnctl")?,
            endpoints: cluster.addrs().join(","),
            token_file: Some(cluster.admin_token_file().to_path_buf()),
        })
    }

    /// The same, without any admin token.
    pub fn without_token(&self) -> Self {
        Self { token_file: None, ..self.clone() }
    }

    pub async fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut cmd = tokio::process::Command::new(&self.bin);
        for var in ["CAIRN_ENDPOINTS", "CAIRN_ADMIN_TOKEN", "CAIRN_ADMIN_TOKEN_FILE"] {
            cmd.env_remove(var);
        }
        cmd.env("CAIRN_ENDPOINTS", &self.endpoints);
        if let Some(f) = &self.token_file {
            cmd.env("CAIRN_ADMIN_TOKEN_FILE", f);
        }
        Ok(cmd.args(args).kill_on_drop(true).output().await?)
    }

    /// Runs and requires exit code `want`; returns stdout.
    pub async fn expect(&self, want: i32, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args).await?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            out.status.code() == Some(want),
            "cairnctl {args:?} exited with {:?}, wanted {want}\nstdout: {stdout}\nstderr: {stderr}",
            out.status.code()
        );
        Ok(stdout)
    }

    pub async fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        self.expect(0, args).await
    }

    /// Runs with `--output json` and requires success; returns the reply.
    pub async fn json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let text = self.ok(&all).await?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("cairnctl {args:?}: not JSON ({e}): {text}"))
    }

    /// The stderr of a run expected to fail with `want`.
    pub async fn fails(&self, want: i32, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args).await?;
        anyhow::ensure!(
            out.status.code() == Some(want),
            "cairnctl {args:?} exited with {:?}, wanted {want}\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The demo job writing to `output`: 4 keys, an endless source at 500 records/s, 3 subtasks.
pub fn demo_graph(output: &Path) -> DemoJob {
    DemoJob {
        source: SourceConfig {
            keys: 4,
            records_per_key: None,
            rate_per_sec: Some(500),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 1,
        parallelism: 2,
        max_parallelism: 16,
    }
}

/// The number at `path` in a JSON reply (0 when absent or null).
pub fn u64_at(v: &Value, path: &[&str]) -> u64 {
    path.iter().fold(v, |v, k| &v[k]).as_u64().unwrap_or(0)
}

/// The string at `path` in a JSON reply ("" when absent).
pub fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter().fold(v, |v, k| &v[k]).as_str().unwrap_or("")
}

/// Waits until `job` has at least `n` completed checkpoints; returns its checkpoint overview.
pub async fn completed(ctl: &Ctl, job: &str, n: u64, timeout: Duration) -> anyhow::Result<Value> {
    wait::until(&format!("{n} completed checkpoints of {job}"), timeout, || async {
        let v = ctl.json(&["checkpoint", "list", job]).await.ok()?;
        (u64_at(&v, &["counts", "completed"]) >= n).then_some(v)
    })
    .await
}

/// The job's status (`running`, `restarting`, `failed`, ...).
pub async fn job_status(ctl: &Ctl, job: &str) -> anyhow::Result<String> {
    Ok(str_at(&ctl.json(&["job", "describe", job]).await?, &["summary", "status"]).to_owned())
}

/// The source offsets (key → records emitted) a snapshot holds: a savepoint directory, or a
/// retained checkpoint's `chk-<id>` directory (whose handles resolve against its job directory).
pub fn savepoint_offsets(dir: &Path) -> anyhow::Result<BTreeMap<u64, u64>> {
    let meta = read_metadata_unverified(&dir.join(METADATA_FILE))?;
    let base = if meta.kind == "checkpoint" { dir.parent().unwrap_or(dir) } else { dir };
    Ok(source_offsets(&meta, base, "source")?)
}

/// Stops `job` with a savepoint into `dir`; checks the path exists and the job finishes.
pub async fn stop(ctl: &Ctl, job: &str, dir: &Path) -> anyhow::Result<(u64, PathBuf)> {
    let reply = ctl.json(&["job", "stop", job, "--savepoint", "--dir", &dir.display().to_string()]).await?;
    let path = PathBuf::from(str_at(&reply, &["path"]));
    anyhow::ensure!(path.starts_with(dir), "savepoint outside {}: {reply}", dir.display());
    anyhow::ensure!(path.join(METADATA_FILE).is_file(), "no _metadata in {}", path.display());
    wait::until(&format!("job {job} to finish"), Duration::from_secs(60), || async {
        (job_status(ctl, job).await.ok()? == "finished").then_some(())
    })
    .await?;
    Ok((u64_at(&reply, &["checkpoint_id"]), path))
}

/// Waits until the committed output in `output` holds exactly the records `offsets` (key →
/// records emitted, e.g. of the final savepoint), each exactly once and no other; a duplicate,
/// gap or wrong sequence at any point fails at once.
pub async fn exactly_once(
    output: &Path,
    offsets: &BTreeMap<u64, u64>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let expect = Expectation { keys: None, records_per_key: None, counts: Some(offsets.clone()) };
    let verdict = crate::output::until_exactly_once(output, &expect, timeout).await?;
    anyhow::ensure!(verdict.records == offsets.values().sum::<u64>(), "{verdict}");
    Ok(())
}
