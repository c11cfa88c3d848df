//! One pass from raw params to their RFC 8785 form: it refuses what JCS cannot canonicalize
//! honestly, writes the canonical bytes (without `params.message.messageId`), and finds the
//! messageId, all without building a tree.
//!
//! Refused: duplicate member names (serde_json would silently keep the last), lone surrogates,
//! and numbers whose decimal value the IEEE-754 double would change. Written as `jcs.rs`
//! writes a parsed value (and as serde_jcs does; the tests compare all three): member names
//! sorted by UTF-16 code units, strings escaped minimally, numbers as their double in
//! ECMAScript's shortest form. Most of the text needs no work: a string without escapes is
//! already canonical, an object whose names arrive sorted stays where it was written, and a
//! short integer is its own canonical form.

use std::borrow::Cow;
use std::cmp::Ordering;

/// Why params could not be hashed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HashError {
    #[error("params are not valid UTF-8 (at byte {offset})")]
    /// Not UTF-8; `offset` is where the valid prefix ends.
    InvalidUtf8 {
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    #[error("params are not valid JSON at byte {offset}: {detail}")]
    /// Not JSON.
    Syntax {
        /// Byte offset of the error (0 when only the parser's message knows).
        offset: usize,
        /// What is wrong there.
        detail: String,
    },
    #[error(
        "duplicate member name {name:?}: RFC 8785 needs I-JSON, where member names are unique"
    )]
    /// An object repeats a member name (serde_json would silently keep the last).
    DuplicateMember {
        /// The repeated name, decoded.
        name: String,
    },
    #[error("lone surrogate {escape} in a string: RFC 8785 needs valid Unicode")]
    /// A `\uD800`-style escape without its pair: not Unicode.
    LoneSurrogate {
        /// The escape as written.
        escape: String,
    },
    #[error(
        "number {text} has no exact RFC 8785 form: RFC 8785 writes the IEEE-754 double it reads \
         as with other digits of another decimal value (or cannot, past the double's range), \
         so numbers that differ would share one hash; send it as a string, or with the digits \
         of its double's shortest form"
    )]
    /// A number whose decimal value the IEEE-754 double JCS prints would change.
    InexactNumber {
        /// The number as written.
        text: String,
    },
    #[error(
        "params nest deeper than {MAX_DEPTH} levels, the most the canonical hash (and \
         serde_json, which reads the params after it) accepts; send flatter params"
    )]
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

/// Nesting bound, the params object itself the first level: serde_json's (it refuses a 128th
/// level), so that params the guard accepts never fail in the method's own parse.
pub const MAX_DEPTH: usize = 127;

/// Raw params in canonical form.
pub(crate) struct Canonical {
    /// The RFC 8785 bytes of the params without `params.message.messageId`: what is hashed.
    pub(crate) bytes: Vec<u8>,
    /// `params.message.messageId` as found.
    pub(crate) message_id: FoundId,
}

/// What `params.message.messageId` held.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FoundId {
    Missing,
    /// The params are an array or a scalar: there is no `message` to look in.
    ParamsNotAnObject,
    /// A string, decoded.
    Text(String),
    /// Some other JSON value.
    NotAString,
}

/// Checks `raw` and writes its canonical form.
pub(crate) fn canonicalize(raw: &[u8]) -> Result<Canonical, HashError> {
    canonicalize_text(utf8(raw)?)
}

/// [`canonicalize`] of params known to be UTF-8 already (jsonrpsee hands them over as text).
pub(crate) fn canonicalize_text(text: &str) -> Result<Canonical, HashError> {
    canonicalize_within(text, REORDER_FACTOR * text.len() + REORDER_FLOOR)
}

/// [`canonicalize_text`], reordering at most `reorder_budget` bytes in the pass.
fn canonicalize_within(text: &str, reorder_budget: usize) -> Result<Canonical, HashError> {
    let scanner = scan(text, reorder_budget)?;
    let bytes = match scanner.reorder_budget {
        Some(_) => scanner.out,
        None => reordered_from_tree(scanner.text)?,
    };
    Ok(Canonical {
        bytes,
        message_id: scanner.message_id,
    })
}

