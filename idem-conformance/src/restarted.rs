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
    /// Opens a connection to the server at `url` (`http://host:port`) and has it answered once.
    pub async fn open(url: &str) -> Result<Self, String> {
        let authority = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url}: not an http:// URL"))?
            .trim_end_matches('/');
        let stream = TcpStream::connect(authority)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {authority}\r\nConnection: keep-alive\r\n\r\n",
            crate::client::AGENT_CARD_PATH
        );
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
    let mut buffer = [0; 4096];
    let head_end = loop {
        if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            return Ok(false);
        }
        read.extend_from_slice(&buffer[..n]);
    };
    let head = String::from_utf8_lossy(&read[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    while read.len() < head_end + length {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            return Ok(false);
        }
        read.extend_from_slice(&buffer[..n]);
    }
    Ok(head.starts_with("http/1.1 "))
}
