//! A database's address as logs show it.

/// `db` (a file's path, or a PostgreSQL URL) as logs and terminals may show it: a URL's
/// password (`user:PASSWORD@`, or a `password=` parameter) as `***`.
///
/// ```
/// use idem_runtime::store::redacted_url;
/// let url = "postgres://app:s3cret@db:5432/a2a?password=s3cret&sslmode=require";
/// assert_eq!(redacted_url(url), "postgres://app:***@db:5432/a2a?password=***&sslmode=require");
/// assert_eq!(redacted_url("./a2a.db"), "./a2a.db");
/// ```
pub fn redacted_url(db: &str) -> String {
    let Some((scheme, rest)) = db.split_once("://") else {
        return db.to_owned(); // a file's path
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let masked = query.split('&').map(|pair| match pair.split_once('=') {
                Some(("password", _)) => "password=***".to_owned(),
                _ => pair.to_owned(),
            });
            format!("{path}?{}", masked.collect::<Vec<_>>().join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}