fn utf8(raw: &[u8]) -> Result<&str, HashError> {
    std::str::from_utf8(raw).map_err(|e| HashError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })
}

/// Checks `text` in one pass, writing its canonical form while reordering stays within budget.
fn scan(text: &str, reorder_budget: usize) -> Result<Scanner<'_>, HashError> {
    let raw = text.as_bytes();
    let mut scanner = Scanner {
        text,
        s: raw,
        pos: 0,
        depth: 0,
        out: Vec::with_capacity(raw.len()),
        scratch: Vec::new(),
        members: Vec::new(),
        message_id: FoundId::Missing,
        reorder_budget: Some(reorder_budget),
    };
    scanner.ws();
    if !matches!(scanner.peek(), Some(b'{' | b'n')) {
        scanner.message_id = FoundId::ParamsNotAnObject; // `null` is params left out
    }
    scanner.value(Place::Params)?;
    scanner.ws();
    if scanner.pos != raw.len() {
        return Err(scanner.syntax("trailing characters"));
    }
    Ok(scanner)
}

/// How many bytes the pass may move to put members in order, per byte of params (plus a
/// floor for small ones): an object out of order moves everything inside it, so objects out
/// of order nested `d` deep move a byte `d` times. Ordinary params move each byte a few
/// times at most; hostile ones (a 10 MB string under 120 levels each out of order) would
/// have moved gigabytes, on the async worker.
const REORDER_FACTOR: usize = 8;
const REORDER_FLOOR: usize = 64 * 1024;

/// The canonical form of params the pass checked but gave up putting in order: written
/// from a parsed tree instead, where each byte is written once (`jcs.rs`).
fn reordered_from_tree(checked: &str) -> Result<Vec<u8>, HashError> {
    let params = serde_json::from_str(checked).map_err(|e| HashError::Syntax {
        offset: 0,
        detail: e.to_string(),
    })?;
    crate::hash::canonical_without_message_id(params)
}

/// Checks `raw`; on success returns it as `&str`, ready for serde_json.
pub fn check(raw: &[u8]) -> Result<&str, HashError> {
    Ok(scan(utf8(raw)?, 0)?.text) // nothing written is kept: nothing worth reordering
}

struct Scanner<'a> {
    text: &'a str,
    s: &'a [u8],
    pos: usize,
    depth: usize,
    /// The canonical form so far.
    out: Vec<u8>,
    /// Where an object's members are put in order (reused: objects end innermost first).
    scratch: Vec<u8>,
    /// The members of the objects being written, innermost last: one stack for all of them,
    /// so an object costs no allocation of its own.
    members: Vec<Member<'a>>,
    message_id: FoundId,
    /// Bytes that reordering members may still move; `None` once spent, after which `out`
    /// is not kept in order (see [`reordered_from_tree`]).
    reorder_budget: Option<usize>,
}

/// Where a value sits, as far as the messageId's removal cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The params themselves.
    Params,
    /// `params.message`.
    Message,
    Elsewhere,
}

/// One member of an object being written: its name and where its `"name":value` is in `out`.
struct Member<'a> {
    name: Cow<'a, str>,
    start: usize,
    end: usize,
}

impl<'a> Scanner<'a> {
    fn syntax(&self, detail: &str) -> HashError {
        HashError::Syntax {
            offset: self.pos,
            detail: detail.to_owned(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    #[inline]
    fn expect(&mut self, byte: u8) -> Result<(), HashError> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.expected(byte))
        }
    }

    /// Out of the way of [`expect`](Self::expect), which runs at every quote and colon.
    #[cold]
    fn expected(&self, byte: u8) -> HashError {
        self.syntax(&format!("expected '{}'", byte as char))
    }

