//! Server-Sent Events as the harness reads them: an event parser that follows the WHATWG
//! event-stream rules (any line ending, comments, multi-line `data`), and a streamed reply that
//! hands out one event at a time while it keeps every byte received, so that a replay can be
//! compared byte for byte with the stream it replays.

use serde_json::Value;

use super::client::Reply;

/// Splits an event stream into the `data` of its events.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Received bytes not yet parsed into lines.
    pending: Vec<u8>,
    /// The `data` lines of the event being read, each followed by `\n`.
    data: Option<String>,
    /// Whether the event being read has any line at all (for the end-of-stream check).
    in_event: bool,
}

impl SseParser {
    pub fn feed(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// The `data` of the next complete event, if the bytes fed so far hold one. Events without
    /// `data` (only comments, `id`, `event` or `retry` lines) are skipped, as a browser would.
    pub fn next_data(&mut self) -> Result<Option<String>, String> {
        while let Some(line) = self.next_line()? {
            if line.is_empty() {
                self.in_event = false;
                if let Some(mut data) = self.data.take() {
                    data.pop(); // the `\n` after the last data line
                    return Ok(Some(data));
                }
                continue;
            }
            self.in_event = true;
            if line.starts_with(':') {
                continue; // a comment
            }
            let (field, value) = match line.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (line.as_str(), ""),
            };
            if field == "data" {
                let data = self.data.get_or_insert_with(String::new);
                data.push_str(value);
                data.push('\n');
            }
        }
        Ok(None)
    }

    /// The body has ended: a `\r` held back as a possible half of `\r\n` ends its line.
    pub fn end_of_input(&mut self) {
        if self.pending.last() == Some(&b'\r') {
            self.pending.push(b'\n');
        }
    }

    /// After [`end_of_input`](Self::end_of_input) and the last event: an error if the body ended
    /// inside an event (the event-stream rules drop such an event silently, which would hide a
    /// truncated stream).
    pub fn finish(&self) -> Result<(), String> {
        if self.in_event || !self.pending.is_empty() {
            return Err(format!(
                "the stream ended inside an event (no blank line after it): {:?}",
                String::from_utf8_lossy(&self.pending)
            ));
        }
        Ok(())
    }

    /// The next whole line without its ending (`\r\n`, `\n` or `\r`).
    fn next_line(&mut self) -> Result<Option<String>, String> {
        let Some(end) = self.pending.iter().position(|b| matches!(b, b'\n' | b'\r')) else {
            return Ok(None);
        };
        let ending = match self.pending[end..] {
            [b'\r', b'\n', ..] => 2,
            // A `\r` last in the buffer may be the first half of a `\r\n`: wait for more.
            [b'\r'] => return Ok(None),
            _ => 1,
        };
        let line: Vec<u8> = self.pending.drain(..end + ending).take(end).collect();
        String::from_utf8(line)
            .map(Some)
            .map_err(|e| format!("the event stream is not UTF-8: {e}"))
    }
}

/// A response read as an event stream, event by event.
pub struct SseReply {
    /// Status and headers of the response; `body` grows with every byte read so far.
    pub reply: Reply,
    response: reqwest::Response,
    parser: SseParser,
    ended: bool,
}

impl SseReply {
    pub fn new(response: reqwest::Response) -> Self {
        let reply = Reply {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: Vec::new(),
        };
        Self {
            reply,
            response,
            parser: SseParser::default(),
            ended: false,
        }
    }

    /// Whether the response says it is an event stream (`text/event-stream`).
    pub fn is_event_stream(&self) -> bool {
        self.reply.content_type() == "text/event-stream"
    }

    /// The next event's `data` as JSON, or `None` once the stream has ended.
    pub async fn next_event(&mut self) -> Result<Option<Value>, String> {
        loop {
            if let Some(data) = self.parser.next_data()? {
                return serde_json::from_str(&data)
                    .map(Some)
                    .map_err(|e| format!("an event's data is not JSON ({e}): {data}"));
            }
            if self.ended {
                self.parser.finish()?;
                return Ok(None);
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => {
                    crate::client::append(&mut self.reply.body, &chunk)?;
                    self.parser.feed(&chunk);
                }
                Ok(None) => {
                    self.ended = true;
                    self.parser.end_of_input();
                }
                Err(e) => return Err(format!("reading the event stream: {e}")),
            }
        }
    }

    /// Every remaining event, to the end of the stream.
    pub async fn rest(&mut self) -> Result<Vec<Value>, String> {
        let mut events = Vec::new();
        while let Some(event) = self.next_event().await? {
            events.push(event);
        }
        Ok(events)
    }

    /// Reads the rest of a response that is not an event stream (an error before the stream).
    pub async fn into_plain(mut self) -> Result<Reply, String> {
        while let Some(chunk) = self
            .response
            .chunk()
            .await
            .map_err(|e| format!("reading the response body: {e}"))?
        {
            crate::client::append(&mut self.reply.body, &chunk)?;
        }
        Ok(self.reply)
    }

    /// Reads to the end and returns the whole reply with every event.
    pub async fn finish(mut self) -> Result<(Reply, Vec<Value>), String> {
        let events = self.rest().await?;
        Ok((self.reply, events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&str]) -> Result<Vec<String>, String> {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk.as_bytes());
            while let Some(data) = parser.next_data()? {
                out.push(data);
            }
        }
        parser.end_of_input();
        while let Some(data) = parser.next_data()? {
            out.push(data);
        }
        parser.finish()?;
        Ok(out)
    }

    #[test]
    fn events_split_across_chunks_and_line_endings() {
        let events = all(&[
            "data: {\"a\"",
            ":1}\n\nda",
            "ta: 2\r",
            "\n\r\ndata:3\r\rdata: 4\n\n",
        ]);
        assert_eq!(events.unwrap(), ["{\"a\":1}", "2", "3", "4"]);
    }

    #[test]
    fn multi_line_data_comments_and_other_fields() {
        let events = all(&[": keep-alive\n\nevent: x\nid: 7\ndata: [1,\ndata:2]\nretry: 5\n\n"]);
        assert_eq!(events.unwrap(), ["[1,\n2]"]);
    }

    #[test]
    fn a_stream_cut_inside_an_event_is_an_error() {
        assert!(all(&["data: 1\n\ndata: 2\n"]).is_err());
        assert!(all(&["data: 1\n\ndata: 2"]).is_err());
        assert_eq!(all(&["data: 1\n\n"]).unwrap(), ["1"]);
        assert_eq!(all(&["data: 1\r\r"]).unwrap(), ["1"]);
    }
}
