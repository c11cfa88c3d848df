//! The RPC layer: sees each governed call with its raw params before jsonrpsee decodes them.
//!
//! It refuses what the extension must refuse (not activated, malformed messageId, params the
//! hash cannot bind) without running the method, and hands the guard the key and the hash of
//! the raw params. Batches do not go through `call()`, so `batch()` checks each entry too.
//!
//! A single call that resends the very bytes of an answered call is answered here, from the
//! store's memory, before jsonrpsee decodes its params: the same bytes are the same key and
//! the same request hash, so nothing needs parsing or hashing canonically.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use jsonrpsee::core::middleware::{Batch, BatchEntry, BatchEntryErr, Notification, RpcServiceT};
use jsonrpsee::core::server::BatchResponseBuilder;
use jsonrpsee::types::error::{
    INVALID_PARAMS_CODE, INVALID_PARAMS_MSG, METHOD_NOT_FOUND_CODE, OVERSIZED_RESPONSE_CODE,
    OVERSIZED_RESPONSE_MSG, TOO_BIG_BATCH_RESPONSE_CODE,
};
use jsonrpsee::types::{ErrorObject, ErrorObjectOwned, Id, Request};
use jsonrpsee::{MethodResponse, ResponsePayload};
use serde_json::value::RawValue;

use crate::claim::IdempotencyCache;
use crate::error::{ErrorCode, IdempotencyError, EXTENSION_URI};
use crate::guard::{collision, store_refusal, verbatim_request};
use crate::hash::{hash_and_message_id, HashError, Sent, Spelling, MAX_DEPTH};
use crate::layers::scope::{
    CallId, GovernedCall, GuardReach, HttpScope, Outcome, Undeduplicated, WebSocket,
};
use crate::message_id::MessageId;
use crate::state::State;
use crate::store::Entry;
use crate::unit_of_work::UnitOfWork;
use crate::wire::{decode, Payload};

/// The tower layer that wraps jsonrpsee's RPC service (see [`crate::Idempotency::rpc_layer`]).
#[derive(Clone, Debug)]
pub struct RpcLayer {
    state: Arc<State>,
}

impl RpcLayer {
    pub(crate) fn new(state: Arc<State>) -> Self {
        Self { state }
    }
}

impl<S> tower::Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The RPC service of [`RpcLayer`].
#[derive(Clone, Debug)]
pub struct RpcService<S> {
    inner: S,
    state: Arc<State>,
}

