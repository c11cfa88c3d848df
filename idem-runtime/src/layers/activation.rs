//! Which extensions a request activated: `A2A-Extensions` and the legacy `X-A2A-Extensions`.

use http::HeaderMap;

/// The activation header of A2A (spec §3.2).
pub const A2A_EXTENSIONS: &str = "a2a-extensions";
/// The header A2A 0.3 clients used; official SDKs still send it.
pub const X_A2A_EXTENSIONS: &str = "x-a2a-extensions";

/// Whether `uri` is among the extensions the request activated: every line of either header,
/// comma-separated, surrounding whitespace ignored. Read as bytes: another extension's URI
/// that is not ASCII (`urn:café`) does not hide this one on its line.
///
/// ```
/// use http::{HeaderMap, HeaderValue};
/// let mut headers = HeaderMap::new();
/// headers.append("A2A-Extensions", HeaderValue::from_static("urn:a ,  urn:b"));
/// assert!(idem_runtime::layers::is_activated(&headers, "urn:b"));
/// assert!(!idem_runtime::layers::is_activated(&headers, "urn:c"));
/// ```
pub fn is_activated(headers: &HeaderMap, uri: &str) -> bool {
    [A2A_EXTENSIONS, X_A2A_EXTENSIONS]
        .iter()
        .flat_map(|name| headers.get_all(*name))
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .any(|item| item.trim_ascii() == uri.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const URI: &str = crate::error::EXTENSION_URI;

    fn headers(lines: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in lines {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn finds_the_uri_in_any_header_line_and_spelling() {
        let uri = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1";
        assert!(is_activated(&headers(&[("A2A-Extensions", uri)]), URI));
        assert!(is_activated(&headers(&[("X-A2A-Extensions", uri)]), URI));
        let several =
            "urn:other,\thttps://agentic-sandbox.aiwg.io/extensions/idempotency/v1 , urn:x";
        assert!(is_activated(&headers(&[("A2A-Extensions", several)]), URI));
        let lines = [("A2A-Extensions", "urn:other"), ("A2A-Extensions", uri)];
        assert!(is_activated(&headers(&lines), URI));
    }

    #[test]
    fn a_line_with_bytes_beyond_ascii_still_activates_its_other_items() {
        let mut map = HeaderMap::new();
        let line = format!("urn:caf\u{e9}:v1, {URI}");
        map.append(
            "A2A-Extensions",
            HeaderValue::from_bytes(line.as_bytes()).unwrap(),
        );
        assert!(is_activated(&map, URI));
        let alone = HeaderValue::from_bytes("urn:caf\u{e9}:v1".as_bytes()).unwrap();
        let mut map = HeaderMap::new();
        map.append("A2A-Extensions", alone);
        assert!(!is_activated(&map, URI));
    }

    #[test]
    fn near_misses_do_not_activate() {
        assert!(!is_activated(&headers(&[]), URI));
        assert!(!is_activated(&headers(&[("A2A-Extensions", "")]), URI));
        let v2 = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v2";
        assert!(!is_activated(&headers(&[("A2A-Extensions", v2)]), URI));
        let prefix = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1/extra";
        assert!(!is_activated(&headers(&[("A2A-Extensions", prefix)]), URI));
        let other_header = [(
            "Extensions",
            "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1",
        )];
        assert!(!is_activated(&headers(&other_header), URI));
    }
}