    fn value(&mut self, place: Place) -> Result<(), HashError> {
        match self.peek() {
            Some(b'{') => self.nested(|s| s.object(place)),
            Some(b'[') => self.nested(Self::array),
            Some(b'"') => {
                let string = self.string()?;
                self.write_string(&string);
                Ok(())
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            _ => Err(self.syntax("expected a value")),
        }
    }

    fn nested(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), HashError>,
    ) -> Result<(), HashError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(HashError::TooDeep);
        }
        f(self)?;
        self.depth -= 1;
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), HashError> {
        if self.s[self.pos..].starts_with(word) {
            self.pos += word.len();
            self.out.extend_from_slice(word);
            Ok(())
        } else {
            Err(self.syntax("invalid literal"))
        }
    }

    fn object(&mut self, place: Place) -> Result<(), HashError> {
        self.expect(b'{')?;
        self.out.push(b'{');
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            self.out.push(b'}');
            return Ok(());
        }
        let body = self.out.len();
        let first = self.members.len();
        let mut removed: Option<Cow<'a, str>> = None;
        loop {
            self.ws();
            let name = self.string()?;
            self.ws();
            self.expect(b':')?;
            self.ws();
            if place == Place::Message && name == "messageId" {
                if removed.replace(name).is_some() {
                    return Err(duplicate("messageId"));
                }
                self.message_id()?;
            } else {
                let inner = match (place, &*name) {
                    (Place::Params, "message") => Place::Message,
                    _ => Place::Elsewhere,
                };
                if self.members.len() > first {
                    self.out.push(b',');
                }
                let start = self.out.len();
                self.write_string(&name);
                self.out.push(b':');
                self.value(inner)?;
                let end = self.out.len();
                self.members.push(Member { name, start, end });
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.syntax("expected ',' or '}'")),
            }
        }
        if let Some(name) = removed {
            if self.members[first..].iter().any(|m| m.name == name) {
                return Err(duplicate(&name));
            }
        }
        self.sort_members(body, first)?;
        self.members.truncate(first);
        self.out.push(b'}');
        Ok(())
    }

    /// Puts the members written from `body` on (those of `self.members` from `first` on) in
    /// RFC 8785 order, refusing a repeated name.
    fn sort_members(&mut self, body: usize, first: usize) -> Result<(), HashError> {
        let members = &mut self.members[first..];
        if members
            .windows(2)
            .all(|m| utf16_cmp(&m[0].name, &m[1].name) == Ordering::Less)
        {
            return Ok(()); // sorted as sent (and so unique): written in place
        }
        members.sort_unstable_by(|a, b| utf16_cmp(&a.name, &b.name));
        if let Some(pair) = members.windows(2).find(|m| m[0].name == m[1].name) {
            return Err(duplicate(&pair[0].name));
        }
        let moved = self.out.len() - body;
        self.reorder_budget = self.reorder_budget.and_then(|left| left.checked_sub(moved));
        if self.reorder_budget.is_none() {
            return Ok(()); // checked; the order is written from a tree
        }
        self.scratch.clear();
        for (i, member) in members.iter().enumerate() {
            if i > 0 {
                self.scratch.push(b',');
            }
            self.scratch
                .extend_from_slice(&self.out[member.start..member.end]);
        }
        self.out.truncate(body);
        self.out.extend_from_slice(&self.scratch);
        Ok(())
    }

    /// Scans `params.message.messageId`, which is not hashed, and keeps what it holds.
    fn message_id(&mut self) -> Result<(), HashError> {
        if self.peek() == Some(b'"') {
            self.message_id = FoundId::Text(self.string()?.into_owned());
            return Ok(());
        }
        let written = self.out.len();
        self.value(Place::Elsewhere)?;
        self.out.truncate(written);
        self.message_id = FoundId::NotAString;
        Ok(())
    }

    fn array(&mut self) -> Result<(), HashError> {
        self.expect(b'[')?;
        self.out.push(b'[');
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            self.out.push(b']');
            return Ok(());
        }
        loop {
            self.ws();
            self.value(Place::Elsewhere)?;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.out.push(b',');
                }
                Some(b']') => {
                    self.pos += 1;
                    self.out.push(b']');
                    return Ok(());
                }
                _ => return Err(self.syntax("expected ',' or ']'")),
            }
        }
    }

    /// A string as RFC 8785 writes it. One borrowed from the input had no escapes, and JSON
    /// text holds no unescaped `"`, `\` or control character: it is canonical as it was sent.
    #[allow(clippy::ptr_arg)] // the variant is what matters: borrowed means unescaped
    fn write_string(&mut self, string: &Cow<'a, str>) {
        match string {
            Cow::Borrowed(raw) => {
                self.out.push(b'"');
                self.out.extend_from_slice(raw.as_bytes());
                self.out.push(b'"');
            }
            Cow::Owned(decoded) => crate::hash::jcs::write_string(decoded, &mut self.out),
        }
    }

    /// Scans a string and returns its decoded value (member names are compared decoded:
    /// `"a"` and `"\u0061"` are the same name), borrowed from the input unless it has escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, HashError> {
        self.expect(b'"')?;
        let mut out = Cow::Borrowed("");
        loop {
            let start = self.pos;
            self.pos += plain_run(&self.s[start..]);
            // The input is valid UTF-8 and we stopped on an ASCII byte: the slice is whole chars.
            let run = &self.text[start..self.pos];
            if out.is_empty() {
                out = Cow::Borrowed(run);
            } else {
                out.to_mut().push_str(run);
            }
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let escaped = self.escape()?;
                    out.to_mut().push(escaped);
                }
                Some(_) => return Err(self.syntax("control character in string")),
                None => return Err(self.syntax("unterminated string")),
            }
        }
    }

    fn escape(&mut self) -> Result<char, HashError> {
        let b = self
            .peek()
            .ok_or_else(|| self.syntax("unterminated escape"))?;
        self.pos += 1;
        Ok(match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode_escape(),
            _ => return Err(self.syntax("invalid escape")),
        })
    }

    fn unicode_escape(&mut self) -> Result<char, HashError> {
        let first = self.hex4()?;
        if !(0xD800..0xE000).contains(&first) {
            return Ok(char::from_u32(first).expect("not a surrogate"));
        }
        let lone = || HashError::LoneSurrogate {
            escape: format!("\\u{first:04X}"),
        };
        if first >= 0xDC00 || !self.s[self.pos..].starts_with(b"\\u") {
            return Err(lone());
        }
        self.pos += 2;
        let second = self.hex4()?;
        if !(0xDC00..0xE000).contains(&second) {
            return Err(lone());
        }
        let code = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
        Ok(char::from_u32(code).expect("valid pair"))
    }

    fn hex4(&mut self) -> Result<u32, HashError> {
        let digits = self
            .s
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.syntax("short \\u escape"))?;
        let text = std::str::from_utf8(digits).map_err(|_| self.syntax("bad \\u escape"))?;
        let value = u32::from_str_radix(text, 16).map_err(|_| self.syntax("bad \\u escape"))?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.syntax("bad \\u escape"));
        }
        self.pos += 4;
        Ok(value)
    }

    fn number(&mut self) -> Result<(), HashError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.syntax("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.require_digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            self.require_digits()?;
        }
        let text = std::str::from_utf8(&self.s[start..self.pos]).expect("ASCII");
        if !crate::hash::number_exactness::is_exact(text) {
            return Err(HashError::InexactNumber {
                text: text.to_owned(),
            });
        }
        write_number(text, &mut self.out);
        Ok(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
    }

    fn require_digits(&mut self) -> Result<(), HashError> {
        let start = self.pos;
        self.digits();
        if self.pos == start {
            return Err(self.syntax("expected digits"));
        }
        Ok(())
    }
}

