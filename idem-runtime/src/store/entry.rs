//! What the store keeps of an answered call (spec §4.4's row) and of a stream still being
//! recorded, and the columns both backends read them from.

use std::sync::Arc;

use bytes::Bytes;

use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::StoreError;

/// A cached outcome (spec §4.4), bound to the method and the request hash it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The idempotency key.
    pub message_id: MessageId,
    /// The JSON-RPC method the key is bound to: reuse under another method is a collision.
    pub method: String,
    /// SHA-256 of the canonical params.
    pub request_hash: RequestHash,
    /// What was answered.
    pub response: StoredResponse,
    /// Unix epoch seconds.
    pub inserted_at: u64,
}

/// The response as it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Response headers that belong to the outcome (e.g. `content-type`).
    pub headers: Vec<(String, String)>,
    /// Raw response bytes.
    pub body: Vec<u8>,
}

impl Entry {
    /// Whether this entry answers a call of `method` whose params hash to `hash`.
    pub fn matches(&self, method: &str, hash: &RequestHash) -> bool {
        self.method == method && &self.request_hash == hash
    }

    /// The stored body as bytes that share `entry`'s memory: replays of one entry to many
    /// clients at once, each reading as slowly as it likes, hold one copy of it, not one each
    /// (a stored stream of 8 MiB took 7.6 MiB a replay: helper-91).
    pub(crate) fn shared_body(entry: &Arc<Entry>) -> Bytes {
        Bytes::from_owner(StoredBody(entry.clone()))
    }
}

/// An entry, lent out as its body's bytes.
struct StoredBody(Arc<Entry>);

impl AsRef<[u8]> for StoredBody {
    fn as_ref(&self) -> &[u8] {
        &self.0.response.body
    }
}

/// An entry's columns as both backends store them (spec §4.4: headers as a JSON object).
pub(crate) struct EntryRow {
    pub(crate) request_hash: String,
    pub(crate) status: u16,
    pub(crate) headers: Vec<u8>,
    pub(crate) body: Vec<u8>,
    pub(crate) inserted_at: i64,
    pub(crate) method: String,
}

/// An open stream's columns as both backends store them.
pub(crate) struct OpenStreamRow {
    pub(crate) method: String,
    pub(crate) request_hash: String,
    pub(crate) jsonrpc_id: String,
    /// The column `started_at` (see [`OpenStream::recorded_at`]).
    pub(crate) recorded_at: i64,
}

impl OpenStreamRow {
    /// The open stream of key `id` this row holds, or which column is wrong.
    pub(crate) fn decode(self, id: &MessageId) -> Result<OpenStream, StoreError> {
        let column = "idempotency_open_streams.request_hash";
        Ok(OpenStream {
            message_id: id.clone(),
            request_hash: stored_hash(id, column, &self.request_hash)?,
            method: self.method,
            jsonrpc_id: self.jsonrpc_id,
            recorded_at: self.recorded_at.max(0) as u64,
        })
    }
}

/// The request hash a row of key `id` holds in `column`, or the corruption that names it.
pub(crate) fn stored_hash(
    id: &MessageId,
    column: &str,
    hex: &str,
) -> Result<RequestHash, StoreError> {
    RequestHash::from_hex(hex).ok_or_else(|| StoreError::Corrupt {
        message_id: id.to_string(),
        detail: column.to_owned(),
    })
}

impl EntryRow {
    /// The entry of key `id` this row holds, or which column is wrong.
    pub(crate) fn decode(self, id: &MessageId) -> Result<Entry, StoreError> {
        let corrupt = |detail: &str| StoreError::Corrupt {
            message_id: id.to_string(),
            detail: detail.to_owned(),
        };
        let request_hash = stored_hash(id, "request_hash", &self.request_hash)?;
        let headers: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&self.headers).map_err(|_| corrupt("response_headers"))?;
        let headers = headers
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(v) => Ok((k, v)),
                _ => Err(corrupt("response_headers")),
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Entry {
            message_id: id.clone(),
            method: self.method,
            request_hash,
            response: StoredResponse {
                status: self.status,
                headers,
                body: self.body,
            },
            inserted_at: self.inserted_at.max(0) as u64,
        })
    }
}

impl StoredResponse {
    /// The `response_headers` column: the headers as one JSON object.
    pub(crate) fn headers_json(&self) -> Vec<u8> {
        let object: serde_json::Map<String, serde_json::Value> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        serde_json::to_vec(&object).expect("a map of strings serializes")
    }
}

