//! RFC 8785 (JCS) canonical JSON, written straight from a parsed value.
//!
//! `serde_jcs` is correct but re-parses every member name to sort it and routes every byte
//! through dynamic dispatch; on the request path that made hashing several times the cost of
//! parsing. This writer does the same three things directly: member names sorted by UTF-16
//! code units, strings escaped as serde_json (and RFC 8785) escape them, every number printed
//! as its IEEE-754 double in ECMAScript's shortest form (ryu-js, as serde_jcs does). Tests keep
//! it byte-identical to serde_jcs.

use serde_json::{Map, Number, Value};

/// Appends the canonical form of `value` to `out`. `None` for a number JCS cannot print
/// (not finite), which parsed JSON never holds.
pub(crate) fn write(value: &Value, out: &mut Vec<u8>) -> Option<()> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => write_number(number, out)?,
        Value::String(string) => write_string(string, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(members) => write_object(members, out)?,
    }
    Some(())
}

fn write_object(members: &Map<String, Value>, out: &mut Vec<u8>) -> Option<()> {
    let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
    // RFC 8785 §3.2.3: by UTF-16 code units, which differs from Rust's (code point) order
    // for names mixing U+E000..U+FFFF with characters beyond U+FFFF.
    sorted.sort_unstable_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
    out.push(b'{');
    for (i, (name, value)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(name, out);
        out.push(b':');
        write(value, out)?;
    }
    out.push(b'}');
    Some(())
}

/// Every JSON number is a double in JCS; integers beyond 2^53 print as their double does.
fn write_number(number: &Number, out: &mut Vec<u8>) -> Option<()> {
    let double = number.as_f64().filter(|d| d.is_finite())?;
    out.extend_from_slice(ryu_js::Buffer::new().format_finite(double).as_bytes());
    Some(())
}

/// serde_json escapes exactly what RFC 8785 §3.2.2.2 requires: `"`, `\`, and U+0000..U+001F
/// (with the short forms for \b \t \n \f \r), and nothing else.
pub(crate) fn write_string(string: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(out, string).expect("writing to a Vec cannot fail");
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn ours(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        write(value, &mut out).unwrap();
        out
    }

    /// A small deterministic generator (xorshift), so the comparison covers shapes no one
    /// thought to write down: nesting, astral and private-use names, control characters.
    pub(crate) struct Gen(pub(crate) u64);

    impl Gen {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn pick<T: Copy>(&mut self, from: &[T]) -> T {
            from[(self.next() % from.len() as u64) as usize]
        }

        fn string(&mut self) -> String {
            let alphabet = [
                'a',
                'B',
                'é',
                '\u{1}',
                '\u{1f}',
                '"',
                '\\',
                '/',
                '\u{7f}',
                '\u{2028}',
                '\u{e000}',
                '\u{ffff}',
                '\u{10000}',
                '😀',
                '\n',
                '\t',
                'z',
                '0',
            ];
            (0..self.next() % 6).map(|_| self.pick(&alphabet)).collect()
        }

        fn number(&mut self) -> Value {
            match self.next() % 5 {
                0 => Value::from(self.next() as i64 >> (self.next() % 64)),
                1 => Value::from(self.next() >> (self.next() % 64)),
                2 => Value::from(f64::from_bits(self.next()) % 1e30).to_owned(),
                3 => Value::from((self.next() % 1000) as f64 / 8.0),
                _ => Value::from(-((self.next() % 100_000) as f64) * 1e-7),
            }
        }

        pub(crate) fn value(&mut self, depth: u32) -> Value {
            match (depth, self.next() % 7) {
                (0, _) | (_, 0) => self.number(),
                (_, 1) => Value::String(self.string()),
                (_, 2) => Value::Bool(self.next().is_multiple_of(2)),
                (_, 3) => Value::Null,
                (_, 4) => Value::Array(
                    (0..self.next() % 4)
                        .map(|_| self.value(depth - 1))
                        .collect(),
                ),
                _ => Value::Object(
                    (0..self.next() % 5)
                        .map(|_| (self.string(), self.value(depth - 1)))
                        .collect(),
                ),
            }
        }
    }

    #[test]
    fn byte_identical_to_serde_jcs_on_generated_values() {
        let mut gen = Gen(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let value = gen.value(4);
            let reference = serde_jcs::to_vec(&value).unwrap();
            assert_eq!(ours(&value), reference, "{value}");
        }
    }

    #[test]
    fn names_sort_by_utf16_code_units() {
        let value: Value = serde_json::from_str(r#"{"\ue000":1,"\ud800\udc00":2,"a":3}"#).unwrap();
        assert_eq!(
            ours(&value),
            "{\"a\":3,\"\u{10000}\":2,\"\u{e000}\":1}".as_bytes()
        );
    }
}