/// How many bytes at the start of `text` need no attention inside a string: up to the first
/// `"`, `\\` or control character. Eight bytes at a time (most of params is text).
fn plain_run(text: &[u8]) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // Each byte's high bit set where the byte is below `n` (n <= 128). A borrow can only mark
    // bytes above a marked one, so the lowest mark is exact.
    let below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS;
    let mut done = 0;
    for chunk in text.chunks_exact(8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let marks = below(word, 0x20)
            | below(word ^ (ONES * u64::from(b'"')), 1)
            | below(word ^ (ONES * u64::from(b'\\')), 1);
        if marks != 0 {
            return done + (marks.trailing_zeros() / 8) as usize;
        }
        done += 8;
    }
    let tail = &text[done..];
    done + tail
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(tail.len())
}

/// RFC 8785 needs I-JSON: an object's member names are unique (compared decoded).
fn duplicate(name: &str) -> HashError {
    HashError::DuplicateMember {
        name: name.to_owned(),
    }
}

/// RFC 8785 §3.2.3: names sort by UTF-16 code units. That is byte order for ASCII, and
/// differs from it only for names mixing U+E000..U+FFFF with characters beyond U+FFFF.
/// So the first byte that differs decides, where both are ASCII (the bytes before it are
/// the same whole characters); a prefix sorts first in both orders.
fn utf16_cmp(a: &str, b: &str) -> Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        Some(i) if x[i].is_ascii() && y[i].is_ascii() => x[i].cmp(&y[i]),
        Some(_) => a.encode_utf16().cmp(b.encode_utf16()),
    }
}

