//! Which `Content-Type`s are JSON. jsonrpsee accepts six spellings of two media types and
//! answers 415 to any other, though RFC 9110 §8.3 makes `application/json ; charset=utf-8` and
//! `application/json; charset="utf-8"` the same media type as the ones it accepts (found by
//! helper-62). The HTTP layer hands jsonrpsee such a request under the plain spelling.

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue};

/// Rewrites a `Content-Type` that jsonrpsee would refuse to the spelling it accepts, where it
/// is `application/json` or `application/json-rpc` with no parameter but a UTF-8 charset,
/// spelled in any way RFC 9110 allows. Any other stays as it is (and gets 415).
pub(crate) fn spelled_for_jsonrpsee(headers: &mut HeaderMap) {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return;
    };
    if jsonrpsee::server::http::is_json(Some(value)) {
        return;
    }
    if let Some(plain) = json_media_type(value.as_bytes()) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(plain));
    }
}

/// The JSON media type `value` names, if it names one: case-insensitive, whitespace where RFC
/// 9110 allows it, and only `charset` parameters, whose value, quoted or not, is UTF-8.
fn json_media_type(value: &[u8]) -> Option<&'static str> {
    const OWS: [char; 2] = [' ', '\t'];
    let value = std::str::from_utf8(value).ok()?;
    let mut parts = value.split(';');
    let essence = parts.next()?.trim_matches(OWS);
    let plain = ["application/json", "application/json-rpc"]
        .into_iter()
        .find(|plain| plain.eq_ignore_ascii_case(essence))?;
    for parameter in parts.map(|parameter| parameter.trim_matches(OWS)) {
        if parameter.is_empty() {
            continue;
        }
        let (name, value) = parameter.split_once('=')?;
        let value = match value.strip_prefix('"') {
            Some(quoted) => quoted.strip_suffix('"')?,
            None => value,
        };
        if !name.eq_ignore_ascii_case("charset") || !value.eq_ignore_ascii_case("utf-8") {
            return None;
        }
    }
    Some(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_json_in_utf8_is_json() {
        let json = [
            "application/json ; charset=utf-8",
            "application/json; charset=\"utf-8\"",
            "application/json;  charset=UTF-8",
            "APPLICATION/JSON;CHARSET=\"UTF-8\"",
            "application/json;",
            "\tapplication/json\t",
        ];
        for spelling in json {
            assert_eq!(
                json_media_type(spelling.as_bytes()),
                Some("application/json"),
                "{spelling}"
            );
        }
        let json_rpc = "application/json-rpc ;charset=\"utf-8\"";
        assert_eq!(
            json_media_type(json_rpc.as_bytes()),
            Some("application/json-rpc")
        );
    }

    #[test]
    fn other_types_charsets_and_parameters_are_not() {
        let not_json = [
            "text/plain",
            "application/jsonx",
            "application/json; charset=iso-8859-1",
            "application/json; charset=\"utf-8",
            "application/json; charset = utf-8",
            "application/json; profile=x",
            "application/json; charset",
            "application/json, text/plain",
        ];
        for spelling in not_json {
            assert_eq!(json_media_type(spelling.as_bytes()), None, "{spelling}");
        }
        assert_eq!(json_media_type(b"application/json; charset=\xff"), None);
    }

    #[test]
    fn only_what_jsonrpsee_refuses_is_rewritten() {
        let mut headers = HeaderMap::new();
        let accepted = HeaderValue::from_static("application/json;charset=utf-8");
        headers.insert(CONTENT_TYPE, accepted.clone());
        spelled_for_jsonrpsee(&mut headers);
        assert_eq!(headers[CONTENT_TYPE], accepted);
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/json ; charset=utf-8"),
        );
        spelled_for_jsonrpsee(&mut headers);
        assert_eq!(headers[CONTENT_TYPE], "application/json");
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        spelled_for_jsonrpsee(&mut headers);
        assert_eq!(headers[CONTENT_TYPE], "text/plain");
    }
}
