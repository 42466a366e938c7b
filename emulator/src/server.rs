//! The emulator's HTTP/1.1 server: accept loop, routing, and the non-model endpoints.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`
//! (JSON or streamed, see [`crate::responses`]), `GET /v1/models`,
//! `GET /health`, `GET /metrics`, `GET /version`, `GET /debug/requests[?since=SEQ]`,
//! `DELETE /debug/requests`, `POST /admin/fail?mode=none|503|hang|die`,
//! `POST /admin/reset-cache`, `GET /admin/state`, `POST /admin/metrics-override`. Anything
//! else: 404 JSON error (405 for a known path with the wrong method). Every response carries `x-replica-id`,
//! and echoes the request's [`DECISION_HEADER`] if it has one (the router's decision, for
//! `prefix-load`'s per-request records: the gateway sends it upstream only).
//!
//! Failure modes apply to every path except `/admin/*` and `/debug/*` (so a test can always
//! observe and flip a replica): `503` answers 503, `hang` never answers, `die` exits the process.
//!
//! Concurrency: one tokio task per connection, one timer per waiting sequence; sockets get
//! TCP_NODELAY. Request bodies are read completely, up to [`MAX_BODY`] (413 above).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::body::EmuBody;
use crate::cache::CacheStats;
use crate::config::{EmulatorArgs, FailMode};
use crate::debuglog::{DebugLog, Record};
use crate::driver::{self, Driver};
use crate::generate::{self, Format, Job, Outcome};
use crate::lock;
use crate::lora::LoraSlots;
use crate::metrics::Snapshot;
use crate::overrides::Overrides;
use crate::prompt::{self, Api};

/// Largest request body read (the brief asks for no limit below 64 MiB).
pub const MAX_BODY: usize = 256 << 20;

/// Shared state of one emulated replica.
pub struct Emulator {
    pub cfg: EmulatorArgs,
    pub id: String,
    /// The replica's engine (shared engine model, stepped in real time).
    pub driver: Arc<Driver>,
    pub metrics: crate::metrics::Metrics,
    /// Resident LoRA adapters (see [`crate::lora`]).
    pub lora: Mutex<LoraSlots>,
    overrides: Mutex<Overrides>,
    /// Stored `/v1/responses` of this instance (vLLM keeps them per instance).
    pub responses: Mutex<crate::responses::ResponseStore>,
    fail: AtomicU8,
    debug: Mutex<DebugLog>,
    seq: AtomicU64,
    started: Instant,
}

impl Emulator {
    pub fn new(cfg: EmulatorArgs, id: String) -> Self {
        Emulator {
            id,
            driver: Arc::new(Driver::new(driver::params(&cfg))),
            metrics: Default::default(),
            lora: Mutex::new(LoraSlots::new(cfg.max_loras, &cfg.lora_adapters)),
            overrides: Mutex::new(Overrides {
                waiting: cfg.report_waiting,
                running: cfg.report_running,
                kv_usage: cfg.report_kv_usage,
            }),
            responses: Mutex::default(),
            fail: AtomicU8::new(cfg.fail.to_u8()),
            debug: Mutex::new(DebugLog::default()),
            seq: AtomicU64::new(0),
            started: Instant::now(),
            cfg,
        }
    }

    pub fn fail_mode(&self) -> FailMode {
        FailMode::from_u8(self.fail.load(Relaxed))
    }

    fn snapshot_metrics(&self) -> String {
        let e = self.driver.metrics();
        self.metrics.running.store(i64::from(e.running), Relaxed);
        self.metrics.waiting.store(i64::from(e.waiting), Relaxed);
        let (kv_usage, cached_blocks) = (e.kv_usage, e.cached_blocks as usize);
        let stats = CacheStats {
            queries: e.queries,
            hits: e.hits,
            evictions: e.evictions,
            preemptions: e.preemptions,
        };
        let lora = lock(&self.lora).clone();
        self.metrics.render(&Snapshot {
            model: &self.cfg.model,
            id: &self.id,
            block_tokens: self.cfg.block_tokens,
            cache_blocks: self.cfg.cache_blocks,
            max_running: self.cfg.max_running,
            lora_resident: lora.resident(),
            max_lora: lora.max_lora(),
            overrides: *lock(&self.overrides),
            kv_usage,
            cached_blocks,
            cache: stats,
            uptime_s: self.started.elapsed().as_secs_f64(),
        })
    }
}

