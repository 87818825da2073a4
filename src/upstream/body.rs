//! An upstream's answer, whichever client fetched it: hyper's HTTP/1
//! connections for `http://` replicas, reqwest (with rustls) for
//! `https://` ones.

use bytes::Bytes;
use http_body_util::BodyExt;

/// A failure reading an upstream's body, with its sources.
pub type ReadError = Box<dyn std::error::Error + Send + Sync>;

/// An upstream's answer: its head, and a [`Body`].
pub type Response = http::Response<Body>;

/// An upstream's body.
pub enum Body {
    /// From a plain-HTTP replica, read straight off hyper's connection,
    /// which goes back to its pool when the body's end has been read.
    Plain(hyper::body::Incoming, Option<super::plain::Held>),
    /// From a TLS replica, through reqwest.
    Tls(reqwest::Body),
}

impl Body {
    /// The next piece of the body; `None` at its end. Trailers are skipped.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ReadError> {
        loop {
            let frame = match self {
                Body::Plain(b, held) => {
                    let frame = b.frame().await;
                    if frame.is_none() {
                        if let Some(h) = held.take() {
                            h.release();
                        }
                    }
                    frame.map(|f| f.map_err(ReadError::from))
                }
                Body::Tls(b) => b.frame().await.map(|f| f.map_err(ReadError::from)),
            };
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(e),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }
}
