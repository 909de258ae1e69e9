//! A fault-injecting HTTP/1.1 proxy between Tollgate and one AWS endpoint (DynamoDB or
//! SQS). `tollgate serve` reaches it through `AWS_ENDPOINT_URL_DYNAMODB` /
//! `AWS_ENDPOINT_URL_SQS`. Each request gets its own decision, drawn from a generator
//! seeded with the schedule's seed and the request's number, so a schedule is fixed by
//! its seed (the order in which concurrent requests arrive is not).
//!
//! Faults: a delay before forwarding; an error answered instead of forwarding (throttling,
//! a transaction conflict, an internal error, a bare 5xx); the request forwarded and its
//! answer dropped (the connection closed, or an internal error in its place: the write
//! happened, the caller cannot know); the connection reset without forwarding. On SQS,
//! a `ReceiveMessage` answer carries a message twice or out of order, and a consumer's
//! `DeleteMessageBatch` is now and then answered as done without being forwarded, so
//! SQS itself delivers the messages again after the chaos queue's short visibility
//! timeout. In front of a `serve` process (`Service::Serve`), between its clients and
//! it: a long delay, the answer dropped after forwarding, a reset.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Which AWS service the proxy fronts (its error shapes differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Dynamo,
    Sqs,
    /// A `tollgate serve` process, as its clients reach it: faults between the clients
    /// and Tollgate.
    Serve,
}

/// Every kind of fault, in the order the report prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    Delay,
    ProvisionedThroughputExceeded,
    Throttling,
    TransactionConflict,
    InternalServerError,
    Status5xx,
    DropAnswer,
    Reset,
    /// A `ReceiveMessage` answer carrying a message twice.
    SqsDuplicate,
    /// A batch of messages delivered in reverse order.
    SqsOutOfOrder,
    /// A consumer's `DeleteMessageBatch` answered as done but never forwarded: SQS
    /// itself delivers the messages again after the queue's visibility timeout (usually
    /// after the card or attempt they were for ended).
    SqsRedeliver,
    /// Between a client and `serve`: a long wait before forwarding (the client gives up
    /// and retries while the first request still arrives).
    ClientDelay,
    /// Between a client and `serve`: forwarded, committed, the answer dropped.
    ClientDropAnswer,
    /// Between a client and `serve`: the connection reset, nothing forwarded.
    ClientReset,
}

impl Fault {
    pub const ALL: [Fault; 14] = [
        Fault::Delay,
        Fault::ProvisionedThroughputExceeded,
        Fault::Throttling,
        Fault::TransactionConflict,
        Fault::InternalServerError,
        Fault::Status5xx,
        Fault::DropAnswer,
        Fault::Reset,
        Fault::SqsDuplicate,
        Fault::SqsOutOfOrder,
        Fault::SqsRedeliver,
        Fault::ClientDelay,
        Fault::ClientDropAnswer,
        Fault::ClientReset,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Delay => "delay",
            Fault::ProvisionedThroughputExceeded => "throughput_exceeded",
            Fault::Throttling => "throttling",
            Fault::TransactionConflict => "tx_conflict",
            Fault::InternalServerError => "internal_error",
            Fault::Status5xx => "5xx",
            Fault::DropAnswer => "drop_answer",
            Fault::Reset => "reset",
            Fault::SqsDuplicate => "sqs_duplicate",
            Fault::SqsOutOfOrder => "sqs_reorder",
            Fault::SqsRedeliver => "sqs_redeliver",
            Fault::ClientDelay => "c_delay",
            Fault::ClientDropAnswer => "c_drop",
            Fault::ClientReset => "c_reset",
        }
    }

    fn index(self) -> usize {
        Fault::ALL.iter().position(|f| *f == self).unwrap()
    }
}

/// Counts of injected faults, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCounts(pub [u64; Fault::ALL.len()]);

impl FaultCounts {
    pub fn get(&self, f: Fault) -> u64 {
        self.0[f.index()]
    }
    pub fn add(&mut self, other: &FaultCounts) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += b;
        }
    }
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// What the proxy does with one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    Forward,
    /// Wait this long, then forward.
    Delay(Duration),
    /// Answer this error without forwarding.
    Error(Fault),
    /// Forward, then close the connection without answering (`true`) or answer an
    /// internal error in the answer's place (`false`).
    DropAnswer {
        close: bool,
    },
    Reset,
}

