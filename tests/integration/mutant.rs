//! The example server behind a proxy on 127.0.0.1 that breaks it in one way, for the tests that
//! show the conformance harness failing broken servers: `harness_mutants.rs` breaks the requests
//! the server gets, `harness_responses.rs` the answers the harness gets. One proxy serves both,
//! so that a fix to how it passes HTTP on is made once.

use std::sync::Arc;
use std::time::Duration;

use idem_conformance::server_process::ServerProcess;
use idem_conformance::Target;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How the proxy breaks requests: it rewrites each one's JSON before passing it on.
pub type Breakage = Arc<dyn Fn(&mut Value) + Send + Sync>;

/// How the proxy breaks answers: it may change each one's head, and says what to do with its
/// body.
pub type AnswerBreakage = Arc<dyn Fn(&mut Head) -> Body + Send + Sync>;

/// An answer's status and headers, as the proxy passes them on.
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut all = self.headers.iter();
        let found = all.find(|(n, _)| n.eq_ignore_ascii_case(name));
        found.map(|(_, value)| value.as_str())
    }

    /// Sets `name` to `value`, in place of any value it had.
    pub fn set(&mut self, name: &str, value: &str) {
        self.remove(name);
        self.headers.push((name.to_owned(), value.to_owned()));
    }

    pub fn remove(&mut self, name: &str) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }

    /// Whether the server says the answer is a replay.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    pub fn is_event_stream(&self) -> bool {
        self.header("content-type") == Some("text/event-stream")
    }
}

/// A change to a whole body.
pub type Change = Box<dyn FnOnce(&mut Vec<u8>) + Send>;

/// What the proxy does with an answer's body.
pub enum Body {
    /// Passed on as it comes, chunk by chunk: a stream stays live.
    Live,
    /// Read to its end, changed, and passed on `after` that.
    Whole { change: Change, after: Duration },
}

impl Body {
    /// Read to its end, then changed by `change`.
    pub fn changed(change: impl FnOnce(&mut Vec<u8>) + Send + 'static) -> Self {
        Self::Whole {
            change: Box::new(change),
            after: Duration::ZERO,
        }
    }

    /// Read to its end, and passed on unchanged `after` that.
    pub fn held(after: Duration) -> Self {
        Self::Whole {
            change: Box::new(|_| {}),
            after,
        }
    }
}

/// The example server behind a proxy on 127.0.0.1 that breaks it.
pub struct Mutant {
    url: String,
    task: tokio::task::JoinHandle<()>,
    server: ServerProcess,
}

/// Both sides of the proxy's breakage; `None` passes that side on untouched.
#[derive(Clone)]
struct Breakages {
    requests: Option<Breakage>,
    answers: Option<AnswerBreakage>,
}

impl Mutant {
    /// A server whose requests `breakage` rewrites.
    pub async fn start(env: &[(&str, &str)], breakage: Breakage) -> Self {
        Self::with(env, Some(breakage), None).await
    }

    /// A server whose answers `breakage` changes.
    pub async fn answering(env: &[(&str, &str)], breakage: AnswerBreakage) -> Self {
        Self::with(env, None, Some(breakage)).await
    }

    async fn with(
        env: &[(&str, &str)],
        requests: Option<Breakage>,
        answers: Option<AnswerBreakage>,
    ) -> Self {
        let breakages = Breakages { requests, answers };
        let server = ServerProcess::start(env);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = server.url.clone();
        let task = tokio::spawn(async move {
            let client = reqwest::Client::new();
            while let Ok((socket, _)) = listener.accept().await {
                let (client, upstream, breakages) =
                    (client.clone(), upstream.clone(), breakages.clone());
                tokio::spawn(async move {
                    let _ = pass_on(socket, &client, &upstream, &breakages).await;
                });
            }
        });
        Self { url, task, server }
    }

    /// The harness's view of it, without a database: what is checked is the answers.
    pub fn target(&self) -> Target {
        Target::new(&self.url, None)
    }

    /// The harness's view of it with the server's database, where a check reads the cache.
    pub fn target_with_db(&self) -> Target {
        Target::new(&self.url, Some(self.server.side_effects_db()))
    }
}

impl Drop for Mutant {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one HTTP/1.1 request, breaks its JSON body, passes it on with its headers, and writes
/// the answer back, broken, closing the connection.
async fn pass_on(
    socket: TcpStream,
    client: &reqwest::Client,
    upstream: &str,
    breakages: &Breakages,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(socket);
    let (method, path, headers, mut body) = read_request(&mut reader).await?;
    // Without a breakage the bytes go as they are: the harness's respelled requests stay so.
    let json = serde_json::from_slice::<Value>(&body).ok();
    if let (Some(breakage), Some(mut json)) = (&breakages.requests, json) {
        breakage(&mut json);
        body = json.to_string().into_bytes();
    }
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
    let mut request = client
        .request(method, format!("{upstream}{path}"))
        .body(body);
    let hop_by_hop = ["host", "content-length", "connection"];
    for (name, value) in &headers {
        if !hop_by_hop.contains(&name.to_ascii_lowercase().as_str()) {
            request = request.header(name, value);
        }
    }
    let response = request.send().await.expect("the example server answers");
    write_answer(reader.get_mut(), response, breakages.answers.as_deref()).await
}

/// A request as the proxy reads it: method, path, headers and body.
type Request = (String, String, Vec<(String, String)>, Vec<u8>);

/// The request `reader` holds: a POST of JSON-RPC, or the GET of the AgentCard.
async fn read_request(reader: &mut BufReader<TcpStream>) -> std::io::Result<Request> {
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let mut words = line.split_whitespace().map(str::to_owned);
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await?;
        match line.trim().split_once(':') {
            Some((name, value)) => headers.push((name.to_owned(), value.trim().to_owned())),
            None => break,
        }
    }
    let length = headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    Ok((method, path, headers, body))
}

/// Writes the server's answer to `socket`, broken by `breakage`: its body whole with its length,
/// or live, chunk by chunk, to the end of the connection (which HTTP/1.1 allows without a
/// length), so that a stream reaches the harness as the server sends it.
async fn write_answer(
    socket: &mut TcpStream,
    mut response: reqwest::Response,
    breakage: Option<&(dyn Fn(&mut Head) -> Body + Send + Sync)>,
) -> std::io::Result<()> {
    let framing = ["content-length", "connection", "transfer-encoding"];
    let headers = response.headers().iter();
    let headers = headers.filter(|(name, _)| !framing.contains(&name.as_str()));
    let mut head = Head {
        status: response.status().as_u16(),
        headers: headers
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
            .collect(),
    };
    let body = breakage.map_or(Body::Live, |breakage| breakage(&mut head));
    let mut text = format!("HTTP/1.1 {} X\r\n", head.status);
    for (name, value) in &head.headers {
        text += &format!("{name}: {value}\r\n");
    }
    let Body::Whole { change, after } = body else {
        socket.write_all(text.as_bytes()).await?;
        socket.write_all(b"connection: close\r\n\r\n").await?;
        while let Some(chunk) = response.chunk().await.map_err(std::io::Error::other)? {
            socket.write_all(&chunk).await?;
        }
        return Ok(());
    };
    let mut whole = response
        .bytes()
        .await
        .map_err(std::io::Error::other)?
        .to_vec();
    change(&mut whole);
    tokio::time::sleep(after).await;
    text += &format!(
        "content-length: {}\r\nconnection: close\r\n\r\n",
        whole.len()
    );
    socket.write_all(text.as_bytes()).await?;
    socket.write_all(&whole).await
}
