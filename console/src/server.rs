//! The console's HTTP routes: pages (`/cluster`, `/jobs`, ...), the same figures as JSON under
//! `/api/...`, actions (`POST /jobs/{job}/actions/{action}`), the login form and the assets.
//!
//! Every path segment and form field is validated before anything is asked of the cluster; a bad
//! one gets a 4xx naming what is wrong, and nothing changes.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Form, Path, Query, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, SET_COOKIE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use maud::Markup;
use serde::Deserialize;
use tokio::sync::watch;
use tonic::Code;

use crate::actions::{self, Action, ActionForm, ActionRequest};
use crate::auth::{AuthError, Caller, Gate, SESSION_COOKIE, same_origin};
use crate::model::*;
use crate::source::{Source, SourceError};
use crate::views::{self, Nav};

/// Header the live-update script sends to get only a page's `<main>`.
pub const FRAGMENT_HEADER: &str = "x-cairn-fragment";

/// What every handler shares.
pub struct AppState {
    pub source: Source,
    pub cluster: watch::Receiver<Arc<ClusterView>>,
    pub gate: Gate,
}

type AppRef = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(|| async { redirect("/cluster") }))
        .route("/cluster", get(cluster_page))
        .route("/api/cluster", get(cluster_api))
        .route("/jobs", get(jobs_page))
        .route("/api/jobs", get(jobs_api))
        .route("/jobs/{job}", get(job_page))
        .route("/api/jobs/{job}", get(job_api))
        .route("/jobs/{job}/checkpoints", get(checkpoints_page))
        .route("/api/jobs/{job}/checkpoints", get(checkpoints_api))
        .route("/jobs/{job}/checkpoints/{id}", get(checkpoint_page))
        .route("/api/jobs/{job}/checkpoints/{id}", get(checkpoint_api))
        .route("/workers", get(workers_page))
        .route("/api/workers", get(workers_api))
        .route("/jobs/{job}/actions/{action}", get(confirm_page).post(action_page))
        .route("/api/jobs/{job}/actions/{action}", post(action_api))
        .route("/login", get(login_page).post(login_submit))
        .route("/logout", post(logout))
        .route("/assets/console.css", get(|| async { asset("text/css; charset=utf-8", views::CSS) }))
        .route("/assets/console.js", get(|| async { asset("text/javascript; charset=utf-8", views::JS) }))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(headers_and_log))
        .with_state(state)
}

/// Security headers on every answer, and one debug line per request.
async fn headers_and_log(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let started = Instant::now();
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "same-origin"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    h.entry(CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    tracing::debug!(%method, path, status = resp.status().as_u16(), elapsed_us = started.elapsed().as_micros() as u64, "console request");
    resp
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(CONTENT_TYPE, content_type), (CACHE_CONTROL, "max-age=300")], body).into_response()
}

fn redirect(to: &str) -> Response {
    let location = HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/"));
    (StatusCode::SEE_OTHER, [(LOCATION, location)]).into_response()
}

/// A refusal or failure, rendered as a page or as JSON.
#[derive(Debug)]
pub struct WebError {
    status: StatusCode,
    message: String,
    json: bool,
}

impl WebError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), json: false }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn json(mut self, json: bool) -> Self {
        self.json = json;
        self
    }
}

impl From<AuthError> for WebError {
    fn from(e: AuthError) -> Self {
        let status = match e {
            AuthError::CrossSite(_) => StatusCode::FORBIDDEN,
            AuthError::WrongToken | AuthError::MalformedHeader | AuthError::Missing => {
                StatusCode::UNAUTHORIZED
            }
        };
        Self::new(status, e.to_string())
    }
}