/// How often each fault is drawn, per request (the rest are forwarded untouched).
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    /// Probability that a request gets a fault at all.
    pub fault: f64,
    /// Probability that a `ReceiveMessage` answer with messages is tampered with.
    pub timer: f64,
}

impl Default for Rates {
    fn default() -> Self {
        Self {
            fault: 0.10,
            timer: 0.5,
        }
    }
}

/// The decision for request number `n` of the schedule `seed` (pure: the same inputs
/// always give the same decision).
pub fn decide(service: Service, seed: u64, n: u64, rates: Rates) -> Decision {
    let mut rng = StdRng::seed_from_u64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    if !rng.random_bool(rates.fault.clamp(0.0, 1.0)) {
        return Decision::Forward;
    }
    if service == Service::Serve {
        return match rng.random_range(0..3) {
            // Past the clients' 8 s per-request timeout now and then.
            0 => Decision::Delay(if rng.random_bool(0.3) {
                Duration::from_millis(rng.random_range(8_500..10_000))
            } else {
                Duration::from_millis(rng.random_range(100..1_500))
            }),
            1 => Decision::DropAnswer { close: true },
            _ => Decision::Reset,
        };
    }
    let kinds: &[Fault] = match service {
        Service::Dynamo => &[
            Fault::Delay,
            Fault::ProvisionedThroughputExceeded,
            Fault::Throttling,
            Fault::TransactionConflict,
            Fault::InternalServerError,
            Fault::Status5xx,
            Fault::DropAnswer,
            Fault::Reset,
        ],
        Service::Sqs | Service::Serve => &[
            Fault::Delay,
            Fault::InternalServerError,
            Fault::Status5xx,
            Fault::DropAnswer,
            Fault::Reset,
        ],
    };
    match kinds[rng.random_range(0..kinds.len())] {
        // Mostly short; one in eight past the SDK's 2 s attempt timeout, so the caller
        // gives up while the request still arrives later.
        Fault::Delay => Decision::Delay(if rng.random_bool(0.125) {
            Duration::from_millis(rng.random_range(2_100..2_600))
        } else {
            Duration::from_millis(rng.random_range(20..400))
        }),
        Fault::DropAnswer => Decision::DropAnswer {
            close: rng.random_bool(0.5),
        },
        Fault::Reset => Decision::Reset,
        other => Decision::Error(other),
    }
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    pub addr: std::net::SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

struct State {
    service: Service,
    upstream: Mutex<String>,
    seed: AtomicU64,
    next: AtomicU64,
    enabled: AtomicBool,
    /// Every request held this long before it is forwarded (faults or not), when set.
    slow: Mutex<Option<Duration>>,
    rates: Mutex<Rates>,
    counts: Mutex<FaultCounts>,
    /// The last `TransactWriteItems` forwarded and answered 200 (DynamoDB): when the
    /// answer came back (Unix millis), the request body.
    acks: Mutex<VecDeque<(i64, String)>>,
    http: reqwest::Client,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream` (`http://host:port`).
    pub async fn start(service: Service, upstream: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            service,
            upstream: Mutex::new(upstream.trim_end_matches('/').to_owned()),
            seed: AtomicU64::new(0),
            next: AtomicU64::new(0),
            enabled: AtomicBool::new(false),
            slow: Mutex::new(None),
            rates: Mutex::new(Rates::default()),
            counts: Mutex::new(FaultCounts::default()),
            acks: Mutex::new(VecDeque::new()),
            http: reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(64)
                .timeout(Duration::from_secs(40))
                .build()
                .expect("an HTTP client"),
        });
        let s = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let _ = conn.set_nodelay(true);
                tokio::spawn(serve_conn(Arc::clone(&s), conn));
            }
        });
        Ok(Self { addr, state, task })
    }

    /// `http://127.0.0.1:PORT`, for the endpoint variables.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Starts a schedule: faults on, decisions drawn from `seed`, counts reset.
    pub fn arm(&self, seed: u64, rates: Rates) {
        self.state.seed.store(seed, Ordering::SeqCst);
        self.state.next.store(0, Ordering::SeqCst);
        *self.state.rates.lock().unwrap() = rates;
        *self.state.counts.lock().unwrap() = FaultCounts::default();
        self.state.enabled.store(true, Ordering::SeqCst);
    }

    /// Holds every request `by` before forwarding it from now on (`None`: no more): a slow
    /// upstream, without faults.
    pub fn slow_down(&self, by: Option<Duration>) {
        *self.state.slow.lock().unwrap() = by;
    }

    /// Faults off (everything forwarded).
    pub fn disarm(&self) {
        self.state.enabled.store(false, Ordering::SeqCst);
    }

    pub fn counts(&self) -> FaultCounts {
        self.state.counts.lock().unwrap().clone()
    }

    /// The `TransactWriteItems` answered 200 between `from` and `to` (Unix millis): the
    /// evidence that the storage acknowledged a write (kept for the last 4096).
    pub fn acks_between(&self, from: i64, to: i64) -> Vec<(i64, String)> {
        self.state
            .acks
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| (from..=to).contains(at))
            .cloned()
            .collect()
    }

    /// Sends what comes in to `upstream` from now on (a restarted process's new port).
    pub fn set_upstream(&self, upstream: &str) {
        *self.state.upstream.lock().unwrap() = upstream.trim_end_matches('/').to_owned();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl State {
    fn count(&self, f: Fault) {
        self.counts.lock().unwrap().0[f.index()] += 1;
    }
}

/// One parsed request.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    close: bool,
}