impl<S> RpcServiceT for RpcService<S>
where
    S: RpcServiceT<
            MethodResponse = MethodResponse,
            BatchResponse = MethodResponse,
            NotificationResponse = MethodResponse,
        > + Send
        + Sync
        + Clone
        + 'static,
{
    type MethodResponse = MethodResponse;
    type NotificationResponse = MethodResponse;
    type BatchResponse = MethodResponse;

    fn call<'a>(
        &self,
        mut request: Request<'a>,
    ) -> impl Future<Output = MethodResponse> + Send + 'a {
        if let Some(scope) = request.extensions().get::<HttpScope>() {
            scope.mark_dispatched();
        }
        let checked = self.admit(&mut request, true);
        let governed = request.extensions().get::<GovernedCall>().cloned();
        let unguarded = Unguarded::of(&request);
        let inner = self.inner.clone();
        let limit = self.state.config.max_response_body_bytes as usize;
        async move {
            let response = match checked {
                // Refused, or a resend whose stored answer is an error.
                Err(error) => return MethodResponse::error(request.id, error),
                Ok(Some(payload)) => answer(request.id, payload, limit),
                Ok(None) => match (inner.call(request).await, unguarded) {
                    (response, Some((reach, unguarded))) if !reach.reached() => {
                        unguarded.answer(response, governed).await
                    }
                    (response, _) => response,
                },
            };
            oversized_told_apart(response, limit)
        }
    }

    fn batch<'a>(&self, mut batch: Batch<'a>) -> impl Future<Output = MethodResponse> + Send + 'a {
        // Every entry is answered but a notification.
        let notifications = batch
            .iter()
            .filter(|e| matches!(e, Ok(BatchEntry::Notification(_))));
        let answers = batch.len() - notifications.count();
        for entry in batch.iter_mut() {
            let Ok(BatchEntry::Call(request)) = entry else {
                continue;
            };
            if let Some(scope) = request.extensions().get::<HttpScope>() {
                scope.mark_batch(answers);
            }
            if let Err(error) = self.admit(request, false) {
                *entry = Err(BatchEntryErr::new(request.id.clone().into_owned(), error));
            }
        }
        let inner = self.inner.clone();
        let limit = self.state.config.max_response_body_bytes as usize;
        async move {
            // jsonrpsee may refuse an entry's typed params before the guard sees it, and a
            // batch's answers cannot be amended afterwards: find the collisions first.
            let mut governed = Vec::new();
            // jsonrpsee answers the entries in order, notifications aside: the answer's place.
            let answered = batch
                .iter_mut()
                .filter(|e| !matches!(e, Ok(BatchEntry::Notification(_))));
            for (place, entry) in answered.enumerate() {
                let Ok(BatchEntry::Call(request)) = entry else {
                    continue;
                };
                let call = request.extensions().get::<GovernedCall>().cloned();
                let held = match &call {
                    Some(call) => held_by_another(call).await,
                    None => None,
                };
                match held {
                    Some(error) => {
                        *entry = Err(BatchEntryErr::new(request.id.clone().into_owned(), error))
                    }
                    // What goes to the method: its guard should take it.
                    None => governed.extend(Unguarded::of(request).map(|u| (place, u, call))),
                }
            }
            let response = inner.batch(batch).await;
            governed.retain(|(_, (reach, _), _)| !reach.reached());
            let response = match governed.is_empty() {
                true => response,
                false => Unguarded::in_batch(response, &governed).await,
            };
            cut_short(oversized_told_apart_in_batch(response, limit), limit)
        }
    }

    fn notification<'a>(
        &self,
        n: Notification<'a>,
    ) -> impl Future<Output = MethodResponse> + Send + 'a {
        // jsonrpsee does not run HTTP notifications, governed or not.
        self.inner.notification(n)
    }
}

impl<S> RpcService<S> {
    /// Checks a call; for a governed one, puts what the guard needs into its extensions.
    /// With `spelled`, a resend of an answered call's very bytes comes back as the stored
    /// payload that answers it.
    fn admit(
        &self,
        request: &mut Request<'_>,
        spelled: bool,
    ) -> Result<Option<Payload>, ErrorObjectOwned> {
        if !self.state.governed.contains(request.method_name()) {
            let id = CallId(request.id.clone().into_owned());
            request.extensions_mut().insert(id);
            return Ok(None);
        }
        // No HTTP request, no scope to record in: counted here, as the scope counts.
        let refused =
            |code| crate::telemetry::outcome(request.method_name(), Outcome::Rejected(code));
        if request.extensions().get::<WebSocket>().is_some() {
            refused(ErrorCode::HttpOnly);
            return Err(IdempotencyError::new(ErrorCode::HttpOnly).to_error_object());
        }
        let Some(scope) = request.extensions().get::<HttpScope>().cloned() else {
            tracing::error!(
                method = request.method_name(),
                "idempotency RPC layer installed without its HTTP layer: refusing the governed call"
            );
            refused(ErrorCode::LayerMissing);
            let error = IdempotencyError::new(ErrorCode::LayerMissing).with_detail(
                "reason",
                "the HTTP layer is not installed: Idempotency::http_layer in set_http_middleware",
            );
            return Err(error.to_error_object());
        };
        let undeduplicated = Undeduplicated {
            id: request.id.clone().into_owned(),
            method: request.method_name().to_owned(),
            max_response_bytes: self.state.config.max_response_body_bytes as usize,
        };
        let Some(cache) = self.state.deduplicating() else {
            scope.record(request.method_name(), Outcome::Undeduplicated);
            self.pass_down(request, undeduplicated);
            return Ok(None);
        };
        if !scope.activated() {
            if self.state.config.required {
                scope.record(
                    request.method_name(),
                    Outcome::Rejected(ErrorCode::ExtensionSupportRequired),
                );
                let error = IdempotencyError::new(ErrorCode::ExtensionSupportRequired)
                    .with_detail("extension", EXTENSION_URI);
                return Err(error.to_error_object());
            }
            scope.record(request.method_name(), Outcome::Undeduplicated);
            self.pass_down(request, undeduplicated);
            return Ok(None);
        }
        if scope.caller().unidentified {
            let error = crate::caller::unidentified();
            scope.record(request.method_name(), Outcome::Rejected(error.code));
            return Err(error.to_error_object());
        }
        let raw = request.params.as_ref().map_or("null", |p| p.get());
        let params = Sent::params(raw.as_bytes());
        if spelled {
            let spelling = || scope.caller().spelling(params.spelling());
            if let Some((entry, payload)) =
                replay_spelled(cache, &params, &spelling, request.method_name())
            {
                scope.record(request.method_name(), Outcome::Replayed);
                // The first retry by key was under another JSON-RPC id (only its params were
                // learnt): these very bytes are answered by the HTTP layer from now on.
                let store = cache.store();
                if let Some(whole) = verbatim_request(&scope, &request.id, &entry, &payload) {
                    store.note_spellings(&entry, &[whole]);
                }
                return Ok(Some(payload));
            }
        }
        match self.governed_call(request, cache, &scope, params) {
            Ok(call) => {
                self.pass_down(request, call);
                Ok(None)
            }
            Err(error) => {
                scope.record(request.method_name(), Outcome::Rejected(error.code));
                Err(error.to_error_object())
            }
        }
    }

