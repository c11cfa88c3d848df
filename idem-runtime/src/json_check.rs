//! One pass over raw JSON text that refuses what RFC 8785 cannot canonicalize honestly.
//!
//! serde_json (without `arbitrary_precision`, which would change number handling for the whole
//! dependency graph) neither reports duplicate member names nor shows number text, so this scanner
//! checks both on the raw bytes before serde_json parses them.

use std::borrow::Cow;

/// Why params could not be hashed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
        "number {text} is not exactly representable as an IEEE-754 double; send it as a string"
    )]
    /// A number whose decimal value the IEEE-754 double JCS prints would change.
    InexactNumber {
        /// The number as written.
        text: String,
    },
    #[error("params nest deeper than {MAX_DEPTH} levels")]
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

/// Nesting bound; serde_json refuses deeper input too.
pub const MAX_DEPTH: usize = 128;

/// Checks `raw`; on success returns it as `&str`, ready for serde_json.
pub fn check(raw: &[u8]) -> Result<&str, HashError> {
    let text = std::str::from_utf8(raw).map_err(|e| HashError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    let mut scanner = Scanner {
        text,
        s: raw,
        pos: 0,
        depth: 0,
    };
    scanner.ws();
    scanner.value()?;
    scanner.ws();
    if scanner.pos != raw.len() {
        return Err(scanner.syntax("trailing characters"));
    }
    Ok(text)
}

struct Scanner<'a> {
    text: &'a str,
    s: &'a [u8],
    pos: usize,
    depth: usize,
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

    fn expect(&mut self, byte: u8) -> Result<(), HashError> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.syntax(&format!("expected '{}'", byte as char)))
        }
    }

    fn value(&mut self) -> Result<(), HashError> {
        match self.peek() {
            Some(b'{') => self.nested(Self::object),
            Some(b'[') => self.nested(Self::array),
            Some(b'"') => self.string().map(drop),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            _ => Err(self.syntax("expected a value")),
        }
    }

    fn nested(&mut self, f: fn(&mut Self) -> Result<(), HashError>) -> Result<(), HashError> {
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
            Ok(())
        } else {
            Err(self.syntax("invalid literal"))
        }
    }

    fn object(&mut self) -> Result<(), HashError> {
        self.expect(b'{')?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        let mut names = Vec::new();
        loop {
            self.ws();
            names.push(self.string()?);
            self.ws();
            self.expect(b':')?;
            self.ws();
            self.value()?;
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return unique(names);
                }
                _ => return Err(self.syntax("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self) -> Result<(), HashError> {
        self.expect(b'[')?;
        self.ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.ws();
            self.value()?;
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(self.syntax("expected ',' or ']'")),
            }
        }
    }

    /// Scans a string and returns its decoded value (member names are compared decoded:
    /// `"a"` and `"\u0061"` are the same name), borrowed from the input unless it has escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, HashError> {
        self.expect(b'"')?;
        let mut out = Cow::Borrowed("");
        loop {
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
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
        if crate::number_exactness::is_exact(text) {
            Ok(())
        } else {
            Err(HashError::InexactNumber {
                text: text.to_owned(),
            })
        }
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

/// RFC 8785 needs I-JSON: an object's member names are unique (compared decoded).
fn unique(mut names: Vec<Cow<'_, str>>) -> Result<(), HashError> {
    names.sort_unstable();
    match names.windows(2).find(|pair| pair[0] == pair[1]) {
        Some(pair) => Err(HashError::DuplicateMember {
            name: pair[0].to_string(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn refuses_deep_nesting_without_overflowing_the_stack() {
        let deep = "[".repeat(100_000);
        assert_eq!(check(deep.as_bytes()), Err(HashError::TooDeep));
    }
}