/// An exact number token as JCS prints its double: a plain integer of up to 15 digits is
/// already in that form (but `-0`, which prints as `0`).
fn write_number(token: &str, out: &mut Vec<u8>) {
    let digits = token.strip_prefix('-').unwrap_or(token);
    let plain = digits.len() <= 15 && digits.bytes().all(|b| b.is_ascii_digit());
    if plain && digits != "0" {
        out.extend_from_slice(token.as_bytes());
    } else if plain {
        out.push(b'0');
    } else {
        let double = crate::hash::number_exactness::double_of(token);
        out.extend_from_slice(ryu_js::Buffer::new().format_finite(double).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::jcs::tests::Gen;
    use serde_json::Value;

    fn canonical(text: &str) -> Vec<u8> {
        canonicalize(text.as_bytes()).unwrap().bytes
    }

    /// JSON text of `value` with every object's members in reverse order and some whitespace:
    /// a spelling serde_json never writes, so the pass must reorder.
    fn respelled(value: &Value, gen: &mut Gen, out: &mut String) {
        let space = |gen: &mut Gen| [" ", "", "\n\t", "  "][(gen.next() % 4) as usize];
        match value {
            Value::Object(members) => {
                out.push('{');
                for (i, (name, member)) in members.iter().rev().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(space(gen));
                    out.push_str(&serde_json::to_string(name).unwrap());
                    out.push_str(space(gen));
                    out.push(':');
                    respelled(member, gen, out);
                }
                out.push_str(space(gen));
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    respelled(item, gen, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }

    /// An exact number spelled with more zeros than Rust's parser reads an exponent past is
    /// written as its value, as serde_jcs writes it: 0, 1 and 2 so spelled shared a hash
    /// (helper-116).
    #[test]
    fn a_long_spelling_of_an_exact_number_is_written_as_its_value() {
        let zeros = "0".repeat(655_359);
        let spellings = [
            (format!("0.{zeros}1e655360"), "1"),
            (format!("0.{zeros}2e655360"), "2"),
            (format!("1{zeros}0e-655360"), "1"),
            (format!("25{zeros}0e-655361"), "2.5"),
        ];
        for (token, value) in spellings {
            let text = format!(r#"{{"n":{token}}}"#);
            let reference = serde_jcs::to_vec(&serde_json::from_str::<Value>(&text).unwrap());
            assert_eq!(canonical(&text), reference.unwrap(), "{value}");
            assert_eq!(canonical(&text), format!(r#"{{"n":{value}}}"#).as_bytes());
        }
    }

    #[test]
    fn byte_identical_to_serde_jcs_on_generated_text_in_any_member_order() {
        let mut gen = Gen(0x2545_f491_4f6c_dd1d);
        let mut accepted = 0;
        for _ in 0..20_000 {
            let value = gen.value(4);
            let reference = serde_jcs::to_vec(&value).unwrap();
            let mut text = String::new();
            respelled(&value, &mut gen, &mut text);
            for spelling in [serde_json::to_string(&value).unwrap(), text] {
                match canonicalize(spelling.as_bytes()) {
                    Ok(ours) => {
                        assert_eq!(ours.bytes, reference, "{spelling}");
                        // And reordered from a tree, as past the reordering budget.
                        let tree = canonicalize_within(&spelling, 0).unwrap();
                        assert_eq!(tree.bytes, reference, "{spelling}");
                        accepted += 1;
                    }
                    // Integers beyond 2^53 that a double would round: refused on purpose.
                    Err(HashError::InexactNumber { .. }) => {}
                    Err(e) => panic!("{spelling}: {e}"),
                }
            }
        }
        assert!(accepted > 30_000, "only {accepted} of 40000 accepted");
    }

    #[test]
    fn finds_the_message_id_and_leaves_it_out() {
        let found = |text: &str| canonicalize(text.as_bytes()).unwrap();
        let with = found(r#"{"message":{"role":"user","messageId":"Ab"},"z":1}"#);
        assert_eq!(with.message_id, FoundId::Text("Ab".into()), "decoded");
        assert_eq!(with.bytes, br#"{"message":{"role":"user"},"z":1}"#);
        assert_eq!(found(r#"{"message":{}}"#).message_id, FoundId::Missing);
        assert_eq!(found(r#"{"messageId":"x"}"#).message_id, FoundId::Missing);
        assert_eq!(found("null").message_id, FoundId::Missing);
        for not_an_object in [r#"[{"message":{"messageId":"x"}}]"#, r#""s""#, "5", "true"] {
            let found = found(not_an_object).message_id;
            assert_eq!(found, FoundId::ParamsNotAnObject, "{not_an_object}");
        }
        for other in ["1", "null", r#"{"a":"b"}"#, r#"["x"]"#] {
            let text = format!(r#"{{"message":{{"messageId":{other},"k":1}}}}"#);
            let canonical = found(&text);
            assert_eq!(canonical.message_id, FoundId::NotAString, "{other}");
            assert_eq!(canonical.bytes, br#"{"message":{"k":1}}"#);
        }
        assert_eq!(
            canonicalize(br#"{"message":{"messageId":"a","messageId":"b"}}"#).err(),
            Some(HashError::DuplicateMember {
                name: "messageId".into()
            })
        );
        assert!(matches!(
            canonicalize(br#"{"message":{"messageId":"a","messageId":"b"}}"#),
            Err(HashError::DuplicateMember { .. })
        ));
    }

    #[test]
    fn plain_runs_stop_at_the_first_byte_that_needs_attention() {
        let expected = |text: &[u8]| {
            text.iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                .unwrap_or(text.len())
        };
        let mut gen = Gen(0x1234_5678_9abc_def1);
        let alphabet = [
            b'a', b'"', b'\\', 0x1f, 0x20, 0x7f, 0x80, 0xff, b'z', 0x00, 0x21, 0x5b, 0x5d,
        ];
        for _ in 0..50_000 {
            let len = (gen.next() % 40) as usize;
            let text: Vec<u8> = (0..len)
                .map(|_| match gen.next() % 4 {
                    0 => alphabet[(gen.next() % alphabet.len() as u64) as usize],
                    _ => b'a' + (gen.next() % 26) as u8,
                })
                .collect();
            assert_eq!(plain_run(&text), expected(&text), "{text:?}");
        }
    }

    #[test]
    fn names_compare_as_utf16_code_units() {
        // ASCII, a two-byte letter, the private-use area (U+E000..) and an astral character:
        // the last two order one way by bytes and the other by UTF-16.
        let alphabet = [
            'a',
            'b',
            'z',
            '\u{e9}',
            '\u{e000}',
            '\u{ffff}',
            '\u{1f600}',
            '\u{10000}',
        ];
        let mut gen = Gen(0x0bad_cafe_f00d_1234);
        let mut name = || -> String {
            let len = (gen.next() % 4) as usize;
            (0..len)
                .map(|_| alphabet[(gen.next() % alphabet.len() as u64) as usize])
                .collect()
        };
        for _ in 0..50_000 {
            let (a, b) = (name(), name());
            let expected = a.encode_utf16().cmp(b.encode_utf16());
            assert_eq!(utf16_cmp(&a, &b), expected, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn numbers_print_as_their_double() {
        assert_eq!(
            canonical("[-0,0,-0.0,4.50,1e2,1E+2,-12,123456789012345]"),
            b"[0,0,0,4.5,100,100,-12,123456789012345]"
        );
        assert_eq!(canonical("[1e21,5e-324,0.1]"), b"[1e+21,5e-324,0.1]");
        assert_eq!(canonical("[9007199254740992]"), b"[9007199254740992]");
    }

    #[test]
    fn official_vectors_from_raw_text() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jcs");
        for name in ["arrays", "french", "structures", "unicode", "weird"] {
            let input = std::fs::read(dir.join(format!("input/{name}.json"))).unwrap();
            let expected = std::fs::read(dir.join(format!("output/{name}.json"))).unwrap();
            assert_eq!(
                String::from_utf8(canonicalize(&input).unwrap().bytes).unwrap(),
                String::from_utf8(expected).unwrap(),
                "{name}"
            );
        }
        // values.json holds numbers such as 333333333.33333329 that JCS rounds: refused.
        let values = std::fs::read(dir.join("input/values.json")).unwrap();
        assert!(matches!(
            canonicalize(&values),
            Err(HashError::InexactNumber { .. })
        ));
    }

    #[test]
    fn refuses_duplicate_members_at_any_depth() {
        let dup = |s: &str| matches!(check(s.as_bytes()), Err(HashError::DuplicateMember { .. }));
        assert!(dup(r#"{"a":1,"a":2}"#));
        assert!(dup(
            r#"{"message":{"parts":[{"kind":"text","kind":"data"}]}}"#
        ));
        assert!(dup(r#"{"a":1,"\u0061":1}"#), "names compare decoded");
        assert!(
            check(br#"{"a":{"a":1},"b":{"a":1}}"#).is_ok(),
            "same name in sibling objects"
        );
    }

    #[test]
    fn refuses_lone_surrogates() {
        for s in [
            r#"["\uD800"]"#,
            r#"["\uDC00"]"#,
            r#"["\uD800x"]"#,
            r#"["\uD800\u0041"]"#,
        ] {
            assert!(
                matches!(check(s.as_bytes()), Err(HashError::LoneSurrogate { .. })),
                "{s}"
            );
        }
        assert!(check(r#"["\uD83D\uDE00"]"#.as_bytes()).is_ok());
    }

    #[test]
    fn refuses_inexact_numbers_and_keeps_exact_spellings() {
        for n in [
            "9007199254740993",
            "0.1000000000000000000001",
            "1e400",
            "-1e400",
            "1e-400",
            "1152921504606846976",
        ] {
            assert_eq!(
                check(format!("[{n}]").as_bytes()),
                Err(HashError::InexactNumber { text: n.into() })
            );
        }
        for n in [
            "4.50",
            "1e2",
            "-0",
            "0",
            "0.1",
            "-0.0",
            "9007199254740992",
            "1E+2",
            "5e-324",
            "1e21",
        ] {
            assert!(check(format!("[{n}]").as_bytes()).is_ok(), "{n}");
        }
    }

    #[test]
    fn refuses_invalid_utf8_and_syntax() {
        assert_eq!(
            check(b"{\"a\":\"\xff\"}"),
            Err(HashError::InvalidUtf8 { offset: 6 })
        );
        for bad in [
            "{\"a\":1",
            "[1,]",
            "{\"a\" 1}",
            "01",
            "1.",
            "-",
            "\"\\x\"",
            "[1] x",
            "\"a\u{1}\"",
            "tru",
        ] {
            assert!(
                matches!(check(bad.as_bytes()), Err(HashError::Syntax { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn objects_out_of_order_nested_deep_are_reordered_from_a_tree() {
        // Each level out of order moves all it holds: in the pass, 100 levels over a 100 KB
        // string would move 10 MB, 100 times the params.
        let mut nested = format!("\"{}\"", "a".repeat(100_000));
        for _ in 0..100 {
            nested = format!("{{\"z\":{nested},\"a\":0}}");
        }
        let text = format!("{{\"message\":{{\"x\":{nested},\"messageId\":\"m\"}}}}");
        let raw = text.as_bytes();
        let budget = REORDER_FACTOR * raw.len() + REORDER_FLOOR;
        assert!(
            scan(&text, budget).unwrap().reorder_budget.is_none(),
            "given up"
        );
        let ours = canonicalize(raw).unwrap();
        let mut value: Value = serde_json::from_str(&text).unwrap();
        value["message"]
            .as_object_mut()
            .unwrap()
            .remove("messageId");
        assert_eq!(ours.bytes, serde_jcs::to_vec(&value).unwrap());
        assert_eq!(ours.message_id, FoundId::Text("m".into()));
    }

    #[test]
    fn refuses_deep_nesting_without_overflowing_the_stack() {
        let deep = "[".repeat(100_000);
        assert_eq!(check(deep.as_bytes()), Err(HashError::TooDeep));
    }
}
