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
    let Ok(double) = token.parse::<f64>() else {
        return false;
    };
    if !double.is_finite() {
        return false;
    }
    // Compare with the very text JCS prints: ECMAScript's shortest round-trip form, which breaks
    // ties to even where Rust's own `{:e}` would not (1424953923781206.2 vs ...06.3).
    decimal(token) == decimal(ryu_js::Buffer::new().format_finite(double))
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
}
