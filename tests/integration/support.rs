//! A real jsonrpsee server on 127.0.0.1 with a real SQLite file, and a small HTTP client.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::store::{SqliteStore, StoreError};
use idem::testing::ManualClock;
use idem::{idempotent, EventStream, Idempotency, IdempotencyConfig, Replayable, UnitOfWork};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::server::middleware::rpc::RpcServiceBuilder;
use jsonrpsee::server::{Server, ServerConfig, ServerHandle};
use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;
use serde_json::{json, Value};

pub const URI: &str = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1";
pub const T0_MS: u64 = 1_800_000_000_000;

#[rpc(server)]
pub trait TestAgent {
    #[method(name = "message/send", aliases = ["SendMessage"], with_extensions)]
    async fn send(
        &self,
        message: Value,
        configuration: Option<Configuration>,
        metadata: Option<Value>,
    ) -> RpcResult<Replayable<Value>>;

    #[method(name = "message/stream", aliases = ["SendStreamingMessage"], with_extensions)]
    async fn stream(
        &self,
        message: Value,
        metadata: Option<Value>,
    ) -> RpcResult<EventStream<Value>>;

    #[method(name = "tasks/get")]
    async fn get(&self) -> RpcResult<usize>;

    /// Outside the extension: `bytes` bytes of text.
    #[method(name = "tasks/padded")]
    async fn padded(&self, bytes: usize) -> RpcResult<String>;
}

/// A typed part of the params, so that jsonrpsee's own decoding can fail.
#[derive(Debug, serde::Deserialize)]
pub struct Configuration {
    #[serde(rename = "historyLength")]
    pub history_length: Option<u32>,
}

/// Counts executions of the guarded body: the side effect the spec says must not repeat.
pub struct Agent {
    pub executions: Arc<AtomicUsize>,
}

impl Agent {
    /// An agent and the counter of its executions.
    pub fn counting() -> (Self, Arc<AtomicUsize>) {
        let executions = Arc::new(AtomicUsize::new(0));
        let agent = Agent {
            executions: executions.clone(),
        };
        (agent, executions)
    }
}