impl From<SourceError> for WebError {
    fn from(e: SourceError) -> Self {
        let status = match &e {
            SourceError::Refused { code, .. } => match code {
                Code::NotFound => StatusCode::NOT_FOUND,
                Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
                Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
                Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
                Code::Unavailable | Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::BAD_GATEWAY,
            },
            SourceError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            SourceError::Setup(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let mut resp = if self.json {
            (self.status, Json(serde_json::json!({ "error": self.message }))).into_response()
        } else if self.status == StatusCode::UNAUTHORIZED {
            let main = maud::html! { (views::error(self.status.as_u16(), &self.message)) (views::login("/cluster", None)) };
            (self.status, views::page("Log in", Nav::None, false, false, main)).into_response()
        } else {
            let main = views::error(self.status.as_u16(), &self.message);
            (self.status, views::page("Error", Nav::None, false, false, main)).into_response()
        };
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"cairn-console\""));
        }
        resp
    }
}

type WebResult = Result<Response, WebError>;

fn job_id(raw: &str) -> Result<String, WebError> {
    cairn_protocol::job::JobId::new(raw)
        .map(|j| j.as_str().to_owned())
        .map_err(|e| WebError::bad_request(format!("job id `{}` is invalid: {e}", raw.escape_debug())))
}

fn checkpoint_id(raw: &str) -> Result<u64, WebError> {
    match raw.parse::<u64>() {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(WebError::bad_request(format!(
            "checkpoint id `{}` is invalid: expected a positive whole number",
            raw.escape_debug()
        ))),
    }
}

/// A page, or only its `<main>` for the live-update script.
fn render(headers: &HeaderMap, title: &str, nav: Nav, caller: Caller, main: Markup) -> Response {
    if headers.contains_key(FRAGMENT_HEADER) {
        return main.into_response();
    }
    views::page(title, nav, true, caller.is_authenticated(), main).into_response()
}

// ---- views ----

fn cluster_view(app: &AppState) -> ClusterView {
    ClusterView::clone(&app.cluster.borrow())
}

async fn cluster_page(State(app): AppRef, headers: HeaderMap) -> WebResult {
    let caller = app.gate.view(&headers)?;
    Ok(render(&headers, "Cluster", Nav::Cluster, caller, views::cluster(&cluster_view(&app))))
}

async fn cluster_api(State(app): AppRef, headers: HeaderMap) -> WebResult {
    app.gate.view(&headers).map_err(|e| WebError::from(e).json(true))?;
    Ok(Json(cluster_view(&app)).into_response())
}

async fn jobs_view(app: &AppState) -> Result<JobsView, WebError> {
    Ok(JobsView::from_reply(&app.source.list_jobs().await?))
}

async fn jobs_page(State(app): AppRef, headers: HeaderMap) -> WebResult {
    let caller = app.gate.view(&headers)?;
    Ok(render(&headers, "Jobs", Nav::Jobs, caller, views::jobs(&jobs_view(&app).await?)))
}

async fn jobs_api(State(app): AppRef, headers: HeaderMap) -> WebResult {
    let json = |e: WebError| e.json(true);
    app.gate.view(&headers).map_err(|e| json(e.into()))?;
    Ok(Json(jobs_view(&app).await.map_err(json)?).into_response())
}

async fn job_view(app: &AppState, raw: &str) -> Result<JobView, WebError> {
    let job = job_id(raw)?;
    Ok(JobView::from_details(&job, &app.source.describe_job(&job).await?))
}

async fn job_page(State(app): AppRef, headers: HeaderMap, Path(job): Path<String>) -> WebResult {
    let caller = app.gate.view(&headers)?;
    let v = job_view(&app, &job).await?;
    Ok(render(&headers, &format!("Job {}", v.job.job_id), Nav::Jobs, caller, views::job(&v)))
}

async fn job_api(State(app): AppRef, headers: HeaderMap, Path(job): Path<String>) -> WebResult {
    let json = |e: WebError| e.json(true);
    app.gate.view(&headers).map_err(|e| json(e.into()))?;
    Ok(Json(job_view(&app, &job).await.map_err(json)?).into_response())
}

async fn checkpoints_view(app: &AppState, raw: &str) -> Result<CheckpointsView, WebError> {
    let job = job_id(raw)?;
    let (overview, savepoints) =
        tokio::join!(app.source.list_checkpoints(&job), app.source.list_savepoints(&job));
    Ok(CheckpointsView::from_replies(&job, &overview?, &savepoints?))
}

