//! A small HTTP/1.1 client (plain `http://` only) with a keep-alive connection pool, over hyper's
//! low-level `client::conn` API. Used by `prefix-load` and by the tests.
//!
//! A connection goes back to the pool only after its response body was read to the end
//! ([`Pooled::done`]); a connection whose response was abandoned is dropped. Pool operations are
//! O(1) under a mutex; the pool keeps at most as many idle connections as were ever in use at once.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::lock;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// `http://host:port/base` split into authority and base path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    /// `host:port` (port 80 when absent).
    pub authority: String,
    /// Path prefix without a trailing `/` (may be empty).
    pub base: String,
}

impl BaseUrl {
    pub fn parse(url: &str) -> Result<BaseUrl, Error> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("only http:// URLs are supported: {url}"))?;
        let (auth, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if auth.is_empty() {
            return Err(format!("no host in {url}").into());
        }
        let authority = if auth
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            auth.to_string()
        } else {
            format!("{auth}:80")
        };
        Ok(BaseUrl {
            authority,
            base: path.trim_end_matches('/').to_string(),
        })
    }

    /// The port, if the authority has one.
    pub fn port(&self) -> Option<u16> {
        self.authority
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
    }
}

/// A keep-alive pool of HTTP/1.1 connections to one authority.
pub struct Client {
    pub url: BaseUrl,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    pub connect_timeout: Duration,
}

/// A connection lent to one request; give it back with [`Pooled::done`] once the body is read.
pub struct Pooled<'a> {
    client: &'a Client,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Pooled<'_> {
    /// The response was read to the end: the connection may serve another request.
    pub fn done(mut self) {
        if let Some(s) = self.sender.take() {
            if !s.is_closed() {
                lock(&self.client.idle).push(s);
            }
        }
    }
}

impl Client {
    pub fn new(url: &str) -> Result<Client, Error> {
        Ok(Client {
            url: BaseUrl::parse(url)?,
            idle: Mutex::new(Vec::new()),
            connect_timeout: Duration::from_secs(5),
        })
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, Error> {
        let stream = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect(&self.url.authority),
        )
        .await
        .map_err(|_| format!("connect to {} timed out", self.url.authority))??;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// Sends one request to `base + path`. The caller reads the body, then calls
    /// [`Pooled::done`].
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(String, String)],
        body: Bytes,
    ) -> Result<(Response<Incoming>, Pooled<'_>), Error> {
        let mut build = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.url.base, path))
            .header("host", &self.url.authority);
        if !body.is_empty() {
            build = build.header("content-type", "application/json");
        }
        for (k, v) in headers {
            build = build.header(k.as_str(), v.as_str());
        }
        let mut req = build.body(Full::new(body))?;
        // Reuse an idle connection if one is still open. A stale one fails before the request
        // is written (hyper hands the request back): retry on the next idle or a fresh one.
        // Bounded: each turn consumes one idle connection or returns.
        loop {
            let pooled = lock(&self.idle).pop();
            let (mut sender, fresh) = match pooled {
                Some(s) => (s, false),
                None => (self.connect().await?, true),
            };
            if sender.ready().await.is_err() {
                if fresh {
                    return Err("connection closed before the request was sent".into());
                }
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    return Ok((
                        resp,
                        Pooled {
                            client: self,
                            sender: Some(sender),
                        },
                    ))
                }
                Err(mut e) => match e.take_message() {
                    Some(r) if !fresh => req = r,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }

    /// Sends a request and reads the whole response: (status, body).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<(u16, Bytes), Error> {
        let (resp, conn) = self.send(method, path, &[], body.into()).await?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        conn.done();
        Ok((status, bytes))
    }

    /// `GET path` as text.
    pub async fn get_text(&self, path: &str) -> Result<(u16, String), Error> {
        let (s, b) = self.call(Method::GET, path, Bytes::new()).await?;
        Ok((s, String::from_utf8_lossy(&b).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_base_urls() {
        let u = BaseUrl::parse("http://127.0.0.1:10000").unwrap();
        assert_eq!(u.authority, "127.0.0.1:10000");
        assert_eq!(u.base, "");
        assert_eq!(u.port(), Some(10000));
        let u = BaseUrl::parse("http://localhost/api/").unwrap();
        assert_eq!(u.authority, "localhost:80");
        assert_eq!(u.base, "/api");
        assert!(BaseUrl::parse("https://x").is_err());
        assert!(BaseUrl::parse("http://").is_err());
    }
}