type Resp = Response<EmuBody>;

fn json_resp(status: StatusCode, v: &Value) -> Resp {
    let mut r = Response::new(EmuBody::full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// vLLM's error shape.
fn error(status: StatusCode, kind: &str, msg: &str) -> Resp {
    json_resp(
        status,
        &json!({"error": {"message": msg, "type": kind, "param": null, "code": status.as_u16()}}),
    )
}

fn path_class(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "chat",
        "/v1/completions" => "completions",
        "/v1/responses" => "responses",
        "/v1/models" => "models",
        "/health" => "health",
        "/metrics" => "metrics",
        p if p.starts_with("/admin/") => "admin",
        p if p.starts_with("/debug/") => "debug",
        _ => "other",
    }
}

fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then_some(v)
    })
}

/// Marks the request's debug record `aborted` if the handler is dropped before it finishes.
struct RecordGuard {
    emu: Arc<Emulator>,
    seq: u64,
    done: bool,
}

impl RecordGuard {
    fn finish(&mut self, outcome: &'static str, status: u16, o: Option<&Outcome>) {
        self.done = true;
        let started = self.emu.started;
        let mut log = lock(&self.emu.debug);
        if let Some(r) = log.get_mut(self.seq) {
            r.outcome = outcome;
            r.status = Some(status);
            if let Some(o) = o {
                r.prompt_tokens = Some(o.prompt_tokens);
                r.cached_tokens = Some(o.cached_tokens);
                r.completion_tokens = Some(o.completion_tokens);
                r.queued_ms = Some(o.queued_ms);
                r.ttft_ms = o.ttft_ms;
                r.total_ms = Some(o.total_ms);
            } else {
                r.total_ms = Some(started.elapsed().as_secs_f64() * 1e3 - r.t_ms);
            }
        }
    }

    fn set(&self, f: impl FnOnce(&mut Record)) {
        if let Some(r) = lock(&self.emu.debug).get_mut(self.seq) {
            f(r);
        }
    }
}

impl Drop for RecordGuard {
    fn drop(&mut self) {
        if !self.done {
            if let Some(r) = lock(&self.emu.debug).get_mut(self.seq) {
                r.outcome = "aborted";
            }
        }
    }
}

/// The request header naming the router's decision (`decision_header` in `envoy/envoy.yaml`),
/// echoed on the response as is: Envoy sends it upstream only, so a load generator behind the
/// gateway sees the decision of each request only through this echo.
pub const DECISION_HEADER: &str = "x-prefix-router-decision";

async fn handle(emu: Arc<Emulator>, req: Request<Incoming>) -> Result<Resp, Infallible> {
    let class = path_class(req.uri().path());
    let decision = req.headers().get(DECISION_HEADER).cloned();
    let mut resp = route(&emu, req).await;
    emu.metrics.count_request(class, resp.status().as_u16());
    if let Ok(v) = HeaderValue::from_str(&emu.id) {
        resp.headers_mut().insert("x-replica-id", v);
    }
    if let Some(v) = decision {
        resp.headers_mut().insert(DECISION_HEADER, v);
    }
    Ok(resp)
}

