//! The harness's HTTP side: POST a JSON-RPC body (activated or not), capture the reply or open it
//! as an event stream, read the AgentCard's idempotency/v1 entry and streaming capability. Deliberately independent of the `idem` crate, so the harness
//! judges any server by what is on the wire.

use std::time::Duration;

use serde_json::Value;

use super::sse::SseReply;

/// The extension URI of idempotency/v1 (spec §3.1).
pub const EXTENSION_URI: &str = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1";

/// Where A2A serves the AgentCard.
pub(crate) const AGENT_CARD_PATH: &str = "/.well-known/agent-card.json";

/// A hung server must fail a scenario, not hang the harness.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The most of one response body the harness reads: a server whose body never ends fails its
/// scenario, instead of filling the harness's memory (16 GB in 40 s: helper-99).
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Appends `chunk` to `body`, or says that the body outgrew [`MAX_BODY_BYTES`].
pub(crate) fn append(body: &mut Vec<u8>, chunk: &[u8]) -> Result<(), String> {
    if body.len() + chunk.len() > MAX_BODY_BYTES {
        let mib = MAX_BODY_BYTES >> 20;
        return Err(format!(
            "the response body is over {mib} MiB: not read further"
        ));
    }
    body.extend_from_slice(chunk);
    Ok(())
}

/// A server under test, reached at `url` (e.g. `http://127.0.0.1:8080`).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    pub url: String,
}

/// A captured HTTP response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

/// The AgentCard's `capabilities.extensions[]` entry for idempotency/v1, and what else of the
/// card decides which scenarios apply.
#[derive(Debug, Clone)]
pub struct CardEntry {
    pub required: bool,
    pub ttl_seconds: u64,
    /// The whole entry, for the checks of the agent-card scenario.
    pub raw: Value,
    /// `capabilities.streaming` is `true`.
    pub streaming: bool,
    /// A `supportedInterfaces[]` entry offers JSON-RPC with `protocolVersion` 1.0.
    pub jsonrpc_1_0: bool,
}

impl Client {
    pub fn new(url: &str) -> Self {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("a reqwest client without TLS always builds");
        Self {
            http,
            url: url.trim_end_matches('/').to_owned(),
        }
    }

    /// POSTs `body` to the JSON-RPC endpoint, with the activation header when `activated`.
    pub async fn post(&self, body: &str, activated: bool) -> Result<Reply, String> {
        let activation: &[(&str, &str)] = &[("A2A-Extensions", EXTENSION_URI)];
        let headers = if activated { activation } else { &[] };
        self.post_with(body.to_owned(), headers).await
    }