    /// Hands a governed call to the method's guard with what it needs: how the call is
    /// governed, the unit of work its body stages writes in (where there is a store), and
    /// the mark that tells the guard took it.
    fn pass_down<T: Clone + Send + Sync + 'static>(
        &self,
        request: &mut Request<'_>,
        governance: T,
    ) {
        let extensions = request.extensions_mut();
        if let Some(cache) = &self.state.cache {
            extensions.insert(UnitOfWork::new(cache.store().clone()));
        }
        extensions.insert(governance);
        extensions.insert(GuardReach::default());
    }

    fn governed_call(
        &self,
        request: &Request<'_>,
        cache: &IdempotencyCache,
        scope: &HttpScope,
        params: Sent,
    ) -> Result<GovernedCall, IdempotencyError> {
        let raw = request.params.as_ref().map_or("null", |p| p.get());
        let (hash, id) = hash_and_message_id(raw).map_err(not_canonicalizable)?;
        let key = MessageId::parse_found(id, self.state.config.message_id_policy).map_err(|e| {
            IdempotencyError::new(ErrorCode::KeyMalformed).with_detail("reason", e.to_string())
        })?;
        let key = match scope.caller().key_scope {
            Some(key_scope) => key.scoped(&key_scope),
            None => key,
        };
        Ok(GovernedCall {
            cache: cache.clone(),
            in_flight_wait: self.state.config.in_flight_wait,
            max_response_bytes: self.state.config.max_response_body_bytes as usize,
            scope: scope.clone(),
            id: request.id.clone().into_owned(),
            method: request.method_name().to_owned(),
            key,
            hash,
            params,
        })
    }
}

/// The response that answers call `id` with `payload`, cut at `limit` bytes as jsonrpsee
/// cuts what the guard answers: a stored result replayed under a longer id can outgrow it,
/// and the same request was answered both ways, by the guard and from memory (helper-76).
fn answer(id: Id<'_>, payload: Payload, limit: usize) -> MethodResponse {
    match payload {
        Ok(result) => {
            let result = ResponsePayload::success(result);
            MethodResponse::response(id, result, limit)
        }
        // An error is cut too: one with its `data` can outgrow the limit as well (helper-78).
        Err(error) => MethodResponse::response(id, ResponsePayload::<()>::error(error), limit),
    }
}