/// Spec §4.4: expired when `inserted_at + ttl_seconds < now`.
pub(crate) fn is_expired(inserted_at: u64, ttl_seconds: u64, now_seconds: u64) -> bool {
    inserted_at.saturating_add(ttl_seconds) < now_seconds
}

/// The time (epoch seconds) before which a row was inserted if it is expired now, as
/// [`is_expired`] decides: what SQL compares `inserted_at` (or a stream's `started_at`) with.
/// Computed here, so that no TTL, however large, wraps around or overflows in the database.
pub(crate) fn expired_before(ttl_seconds: u64, now_seconds: u64) -> i64 {
    i64::try_from(now_seconds.saturating_sub(ttl_seconds)).unwrap_or(i64::MAX)
}

/// The time a replica reads rows at, and its TTL: a row is expired past its own `expires_at`
/// (on PostgreSQL), or, a row that has none, as [`is_expired`] decides with this TTL.
#[derive(Clone, Copy)]
pub(crate) struct ReadAt {
    pub now: u64,
    pub ttl: u64,
}

impl ReadAt {
    /// Whether a row stored at `inserted_at` is expired (spec §4.4: past its expiry).
    pub(crate) fn expired(self, expires_at: Option<i64>, inserted_at: u64) -> bool {
        self.expiry(expires_at, inserted_at) < self.now
    }

    /// When a row stored at `inserted_at` expires (epoch seconds): at its `expires_at`, unless
    /// that is older than the row (a replica of an earlier version, storing a key again over
    /// an expired row, leaves that row's behind, and the new entry would look expired at once;
    /// a key an earlier version stored first has none): then by this TTL.
    pub(crate) fn expiry(self, expires_at: Option<i64>, inserted_at: u64) -> u64 {
        match expires_at.and_then(|at| u64::try_from(at).ok()) {
            Some(expires_at) if expires_at >= inserted_at => expires_at,
            _ => inserted_at.saturating_add(self.ttl),
        }
    }

    /// What SQL compares a row's `expires_at` with: now.
    #[cfg(feature = "postgres")]
    pub(crate) fn now_param(self) -> i64 {
        i64::try_from(self.now).unwrap_or(i64::MAX)
    }

    /// What SQL compares a row's `inserted_at` with when its `expires_at` does not count
    /// ([`expired_before`]).
    pub(crate) fn before_param(self) -> i64 {
        expired_before(self.ttl, self.now)
    }
}

/// A stream being recorded: the durable record of a call whose side effects are committed and
/// whose response is still being produced (kept apart from the §4.4 table of completed entries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenStream {
    /// The idempotency key.
    pub message_id: MessageId,
    /// The JSON-RPC method of the call.
    pub method: String,
    /// SHA-256 of the canonical params.
    pub request_hash: RequestHash,
    /// The call's JSON-RPC `id`, as JSON text: the terminal event of an interrupted stream
    /// carries it, as every recorded event does.
    pub jsonrpc_id: String,
    /// Unix epoch seconds: when it started, then when its last event was recorded (each
    /// event moves it; the stores' column `started_at` holds it). A record a process left
    /// open expires a TTL after its last sign of life: one counted from the start would let a
    /// stream that ran past the TTL, then died, run again at its first retry. The entry it
    /// becomes is inserted when it ends.
    pub recorded_at: u64,
}

impl OpenStream {
    /// Whether the record was left open a TTL after its last recorded event: the sweep takes
    /// it, and a claim that reaches it first takes it for gone too, so that its key runs again
    /// as any expired key does (a stream this process still records is in flight, never
    /// claimed).
    pub(crate) fn expired(&self, ttl_seconds: u64, now_seconds: u64) -> bool {
        is_expired(self.recorded_at, ttl_seconds, now_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::request_hash;

    #[test]
    fn a_shared_body_lends_the_entrys_own_bytes_while_it_is_held() {
        let entry = Arc::new(Entry {
            message_id: MessageId::parse_str("9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c").unwrap(),
            method: "message/stream".into(),
            request_hash: request_hash(b"{}").unwrap(),
            response: StoredResponse {
                status: 200,
                headers: vec![],
                body: b"data: {}\n\n".repeat(1000),
            },
            inserted_at: 0,
        });
        let replays: Vec<Bytes> = (0..3).map(|_| Entry::shared_body(&entry)).collect();
        for body in &replays {
            assert_eq!(body.as_ptr(), entry.response.body.as_ptr(), "not a copy");
            assert_eq!(&body[..], &entry.response.body[..]);
        }
        assert_eq!(Arc::strong_count(&entry), 4);
        drop(replays);
        assert_eq!(Arc::strong_count(&entry), 1);
    }
}