    /// POSTs `body` (any bytes) with exactly these extra headers.
    pub async fn post_with(
        &self,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        let mut response = self.send(body, headers).await?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("reading the response body: {e}"))?
        {
            append(&mut body, &chunk)?;
        }
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// POSTs `body` with the activation header and `headers`, and returns as soon as the
    /// response head is in: the body is then read event by event.
    pub async fn open_stream(
        &self,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Result<SseReply, String> {
        let activated: Vec<(&str, &str)> = std::iter::once(("A2A-Extensions", EXTENSION_URI))
            .chain(headers.iter().copied())
            .collect();
        self.open_stream_with(body.to_owned(), &activated).await
    }

    /// Like [`open_stream`](Self::open_stream), with exactly these extra headers.
    pub async fn open_stream_with(
        &self,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> Result<SseReply, String> {
        Ok(SseReply::new(self.send(body, headers).await?))
    }

    async fn send(
        &self,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> Result<reqwest::Response, String> {
        let mut request = self
            .http
            .post(format!("{}/", self.url))
            .header("content-type", "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
            .send()
            .await
            .map_err(|e| format!("POST {}: {e}", self.url))
    }

    /// Fetches the AgentCard and returns its idempotency/v1 entry.
    pub async fn card(&self) -> Result<CardEntry, String> {
        let url = format!("{}{AGENT_CARD_PATH}", self.url);
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: HTTP {}", response.status()));
        }
        let card: Value = response
            .json()
            .await
            .map_err(|e| format!("GET {url}: not JSON: {e}"))?;
        CardEntry::from_card(&card)
    }
}

impl CardEntry {
    /// Reads a whole AgentCard.
    pub fn from_card(card: &Value) -> Result<Self, String> {
        let raw = card["capabilities"]["extensions"]
            .as_array()
            .and_then(|all| all.iter().find(|e| e["uri"] == EXTENSION_URI))
            .ok_or_else(|| format!("no capabilities.extensions[] entry with uri {EXTENSION_URI}"))?
            .clone();
        let ttl_seconds = raw["params"]["ttl_seconds"]
            .as_u64()
            .ok_or_else(|| format!("params.ttl_seconds is not a non-negative integer: {raw}"))?;
        let jsonrpc_1_0 = card["supportedInterfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|i| i["protocolBinding"] == "JSONRPC" && i["protocolVersion"] == "1.0");
        Ok(Self {
            required: raw["required"].as_bool().unwrap_or(false),
            ttl_seconds,
            raw,
            streaming: card["capabilities"]["streaming"] == true,
            jsonrpc_1_0,
        })
    }
}

impl Reply {
    /// The body as JSON.
    pub fn try_json(&self) -> Result<Value, String> {
        serde_json::from_slice(&self.body)
            .map_err(|e| format!("the body is not JSON ({e}): {}", self.describe()))
    }

    /// The media type of the `Content-Type` header, without parameters, lowercase.
    pub fn content_type(&self) -> String {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default()
    }

    /// Whether `Idempotent-Replayed: true` is present; any other value is a violation (§4.3.3).
    pub fn try_replayed(&self) -> Result<bool, String> {
        match self.headers.get("idempotent-replayed") {
            None => Ok(false),
            Some(v) if v == "true" => Ok(true),
            Some(v) => Err(format!(
                "Idempotent-Replayed must be absent or \"true\", got {v:?}"
            )),
        }
    }

    /// Whether the response `A2A-Extensions` header lists the extension (§3.2).
    pub fn echoes_extension(&self) -> bool {
        self.headers
            .get_all("a2a-extensions")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|uri| uri.trim() == EXTENSION_URI))
    }

    /// `error.code` and `error.data.code` of a JSON-RPC error response.
    pub fn error_codes(&self) -> Result<(i64, Option<String>), String> {
        let json = self.try_json()?;
        let code = json["error"]["code"]
            .as_i64()
            .ok_or_else(|| format!("no JSON-RPC error.code in {}", self.describe()))?;
        let data_code = json["error"]["data"]["code"].as_str().map(str::to_owned);
        Ok((code, data_code))
    }

    /// For tests: the body as JSON; panics, showing the body, if it is not.
    pub fn json(&self) -> Value {
        self.try_json().unwrap_or_else(|e| panic!("{e}"))
    }

    /// For tests: whether the answer is a replay; panics on a malformed header.
    pub fn replayed(&self) -> bool {
        self.try_replayed().unwrap_or_else(|e| panic!("{e}"))
    }

    /// A header's value, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// For tests: `error.code`; panics without one.
    pub fn error_code(&self) -> i64 {
        self.error_codes().unwrap_or_else(|e| panic!("{e}")).0
    }

    /// For tests: `error.data.code`, or `""`.
    pub fn data_code(&self) -> String {
        let codes = self.error_codes().unwrap_or_else(|e| panic!("{e}"));
        codes.1.unwrap_or_default()
    }

    /// For tests: the answer with JSON-RPC id `id` in a batch reply; panics without one.
    pub fn batch_answer(&self, id: u64) -> Value {
        let answers = self.json();
        let answers = answers.as_array().expect("a batch reply is an array");
        let answer = answers.iter().find(|a| a["id"] == id);
        answer
            .unwrap_or_else(|| panic!("no answer {id} in {answers:?}"))
            .clone()
    }

    /// Status, replay header and (shortened) body, for failure messages.
    pub fn describe(&self) -> String {
        const MAX: usize = 400;
        let body = String::from_utf8_lossy(&self.body);
        let shown: String = body.chars().take(MAX).collect();
        let more = if body.chars().count() > MAX {
            "…"
        } else {
            ""
        };
        let replayed = self
            .headers
            .get("idempotent-replayed")
            .map(|v| format!(", Idempotent-Replayed: {v:?}"))
            .unwrap_or_default();
        format!("HTTP {}{replayed}, body {shown}{more}", self.status)
    }
}
