//! What the store tests share: keys, responses, configs, and a call claimed and completed.

use std::sync::Arc;

use crate::claim::{Claim, IdempotencyCache, Ticket};
use crate::hash::{request_hash, RequestHash};
use crate::message_id::MessageId;
use crate::store::{Entry, StoredResponse};
use crate::IdempotencyConfig;

pub fn key(n: u32) -> MessageId {
    MessageId::parse_str(&format!("9b2e7c1a-3f4d-4e5a-8b6c-{n:012x}")).unwrap()
}

pub fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

pub fn config(ttl_seconds: u64, max_cache_entries: u64) -> IdempotencyConfig {
    IdempotencyConfig::default().with(|c| {
        c.ttl_seconds = ttl_seconds;
        c.max_cache_entries = max_cache_entries;
    })
}

/// Claims `key` and completes it with `body`; panics unless the claim wins.
pub async fn execute(
    cache: &IdempotencyCache,
    key: &MessageId,
    params: &str,
    body: &str,
) -> Arc<Entry> {
    let hash = request_hash(params.as_bytes()).unwrap();
    match cache.claim(key, "message/send", &hash).await.unwrap() {
        Claim::Execute(ticket) => ticket.complete(response(body)).await.unwrap(),
        _ => panic!("expected to win the claim for {key}"),
    }
}

/// Whether a `message/send` claim of `key` wins (the key is free: the call would execute).
pub async fn wins(
    cache: &IdempotencyCache,
    key: &MessageId,
    hash: &crate::hash::RequestHash,
) -> bool {
    matches!(
        cache.claim(key, "message/send", hash).await.unwrap(),
        Claim::Execute(_)
    )
}

pub async fn cached_body(cache: &IdempotencyCache, key: &MessageId) -> Option<Vec<u8>> {
    cache
        .store()
        .get(key)
        .await
        .unwrap()
        .map(|e| e.response.body)
}

pub fn bytes_of(text: &str) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(text.as_bytes())
}

/// Claims `key` as a retry does after the call that held it failed: that call's release may
/// still be on its way (on PostgreSQL, its own statement), so a claim held meanwhile is tried
/// again, for up to 10 s; panics unless it then wins.
pub async fn won_once_released(
    cache: &IdempotencyCache,
    key: &MessageId,
    method: &str,
    hash: &RequestHash,
) -> Ticket {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match cache.claim(key, method, hash).await.unwrap() {
            Claim::Execute(ticket) => return ticket,
            Claim::InFlight(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            _ => panic!("expected to win the claim for {key} once it was released"),
        }
    }
}

/// Claims `key`; panics unless the claim wins.
pub async fn won(
    cache: &IdempotencyCache,
    key: &MessageId,
    method: &str,
    hash: &RequestHash,
) -> Ticket {
    match cache.claim(key, method, hash).await.unwrap() {
        Claim::Execute(ticket) => ticket,
        _ => panic!("expected to win the claim for {key}"),
    }
}

/// The `n`th event of the streams these tests record, under the call's id 5.
pub fn stream_event(n: u32) -> bytes::Bytes {
    bytes_of(&format!(
        "data: {{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{n}}}\n\n"
    ))
}

/// A won claim of `key` whose stream has recorded its first event.
pub async fn opened_stream(
    cache: &IdempotencyCache,
    key: &MessageId,
    hash: &RequestHash,
) -> Ticket {
    let mut ticket = won(cache, key, "message/stream", hash).await;
    ticket
        .open_stream("5".into(), stream_event(0), Vec::new())
        .await
        .unwrap();
    ticket
}

/// The entry a retry that found its key in flight ends with: the one it was woken with, or,
/// released to claim again (as the guard does), the one it then finds stored.
pub async fn outcome_after(
    flight: crate::claim::InFlight,
    cache: &IdempotencyCache,
    key: &MessageId,
    method: &str,
    hash: &RequestHash,
) -> Arc<Entry> {
    match flight.wait(std::time::Duration::from_secs(10), false).await {
        crate::claim::Waited::Done(entry) => entry,
        crate::claim::Waited::Released => match cache.claim(key, method, hash).await {
            Ok(Claim::Cached(entry)) => entry,
            _ => panic!("the retry claims again and finds the outcome"),
        },
        _ => panic!("the retry gets the outcome"),
    }
}