async fn route(emu: &Arc<Emulator>, req: Request<Incoming>) -> Resp {
    let seq = emu.seq.fetch_add(1, Relaxed);
    let path = req.uri().path().to_string();
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in req.headers() {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        headers
            .entry(k.as_str().to_string())
            .and_modify(|e| *e = format!("{e}, {v}"))
            .or_insert(v);
    }
    let observer = path.starts_with("/admin/") || path.starts_with("/debug/");
    if !observer {
        lock(&emu.debug).push(Record {
            seq,
            t_ms: emu.started.elapsed().as_secs_f64() * 1e3,
            method: req.method().to_string(),
            path: req.uri().to_string(),
            headers,
            outcome: "pending",
            ..Default::default()
        });
    }
    let mut rec = RecordGuard {
        emu: emu.clone(),
        seq,
        done: observer,
    };

    if !observer {
        match emu.fail_mode() {
            FailMode::None => {}
            FailMode::Unavailable => {
                rec.finish("error", 503, None);
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailableError",
                    "replica is failing on purpose (fail mode 503)",
                );
            }
            FailMode::Hang => {
                rec.set(|r| r.outcome = "hang");
                rec.done = true;
                std::future::pending::<()>().await;
            }
            FailMode::Die => {
                eprintln!("replica-emulator {}: fail mode 'die': exiting", emu.id);
                std::process::exit(1);
            }
        }
    }

    let (method, p) = (req.method().clone(), path.as_str());
    let resp = match (&method, p) {
        (&Method::POST, "/v1/chat/completions") => {
            return completion(emu, Api::Chat, req, rec).await
        }
        (&Method::POST, "/v1/completions") => {
            return completion(emu, Api::Completions, req, rec).await
        }
        (&Method::POST, "/v1/responses") => return responses(emu, req, rec).await,
        (&Method::GET, "/health") => json_resp(StatusCode::OK, &json!({"status": "ok"})),
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(EmuBody::full(emu.snapshot_metrics()));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        (&Method::GET, "/v1/models") => json_resp(StatusCode::OK, &models(emu)),
        (&Method::GET, "/version") => json_resp(
            StatusCode::OK,
            &json!({"version": env!("CARGO_PKG_VERSION")}),
        ),
        (&Method::GET, "/debug/requests") => {
            let since = query_param(req.uri().query(), "since").and_then(|s| s.parse().ok());
            let log = lock(&emu.debug);
            json_resp(
                StatusCode::OK,
                &json!({"id": emu.id, "requests": log.since(since)}),
            )
        }
        (&Method::DELETE, "/debug/requests") => {
            lock(&emu.debug).clear();
            json_resp(StatusCode::OK, &json!({"cleared": true}))
        }
        (&Method::POST, "/admin/fail") => {
            match query_param(req.uri().query(), "mode")
                .unwrap_or("")
                .parse::<FailMode>()
            {
                Ok(mode) => {
                    emu.fail.store(mode.to_u8(), Relaxed);
                    json_resp(
                        StatusCode::OK,
                        &json!({"id": emu.id, "fail": mode.as_str()}),
                    )
                }
                Err(e) => error(StatusCode::BAD_REQUEST, "BadRequestError", &e),
            }
        }
        (&Method::POST, "/admin/reset-cache") => {
            emu.driver.reset_cache();
            json_resp(StatusCode::OK, &json!({"id": emu.id, "reset": true}))
        }
        (&Method::GET, "/admin/state") => json_resp(StatusCode::OK, &state(emu)),
        (&Method::POST, "/admin/metrics-override") => metrics_override(emu, req).await,
        (
            _,
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/responses"
            | "/health"
            | "/metrics"
            | "/v1/models"
            | "/version"
            | "/debug/requests"
            | "/admin/fail"
            | "/admin/reset-cache"
            | "/admin/state"
            | "/admin/metrics-override",
        ) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "Method Not Allowed",
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            &format!("no route for {method} {p}"),
        ),
    };
    rec.finish(
        if resp.status().is_success() {
            "ok"
        } else {
            "error"
        },
        resp.status().as_u16(),
        None,
    );
    resp
}

fn models(emu: &Emulator) -> Value {
    let cfg = &emu.cfg;
    let mut data = vec![json!({
        "id": cfg.model, "object": "model", "created": 0, "owned_by": "vllm",
        "root": cfg.model, "parent": null, "max_model_len": cfg.max_model_len,
    })];
    for a in &cfg.lora_adapters {
        data.push(json!({
            "id": a, "object": "model", "created": 0, "owned_by": "vllm",
            "root": a, "parent": cfg.model,
        }));
    }
    json!({"object": "list", "data": data})
}