/// jsonrpsee answers a response over its size limit with -32008 "Response is too big", the
/// code A2A gives ExtensionSupportRequiredError, which tells a client to activate an extension
/// (found by helper-77: a `tasks/get` of a large task, a cancel that took effect). Any call's
/// such answer is `IDEMPOTENCY_RESPONSE_TOO_LARGE` instead, naming the limit.
fn oversized_told_apart(response: MethodResponse, limit: usize) -> MethodResponse {
    if response.as_error_code() != Some(OVERSIZED_RESPONSE_CODE) {
        return response;
    }
    let Ok(answer) = serde_json::from_str::<Answer<'_>>(response.as_json().get()) else {
        return response;
    };
    match answer.error.as_ref().is_some_and(AnswerError::is_oversized) {
        true => MethodResponse::error(answer.id, too_large(limit))
            .with_extensions(response.extensions().clone()),
        false => response,
    }
}

/// The same in a batch, whose entries jsonrpsee runs without this layer's `call` (found by
/// helper-78). Looked for in the answer's text first: most batches hold no such answer.
fn oversized_told_apart_in_batch(response: MethodResponse, limit: usize) -> MethodResponse {
    let json = response.as_json().get();
    if !json.contains(OVERSIZED_RESPONSE_MSG) {
        return response;
    }
    let Ok(answers) = serde_json::from_str::<Vec<Answer<'_>>>(json) else {
        return response;
    };
    let rebuilt = answers.into_iter().map(|answer| {
        match answer.error.as_ref().is_some_and(AnswerError::is_oversized) {
            true => MethodResponse::error(answer.id, too_large(limit)),
            false => answer.written_again(),
        }
    });
    batch_of(rebuilt, &response)
}

/// The batch answer of `answers`, in order, in place of `replaced` (its extensions kept). A
/// replacement may take it a little past jsonrpsee's size limit.
fn batch_of(
    answers: impl IntoIterator<Item = MethodResponse>,
    replaced: &MethodResponse,
) -> MethodResponse {
    let mut rebuilt = BatchResponseBuilder::new_with_limit(usize::MAX);
    for answer in answers {
        let _ = rebuilt.append(answer);
    }
    let extensions = replaced.extensions().clone();
    MethodResponse::from_batch(rebuilt.finish()).with_extensions(extensions)
}

/// jsonrpsee stops a batch whose answers together outgrow the limit at the call whose answer
/// passes it, and answers its own -32011 alone: the calls up to that one ran (and their
/// retries are replays), the later ones never did, and nothing said so. Said as the
/// extension's `IDEMPOTENCY_RESPONSE_TOO_LARGE`, naming the limit.
fn cut_short(response: MethodResponse, limit: usize) -> MethodResponse {
    if response.as_error_code() != Some(TOO_BIG_BATCH_RESPONSE_CODE) {
        return response;
    }
    let reason = "the batch's answers together outgrow the limit: its calls ran in order up \
                  to the one whose answer passed it (their retries are replays), the later \
                  ones did not run; send them in smaller batches, or one at a time";
    let error = IdempotencyError::new(ErrorCode::ResponseTooLarge)
        .with_detail("limit_bytes", limit)
        .with_detail("reason", reason);
    MethodResponse::error(Id::Null, error.to_error_object())
        .with_extensions(response.extensions().clone())
}

fn too_large(limit: usize) -> ErrorObjectOwned {
    let error = IdempotencyError::new(ErrorCode::ResponseTooLarge);
    error.with_detail("limit_bytes", limit).to_error_object()
}

/// Params the hash cannot bind: the reason, and for nesting the limit, as data.
fn not_canonicalizable(error: HashError) -> IdempotencyError {
    let refused = IdempotencyError::new(ErrorCode::PayloadNotCanonicalizable)
        .with_detail("reason", error.to_string());
    match error {
        HashError::TooDeep => refused.with_detail("max_depth", MAX_DEPTH),
        _ => refused,
    }
}

