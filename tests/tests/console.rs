//! The web console over real HTTP against in-process clusters running the demo job: every view
//! renders the cluster's real figures (also on a follower, which reads through the leader),
//! actions need the admin token and change nothing without it, bad input gets a precise 4xx,
//! actions apply once per request id, and views can be made to need the token (login cookie,
//! same-origin check). The `cairn` binary serves it on `console_listen`, on every replica.

use std::net::SocketAddr;
use std::time::Duration;

use cairn_client::{AuthChannel, ClientError, LeaderClient};
use cairn_console::{Console, ConsoleConfig, SourceConfig};
use cairn_proto::admin::admin_client::AdminClient;
use cairn_proto::admin::*;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig as DemoSource;
use cairn_taskrt::worker::Worker;
use cairn_tests::http::{get, post_form};
use cairn_tests::inproc::{InProcCluster, test_timing};
use cairn_tests::procs::{ProcCluster, ProcOptions, failover_args};
use cairn_tests::{init_test_logging, wait};

const T: Duration = Duration::from_secs(60);

/// A bad action request: path, form fields, the status and what the answer must say.
type BadCase = (String, Vec<(&'static str, &'static str)>, u16, &'static str);

async fn admin<R, F, Fut>(c: &LeaderClient, mut f: F) -> Result<R, ClientError>
where
    F: FnMut(AdminClient<AuthChannel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
{
    let mut c = c.clone();
    c.call("admin call", move |ch| {
        let fut = f(AdminClient::new(ch));
        async move { fut.await.map(tonic::Response::into_inner) }
    })
    .await
}

/// Submits the demo job `job` (checkpoint every 300 ms, savepoints into `savepoints`).
async fn submit(
    c: &LeaderClient,
    job: &str,
    out: &std::path::Path,
    savepoints: &std::path::Path,
) -> anyhow::Result<()> {
    let graph = DemoJob {
        source: DemoSource {
            keys: 4,
            records_per_key: None,
            rate_per_sec: Some(500),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: out.display().to_string(),
        source_parallelism: 1,
        parallelism: 2,
        max_parallelism: 8,
    }
    .graph();
    let req = SubmitJobRequest {
        job_id: job.into(),
        graph_json: serde_json::to_string(&graph)?,
        checkpoint_json: serde_json::json!({
            "interval": "300ms", "timeout": "30s", "retained": 2,
            "savepoint_dir": savepoints.display().to_string(),
        })
        .to_string(),
        request_id: format!("submit-{job}"),
        ..Default::default()
    };
    admin(c, |mut a| {
        let req = req.clone();
        async move { a.submit_job(req).await }
    })
    .await?;
    Ok(())
}

async fn overview(c: &LeaderClient, job: &str) -> anyhow::Result<CheckpointOverview> {
    let req = JobRequest { job_id: job.into() };
    Ok(admin(c, |mut a| {
        let req = req.clone();
        async move { a.list_checkpoints(req).await }
    })
    .await?)
}

async fn details(c: &LeaderClient, job: &str) -> anyhow::Result<JobDetails> {
    let req = JobRequest { job_id: job.into() };
    Ok(admin(c, |mut a| {
        let req = req.clone();
        async move { a.describe_job(req).await }
    })
    .await?)
}

async fn savepoints(c: &LeaderClient, job: &str) -> anyhow::Result<usize> {
    let req = JobRequest { job_id: job.into() };
    Ok(admin(c, |mut a| {
        let req = req.clone();
        async move { a.list_savepoints(req).await }
    })
    .await?
    .savepoints
    .len())
}

/// Waits until `job` has at least `n` completed checkpoints.
async fn completed(c: &LeaderClient, job: &str, n: u64) -> anyhow::Result<CheckpointOverview> {
    wait::until(&format!("{n} completed checkpoints of {job}"), T, || async {
        let o = overview(c, job).await.ok()?;
        (o.counts.as_ref().map(|c| c.completed).unwrap_or(0) >= n).then_some(o)
    })
    .await
}

/// A console reading through the replica at `endpoint`.
async fn console(
    cluster: &InProcCluster,
    endpoint: SocketAddr,
    views_need_token: bool,
) -> anyhow::Result<Console> {
    let listener = cairn_console::bind("127.0.0.1:0").await?;
    Ok(Console::start(
        listener,
        ConsoleConfig {
            source: SourceConfig {
                endpoints: vec![endpoint.to_string()],
                token: cluster.admin_token().to_owned(),
                tls: None,
            },
            views_need_token,
            refresh: Duration::from_millis(200),
        },
    )?)
}

fn follower_of(cluster: &InProcCluster, leader: u64) -> anyhow::Result<SocketAddr> {
    cluster
        .addrs
        .iter()
        .find(|(id, _)| **id != leader)
        .map(|(_, a)| *a)
        .ok_or_else(|| anyhow::anyhow!("no follower"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_console_shows_the_cluster_its_jobs_checkpoints_and_workers() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(3, test_timing()).await?;
    let leader = cluster.wait_leader(T).await?;
    let worker = Worker::start(cluster.worker_config("console-w1"))?;
    let dir = tempfile::tempdir()?;
    let c = cluster.client()?;
    submit(&c, "shop", &dir.path().join("out"), &dir.path().join("sp")).await?;
    let o = completed(&c, "shop", 3).await?;
    let latest = o.latest_completed.as_ref().map(|s| s.id).unwrap_or(0);
    let console = console(&cluster, follower_of(&cluster, leader)?, false).await?;
    let at = console.local_addr();

    // Cluster: members, leader, term; the leader history fills in from the observer.
    let v = wait::until("the cluster view with three members", T, || async {
        let v = get("/api/cluster").send(at).await.ok()?.json().ok()?;
        // The replicated history reaches this follower with the leader's first entry.
        let replicated = v["leader_history"][0]["first_log_index"].is_u64();
        (v["nodes"].as_array().map(Vec::len) == Some(3) && replicated).then_some(v)
    })
    .await?;
    assert_eq!(v["leader_id"], leader);
    assert_eq!(v["leader_history"][0]["term"], v["term"], "{v}");
    assert!(v["term"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert_eq!(v["leader_history"][0]["leader_id"], leader, "{v}");
    let page = get("/cluster").send(at).await?;
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").is_some_and(|t| t.starts_with("text/html")));
    assert!(
        page.body.contains("Leader history") && page.body.contains(&format!("node {leader}")),
        "{}",
        page.body
    );
    assert!(page.body.contains(r#"<main data-live="2000">"#));

    // Jobs: status, attempts, latest checkpoint.
    let jobs = get("/api/jobs").send(at).await?.json()?;
    assert_eq!(jobs["jobs"][0]["job_id"], "shop");
    assert_eq!(jobs["jobs"][0]["status"], "running");
    let page = get("/jobs").send(at).await?;
    assert!(page.body.contains(r#"<a href="/jobs/shop">shop</a>"#), "{}", page.body);

    // One job: its tasks and the worker running them.
    let job = get("/api/jobs/shop").send(at).await?.json()?;
    assert_eq!(job["job"]["job_id"], "shop");
    assert_eq!(job["checkpoint_config"]["interval_ms"], 300);
    assert!(job["tasks"].as_array().is_some_and(|t| !t.is_empty()), "{job}");
    let page = get("/jobs/shop").send(at).await?;
    assert!(page.body.contains("console-w1") && page.body.contains(r#"id="tasks""#), "{}", page.body);

    // Checkpoints: counts, history, charts with one point per completed checkpoint.
    let cps = get("/api/jobs/shop/checkpoints").send(at).await?.json()?;
    let completed_now = cps["counts"]["completed"].as_u64().unwrap_or(0);
    assert!(completed_now >= 3, "{cps}");
    let page = get("/jobs/shop/checkpoints").send(at).await?;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains(r#"<svg id="chart-duration""#) && page.body.contains(r#"<svg id="chart-size""#)
    );
    let points = page.body.matches("<circle").count();
    assert!(points >= 2 * 3, "two charts of at least 3 points: {points}");
    assert!(page.body.contains(&format!(r#"data-checkpoint="{latest}""#)), "{}", page.body);

    // One checkpoint: per-subtask figures, slowest first.
    let cp = get(&format!("/api/jobs/shop/checkpoints/{latest}")).send(at).await?.json()?;
    assert_eq!(cp["checkpoint"]["id"], latest);
    assert_eq!(cp["checkpoint"]["status"], "completed");
    let e2e: Vec<u64> = cp["subtasks"]
        .as_array()
        .map(|s| s.iter().filter_map(|s| s["end_to_end_ms"].as_u64()).collect())
        .unwrap_or_default();
    assert!(e2e.len() >= 3, "{cp}");
    assert!(e2e.windows(2).all(|w| w[0] >= w[1]), "slowest first: {e2e:?}");
    let page = get(&format!("/jobs/shop/checkpoints/{latest}")).send(at).await?;
    assert!(page.body.contains("Subtasks, slowest first") && page.body.contains("Alignment"));

    // Workers and slots.
    let w = get("/api/workers").send(at).await?.json()?;
    assert_eq!(w["workers"][0]["worker_id"], "console-w1", "{w}");
    assert!(w["workers"][0]["slots_used"].as_u64().unwrap_or(0) >= 1, "{w}");
    assert_eq!(w["workers"][0]["jobs"][0], "shop");
    assert_eq!(w["workers"][0]["state"], "attached", "{w}");
    assert_eq!(w["used_slots"], w["workers"][0]["slots_used"], "{w}");

    // The live-update script gets only the <main> of a page.
    let fragment = get("/jobs").header("x-cairn-fragment", "1").send(at).await?;
    assert!(
        fragment.body.starts_with("<h1>Jobs</h1>") && !fragment.body.contains("<html"),
        "{}",
        fragment.body
    );
    let js = get("/assets/console.js").send(at).await?;
    assert!(js.status == 200 && js.body.contains("x-cairn-fragment"));

    console.shutdown().await;
    worker.shutdown().await;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_need_the_token_validate_their_input_and_apply_once() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(3, test_timing()).await?;
    let leader = cluster.wait_leader(T).await?;
    let worker = Worker::start(cluster.worker_config("console-w2"))?;
    let dir = tempfile::tempdir()?;
    let c = cluster.client()?;
    submit(&c, "pay", &dir.path().join("out"), &dir.path().join("sp")).await?;
    completed(&c, "pay", 1).await?;
    let console = console(&cluster, follower_of(&cluster, leader)?, false).await?;
    let at = console.local_addr();
    let token = cluster.admin_token().to_owned();
    let host = at.to_string();
    let origin = format!("http://{host}");

    // Unauthenticated, wrongly authenticated or cross-site callers: refused, nothing changes.
    let before_interval = details(&c, "pay").await?.checkpoint_config.map(|c| c.interval_ms);
    let confirmed = [("confirm", "yes"), ("request_id", "nope-1")];
    for action in ["savepoint", "cancel", "stop", "checkpoint"] {
        let path = format!("/jobs/pay/actions/{action}");
        let r = post_form(&path, &confirmed).send(at).await?;
        assert_eq!(r.status, 401, "{action}: {}", r.body);
        assert!(r.header("www-authenticate").is_some());
        let r =
            post_form(&format!("/api{path}"), &confirmed).bearer("wrong-token-wrong-token").send(at).await?;
        assert_eq!(
            (r.status, r.json()?["error"].as_str().map(str::to_owned)),
            (401, Some("wrong admin token".into()))
        );
        // A forged session cookie is no session.
        let r = post_form(&path, &confirmed)
            .header("cookie", "cairn_console_session=00ff00ff")
            .header("origin", &origin)
            .send(at)
            .await?;
        assert_eq!(r.status, 401, "{action}");
    }
    let r = post_form(
        "/jobs/pay/actions/interval",
        &[("confirm", "yes"), ("request_id", "n-2"), ("interval", "9s")],
    )
    .send(at)
    .await?;
    assert_eq!(r.status, 401);
    // A GET never acts.
    assert_eq!(get("/jobs/pay/actions/cancel").send(at).await?.status, 200);
    assert_eq!(savepoints(&c, "pay").await?, 0, "no savepoint was taken");
    let d = details(&c, "pay").await?;
    assert_eq!(d.summary.map(|s| s.status), Some("running".into()), "the job still runs");
    assert_eq!(d.checkpoint_config.map(|c| c.interval_ms), before_interval, "the interval is unchanged");

    // Bad input: a precise 4xx, nothing changes.
    let cases: Vec<BadCase> = vec![
        ("/api/jobs/..x/actions/savepoint".into(), confirmed.to_vec(), 400, "job id `..x` is invalid"),
        ("/api/jobs/nosuch/actions/savepoint".into(), confirmed.to_vec(), 404, "nosuch"),
        ("/api/jobs/pay/actions/explode".into(), confirmed.to_vec(), 404, "unknown action `explode`"),
        ("/api/jobs/pay/actions/savepoint".into(), vec![("request_id", "r-3")], 400, "not confirmed"),
        ("/api/jobs/pay/actions/savepoint".into(), vec![("confirm", "yes")], 400, "request_id is missing"),
        (
            "/api/jobs/pay/actions/savepoint".into(),
            vec![("confirm", "yes"), ("request_id", "a%20b")],
            400,
            "request_id must be",
        ),
        (
            "/api/jobs/pay/actions/interval".into(),
            vec![("confirm", "yes"), ("request_id", "r-4"), ("interval", "soon")],
            400,
            "interval `soon` is not a duration",
        ),
        (
            "/api/jobs/pay/actions/interval".into(),
            vec![("confirm", "yes"), ("request_id", "r-5"), ("interval", "1ms")],
            400,
            "out of range",
        ),
    ];
    for (path, fields, status, says) in &cases {
        let r = post_form(path, fields).bearer(&token).send(at).await?;
        let msg = r.json()?["error"].as_str().unwrap_or_default().to_owned();
        assert_eq!(r.status, *status, "{path} {fields:?}: {msg}");
        assert!(msg.contains(says), "{path} {fields:?}: {msg:?} should say {says:?}");
    }
    for (path, status) in [
        ("/api/jobs/pay/checkpoints/0", 400),
        ("/api/jobs/pay/checkpoints/abc", 400),
        ("/api/jobs/pay/checkpoints/99999", 404),
        ("/jobs/%2e%2e", 400),
        ("/api/nothing-here", 404),
    ] {
        assert_eq!(get(path).send(at).await?.status, status, "{path}");
    }
    assert_eq!(savepoints(&c, "pay").await?, 0);
    assert_eq!(details(&c, "pay").await?.checkpoint_config.map(|c| c.interval_ms), before_interval);

    // With the token: a savepoint, submitted twice with one request id, is taken once.
    let fields = [("confirm", "yes"), ("request_id", "console-sp-1")];
    let first = post_form("/api/jobs/pay/actions/savepoint", &fields).bearer(&token).send(at).await?;
    assert_eq!(first.status, 200, "{}", first.body);
    let again = post_form("/api/jobs/pay/actions/savepoint", &fields).bearer(&token).send(at).await?;
    assert_eq!(first.json()?["checkpoint_id"], again.json()?["checkpoint_id"]);
    assert_eq!(savepoints(&c, "pay").await?, 1);

    // The interval, by the HTML form with a login cookie from this console's own page.
    let login = post_form("/login", &[("token", &token), ("next", "/jobs/pay")])
        .header("origin", &origin)
        .send(at)
        .await?;
    assert_eq!((login.status, login.header("location")), (303, Some("/jobs/pay")));
    let cookie = login.header("set-cookie").and_then(|c| c.split(';').next()).unwrap_or_default().to_owned();
    assert!(cookie.starts_with("cairn_console_session="), "{cookie}");
    let form = get("/jobs/pay/actions/interval").header("cookie", &cookie).send(at).await?;
    assert!(
        form.body.contains(r#"name="request_id""#)
            && form.body.contains("Confirm: Change checkpoint interval")
    );
    let interval = [("confirm", "yes"), ("request_id", "console-int-1"), ("interval", "2s")];
    let foreign = post_form("/jobs/pay/actions/interval", &interval)
        .header("cookie", &cookie)
        .header("origin", "http://attacker.example")
        .send(at)
        .await?;
    assert_eq!(foreign.status, 403, "{}", foreign.body);
    let no_origin =
        post_form("/jobs/pay/actions/interval", &interval).header("cookie", &cookie).send(at).await?;
    assert_eq!(no_origin.status, 403);
    assert_eq!(details(&c, "pay").await?.checkpoint_config.map(|c| c.interval_ms), before_interval);
    let done = post_form("/jobs/pay/actions/interval", &interval)
        .header("cookie", &cookie)
        .header("origin", &origin)
        .send(at)
        .await?;
    assert_eq!(done.status, 200, "{}", done.body);
    assert!(done.body.contains("checkpoint interval of job pay set to 2s"), "{}", done.body);
    assert_eq!(details(&c, "pay").await?.checkpoint_config.map(|c| c.interval_ms), Some(2000));

    // Cancel: the job ends.
    let r =
        post_form("/api/jobs/pay/actions/cancel", &[("confirm", "yes"), ("request_id", "console-cancel-1")])
            .bearer(&token)
            .send(at)
            .await?;
    assert_eq!(r.status, 200, "{}", r.body);
    wait::until("job pay cancelled", T, || async {
        let s = details(&c, "pay").await.ok()?.summary?.status;
        (s == "cancelled" || s == "canceled").then_some(())
    })
    .await?;

    console.shutdown().await;
    worker.shutdown().await;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_need_the_token_when_configured_so() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(1, test_timing()).await?;
    cluster.wait_leader(T).await?;
    let c = cluster.client()?;
    let dir = tempfile::tempdir()?;
    submit(&c, "quiet", &dir.path().join("out"), &dir.path().join("sp")).await?;
    let endpoint = cluster.addrs.values().next().copied().ok_or_else(|| anyhow::anyhow!("no replica"))?;
    let console = console(&cluster, endpoint, true).await?;
    let at = console.local_addr();
    let token = cluster.admin_token().to_owned();

    for path in
        ["/api/jobs", "/api/cluster", "/api/jobs/quiet", "/api/jobs/quiet/checkpoints", "/api/workers"]
    {
        let r = get(path).send(at).await?;
        assert_eq!(r.status, 401, "{path}");
        assert!(!r.body.contains("quiet"), "{path} leaks: {}", r.body);
        assert_eq!(get(path).bearer(&token).send(at).await?.status, 200, "{path}");
    }
    let page = get("/jobs").send(at).await?;
    assert_eq!(page.status, 401);
    assert!(page.body.contains(r#"name="token""#), "the page offers the login form");

    // A wrong login: 401, no cookie.
    let wrong = post_form("/login", &[("token", "not-the-token-at-all")]).send(at).await?;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    // The right one: a session cookie that opens the views; an open redirect is refused.
    let ok = post_form("/login", &[("token", &token), ("next", "//evil.example/x")]).send(at).await?;
    assert_eq!((ok.status, ok.header("location")), (303, Some("/cluster")));
    let set = ok.header("set-cookie").unwrap_or_default().to_owned();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && !set.contains(&token), "{set}");
    let cookie = set.split(';').next().unwrap_or_default().to_owned();
    let jobs = get("/api/jobs").header("cookie", &cookie).send(at).await?.json()?;
    assert_eq!(jobs["jobs"][0]["job_id"], "quiet");
    // Logging out clears it.
    let out = post_form("/logout", &[]).header("cookie", &cookie).send(at).await?;
    assert!(out.header("set-cookie").is_some_and(|c| c.contains("Max-Age=0")));

    console.shutdown().await;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cairn_binary_serves_the_console_on_console_listen() -> anyhow::Result<()> {
    init_test_logging();
    let options = ProcOptions { console: true, ..ProcOptions::default() };
    let cluster = ProcCluster::start_with_options(
        3,
        &failover_args("8s").iter().map(String::as_str).collect::<Vec<_>>(),
        options,
    )?;
    let mut c = cluster.client()?;
    let leader = wait::until("a leader", T, || {
        let mut c = c.clone();
        async move { c.status().await.ok().map(|s| s.leader_id).filter(|l| *l > 0) }
    })
    .await?;
    c.register_job("bin-job", "").await?;
    for (id, node) in &cluster.nodes {
        let at: SocketAddr =
            node.console_addr.as_deref().ok_or_else(|| anyhow::anyhow!("no console"))?.parse()?;
        // Each replica's console, the followers' through the leader, shows the same cluster.
        let v = wait::until(&format!("node {id}'s console"), T, || async {
            let v = get("/api/cluster").send(at).await.ok()?.json().ok()?;
            (v["leader_id"] == leader && v["nodes"].as_array().map(Vec::len) == Some(3)).then_some(v)
        })
        .await?;
        assert_eq!(v["leader_id"], leader);
        let jobs = get("/api/jobs").send(at).await?.json()?;
        assert_eq!(jobs["jobs"][0]["job_id"], "bin-job", "node {id}: {jobs}");
        // Actions need the token here too; with it, they act.
        let fields = [("confirm", "yes"), ("request_id", "bin-cancel-1")];
        let r = post_form("/api/jobs/bin-job/actions/cancel", &fields).send(at).await?;
        assert_eq!(r.status, 401, "node {id}: {}", r.body);
    }
    let at: SocketAddr = cluster
        .nodes
        .values()
        .find(|n| n.id != leader)
        .and_then(|n| n.console_addr.as_deref())
        .ok_or_else(|| anyhow::anyhow!("no follower console"))?
        .parse()?;
    let fields = [("confirm", "yes"), ("request_id", "bin-cancel-1")];
    let r =
        post_form("/api/jobs/bin-job/actions/cancel", &fields).bearer(cluster.admin_token()).send(at).await?;
    assert_eq!(r.status, 200, "{}", r.body);
    let job = c.get_job("bin-job").await?;
    assert!(job.status.contains("cancel"), "{job:?}");
    Ok(())
}