fn state(emu: &Emulator) -> Value {
    let e = emu.driver.metrics();
    let cfg = &emu.cfg;
    json!({
        "id": emu.id,
        "model": cfg.model,
        "fail": emu.fail_mode().as_str(),
        "block_tokens": cfg.block_tokens,
        "cache_blocks": cfg.cache_blocks,
        "chars_per_token": cfg.chars_per_token,
        "prefill_us_per_token": cfg.prefill_us_per_token,
        "prefill_overhead_ms": cfg.prefill_overhead_ms,
        "api_delay_ms": cfg.api_delay_ms,
        "api_us_per_token": cfg.api_us_per_token,
        "decode_ms_per_token": cfg.decode_ms_per_token,
        "max_running": cfg.max_running,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "decode_us_per_seq": cfg.decode_us_per_seq,
        "prefill_lanes": cfg.prefill_lanes,
        "attention_tokens": cfg.attention_tokens,
        "decode_ns_per_ctx_token": cfg.decode_ns_per_ctx_token,
        "lora_adapters": cfg.lora_adapters,
        "max_loras": cfg.max_loras,
        "lora_resident": lock(&emu.lora).resident(),
        "lora_loads": lock(&emu.lora).loads(),
        "metrics_override": lock(&emu.overrides).to_json(),
        "used_blocks": e.kv_used_blocks,
        "cached_blocks": e.cached_blocks,
        "kv_usage": e.kv_usage,
        "prefix_cache_queries": e.queries,
        "prefix_cache_hits": e.hits,
        "preemptions": e.preemptions,
        "engine_steps": e.steps,
        "running": e.running,
        "waiting": e.waiting,
    })
}

/// `POST /admin/metrics-override`: query `?waiting=..&kv_usage=..` or a JSON body; replaces
/// every override (absent = real value).
async fn metrics_override(emu: &Emulator, req: Request<Incoming>) -> Resp {
    let query = req.uri().query().map(str::to_string);
    let parsed = match query {
        Some(q) if !q.is_empty() => Overrides::from_query(&q),
        _ => match Limited::new(req.into_body(), 1 << 16).collect().await {
            Ok(b) => Overrides::from_json(&b.to_bytes()),
            Err(e) => Err(format!("could not read the body: {e}")),
        },
    };
    match parsed {
        Ok(o) => {
            *lock(&emu.overrides) = o;
            json_resp(
                StatusCode::OK,
                &json!({"id": emu.id, "metrics_override": o.to_json()}),
            )
        }
        Err(e) => error(StatusCode::BAD_REQUEST, "BadRequestError", &e),
    }
}

/// A request rejected before generation: status, error type, message.
type Reject = (StatusCode, &'static str, String);

/// Parses and validates a completion request into a [`Job`].
fn parse_job(
    emu: &Emulator,
    api: Api,
    seq: u64,
    body: &[u8],
    arrived: Instant,
) -> Result<Job, Reject> {
    let bad = |m: &str| (StatusCode::BAD_REQUEST, "BadRequestError", m.to_string());
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(&format!("invalid JSON: {e}")))?;
    if !v.is_object() {
        return Err(bad("the request body must be a JSON object"));
    }
    let cfg = &emu.cfg;
    let model = match v.get("model") {
        None | Some(Value::Null) => cfg.model.clone(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("'model' must be a string")),
    };
    let lora = cfg.lora_adapters.iter().find(|a| **a == model).cloned();
    if cfg.strict_model && lora.is_none() && model != cfg.model {
        return Err((
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("The model `{model}` does not exist."),
        ));
    }
    let p = prompt::prompt_of(api, &v, cfg.chars_per_token).map_err(|e| bad(&e))?;
    let max_tokens = match v
        .get("max_completion_tokens")
        .or_else(|| v.get("max_tokens"))
    {
        None | Some(Value::Null) => 16,
        Some(x) => match x.as_u64() {
            Some(n) if n >= 1 => n as usize,
            _ => return Err(bad("'max_tokens' must be a positive integer")),
        },
    };
    if p.tokens.is_empty() {
        return Err(bad("the prompt is empty"));
    }
    if p.tokens.len().saturating_add(max_tokens) > cfg.max_model_len {
        return Err(bad(&format!(
            "This model's maximum context length is {} tokens. However, you requested {} tokens \
             ({} in the messages, {} in the completion).",
            cfg.max_model_len,
            p.tokens.len() + max_tokens,
            p.tokens.len(),
            max_tokens
        )));
    }
    let stream = match v.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("'stream' must be a boolean")),
    };
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let cache_salt = v
        .get("cache_salt")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(Job {
        api,
        seq,
        model,
        lora,
        cache_salt,
        tokens: p.tokens,
        max_tokens,
        stream,
        include_usage,
        arrived,
    })
}