async fn checkpoints_page(State(app): AppRef, headers: HeaderMap, Path(job): Path<String>) -> WebResult {
    let caller = app.gate.view(&headers)?;
    let v = checkpoints_view(&app, &job).await?;
    Ok(render(&headers, &format!("Checkpoints of {}", v.job_id), Nav::Jobs, caller, views::checkpoints(&v)))
}

async fn checkpoints_api(State(app): AppRef, headers: HeaderMap, Path(job): Path<String>) -> WebResult {
    let json = |e: WebError| e.json(true);
    app.gate.view(&headers).map_err(|e| json(e.into()))?;
    Ok(Json(checkpoints_view(&app, &job).await.map_err(json)?).into_response())
}

async fn checkpoint_view(app: &AppState, raw_job: &str, raw_id: &str) -> Result<CheckpointView, WebError> {
    let job = job_id(raw_job)?;
    let id = checkpoint_id(raw_id)?;
    Ok(CheckpointView::from_details(&job, id, &app.source.describe_checkpoint(&job, id).await?))
}

async fn checkpoint_page(
    State(app): AppRef,
    headers: HeaderMap,
    Path((job, id)): Path<(String, String)>,
) -> WebResult {
    let caller = app.gate.view(&headers)?;
    let v = checkpoint_view(&app, &job, &id).await?;
    let title = format!("Checkpoint {} of {}", v.checkpoint.id, v.job_id);
    Ok(render(&headers, &title, Nav::Jobs, caller, views::checkpoint(&v)))
}

async fn checkpoint_api(
    State(app): AppRef,
    headers: HeaderMap,
    Path((job, id)): Path<(String, String)>,
) -> WebResult {
    let json = |e: WebError| e.json(true);
    app.gate.view(&headers).map_err(|e| json(e.into()))?;
    Ok(Json(checkpoint_view(&app, &job, &id).await.map_err(json)?).into_response())
}

async fn workers_view(app: &AppState) -> Result<WorkersView, WebError> {
    Ok(WorkersView::from_reply(app.source.list_workers().await?))
}

async fn workers_page(State(app): AppRef, headers: HeaderMap) -> WebResult {
    let caller = app.gate.view(&headers)?;
    Ok(render(&headers, "Workers", Nav::Workers, caller, views::workers(&workers_view(&app).await?)))
}

async fn workers_api(State(app): AppRef, headers: HeaderMap) -> WebResult {
    let json = |e: WebError| e.json(true);
    app.gate.view(&headers).map_err(|e| json(e.into()))?;
    Ok(Json(workers_view(&app).await.map_err(json)?).into_response())
}

// ---- actions ----

async fn confirm_page(
    State(app): AppRef,
    headers: HeaderMap,
    Path((job, action)): Path<(String, String)>,
) -> WebResult {
    let caller = app.gate.view(&headers)?;
    let job = job_id(&job)?;
    let action = Action::parse(&action).map_err(|m| WebError::new(StatusCode::NOT_FOUND, m))?;
    // The job must exist; its interval pre-fills the interval form.
    let details = app.source.describe_job(&job).await?;
    let interval = details.checkpoint_config.map(|c| c.interval_ms);
    let main = views::confirm(&job, action, &actions::new_request_id(), caller.is_authenticated(), interval);
    Ok(views::page(action.title(), Nav::Jobs, false, caller.is_authenticated(), main).into_response())
}

