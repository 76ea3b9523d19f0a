//! The web console's browser suite: headless Chromium against `cairn-demo` (three replicas, a
//! worker and the demo job, each replica serving the console).
//!
//! Checks, in a real browser, that every view renders the cluster's figures (the cluster page on a
//! follower's console, which reads through the leader), that a live page refreshes itself, and
//! that an operator can log in and trigger a savepoint; writes a screenshot of each page under
//! `<target dir>/console-screenshots/`. Exits non-zero on the first failed check.
//!
//! ```text
//! tests/console/run.sh            # installs chromium when missing, builds, runs this
//! cargo run -p cairn-tests --bin cairn-console-browser -- [--chromium /usr/bin/chromium]
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use cairn_tests::cdp::{Browser, Page};
use cairn_tests::http::get;
use cairn_tests::procs::{binary, free_port_run};
use clap::Parser;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const T: Duration = Duration::from_secs(60);

#[derive(Parser)]
struct Args {
    /// The Chromium binary.
    #[arg(long, env = "CAIRN_CHROMIUM", default_value = "chromium")]
    chromium: PathBuf,
    /// Where the screenshots go (default: <target dir>/console-screenshots).
    #[arg(long)]
    screenshots: Option<PathBuf>,
}

/// `cairn-demo` as a child process; stopped with SIGTERM (by its PID) on drop.
struct Demo {
    child: Child,
    log: PathBuf,
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
            for _ in 0..100 {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn chromium_path(name: &Path) -> anyhow::Result<PathBuf> {
    if name.components().count() > 1 {
        return Ok(name.to_owned());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!("{} not found on PATH; install it (apt-get install chromium)", name.display())
        })
}

async fn shot(page: &mut Page, dir: &Path, name: &str) -> anyhow::Result<()> {
    let path = page.screenshot(&dir.join(format!("{name}.png"))).await?;
    println!("  screenshot {}", path.display());
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let chromium = chromium_path(&args.chromium)?;
    let target = std::env::current_exe()?
        .parent()
        .and_then(Path::parent)
        .map(Path::to_owned)
        .ok_or_else(|| anyhow::anyhow!("cannot find the target directory"))?;
    let screenshots = args.screenshots.unwrap_or_else(|| target.join("console-screenshots"));
    let data = tempfile::tempdir()?;

    // The demo: replicas on base+1..3, consoles on console_base+1..3.
    let base = free_port_run(3)? - 1;
    let console_base = free_port_run(3)? - 1;
    let log = data.path().join("demo.log");
    let child = Command::new(binary("cairn-demo")?)
        .args(["--data-dir", &data.path().join("demo").display().to_string()])
        .args(["--base-port", &base.to_string(), "--console-base-port", &console_base.to_string()])
        .args(["--interval", "500ms", "--rate", "200"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(data.path().join("demo.err"))?)
        .spawn()
        .context("starting cairn-demo")?;
    let demo = Demo { child, log };
    let leader_console: std::net::SocketAddr = format!("127.0.0.1:{}", console_base + 1).parse()?;
    let url = |port_offset: u16, path: &str| format!("http://127.0.0.1:{}{path}", console_base + port_offset);

    // The demo prints its console URL, then checkpoints.
    cairn_tests::wait::until("cairn-demo to print its console URL", T, || async {
        std::fs::read_to_string(&demo.log).ok()?.contains(&url(1, "/")).then_some(())
    })
    .await
    .with_context(|| {
        format!("cairn-demo output: {}", std::fs::read_to_string(&demo.log).unwrap_or_default())
    })?;
    let latest = cairn_tests::wait::until("3 completed checkpoints of the demo job", T, || async {
        let v = get("/api/jobs/demo/checkpoints").send(leader_console).await.ok()?.json().ok()?;
        (v["counts"]["completed"].as_u64()? >= 3).then(|| v["latest_completed"]["id"].as_u64()).flatten()
    })
    .await?;
    let cluster = get("/api/cluster").send(leader_console).await?.json()?;
    let leader = cluster["leader_id"].as_u64().unwrap_or(0);
    let follower = (1..=3u16).find(|i| u64::from(*i) != leader).unwrap_or(2);
    println!("cairn-demo up: leader node {leader}, follower console {}", url(follower, "/"));

    let browser = Browser::start(&chromium, (1280, 900))?;
    let mut page = browser.page().await?;

    // Cluster, on a follower's console: three members, the leader marked, the history.
    println!("cluster view (follower's console)");
    page.navigate(&url(follower, "/cluster")).await?;
    page.wait_for("three members", "document.querySelectorAll('#members tbody tr').length === 3", T).await?;
    let leader_row = page
        .eval(&format!("document.querySelector('#members tr[data-node=\"{leader}\"]').textContent"))
        .await?;
    anyhow::ensure!(leader_row.as_str().is_some_and(|t| t.contains("leader")), "leader row: {leader_row}");
    page.wait_for(
        "a leader in the history",
        "document.querySelectorAll('#leader-history tbody tr[data-term]').length >= 1",
        T,
    )
    .await?;
    // Live: the script replaces <main> from the server while the page is open.
    page.wait_for("a live refresh", "document.querySelector('main').getAttribute('data-updated')", T).await?;
    page.wait_for("the live status", "document.getElementById('live-status').textContent === 'live'", T)
        .await?;
    shot(&mut page, &screenshots, "cluster").await?;

    println!("jobs view");
    page.navigate(&url(1, "/jobs")).await?;
    page.wait_for(
        "the demo job running",
        "(document.querySelector('#jobs tr[data-job=\"demo\"]') || {textContent: ''}).textContent.includes('running')",
        T,
    )
    .await?;
    shot(&mut page, &screenshots, "jobs").await?;

    println!("job view");
    page.navigate(&url(1, "/jobs/demo")).await?;
    page.wait_for(
        "tasks on the demo worker",
        "document.querySelector('#tasks').textContent.includes('demo-worker')",
        T,
    )
    .await?;
    page.wait_for("the worker's slots", "document.querySelectorAll('#workers tbody tr').length === 1", T)
        .await?;
    shot(&mut page, &screenshots, "job").await?;

    println!("checkpoints view");
    page.navigate(&url(1, "/jobs/demo/checkpoints")).await?;
    page.wait_for("the duration chart", "document.querySelectorAll('#chart-duration circle').length >= 3", T)
        .await?;
    page.wait_for("the size chart", "document.querySelectorAll('#chart-size circle').length >= 3", T).await?;
    page.wait_for("the history", "document.querySelectorAll('#history tbody tr').length >= 3", T).await?;
    let chart_width =
        page.eval("document.querySelector('#chart-duration').getBoundingClientRect().width").await?;
    anyhow::ensure!(chart_width.as_f64().unwrap_or(0.0) > 100.0, "the chart is drawn: width {chart_width}");
    shot(&mut page, &screenshots, "checkpoints").await?;

    println!("checkpoint view (#{latest})");
    page.navigate(&url(1, &format!("/jobs/demo/checkpoints/{latest}"))).await?;
    page.wait_for("subtask figures", "document.querySelectorAll('#subtasks tbody tr').length >= 3", T)
        .await?;
    shot(&mut page, &screenshots, "checkpoint").await?;

    println!("workers view");
    page.navigate(&url(1, "/workers")).await?;
    page.wait_for(
        "the demo worker, attached and running the demo job",
        "Array.from(document.querySelectorAll('#workers tr[data-state=attached]')).some(r => \
         r.dataset.worker === 'demo-worker' && r.querySelector('a[href=\"/jobs/demo\"]'))",
        T,
    )
    .await?;
    shot(&mut page, &screenshots, "workers").await?;

    // An action: log in on a follower's console, confirm a savepoint, see it listed.
    println!("action: trigger a savepoint from a follower's console");
    let token = std::fs::read_to_string(data.path().join("demo/admin-token"))?.trim().to_owned();
    page.navigate(&url(follower, "/jobs/demo/actions/savepoint")).await?;
    page.wait_for(
        "the login prompt",
        "document.body.textContent.includes('Actions need the admin token')",
        T,
    )
    .await?;
    page.navigate(&url(follower, "/login?next=/jobs/demo/actions/savepoint")).await?;
    page.wait_for("the login form", "document.querySelector('form.login') !== null", T).await?;
    page.eval(&format!(
        "document.querySelector('input[name=token]').value = {}; document.querySelector('form.login button').click(); true",
        serde_json::to_string(&token)?
    ))
    .await?;
    page.wait_for("the confirmation form", "document.getElementById('confirm') !== null", T).await?;
    shot(&mut page, &screenshots, "confirm-savepoint").await?;
    page.eval("document.getElementById('confirm').click(); true").await?;
    let outcome = page
        .wait_for(
            "the savepoint's outcome",
            // The outcome, or the error page's message (then the check below fails at once).
            "(document.getElementById('outcome') || document.getElementById('error') || {textContent: ''}).textContent",
            Duration::from_secs(150),
        )
        .await?;
    println!("  outcome: {outcome}");
    anyhow::ensure!(
        outcome.as_str().is_some_and(|o| o.contains("savepoint") && o.contains("written to")),
        "{outcome}"
    );
    shot(&mut page, &screenshots, "savepoint-done").await?;
    page.navigate(&url(follower, "/jobs/demo/checkpoints")).await?;
    page.wait_for(
        "the savepoint listed",
        "document.querySelectorAll('#savepoints tbody tr').length === 1",
        T,
    )
    .await?;
    shot(&mut page, &screenshots, "checkpoints-with-savepoint").await?;

    drop(page);
    drop(browser);
    drop(demo);
    println!("console browser suite: all checks passed; screenshots in {}", screenshots.display());
    Ok(())
}