#[async_trait]
impl TestAgentServer for Agent {
    #[idempotent]
    async fn send(
        &self,
        ext: &Extensions,
        message: Value,
        configuration: Option<Configuration>,
        metadata: Option<Value>,
    ) -> RpcResult<Replayable<Value>> {
        let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        if metadata
            .as_ref()
            .is_some_and(|m| m["stagePanicsOnDrop"] == true)
        {
            // A write that captured a value whose `Drop` panics: an application's bug.
            let captured = PanicsOnDrop(Box::pin(()));
            UnitOfWork::of(ext)?.stage(move |_| {
                let _ = &captured;
                Ok(())
            })?;
        }
        if let Some(name) = metadata.as_ref().and_then(|m| m["effect"].as_str()) {
            stage_effect(&UnitOfWork::of(ext)?, name)?;
        }
        if let Some(ms) = metadata.as_ref().and_then(|m| m["delayMs"].as_u64()) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let text = message["parts"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match text.as_str() {
            "fail" => Err(ErrorObjectOwned::owned(
                -32000,
                "application failure",
                Some(json!({"execution": n})),
            )),
            "panic" => panic!("the body panicked on purpose"),
            // A failure that carries the text back, as large as it is.
            echoed if echoed.starts_with("fail-echo") => Err(ErrorObjectOwned::owned(
                -32000,
                "application failure",
                Some(json!({"echo": echoed})),
            )),
            // A method's own refusal with JSON-RPC's Invalid Request code.
            "invalid" => Err(jsonrpsee::types::ErrorCode::InvalidRequest.into()),
            _ => {
                let history = configuration.and_then(|c| c.history_length);
                let task = json!({"kind": "task", "id": format!("task-{n}"), "echo": text,
                                  "execution": n, "historyLength": history});
                Ok(task.into())
            }
        }
    }

    /// Streams `metadata.events` (default 4) events, `metadata.stepMs` (default 50; 0: all
    /// ready at once) apart,
    /// each padded with `metadata.padKiB` KiB, after `metadata.setupMs` of setup; stages the
    /// effect `metadata.effect`, if named.
    /// Text `fail-early` fails before streaming; `fail-mid` sends an error as the third event;
    /// `panic-on-drop` gives a stream whose `Drop` panics, after its last event.
    #[idempotent]
    async fn stream(
        &self,
        ext: &Extensions,
        message: Value,
        metadata: Option<Value>,
    ) -> RpcResult<EventStream<Value>> {
        let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        let metadata = metadata.unwrap_or_default();
        let count = metadata["events"].as_u64().unwrap_or(4);
        let step = Duration::from_millis(metadata["stepMs"].as_u64().unwrap_or(50));
        let pad_kib = metadata["padKiB"].as_u64().unwrap_or(0) as usize;
        if let Some(name) = metadata["effect"].as_str() {
            stage_effect(&UnitOfWork::of(ext)?, name)?;
        }
        let text = message["parts"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if let Some(ms) = metadata["setupMs"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if text == "fail-early" {
            return Err(ErrorObjectOwned::owned(
                -32001,
                "Task not found",
                None::<()>,
            ));
        }
        let panics_on_drop = text == "panic-on-drop";
        let events = futures::stream::unfold(0, move |seq| {
            let text = text.clone();
            async move {
                if seq == count {
                    return None;
                }
                if !step.is_zero() {
                    tokio::time::sleep(step).await;
                }
                let event = if text == "fail-mid" && seq == 2 {
                    Err(ErrorObjectOwned::owned(
                        -32000,
                        "mission failed mid-stream",
                        None::<()>,
                    ))
                } else {
                    let pad = "x".repeat(pad_kib * 1024);
                    Ok(json!({"seq": seq, "execution": n, "final": seq + 1 == count, "pad": pad}))
                };
                Some((event, seq + 1))
            }
        });
        if panics_on_drop {
            return Ok(EventStream::new(PanicsOnDrop(Box::pin(events))));
        }
        Ok(EventStream::new(events))
    }

    async fn get(&self) -> RpcResult<usize> {
        Ok(self.executions.load(Ordering::SeqCst))
    }

    async fn padded(&self, bytes: usize) -> RpcResult<String> {
        Ok("x".repeat(bytes))
    }
}

/// A stream (or any value) whose `Drop` panics: an application's bug the guard must survive.
struct PanicsOnDrop<S>(std::pin::Pin<Box<S>>);

impl<S: futures::Stream> futures::Stream for PanicsOnDrop<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        self.0.as_mut().poll_next(cx)
    }
}

impl<S> Drop for PanicsOnDrop<S> {
    fn drop(&mut self) {
        panic!("the test's stream panics as it is dropped");
    }
}

/// The header the test server's stand-in for an auth layer reads: a principal, or `-` for a
/// caller marked unauthenticated. Without it, no `Caller` is inserted.
pub const PRINCIPAL_HEADER: &str = "x-test-principal";

/// What an application's auth layer does: tell the extension who calls.
fn caller_from_header<B>(mut request: http::Request<B>) -> http::Request<B> {
    let principal = request.headers().get(PRINCIPAL_HEADER).cloned();
    if let Some(principal) = principal {
        let caller = match principal.to_str().expect("an ASCII principal") {
            "-" => idem::Caller::Unauthenticated,
            name => idem::Caller::authenticated(name),
        };
        request.extensions_mut().insert(caller);
    }
    request
}

/// The test agent's card as the application writes it: an entry of this extension from an
/// earlier configuration (the layer replaces it), and another extension's (kept).
pub fn card() -> Value {
    json!({
        "name": "Test agent",
        "capabilities": {"extensions": [
            {"uri": URI, "params": {"ttl_seconds": 1}},
            {"uri": "https://example.invalid/other/v1"},
        ]},
    })
}

/// The table the test agent's side effects go to: `name` is unique, so a test can make a
/// staged write fail by inserting the name first.
pub const EFFECTS: &str = "CREATE TABLE IF NOT EXISTS effects (name TEXT NOT NULL PRIMARY KEY)";

/// Stages two rows, `before:NAME` then `NAME`: a failure of the second must undo the first.
pub fn stage_effect(unit: &UnitOfWork, name: &str) -> RpcResult<()> {
    let name = name.to_owned();
    unit.stage(move |db| {
        db.execute(
            "INSERT INTO effects (name) VALUES (?1)",
            [format!("before:{name}")],
        )?;
        db.execute("INSERT INTO effects (name) VALUES (?1)", [&name])?;
        Ok(())
    })
}

pub struct TestServer {
    pub url: String,
    pub executions: Arc<AtomicUsize>,
    pub idem: Idempotency,
    handle: ServerHandle,
}

/// The extension on `db`, governing `governed` besides the default methods, once a server
/// stopped just before has let the file go: jsonrpsee's `stopped()` does not wait for the
/// connection tasks, which hold the layers, and with them the store, until they see the stop
/// (at most 5 s here).
pub async fn open_when_released(
    db: &Path,
    config: IdempotencyConfig,
    clock: Arc<ManualClock>,
    governed: &[&str],
) -> Idempotency {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let builder = governed
            .iter()
            .fold(Idempotency::builder(config.clone()), |b, m| b.govern(m));
        match builder.store(|config| SqliteStore::open_with_clock(db, config, clock.clone())) {
            Err(StoreError::InUse { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            opened => return opened.expect("open store"),
        }
    }
}

impl TestServer {
    /// Starts a server with the extension on `db`.
    pub async fn start(db: &Path, config: IdempotencyConfig, clock: Arc<ManualClock>) -> Self {
        let (agent, executions) = Agent::counting();
        Self::serve(db, config, clock, agent.into_rpc(), executions).await
    }

    /// Starts a server with the extension on `db` that serves `methods`, whose executions
    /// `executions` counts.
    pub async fn serve<C: Send + Sync + 'static>(
        db: &Path,
        config: IdempotencyConfig,
        clock: Arc<ManualClock>,
        methods: jsonrpsee::RpcModule<C>,
        executions: Arc<AtomicUsize>,
    ) -> Self {
        let idem = open_when_released(db, config, clock, &[]).await;
        Self::serve_on(idem, methods, executions).await
    }

    /// Serves `methods` under `idem` (see [`open_when_released`]).
    pub async fn serve_on<C: Send + Sync + 'static>(
        idem: Idempotency,
        methods: jsonrpsee::RpcModule<C>,
        executions: Arc<AtomicUsize>,
    ) -> Self {
        // None under `Idempotency::off()`.
        if let Some(database) = idem.database() {
            let created = database.transact(|db| db.execute_batch(EFFECTS));
            created.await.expect("effects table");
        }
        // As the extension's docs ask: jsonrpsee cuts responses where the extension does.
        let limits = ServerConfig::builder()
            .max_response_body_size(idem.config().max_response_body_bytes)
            .build();
        let server = Server::builder()
            .set_config(limits)
            .set_http_middleware(
                tower::ServiceBuilder::new()
                    .layer(idem.agent_card_layer(card()))
                    .map_request(caller_from_header)
                    .layer(idem.http_layer()),
            )
            .set_rpc_middleware(RpcServiceBuilder::new().layer(idem.rpc_layer()))
            .build("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = server.local_addr().unwrap();
        Self::launch(idem, addr, server.start(methods), executions)
    }

    /// A server whose `#[idempotent]` method runs without the idempotency layers.
    pub async fn start_without_layers(db: &Path) -> Self {
        let idem = Idempotency::open(db, IdempotencyConfig::default()).expect("open store");
        let server = Server::builder()
            .build("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = server.local_addr().unwrap();
        let (agent, executions) = Agent::counting();
        Self::launch(idem, addr, server.start(agent.into_rpc()), executions)
    }

    fn launch(
        idem: Idempotency,
        addr: std::net::SocketAddr,
        handle: ServerHandle,
        executions: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            url: format!("http://{addr}"),
            executions,
            idem,
            handle,
        }
    }

    pub fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }

    /// Waits until the agent's body has started `n` times: a call is then surely in flight.
    pub async fn wait_for_executions(&self, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.executions() < n {
            assert!(std::time::Instant::now() < deadline, "no execution started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the server and waits until it has, so the store can be dropped and reopened.
    pub async fn stop(self) {
        self.handle.stop().expect("running");
        self.handle.stopped().await;
    }
}

/// A test's own database file in a temporary directory.
pub struct Db {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    pub clock: Arc<ManualClock>,
}

impl Db {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            path: dir.path().join("a2a.db"),
            _dir: dir,
            clock: Arc::new(ManualClock::new(T0_MS)),
        }
    }

    pub async fn server(&self, config: IdempotencyConfig) -> TestServer {
        TestServer::start(&self.path, config, self.clock.clone()).await
    }

    /// The names in the test agent's `effects` table, sorted.
    pub fn effects(&self) -> Vec<String> {
        let conn = rusqlite::Connection::open(&self.path).unwrap();
        let mut names = conn
            .prepare("SELECT name FROM effects ORDER BY name")
            .unwrap();
        let names = names.query_map([], |r| r.get(0)).unwrap();
        names.collect::<Result<_, _>>().unwrap()
    }

    /// Rows of `idempotency_cache` for `message_id`: (request_hash, response_body, inserted_at).
    pub fn row(&self, message_id: &str) -> Option<(String, Vec<u8>, i64)> {
        let conn = rusqlite::Connection::open(&self.path).unwrap();
        conn.query_row(
            "SELECT request_hash, response_body, inserted_at FROM idempotency_cache WHERE message_id = ?1",
            [message_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .ok()
    }

    pub fn row_count(&self) -> i64 {
        let conn = rusqlite::Connection::open(&self.path).unwrap();
        conn.query_row("SELECT COUNT(*) FROM idempotency_cache", [], |r| r.get(0))
            .unwrap()
    }
}

use idem_conformance::client::Client;
/// A captured HTTP response: the harness's, with its test helpers.
pub use idem_conformance::client::Reply;

/// POSTs `body` with these headers (the harness's client).
pub async fn post(url: &str, body: impl Into<reqwest::Body>, headers: &[(&str, &str)]) -> Reply {
    try_post(url, body, headers).await.expect("server answers")
}

/// Like [`post`], for a server that may die mid-request: the transport error, if any.
pub async fn try_post(
    url: &str,
    body: impl Into<reqwest::Body>,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    Client::new(url).post_with(body, headers).await
}

/// What `child` printed once it exited, within 30 s; past that it is killed, and the test
/// fails saying `what` (a process that should have refused waited or served instead).
pub fn exited_within_30_s(mut child: std::process::Child, what: &str) -> std::process::Output {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill().and_then(|()| child.wait());
            panic!("{what} after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

pub const ACTIVATED: &[(&str, &str)] = &[("A2A-Extensions", URI)];

pub async fn post_activated(url: &str, body: impl Into<reqwest::Body>) -> Reply {
    post(url, body, ACTIVATED).await
}

/// The task `id` once it is completed (`tasks/get` every 50 ms); panics after `within`.
pub async fn until_completed(url: &str, id: &str, within: std::time::Duration) -> Value {
    let deadline = std::time::Instant::now() + within;
    loop {
        let get = json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"id": id}});
        let task = deep_json(&post(url, get.to_string(), &[]).await.body)["result"].clone();
        if task["status"]["state"] == "completed" {
            return task;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not completed: {task}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A JSON response, also one that nests deeper than serde_json's default limit (a task of
/// params at the extension's limit).
pub fn deep_json(body: &[u8]) -> Value {
    let mut reader = serde_json::Deserializer::from_slice(body);
    reader.disable_recursion_limit();
    serde::Deserialize::deserialize(&mut reader).expect("a JSON response")
}

/// `body` sent chunked (no `Content-Length`), in pieces of 1 KiB.
pub fn chunked(body: String) -> reqwest::Body {
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = body
        .into_bytes()
        .chunks(1024)
        .map(|piece| Ok(piece.to_vec()))
        .collect();
    reqwest::Body::wrap_stream(futures::stream::iter(pieces))
}

/// A fresh random message id.
pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A loopback port that was free a moment ago: nothing listens on it now, so a connection to
/// it is refused.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// A `message/send` request body.
pub fn send(id: u64, message_id: &str, text: &str) -> String {
    send_with(id, "message/send", message_id, text, json!({}))
}

pub fn send_with(id: u64, method: &str, message_id: &str, text: &str, metadata: Value) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": method,
        "params": {
            "message": {"kind": "message", "messageId": message_id, "role": "user", "parts": [{"kind": "text", "text": text}]},
            "metadata": metadata,
        }
    })
    .to_string()
}

/// The harness's event-stream reader, with the tests' helpers: they panic instead of
/// returning the harness's errors.
pub struct SseReply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    inner: idem_conformance::sse::SseReply,
}

impl SseReply {
    pub async fn open(url: &str, body: String, headers: &[(&str, &str)]) -> Self {
        let opened = Client::new(url).open_stream_with(body, headers).await;
        let inner = opened.expect("server answers");
        Self {
            status: inner.reply.status,
            headers: inner.reply.headers.clone(),
            inner,
        }
    }

