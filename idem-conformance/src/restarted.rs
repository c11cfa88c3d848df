//! Whether `--restart-cmd` really restarted the server: a connection opened before it, and
//! answered once, is answered no more by a process that restarted. Without this, a command
//! that restarted nothing (`true`, a typo'd service name) let AC-4 pass on the process that
//! had kept its cache in memory all along.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a connection kept from before the restart is given to answer again.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// A keep-alive connection to the server, answered once.
pub struct Witness {
    stream: TcpStream,
    request: String,
}

impl Witness {
    /// Opens a connection to the server at `url` (`http://host[:port][/path]`) and has it
    /// answered once.
    pub async fn open(url: &str) -> Result<Self, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
        let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
            return Err(format!("{url}: no host and port to connect to"));
        };
        let connected = tokio::time::timeout(ANSWER_WITHIN, TcpStream::connect((host, port)));
        let stream = match connected.await {
            Ok(stream) => stream.map_err(|e| format!("{url}: {e}"))?,
            Err(_) => return Err(format!("{url}: no connection within {ANSWER_WITHIN:?}")),
        };
        // The card as the harness's client asks for it: under the URL's path.
        let path = format!(
            "{}{}",
            parsed.path().trim_end_matches('/'),
            crate::client::AGENT_CARD_PATH
        );
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: keep-alive\r\n\r\n");
        let mut witness = Self { stream, request };
        match witness.answered().await {
            true => Ok(witness),
            false => Err(format!("{url} did not answer a request for its AgentCard")),
        }
    }

    /// Whether the connection is still answered: the process that served it still runs.
    pub async fn still_answered(mut self) -> bool {
        self.answered().await
    }

    /// Sends the request and reads a whole response, within [`ANSWER_WITHIN`].
    async fn answered(&mut self) -> bool {
        let exchange = async {
            self.stream.write_all(self.request.as_bytes()).await?;
            read_response(&mut self.stream).await
        };
        matches!(
            tokio::time::timeout(ANSWER_WITHIN, exchange).await,
            Ok(Ok(true))
        )
    }
}

/// Reads one response: its head, then as many bytes as its `Content-Length` says. `false` if
/// the connection closed first.
async fn read_response(stream: &mut TcpStream) -> std::io::Result<bool> {
    let mut read = Vec::new();
    let head_end = loop {
        if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if !read_more(stream, &mut read).await? {
            return Ok(false);
        }
    };
    let head = String::from_utf8_lossy(&read[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    while read.len() < head_end + length {
        if !read_more(stream, &mut read).await? {
            return Ok(false);
        }
    }
    Ok(head.starts_with("http/1."))
}

/// Reads what `stream` has next onto `read`; `false` if the connection closed.
async fn read_more(stream: &mut TcpStream, read: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut buffer = [0; 4096];
    let n = stream.read(&mut buffer).await?;
    read.extend_from_slice(&buffer[..n]);
    Ok(n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, BufReader};

    /// A server that answers each request of a connection in HTTP/1.0, `answers` times, then
    /// closes it; the request lines it read.
    async fn server(answers: usize) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/base/", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut reader = BufReader::new(socket);
            let mut request_lines = Vec::new();
            for _ in 0..answers {
                let mut line = String::new();
                reader.read_line(&mut line).await.unwrap();
                request_lines.push(line.trim().to_owned());
                // The headers, up to the empty line.
                while !line.trim().is_empty() {
                    line.clear();
                    reader.read_line(&mut line).await.unwrap();
                }
                let answer = "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}";
                reader.get_mut().write_all(answer.as_bytes()).await.unwrap();
            }
            request_lines
        });
        (url, task)
    }

    #[tokio::test]
    async fn a_connection_answered_again_is_a_server_that_did_not_restart() {
        let (url, server) = server(2).await;
        let witness = Witness::open(&url).await.unwrap();
        assert!(witness.still_answered().await, "HTTP/1.0 answers count");
        let lines = server.await.unwrap();
        let expected = "GET /base/.well-known/agent-card.json HTTP/1.1";
        assert_eq!(lines, [expected, expected], "the card under the URL's path");
    }

    #[tokio::test]
    async fn a_connection_closed_is_a_server_that_restarted() {
        let (url, server) = server(1).await;
        let witness = Witness::open(&url).await.unwrap();
        server.await.unwrap(); // the connection closes with the task
        assert!(!witness.still_answered().await);
    }
}
