//! `Replayable<T>`: the return type of an `#[idempotent]` method.
//!
//! The user's body returns its own typed value; the guard serializes it once, stores those bytes,
//! and answers with them. A replay answers with the same stored bytes, so the first answer and every
//! replay are byte-identical (jsonrpsee writes a `RawValue` verbatim).

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

/// A method result that is either freshly produced or replayed from the cache.
///
/// ```
/// use idem_runtime::Replayable;
/// #[derive(Clone, serde::Serialize)]
/// struct Task { id: String }
/// let fresh: Replayable<Task> = Task { id: "t1".into() }.into();
/// assert_eq!(serde_json::to_string(&fresh).unwrap(), r#"{"id":"t1"}"#);
/// ```
#[derive(Debug, Clone)]
pub struct Replayable<T>(Inner<T>);

#[derive(Debug, Clone)]
enum Inner<T> {
    Fresh(T),
    Stored(Box<RawValue>),
}

impl<T> Replayable<T> {
    /// Wraps a freshly produced value.
    ///
    /// ```
    /// use idem_runtime::Replayable;
    /// use serde_json::value::RawValue;
    /// let fresh = Replayable::new(42);
    /// assert_eq!(fresh.fresh(), Some(&42));
    /// assert!(fresh.raw().is_none());
    /// let replayed = Replayable::<i32>::stored(RawValue::from_string("42".into()).unwrap());
    /// assert!(replayed.fresh().is_none());
    /// assert_eq!(replayed.raw().map(RawValue::get), Some("42"));
    /// // Either way the client gets the same bytes.
    /// let bytes = |r: &Replayable<i32>| serde_json::to_string(r).unwrap();
    /// assert_eq!(bytes(&fresh), bytes(&replayed));
    /// ```
    pub fn new(value: T) -> Self {
        Self(Inner::Fresh(value))
    }

    /// Wraps bytes read back from the cache.
    pub fn stored(raw: Box<RawValue>) -> Self {
        Self(Inner::Stored(raw))
    }

    /// The fresh value, if this is not a replay.
    pub fn fresh(&self) -> Option<&T> {
        match &self.0 {
            Inner::Fresh(value) => Some(value),
            Inner::Stored(_) => None,
        }
    }

    /// The stored JSON text, if this is (or was already turned into) stored bytes.
    pub fn raw(&self) -> Option<&RawValue> {
        match &self.0 {
            Inner::Fresh(_) => None,
            Inner::Stored(raw) => Some(raw),
        }
    }
}

impl<T> From<T> for Replayable<T> {
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T: Serialize> Serialize for Replayable<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Inner::Fresh(value) => value.serialize(serializer),
            Inner::Stored(raw) => raw.serialize(serializer),
        }
    }
}