async fn serve_conn(state: Arc<State>, mut conn: TcpStream) {
    let mut buf = Vec::with_capacity(8192);
    loop {
        let req = match read_request(&mut conn, &mut buf).await {
            Some(req) => req,
            None => return,
        };
        let decision = if state.enabled.load(Ordering::SeqCst) {
            let n = state.next.fetch_add(1, Ordering::SeqCst);
            let rates = *state.rates.lock().unwrap();
            decide(state.service, state.seed.load(Ordering::SeqCst), n, rates)
        } else {
            Decision::Forward
        };
        if let Some(done) = skip_delete(&state, &req) {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\n\r\n",
                done.len()
            );
            if conn.write_all(head.as_bytes()).await.is_err()
                || conn.write_all(&done).await.is_err()
            {
                return;
            }
            continue;
        }
        let slow = *state.slow.lock().unwrap();
        if let Some(by) = slow {
            tokio::time::sleep(by).await;
        }
        let client = state.service == Service::Serve;
        let answer = match decision {
            Decision::Forward => forward(&state, &req).await,
            Decision::Delay(d) => {
                state.count(if client {
                    Fault::ClientDelay
                } else {
                    Fault::Delay
                });
                tokio::time::sleep(d).await;
                forward(&state, &req).await
            }
            Decision::Error(fault) => {
                state.count(fault);
                Some(error_answer(state.service, fault, &req))
            }
            Decision::DropAnswer { close } => {
                state.count(if client {
                    Fault::ClientDropAnswer
                } else {
                    Fault::DropAnswer
                });
                let forwarded = forward(&state, &req).await;
                if close || forwarded.is_none() {
                    None
                } else {
                    Some(error_answer(
                        state.service,
                        Fault::InternalServerError,
                        &req,
                    ))
                }
            }
            Decision::Reset => {
                state.count(if client {
                    Fault::ClientReset
                } else {
                    Fault::Reset
                });
                None
            }
        };
        let Some((status, headers, body)) = answer else {
            // No answer: reset the connection (RST, not a clean close). A zero linger
            // never blocks: the close discards what is unsent at once.
            #[allow(deprecated)]
            let _ = conn.set_linger(Some(Duration::ZERO));
            return;
        };
        let body = if state.service == Service::Sqs && status == 200 {
            tamper_receive(&state, &req, body)
        } else {
            body
        };
        let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
        for (k, v) in &headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("content-length: {}\r\n", body.len()));
        if req.close {
            head.push_str("connection: close\r\n");
        }
        head.push_str("\r\n");
        if conn.write_all(head.as_bytes()).await.is_err() || conn.write_all(&body).await.is_err() {
            return;
        }
        if req.close {
            return;
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Reads one request from `conn` (`buf` keeps what was read past it); `None` at the end
/// of the connection or on anything unparseable.
async fn read_request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let method = parsed.method?.to_owned();
                let path = parsed.path?.to_owned();
                let headers: Vec<(String, String)> = parsed
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                let header = |name: &str| {
                    headers
                        .iter()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.clone())
                };
                let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
                buf.drain(..head_len);
                let body = if header("transfer-encoding")
                    .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
                {
                    read_chunked(conn, buf).await?
                } else {
                    let len: usize = header("content-length")
                        .map(|v| v.trim().parse().ok())
                        .unwrap_or(Some(0))?;
                    while buf.len() < len {
                        if !fill(conn, buf).await {
                            return None;
                        }
                    }
                    buf.drain(..len).collect()
                };
                return Some(Request {
                    method,
                    path,
                    headers,
                    body,
                    close,
                });
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() > 1 << 20 || !fill(conn, buf).await {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
}

