//! A database's address as logs show it.

/// `db` (a file's path, a PostgreSQL URL, or a libpq key-value string) as logs and terminals
/// may show it: every password in it as `***`. The password is found where tokio-postgres
/// takes it from: a URL's user part (everything before its first `@`), a `password`
/// parameter however percent-encoded, a `password=` key of a key-value string.
///
/// ```
/// use idem_runtime::store::redacted_url;
/// let url = "postgres://app:s3cret@db:5432/a2a?password=s3cret&sslmode=require";
/// assert_eq!(redacted_url(url), "postgres://app:***@db:5432/a2a?password=***&sslmode=require");
/// assert_eq!(redacted_url("host=db password='s 3' user=app"), "host=db password=*** user=app");
/// assert_eq!(redacted_url("./a2a.db"), "./a2a.db");
/// ```
pub fn redacted_url(db: &str) -> String {
    match db.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", redacted_url_rest(rest)),
        None => redacted_key_values(db),
    }
}

/// What follows a URL's `scheme://`.
fn redacted_url_rest(rest: &str) -> String {
    // tokio-postgres takes the credentials up to the first `@` wherever it is, a `/` or a `?`
    // in the password included.
    let (credentials, address) = match rest.split_once('@') {
        Some((credentials, address)) => (Some(credentials), address),
        None => (None, rest),
    };
    let credentials = match credentials.map(|c| c.split_once(':').map_or(c, |(user, _)| user)) {
        Some(user) if credentials != Some(user) => format!("{user}:***@"),
        Some(user) => format!("{user}@"),
        None => String::new(),
    };
    let address = match address.split_once('?') {
        Some((path, query)) => {
            let masked = query.split('&').map(|pair| match pair.split_once('=') {
                Some((name, _)) if percent_decoded(name) == "password" => format!("{name}=***"),
                _ => pair.to_owned(),
            });
            format!("{path}?{}", masked.collect::<Vec<_>>().join("&"))
        }
        None => address.to_owned(),
    };
    credentials + &address
}

/// `text` with its `%XX` escapes decoded (anything else as it is).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A libpq key-value string (`host=db password=secret`) with the value of each `password`
/// key, quoted (`'...'`, with `\` escapes) or not, as `***`.
fn redacted_key_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("password") {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let after_key = &from["password".len()..];
        let starts_a_key = before.is_empty() || before.ends_with(char::is_whitespace);
        let value = after_key
            .trim_start()
            .strip_prefix('=')
            .map(str::trim_start);
        let Some(value) = value.filter(|_| starts_a_key) else {
            out.push_str("password");
            rest = after_key;
            continue;
        };
        out.push_str("password=***");
        rest = &value[value_len(value)..];
    }
    out + rest
}

/// The bytes of a key-value string's value at the start of `text`.
fn value_len(text: &str) -> usize {
    let Some(quoted) = text.strip_prefix('\'') else {
        return text.find(char::is_whitespace).unwrap_or(text.len());
    };
    let mut escaped = false;
    for (i, c) in quoted.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '\'' => return i + 2,
            _ => {}
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::redacted_url;

    /// Each spelling tokio-postgres takes a password from (found by helper-46: a password with
    /// a `/` or a `?`, and a percent-encoded parameter name, were printed whole).
    #[test]
    fn no_password_tokio_postgres_would_read_is_shown() {
        for (db, shown) in [
            (
                "postgres://app:pa/ss@db:5432/a2a",
                "postgres://app:***@db:5432/a2a",
            ),
            ("postgres://app:pa?ss@db/a2a", "postgres://app:***@db/a2a"),
            ("postgres://app:p@ss@db/a2a", "postgres://app:***@ss@db/a2a"),
            (
                "postgres://app@db/a2a?pass%77ord=s3cret",
                "postgres://app@db/a2a?pass%77ord=***",
            ),
            (
                "postgresql://db/a2a?password=s3cret&x=1",
                "postgresql://db/a2a?password=***&x=1",
            ),
            ("postgres://db:5432/a2a", "postgres://db:5432/a2a"),
            ("host=db password=s3cret", "host=db password=***"),
            ("password = 's3 \\' cret' host=db", "password=*** host=db"),
            ("host=db passwordless=1", "host=db passwordless=1"),
            ("/var/lib/a2a/password=1.db", "/var/lib/a2a/password=1.db"),
        ] {
            assert_eq!(redacted_url(db), shown, "{db}");
            assert!(!redacted_url(db).contains("s3"), "{db}");
        }
    }
}
