//! The `.http` request files of `examples/` (spec §10) run as they are against a fresh example
//! server, every request in order, with every promise of their comments asserted, so that the
//! files cannot rot.
//!
//! The files use the REST Client / JetBrains HTTP Client format: requests separated by `### title`
//! lines; comment lines (`#` or `//`) before the request line; `METHOD URL`, header lines, a
//! blank line, the body. Comment markers this test honours:
//!
//! - `# @wait 3s` (or `500ms`): sleep before sending the request.
//! - `# expect: status 422`
//! - `# expect: header NAME: VALUE` / `# expect: no-header NAME`
//! - `# expect: body byte-identical to response N` / `# expect: body differs from response N`
//! - `# expect: json error.data.code = "JSON VALUE"` (a dotted path into the response body)

use std::time::Duration;

use serde_json::Value;

use idem_conformance::client::Reply;
use idem_conformance::server_process::{ServerProcess, SHORT_TTL};

/// The example server's default address, which the files target so they run as they are.
const DEFAULT_ORIGIN: &str = "http://127.0.0.1:8080";

#[tokio::test]
async fn replay_hit() {
    run_file("replay-hit.http", &[]).await;
}

#[tokio::test]
async fn key_collision_422() {
    run_file("key-collision-422.http", &[]).await;
}

#[tokio::test]
async fn post_ttl_new_request() {
    run_file("post-ttl-new-request.http", SHORT_TTL).await;
}

/// One request of a file, with what its comments promise.
#[derive(Debug, PartialEq)]
struct Request {
    title: String,
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: String,
    wait: Duration,
    expectations: Vec<Expect>,
}

#[derive(Debug, PartialEq)]
enum Expect {
    Status(u16),
    Header(String, String),
    NoHeader(String),
    SameBodyAs(usize),
    OtherBodyThan(usize),
    Json(String, Value),
}

async fn run_file(name: &str, env: &[(&str, &str)]) {
    let path = format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let requests = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(!requests.is_empty(), "{name} has no request");
    let server = ServerProcess::start(env);
    let client = reqwest::Client::new();
    let mut replies = Vec::new();
    for (n, request) in (1..).zip(&requests) {
        let context = format!("{name}, request {n} ({})", request.title);
        assert!(
            request.url.starts_with(DEFAULT_ORIGIN),
            "{context}: must target the example server's default {DEFAULT_ORIGIN}"
        );
        assert!(
            !request.expectations.is_empty(),
            "{context}: no `# expect:` line"
        );
        tokio::time::sleep(request.wait).await;
        let reply = send(&client, request, &server.url).await;
        for expect in &request.expectations {
            if let Err(message) = verify(expect, &reply, &replies) {
                panic!("{context}: {message}\n  got {}", reply.describe());
            }
        }
        replies.push(reply);
    }
}

/// Sends `request` to the test server instead of the default address.
async fn send(client: &reqwest::Client, request: &Request, server_url: &str) -> Reply {
    let url = request.url.replacen(DEFAULT_ORIGIN, server_url, 1);
    let method: reqwest::Method = request.method.parse().expect("an HTTP method");
    let mut builder = client.request(method, url).body(request.body.clone());
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    let response = builder.send().await.expect("the server answers");
    Reply {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: response.bytes().await.expect("a body").to_vec(),
    }
}

/// Checks one promise; `earlier` are the replies to the requests before (response N = index N-1).
fn verify(expect: &Expect, reply: &Reply, earlier: &[Reply]) -> Result<(), String> {
    let earlier_body = |n: usize| {
        earlier
            .get(n - 1)
            .map(|r| &r.body)
            .ok_or(format!("there is no response {n} before this one"))
    };
    let header = |name: &str| reply.headers.get(name).map(|v| v.to_str().unwrap_or("?"));
    let ok = match expect {
        Expect::Status(status) => reply.status == *status,
        Expect::Header(name, value) => header(name) == Some(value.as_str()),
        Expect::NoHeader(name) => header(name).is_none(),
        Expect::SameBodyAs(n) => reply.body == *earlier_body(*n)?,
        Expect::OtherBodyThan(n) => reply.body != *earlier_body(*n)?,
        Expect::Json(path, value) => json_at(&reply.try_json()?, path) == Some(value),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("expected {expect:?}"))
    }
}

/// `a.b.0.c` into a JSON value.
fn json_at<'v>(value: &'v Value, path: &str) -> Option<&'v Value> {
    value.pointer(&format!("/{}", path.replace('.', "/")))
}