async fn fill(conn: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16384];
    match conn.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

async fn read_chunked(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                break i;
            }
            if !fill(conn, buf).await {
                return None;
            }
        };
        let size_text = String::from_utf8_lossy(&buf[..line_end]).to_string();
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        buf.drain(..line_end + 2);
        while buf.len() < size + 2 {
            if !fill(conn, buf).await {
                return None;
            }
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
        if size == 0 {
            return Some(body);
        }
    }
}

type Answer = (u16, Vec<(String, String)>, Vec<u8>);

/// [`forward_once`], keeping the evidence of each acknowledged `TransactWriteItems`.
async fn forward(state: &State, req: &Request) -> Option<Answer> {
    let answer = forward_once(state, req).await;
    if state.service == Service::Dynamo
        && answer.as_ref().is_some_and(|a| a.0 == 200)
        && target(req).ends_with("TransactWriteItems")
    {
        let mut acks = state.acks.lock().unwrap();
        if acks.len() >= 4096 {
            acks.pop_front();
        }
        acks.push_back((
            chrono::Utc::now().timestamp_millis(),
            String::from_utf8_lossy(&req.body).into_owned(),
        ));
    }
    answer
}

/// Sends the request upstream; `None` when upstream cannot be reached (then the caller
/// sees its connection reset, as with the real service down).
async fn forward_once(state: &State, req: &Request) -> Option<Answer> {
    let url = format!("{}{}", state.upstream.lock().unwrap().clone(), req.path);
    let method = reqwest::Method::from_bytes(req.method.as_bytes()).ok()?;
    let mut builder = state.http.request(method, url).body(req.body.clone());
    for (k, v) in &req.headers {
        if matches!(
            k.as_str(),
            "host" | "content-length" | "transfer-encoding" | "connection"
        ) {
            continue;
        }
        builder = builder.header(k, v);
    }
    let resp = builder.send().await.ok()?;
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "content-length" | "transfer-encoding" | "connection" | "keep-alive"
            )
        })
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let body = resp.bytes().await.ok()?.to_vec();
    Some((status, headers, body))
}