async fn perform(
    app: &AppState,
    headers: &HeaderMap,
    job: &str,
    action: &str,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> Result<actions::Outcome, WebError> {
    // Authentication first: an unauthenticated caller learns nothing and changes nothing.
    let caller = app.gate.action(headers)?;
    let job = job_id(job)?;
    let action = Action::parse(action).map_err(|m| WebError::new(StatusCode::NOT_FOUND, m))?;
    let Form(form) =
        form.map_err(|e| WebError::new(e.status(), format!("the action's form: {}", e.body_text())))?;
    let req = ActionRequest::validate(action, &form).map_err(WebError::bad_request)?;
    tracing::info!(job = %job, action = action.slug(), request_id = %req.request_id, ?caller, "console action");
    let outcome = actions::run(&app.source, &job, &req).await.map_err(|e| {
        tracing::warn!(job = %job, action = action.slug(), request_id = %req.request_id, error = %e, "console action failed");
        WebError::from(e)
    })?;
    Ok(outcome)
}

async fn action_page(
    State(app): AppRef,
    headers: HeaderMap,
    Path((job, action)): Path<(String, String)>,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> WebResult {
    let outcome = perform(&app, &headers, &job, &action, form).await?;
    let main = views::action_done(&outcome.job_id, outcome.action, &outcome.message);
    Ok(views::page(outcome.action.title(), Nav::Jobs, false, true, main).into_response())
}

async fn action_api(
    State(app): AppRef,
    headers: HeaderMap,
    Path((job, action)): Path<(String, String)>,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> WebResult {
    let outcome = perform(&app, &headers, &job, &action, form).await.map_err(|e| e.json(true))?;
    Ok(Json(outcome).into_response())
}

// ---- login ----

#[derive(Debug, Default, Deserialize)]
struct LoginQuery {
    next: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct LoginForm {
    token: Option<String>,
    next: Option<String>,
}

/// Where to go after logging in: a path of this console only (no open redirect).
fn local_path(next: Option<&str>) -> String {
    match next {
        Some(p)
            if p.starts_with('/')
                && !p.starts_with("//")
                && p.len() <= 512
                && p.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            p.to_owned()
        }
        _ => "/cluster".to_owned(),
    }
}

async fn login_page(Query(q): Query<LoginQuery>) -> Response {
    let next = local_path(q.next.as_deref());
    views::page("Log in", Nav::None, false, false, views::login(&next, None)).into_response()
}

async fn login_submit(
    State(app): AppRef,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> WebResult {
    same_origin(&headers, false)?;
    let Form(form) =
        form.map_err(|e| WebError::new(e.status(), format!("the login form: {}", e.body_text())))?;
    let next = local_path(form.next.as_deref());
    let token = form.token.as_deref().map(str::trim).unwrap_or_default();
    if token.is_empty() || !app.gate.is_token(token) {
        tracing::warn!("console: login with a wrong admin token");
        let main = views::login(&next, Some("wrong admin token"));
        return Ok(
            (StatusCode::UNAUTHORIZED, views::page("Log in", Nav::None, false, false, main)).into_response()
        );
    }
    let cookie = format!("{SESSION_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", app.gate.session_value());
    let mut resp = redirect(&next);
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(SET_COOKIE, v);
    }
    Ok(resp)
}

async fn logout(headers: HeaderMap) -> WebResult {
    same_origin(&headers, false)?;
    let mut resp = redirect("/cluster");
    resp.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_static("cairn_console_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    Ok(resp)
}

async fn not_found(req: Request) -> WebError {
    let path = req.uri().path();
    WebError::new(StatusCode::NOT_FOUND, format!("no page at `{}`", path.escape_debug()))
        .json(path.starts_with("/api/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_paths_are_followed_after_login() {
        assert_eq!(local_path(Some("/jobs/a")), "/jobs/a");
        for bad in ["//evil.example/", "https://evil.example/", "jobs", "/a\\b", "/a b"] {
            assert_eq!(local_path(Some(bad)), "/cluster", "{bad}");
        }
        assert_eq!(local_path(None), "/cluster");
    }

    #[test]
    fn ids_are_validated() {
        assert!(job_id("demo-1.x").is_ok());
        assert_eq!(job_id("../etc").map_err(|e| e.status), Err(StatusCode::BAD_REQUEST));
        assert_eq!(checkpoint_id("12").ok(), Some(12));
        for bad in ["0", "-1", "x", "1e3", ""] {
            assert_eq!(checkpoint_id(bad).map_err(|e| e.status), Err(StatusCode::BAD_REQUEST), "{bad}");
        }
    }
}