    pub fn content_type(&self) -> String {
        self.inner.reply.content_type()
    }

    pub fn replayed(&self) -> bool {
        self.inner.reply.replayed()
    }

    /// Every byte received so far.
    pub fn raw(&self) -> &[u8] {
        &self.inner.reply.body
    }

    /// The next event's JSON, or `None` at the end of the stream.
    pub async fn next_event(&mut self) -> Option<Value> {
        self.inner
            .next_event()
            .await
            .expect("a well-formed event stream")
    }

    /// Every remaining event.
    pub async fn rest(&mut self) -> Vec<Value> {
        self.inner.rest().await.expect("a well-formed event stream")
    }
}

/// A `message/stream` request body.
pub fn stream_request(id: u64, message_id: &str, text: &str, metadata: Value) -> String {
    send_with(id, "message/stream", message_id, text, metadata)
}

/// One JSON-RPC call over a WebSocket: the handshake and one masked text frame by hand
/// (RFC 6455), since the tests need nothing more of a WebSocket client.
pub async fn websocket_call(url: &str, request: &str) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.strip_prefix("http://").unwrap();
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let handshake = format!(
        "GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         A2A-Extensions: {URI}\r\n\r\n"
    );
    socket.write_all(handshake.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(socket.read_u8().await.unwrap());
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let payload = request.as_bytes();
    let mut frame = vec![
        0x81,
        0x80 | 126,
        (payload.len() >> 8) as u8,
        payload.len() as u8,
    ];
    frame.extend_from_slice(&[0, 0, 0, 0]); // a zero mask leaves the payload as it is
    frame.extend_from_slice(payload);
    socket.write_all(&frame).await.unwrap();
    let (_, len) = (
        socket.read_u8().await.unwrap(),
        socket.read_u8().await.unwrap(),
    );
    let len = match len {
        126 => socket.read_u16().await.unwrap() as usize,
        n => n as usize,
    };
    let mut body = vec![0; len];
    socket.read_exact(&mut body).await.unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// The example's counter of tasks staged by calls' bodies, committed or not
/// (`tasks::STAGED`): more than the tasks table holds means a body ran again with its writes
/// dropped, which the rows alone would not show (helper-123).
pub const TASKS_STAGED: &str = "a2a_tasks_staged_total";

/// The value of the metric sample `series` (its name and labels as rendered), or of a bare
/// name the sum of its series, at `url`'s `GET /metrics`; 0 when absent (a series whose labels
/// are not known in advance is rendered from its first event on).
pub async fn metric(url: &str, series: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics")).await.unwrap();
    let text = text.text().await.unwrap();
    let samples = text.lines().filter_map(|line| line.rsplit_once(' '));
    let matching = samples.filter(|(name, _)| {
        *name == series || name.split_once('{').is_some_and(|(bare, _)| bare == series)
    });
    matching
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}