/// The entry, and the stored JSON-RPC payload, that answer a resend of these very params, if
/// the store holds it in memory. Streams are replayed by the guard (their answer is not one
/// payload).
fn replay_spelled(
    cache: &IdempotencyCache,
    params: &Sent,
    spelling: &dyn Fn() -> Spelling,
    method: &str,
) -> Option<(Arc<Entry>, Payload)> {
    let entry = cache.store().spelled(params.glimpse, spelling)?;
    // The same params under another method are the guard's 422, not a replay.
    if entry.method != method || crate::guard::stream::is_event_stream(&entry) {
        return None;
    }
    let payload = decode(&entry.response.body)?;
    Some((entry, payload))
}

/// A governed call, to answer as the application's mistake if its method's guard never
/// takes it. Borrows the request's id and method name (no copy on the way of every call).
struct Unguarded<'a> {
    id: Id<'a>,
    method: Cow<'a, str>,
}

impl<'a> Unguarded<'a> {
    /// The mark the guard sets, and the call, for a governed call passed down.
    fn of(request: &Request<'a>) -> Option<(GuardReach, Self)> {
        let reach = request.extensions().get::<GuardReach>()?.clone();
        let call = Self {
            id: request.id.clone(),
            method: request.method.clone(),
        };
        Some((reach, call))
    }

    /// jsonrpsee refused the call before the guard saw it: params whose types do not decode
    /// are the call's outcome, stored as any failure is ([`store_refusal`]); for a method
    /// jsonrpsee does not know, its error stands, unless another payload holds the key, which
    /// is still the spec's 422 (§4.3). Any other answer came from a method without
    /// `#[idempotent]`, which ran undeduplicated with its staged writes dropped: answered as
    /// the application's mistake, loudly, never as what the body said.
    async fn answer(
        self,
        response: MethodResponse,
        governed: Option<GovernedCall>,
    ) -> MethodResponse {
        let error = response
            .is_error()
            .then(|| decode(response.as_json().get().as_bytes()));
        let error = error.flatten().and_then(Result::err);
        if let Some(refusal) = error.filter(refused_before_the_body) {
            return match governed {
                Some(call) if refusal.code() == INVALID_PARAMS_CODE => {
                    let payload = store_refusal(&call, refusal).await;
                    answer(call.id.clone(), payload, call.max_response_bytes)
                        .with_extensions(response.extensions().clone())
                }
                Some(call) => collision_instead(&call, response).await,
                None => response,
            };
        }
        let extensions = response.extensions().clone();
        let error = self.error(governed.as_ref());
        MethodResponse::error(self.id, error).with_extensions(extensions)
    }

    /// A batch's answers, those in the places of `unguarded` calls replaced as in [`answer`]
    /// (a key that an entry before it took in the same batch included), the others written
    /// again as jsonrpsee wrote them (jsonrpsee's batch answer is one piece of JSON, and it
    /// makes a batch only of answers it serializes). A replacement may take the answer a
    /// little past jsonrpsee's size limit.
    async fn in_batch(
        response: MethodResponse,
        unguarded: &[(usize, (GuardReach, Self), Option<GovernedCall>)],
    ) -> MethodResponse {
        let Ok(answers) = serde_json::from_str::<Vec<Answer<'_>>>(response.as_json().get()) else {
            return response; // one answer for the whole batch: none of a call's to replace
        };
        let mut rebuilt = Vec::with_capacity(answers.len());
        for (place, answer) in answers.into_iter().enumerate() {
            let mistake = unguarded.iter().find(|(at, ..)| *at == place);
            let error = answer.error.as_ref().map(AnswerError::to_error_object);
            let one = match (mistake, error.filter(refused_before_the_body)) {
                (Some((_, (_, call), governed)), None) => {
                    MethodResponse::error(answer.id, call.error(governed.as_ref()))
                }
                (Some((_, _, Some(governed))), Some(refusal)) => {
                    match refusal.code() == INVALID_PARAMS_CODE {
                        true => {
                            let payload = store_refusal(governed, refusal).await;
                            self::answer(answer.id, payload, governed.max_response_bytes)
                        }
                        false => match held_by_another(governed).await {
                            Some(collision) => MethodResponse::error(answer.id, collision),
                            None => answer.written_again(),
                        },
                    }
                }
                _ => answer.written_again(),
            };
            rebuilt.push(one);
        }
        batch_of(rebuilt, &response)
    }

    /// The answer in place of the method's; counted as a refusal where the call was
    /// deduplicated (one that was not was counted as it was passed down).
    fn error(&self, governed: Option<&GovernedCall>) -> ErrorObjectOwned {
        if let Some(call) = governed {
            call.record(Outcome::Rejected(ErrorCode::NotGuarded));
        }
        tracing::error!(
            method = %self.method,
            "a governed method answered without its guard: put #[idempotent] on its \
             implementation (in the `impl ...Server for ...` block: jsonrpsee drops the \
             attributes of `#[rpc]` trait methods), or stop governing it; or an RPC \
             middleware installed after Idempotency::rpc_layer answered it (put rpc_layer last)"
        );
        let error = IdempotencyError::new(ErrorCode::NotGuarded);
        error
            .with_detail("method", self.method.as_ref())
            .to_error_object()
    }
}