fn target(req: &Request) -> String {
    req.headers
        .iter()
        .find(|(k, _)| k == "x-amz-target")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// The error a service answers for `fault`, shaped as its SDK parses it (awsJson 1.0).
fn error_answer(service: Service, fault: Fault, req: &Request) -> Answer {
    let json_headers = |ty: &str| {
        vec![
            (
                "content-type".to_owned(),
                "application/x-amz-json-1.0".to_owned(),
            ),
            ("x-amzn-errortype".to_owned(), ty.to_owned()),
        ]
    };
    let (status, ty, body) = match (service, fault) {
        (Service::Dynamo, Fault::ProvisionedThroughputExceeded) => (
            400,
            "ProvisionedThroughputExceededException",
            json!({"__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                   "message": "The level of configured provisioned throughput for the table was exceeded."}),
        ),
        (Service::Dynamo, Fault::Throttling) => (
            400,
            "ThrottlingException",
            json!({"__type": "com.amazon.coral.availability#ThrottlingException",
                   "message": "Rate of requests exceeds the allowed throughput."}),
        ),
        (Service::Dynamo, Fault::TransactionConflict) => {
            if target(req).ends_with("TransactWriteItems") {
                let items = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| v["TransactItems"].as_array().map(Vec::len))
                    .unwrap_or(1);
                let mut reasons = vec![json!({"Code": "None"}); items];
                reasons[0] = json!({"Code": "TransactionConflict",
                    "Message": "Transaction is ongoing for the item"});
                (
                    400,
                    "TransactionCanceledException",
                    json!({"__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                           "message": "Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict]",
                           "CancellationReasons": reasons}),
                )
            } else {
                (
                    400,
                    "TransactionConflictException",
                    json!({"__type": "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
                           "message": "Transaction is ongoing for the item"}),
                )
            }
        }
        (Service::Dynamo, _) => (
            500,
            "InternalServerError",
            json!({"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError",
                   "message": "Internal server error"}),
        ),
        (Service::Sqs, Fault::Status5xx) => (503, "ServiceUnavailable", json!({})),
        (Service::Sqs | Service::Serve, _) => (
            500,
            "InternalError",
            json!({"__type": "com.amazonaws.sqs#InternalError",
                   "message": "We encountered an internal error. Please try again."}),
        ),
    };
    if fault == Fault::Status5xx && service == Service::Dynamo {
        // A bare gateway error, not DynamoDB's own shape.
        return (
            503,
            vec![("content-type".to_owned(), "text/html".to_owned())],
            b"<html><body>503 Service Unavailable</body></html>".to_vec(),
        );
    }
    (status, json_headers(ty), serde_json::to_vec(&body).unwrap())
}

/// Now and then (at the timer rate) a consumer's `DeleteMessageBatch` is
/// answered as done without forwarding it: the messages stay in the queue, and SQS
/// delivers them again once the visibility timeout has passed. The answer to send, if so.
fn skip_delete(state: &State, req: &Request) -> Option<Vec<u8>> {
    if state.service != Service::Sqs
        || !state.enabled.load(Ordering::SeqCst)
        || !target(req).ends_with("DeleteMessageBatch")
    {
        return None;
    }
    let n = state.next.fetch_add(1, Ordering::SeqCst);
    let rate = state.rates.lock().unwrap().timer;
    let mut rng = StdRng::seed_from_u64(
        state.seed.load(Ordering::SeqCst) ^ n.wrapping_mul(0xA24B_AED4_963E_E407) ^ 0xDE1E,
    );
    if !rng.random_bool(rate.clamp(0.0, 1.0)) {
        return None;
    }
    let asked: Value = serde_json::from_slice(&req.body).ok()?;
    let ids: Vec<Value> = asked["Entries"]
        .as_array()?
        .iter()
        .map(|e| json!({"Id": e["Id"]}))
        .collect();
    state.count(Fault::SqsRedeliver);
    serde_json::to_vec(&json!({"Successful": ids, "Failed": []})).ok()
}

/// On a `ReceiveMessage` answer: duplicate a message, or reverse the batch.
fn tamper_receive(state: &State, req: &Request, body: Vec<u8>) -> Vec<u8> {
    if !state.enabled.load(Ordering::SeqCst) || !target(req).ends_with("ReceiveMessage") {
        return body;
    }
    let Ok(mut answer) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    let n = state.next.fetch_add(1, Ordering::SeqCst);
    let rate = state.rates.lock().unwrap().timer;
    let mut rng = StdRng::seed_from_u64(
        state.seed.load(Ordering::SeqCst) ^ n.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0x5151,
    );
    let mut messages: Vec<Value> = answer["Messages"].as_array().cloned().unwrap_or_default();
    if !messages.is_empty() && messages.len() < 10 && rng.random_bool(rate) {
        let i = rng.random_range(0..messages.len());
        messages.push(messages[i].clone());
        state.count(Fault::SqsDuplicate);
    }
    if messages.len() >= 2 && rng.random_bool(rate) {
        messages.reverse();
        state.count(Fault::SqsOutOfOrder);
    }
    if messages.is_empty() {
        return body;
    }
    answer["Messages"] = Value::Array(messages);
    serde_json::to_vec(&answer).unwrap_or(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schedule is a function of the seed and the request's number.
    #[test]
    fn decisions_are_fixed_by_the_seed() {
        let rates = Rates {
            fault: 0.5,
            timer: 0.5,
        };
        let a: Vec<_> = (0..200)
            .map(|n| decide(Service::Dynamo, 7, n, rates))
            .collect();
        let b: Vec<_> = (0..200)
            .map(|n| decide(Service::Dynamo, 7, n, rates))
            .collect();
        let c: Vec<_> = (0..200)
            .map(|n| decide(Service::Dynamo, 8, n, rates))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let faults = a.iter().filter(|d| **d != Decision::Forward).count();
        assert!((50..150).contains(&faults), "{faults} of 200 at rate 0.5");
        for kind in [
            Fault::ProvisionedThroughputExceeded,
            Fault::Throttling,
            Fault::TransactionConflict,
            Fault::InternalServerError,
            Fault::Status5xx,
        ] {
            assert!(a.contains(&Decision::Error(kind)), "{kind:?} drawn");
        }
        assert!(a.iter().any(|d| matches!(d, Decision::DropAnswer { .. })));
        assert!(a.contains(&Decision::Reset));
        assert!(a.iter().any(|d| matches!(d, Decision::Delay(_))));
    }

    #[test]
    fn rate_zero_forwards_everything() {
        let rates = Rates {
            fault: 0.0,
            timer: 0.0,
        };
        assert!((0..500).all(|n| decide(Service::Sqs, 1, n, rates) == Decision::Forward));
    }
}