/// `POST /v1/responses`.
async fn responses(emu: &Arc<Emulator>, req: Request<Incoming>, mut rec: RecordGuard) -> Resp {
    let arrived = Instant::now();
    let body = match read_body(req, &mut rec).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    match crate::responses::handle(emu, rec.seq, &body, arrived).await {
        crate::responses::Reply::Json(status, v, o) => {
            let outcome = if status.is_success() { "ok" } else { "error" };
            rec.finish(outcome, status.as_u16(), o.as_ref());
            json_resp(status, &v)
        }
        crate::responses::Reply::Stream(rx, done) => {
            tokio::spawn(async move {
                let o = done.await.ok();
                let aborted = o.as_ref().is_none_or(|o| o.aborted);
                rec.finish(if aborted { "aborted" } else { "ok" }, 200, o.as_ref());
            });
            sse_resp(rx)
        }
    }
}

/// `200 text/event-stream` whose events arrive on `rx` (like vLLM's StreamingResponse).
fn sse_resp(rx: mpsc::Receiver<Bytes>) -> Resp {
    let mut r = Response::new(EmuBody::Chan(rx));
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// The whole request body (≤ [`MAX_BODY`]), or the error response (recorded).
async fn read_body(req: Request<Incoming>, rec: &mut RecordGuard) -> Result<Bytes, Resp> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            let too_big = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            let (status, msg) = if too_big {
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("body larger than {MAX_BODY} bytes"),
                )
            } else {
                (
                    StatusCode::BAD_REQUEST,
                    format!("could not read the body: {e}"),
                )
            };
            rec.finish("error", status.as_u16(), None);
            Err(error(status, "BadRequestError", &msg))
        }
    }
}

async fn completion(
    emu: &Arc<Emulator>,
    api: Api,
    req: Request<Incoming>,
    mut rec: RecordGuard,
) -> Resp {
    let arrived = Instant::now();
    let body = match read_body(req, &mut rec).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let job = match parse_job(emu, api, rec.seq, &body, arrived) {
        Ok(j) => j,
        Err((status, kind, msg)) => {
            rec.finish("error", status.as_u16(), None);
            return error(status, kind, &msg);
        }
    };
    rec.set(|r| {
        r.model = Some(job.model.clone());
        r.stream = Some(job.stream);
        r.prompt_tokens = Some(job.tokens.len());
    });
    if !job.stream {
        let o = generate::run(emu.clone(), job.clone(), None).await;
        rec.finish("ok", 200, Some(&o));
        return json_resp(
            StatusCode::OK,
            &Format {
                job: &job,
                created: generate::unix_now(),
            }
            .full(&o),
        );
    }
    // Streaming: headers now, events as they are produced (like vLLM's StreamingResponse).
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let emu2 = emu.clone();
    tokio::spawn(async move {
        let o = generate::run(emu2, job, Some(tx)).await;
        rec.finish(if o.aborted { "aborted" } else { "ok" }, 200, Some(&o));
    });
    sse_resp(rx)
}

/// Binds the listener (port 0 = any free port) and returns it with its local address.
pub async fn bind(cfg: &EmulatorArgs) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind((cfg.host.as_str(), cfg.port)).await?;
    let a = l.local_addr()?;
    Ok((l, a))
}

/// Serves connections forever.
pub async fn serve(emu: Arc<Emulator>, listener: TcpListener) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                eprintln!("replica-emulator {}: accept: {e}", emu.id);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let emu = emu.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(emu.clone(), req));
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
