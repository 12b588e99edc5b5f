//! OpenAI's envelope for the requests actix refuses before any handler runs: a request
//! line or header it cannot parse (a URL over 64 KiB, a control byte in a header value
//! such as `Authorization`: 400), a request head over 128 KiB (431) or a connection's
//! first request not whole within `Limits::idle_connection` (408). actix-http writes
//! those as bare statuses from inside its connection dispatcher, which has no hook for
//! their body, so a connection's writes pass through [`EnvelopedParseErrors`], which
//! swaps such a response, on its way out, for the same status with the envelope.
//!
//! Nothing else this server writes can be taken for one: its own error responses all
//! have bodies, and its bodies (JSON, SSE of JSON, the dashboard page, metrics text)
//! never hold an HTTP status line after a raw CR LF.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use memchr::memmem;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::error::ApiError;

/// What actix-http writes for a head it could not parse, and what that means.
static BARE_RESPONSES: [(&[u8], ApiError); 3] = [
    (b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n", ApiError::MalformedRequest),
    (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n", ApiError::RequestHeadTooLarge),
    (b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n", ApiError::RequestHeadTimeout),
];

/// A connection whose bare parse-error responses go out in OpenAI's envelope.
pub struct EnvelopedParseErrors<T> {
    inner: T,
    replacing: Option<Replacement>,
}

/// An enveloped response being written in place of a bare one.
struct Replacement {
    response: Vec<u8>,
    written: usize,
    /// Bytes of the bare response, reported as written once `response` is out.
    replaces: usize,
}

impl<T> EnvelopedParseErrors<T> {
    pub fn new(inner: T) -> Self {
        EnvelopedParseErrors { inner, replacing: None }
    }
}

/// The first bare response in `bytes`: where it starts, its length, and its error.
fn find_bare_response(bytes: &[u8]) -> Option<(usize, usize, &'static ApiError)> {
    BARE_RESPONSES
        .iter()
        .filter_map(|(head, error)| {
            let at = memmem::find(bytes, head)?;
            let len = memmem::find(&bytes[at..], b"\r\n\r\n")? + 4;
            Some((at, len, error))
        })
        .min_by_key(|&(at, ..)| at)
}

/// The whole response for `error`; the connection closes after it, as it would have.
fn enveloped_response(error: &ApiError) -> Vec<u8> {
    let status = error.status();
    let body = error.envelope().to_string();
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    [head.into_bytes(), body.into_bytes()].concat()
}

impl<T: AsyncWrite + Unpin> AsyncWrite for EnvelopedParseErrors<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.replacing.is_none() {
            match find_bare_response(bytes) {
                None => return Pin::new(&mut this.inner).poll_write(cx, bytes),
                // What comes before goes out as it is; the bare response starts the next write.
                Some((at, ..)) if at > 0 => return Pin::new(&mut this.inner).poll_write(cx, &bytes[..at]),
                Some((_, len, error)) => {
                    this.replacing =
                        Some(Replacement { response: enveloped_response(error), written: 0, replaces: len })
                }
            }
        }
        let Some(replacement) = this.replacing.as_mut() else { return Poll::Ready(Ok(0)) };
        while replacement.written < replacement.response.len() {
            let written =
                ready!(Pin::new(&mut this.inner).poll_write(cx, &replacement.response[replacement.written..]))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            replacement.written += written;
        }
        let replaced = replacement.replaces;
        this.replacing = None;
        Poll::Ready(Ok(replaced))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for EnvelopedParseErrors<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Everything `writes` puts on the wire through the wrapper, written in pieces of
    /// at most `piece` bytes at a time by the underlying connection.
    async fn on_the_wire(writes: &[&[u8]], piece: usize) -> Vec<u8> {
        let (client, mut server) = tokio::io::duplex(piece);
        let mut wrapped = EnvelopedParseErrors::new(client);
        let writes: Vec<Vec<u8>> = writes.iter().map(|w| w.to_vec()).collect();
        let writer = tokio::spawn(async move {
            for write in writes {
                wrapped.write_all(&write).await.unwrap();
            }
            wrapped.shutdown().await.unwrap();
        });
        let mut out = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut server, &mut out).await.unwrap();
        writer.await.unwrap();
        out
    }

    const BARE_400: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\ndate: now\r\n\r\n";

    #[tokio::test]
    async fn a_bare_400_goes_out_enveloped_whole_even_through_a_narrow_connection() {
        for piece in [7, 64, 4096] {
            let out = String::from_utf8(on_the_wire(&[BARE_400], piece).await).unwrap();
            let (head, body) = out.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
            assert!(head.contains(&format!("content-length: {}", body.len())), "{out}");
            let body: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(body["error"]["code"], "malformed_request", "{body}");
        }
    }

    #[tokio::test]
    async fn what_precedes_a_bare_response_is_kept_and_other_responses_pass_unchanged() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        let out = on_the_wire(&[&[&ok[..], BARE_400].concat()], 4096).await;
        assert!(out.starts_with(ok), "{}", String::from_utf8_lossy(&out));
        assert!(String::from_utf8_lossy(&out[ok.len()..]).contains("\"malformed_request\""));
        let enveloped_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 9\r\n\r\n{\"a\":\"b\"}";
        assert_eq!(on_the_wire(&[enveloped_400, ok], 16).await, [&enveloped_400[..], ok].concat());
        let too_large = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        let out = String::from_utf8(on_the_wire(&[too_large], 4096).await).unwrap();
        assert!(out.starts_with("HTTP/1.1 431 ") && out.contains("request_header_fields_too_large"), "{out}");
    }
}
