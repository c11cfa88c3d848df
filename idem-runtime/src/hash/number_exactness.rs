//! Is a JSON number token's decimal value exactly the one JCS will print for its double?
//!
//! JCS serializes every number as the shortest text that round-trips its IEEE-754 double. A token
//! is honest input when that text has the same decimal value: `4.50`, `1e2` and `-0` are, while
//! `9007199254740993` (printed `9007199254740992`) is not, and would share a hash with it.

/// A decimal value as `digits × 10^exponent`, with no leading or trailing zeros in `digits`
/// (zero is the empty digit string, whatever its sign).
#[derive(Debug, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: String,
    exponent: i64,
}

/// `true` when `token` (valid JSON number grammar) is exactly what its double serializes to.
pub fn is_exact(token: &str) -> bool {
    if is_short_plain_decimal(token) {
        return true;
    }
    let value = decimal(token);
    // Parsed from its digits, not from the token: Rust's parser took a token of a million
    // digits and as long an exponent for infinity or zero, where its value was 1 (helper-92).
    let Ok(double) = value.text().parse::<f64>() else {
        return false;
    };
    if !double.is_finite() {
        return false;
    }
    // Compare with the very text JCS prints: ECMAScript's shortest round-trip form, which breaks
    // ties to even where Rust's own `{:e}` would not (1424953923781206.2 vs ...06.3).
    value == decimal(ryu_js::Buffer::new().format_finite(double))
}

/// The double of a token that [`is_exact`] accepted, read from its digits as there: read from
/// the token, an exact 1 spelled with 655,360 zeros was 0 or infinity, and 0, 1 and 2 so
/// spelled shared a hash (helper-116).
pub(crate) fn double_of(exact: &str) -> f64 {
    decimal(exact)
        .text()
        .parse()
        .expect("an exact token's digits parse")
}

impl Decimal {
    /// The value, spelled with no zero that does not count: `-12e-3` for `-0.0120`.
    fn text(&self) -> String {
        match self.digits.is_empty() {
            true => "0".to_owned(),
            false => {
                let sign = if self.negative { "-" } else { "" };
                format!("{sign}{}e{}", self.digits, self.exponent)
            }
        }
    }
}

/// Without an exponent and with at most 15 digits, a decimal survives any IEEE-754 double
/// round trip (15 is DBL_DIG), so the common short numbers skip the full comparison.
fn is_short_plain_decimal(token: &str) -> bool {
    let digits = token.strip_prefix('-').unwrap_or(token);
    let mut count = 0;
    for b in digits.bytes() {
        match b {
            b'0'..=b'9' => count += 1,
            b'.' => {}
            _ => return false,
        }
    }
    count <= 15
}

fn decimal(text: &str) -> Decimal {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exp_text) = unsigned.split_once(['e', 'E']).unwrap_or((unsigned, "0"));
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // Exponents beyond i64 give an infinite or zero double, refused before we compare.
    let exp: i64 = exp_text
        .trim_start_matches('+')
        .parse()
        .unwrap_or(i64::MAX / 2);
    let all_digits = format!("{int_part}{frac_part}");
    let trimmed_front = all_digits.trim_start_matches('0');
    let digits = trimmed_front.trim_end_matches('0');
    let trailing_zeros = (trimmed_front.len() - digits.len()) as i64;
    Decimal {
        negative: negative && !digits.is_empty(),
        digits: digits.to_owned(),
        exponent: if digits.is_empty() {
            0
        } else {
            exp.saturating_sub(frac_part.len() as i64)
                .saturating_add(trailing_zeros)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_decimals() {
        assert_eq!(decimal("4.50"), decimal("45e-1"));
        assert_eq!(decimal("100"), decimal("1e2"));
        assert_eq!(decimal("-0"), decimal("0e0"));
        assert_eq!(decimal("0.00120"), decimal("1.2e-3"));
    }

    #[test]
    fn exactness() {
        assert!(is_exact("0.1"));
        assert!(is_exact("-2.5e-7"));
        assert!(is_exact("123456789012345680000"));
        assert!(!is_exact("123456789012345678901"));
        assert!(!is_exact("0.30000000000000000001"));
        assert!(!is_exact("1e99999999999999999999"));
        assert!(
            is_exact("1424953923781206.2"),
            "ECMAScript tie-to-even digits"
        );
    }

    /// Exact values spelled with a million zeros that do not count, and as long an exponent
    /// to make up for them: refused as inexact before (helper-92), while serde_jcs prints them.
    #[test]
    fn zeros_that_do_not_count_are_not_read_as_overflow() {
        let zeros = "0".repeat(1_000_000);
        let n = zeros.len();
        let exact = [
            format!("1{zeros}e-{n}"),
            format!("0.{zeros}1e{}", n + 1),
            format!("-123{zeros}e-{n}"),
            format!("17976931348623157{zeros}e{}", 292 - n as i64),
        ];
        for token in &exact {
            assert!(is_exact(token), "{}...", &token[..20]);
        }
        assert!(
            !is_exact(&format!("1{zeros}1e-{n}")),
            "2 digits past a double's"
        );
        assert!(
            !is_exact(&format!("1{zeros}e400")),
            "past the largest double"
        );
        let one = [format!("1{zeros}e-{n}"), format!("0.{zeros}1e{}", n + 1)];
        for token in &one {
            assert_eq!(double_of(token), 1.0, "{}...", &token[..20]);
        }
    }

    #[test]
    fn the_short_path_agrees_with_the_full_comparison() {
        let short = [
            "0",
            "-0",
            "7",
            "-12.5",
            "0.00000000000001",
            "123456789012345",
            "99999999999999.9",
            "4.50",
        ];
        for token in short {
            assert!(is_short_plain_decimal(token), "{token}");
            let double: f64 = token.parse().unwrap();
            let printed = ryu_js::Buffer::new().format_finite(double).to_owned();
            assert_eq!(decimal(token), decimal(&printed), "{token}");
        }
        // And on many generated ones: any digit string of up to 15 digits, point anywhere.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..100_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let digits = (seed % 15 + 1) as usize;
            let mut token = format!("{:015}", seed >> 4)[..digits].to_owned();
            let point = (seed >> 60) as usize % (digits + 1);
            if point > 0 && point < digits {
                token.insert(point, '.');
            }
            let printed = ryu_js::Buffer::new()
                .format_finite(token.parse::<f64>().unwrap())
                .to_owned();
            assert_eq!(decimal(&token), decimal(&printed), "{token}");
        }
        for token in [
            "1234567890123456",
            "0.000000000000001",
            "1e2",
            "0.1000000000000000000001",
        ] {
            assert!(!is_short_plain_decimal(token), "{token}");
        }
    }
}