/// The requests of a file. Text before the first `###` may only be comments.
fn parse(text: &str) -> Result<Vec<Request>, String> {
    // A leading newline lets a file start with `###` and still get an (empty) preamble.
    let text = format!("\n{text}");
    let mut blocks = text.split("\n###");
    let preamble = blocks.next().unwrap_or_default();
    if let Some(line) = preamble
        .lines()
        .find(|l| !is_comment(l) && !l.trim().is_empty())
    {
        return Err(format!(
            "{line:?} before the first `###` would be sent unchecked"
        ));
    }
    blocks.map(parse_block).collect()
}

/// One `### title` block: comments with markers, request line, headers, blank line, body.
fn parse_block(block: &str) -> Result<Request, String> {
    let mut lines = block.lines();
    let title = lines.next().unwrap_or_default().trim().to_owned();
    let (mut wait, mut expectations) = (Duration::ZERO, Vec::new());
    let request_line = loop {
        let line = lines
            .next()
            .ok_or(format!("{title:?} has no request line"))?;
        if line.trim().is_empty() {
            continue;
        }
        if !is_comment(line) {
            break line;
        }
        let comment = line.trim_start_matches(['#', '/']).trim();
        if let Some(duration) = comment.strip_prefix("@wait") {
            wait = parse_duration(duration.trim())?;
        } else if let Some(expect) = comment.strip_prefix("expect:") {
            expectations.push(parse_expectation(expect.trim())?);
        }
    };
    let mut words = request_line.split_whitespace();
    let (method, url) = match (words.next(), words.next()) {
        (Some(method), Some(url)) => (method.to_owned(), url.to_owned()),
        _ => return Err(format!("{title:?}: bad request line {request_line:?}")),
    };
    let headers = lines
        .by_ref()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| parse_header(l).ok_or(format!("{title:?}: bad header line {l:?}")))
        .collect::<Result<_, _>>()?;
    let body = lines.collect::<Vec<_>>().join("\n").trim().to_owned();
    Ok(Request {
        title,
        method,
        url,
        headers,
        body,
        wait,
        expectations,
    })
}

fn is_comment(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with('#') || line.starts_with("//")
}

fn parse_header(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split_once(':')?;
    Some((name.trim().to_owned(), value.trim().to_owned()))
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("bad @wait duration {text:?}: write e.g. 3s or 500ms");
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
    let number: u64 = number.parse().map_err(|_| bad())?;
    match unit {
        "s" => Ok(Duration::from_secs(number)),
        "ms" => Ok(Duration::from_millis(number)),
        _ => Err(bad()),
    }
}

fn parse_expectation(text: &str) -> Result<Expect, String> {
    let bad = || format!("unknown `# expect:` {text:?}");
    let response_number = |n: &str| n.trim().parse::<usize>().ok().filter(|n| *n > 0);
    let (kind, rest) = text.split_once(' ').ok_or_else(bad)?;
    let expect = match kind {
        "status" => rest.trim().parse().ok().map(Expect::Status),
        "header" => parse_header(rest).map(|(name, value)| Expect::Header(name, value)),
        "no-header" => Some(Expect::NoHeader(rest.trim().to_owned())),
        "body" => match (
            rest.strip_prefix("byte-identical to response "),
            rest.strip_prefix("differs from response "),
        ) {
            (Some(n), _) => response_number(n).map(Expect::SameBodyAs),
            (_, Some(n)) => response_number(n).map(Expect::OtherBodyThan),
            _ => None,
        },
        "json" => rest.split_once(" = ").and_then(|(path, value)| {
            let value = serde_json::from_str(value.trim()).ok()?;
            Some(Expect::Json(path.trim().to_owned(), value))
        }),
        _ => None,
    };
    expect.ok_or_else(bad)
}

#[test]
fn the_parser_reads_markers_request_headers_and_body() {
    let text = "# preamble\n\n### 1. first\n# @wait 500ms\n# expect: status 422\n\
                # expect: header A: b\n# expect: no-header C\n// expect: body differs from response 1\n\
                # expect: json error.data.code = \"X\"\nPOST http://127.0.0.1:8080/ HTTP/1.1\n\
                Content-Type: application/json\n\n{\"a\":\n 1}\n\n";
    let requests = parse(text).unwrap();
    let expected = Request {
        title: "1. first".into(),
        method: "POST".into(),
        url: "http://127.0.0.1:8080/".into(),
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: "{\"a\":\n 1}".into(),
        wait: Duration::from_millis(500),
        expectations: vec![
            Expect::Status(422),
            Expect::Header("A".into(), "b".into()),
            Expect::NoHeader("C".into()),
            Expect::OtherBodyThan(1),
            Expect::Json("error.data.code".into(), Value::from("X")),
        ],
    };
    assert_eq!(requests, vec![expected]);
    assert!(parse("POST http://x/\n### a\nGET http://x/").is_err());
    assert!(parse("### a\n# expect: status teapot\nGET http://x/").is_err());
}