/// Whether an answer with this error is jsonrpsee's own, before any method body ran: to a
/// method it does not know, or to params whose types do not decode, which it answers
/// "Invalid params" with the decoder's message as a string. A body's own -32602 of another
/// shape (no data, an object) is the body's, and its missing guard is named (it was stored
/// as the key's outcome, and the retry ran the body again: helper-97).
fn refused_before_the_body(error: &ErrorObjectOwned) -> bool {
    match error.code() {
        METHOD_NOT_FOUND_CODE => true,
        INVALID_PARAMS_CODE => {
            let data_is_text = error.data().is_some_and(|d| d.get().starts_with('"'));
            error.message() == INVALID_PARAMS_MSG && data_is_text
        }
        _ => false,
    }
}

/// One answer of a batch, as jsonrpsee wrote it: each member kept as its JSON text, and a
/// member's absence told from its `null`.
#[derive(serde::Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    id: Id<'a>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<AnswerError<'a>>,
}

#[derive(serde::Deserialize)]
struct AnswerError<'a> {
    code: i32,
    #[serde(borrow)]
    message: Cow<'a, str>,
    #[serde(borrow, default, deserialize_with = "present")]
    data: Option<&'a RawValue>,
}

impl AnswerError<'_> {
    fn to_error_object(&self) -> ErrorObjectOwned {
        ErrorObject::owned(self.code, self.message.to_string(), self.data)
    }

    /// jsonrpsee's answer to a response over its size limit.
    fn is_oversized(&self) -> bool {
        self.code == OVERSIZED_RESPONSE_CODE && self.message == OVERSIZED_RESPONSE_MSG
    }
}

impl Answer<'_> {
    /// The answer, serialized as jsonrpsee serialized it.
    fn written_again(self) -> MethodResponse {
        match self.error {
            Some(error) => MethodResponse::error(self.id, error.to_error_object()),
            // Neither member is not an answer jsonrpsee writes: `null` stands in.
            None => {
                let result = ResponsePayload::success(self.result);
                MethodResponse::response(self.id, result, usize::MAX)
            }
        }
    }
}

/// A member that is there, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<&'de RawValue>, D::Error> {
    serde::Deserialize::deserialize(deserializer).map(Some)
}

/// The 422 collision if another payload (or method) holds the call's key; else `response`.
async fn collision_instead(call: &GovernedCall, response: MethodResponse) -> MethodResponse {
    match held_by_another(call).await {
        Some(error) => MethodResponse::error(call.id.clone(), error),
        None => response,
    }
}

/// The spec's 422 when another payload (or method) holds the call's key.
async fn held_by_another(call: &GovernedCall) -> Option<ErrorObjectOwned> {
    match call.cache.holder(&call.key).await {
        Ok(Some((method, hash))) => collision(call, &method, &hash),
        _ => None,
    }
}
