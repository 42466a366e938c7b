//! A blocking HTTP/1.1 client (ureq, keep-alive pool) with a hard timeout on every call,
//! so a request the proxy never answers fails the test instead of hanging it.

use std::io::Read;
use std::time::{Duration, Instant};

/// A complete response.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Response headers, names lowercase.
    pub headers: Vec<(String, String)>,
    /// Body as text (lossy UTF-8).
    pub body: String,
    /// Time from sending to the end of the body.
    pub elapsed: Duration,
}

impl Reply {
    /// First value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The emulator that answered (`x-replica-id`).
    pub fn replica(&self) -> Option<&str> {
        self.header("x-replica-id")
    }
}

/// See the module documentation.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
}

impl Client {
    /// Client whose every call (connect to end of body) is bounded by `timeout`.
    pub fn new(timeout: Duration) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .max_idle_connections_per_host(16)
            .build();
        Client {
            agent: config.into(),
        }
    }

    /// `GET url`.
    pub fn get(&self, url: &str) -> Result<Reply, String> {
        let t0 = Instant::now();
        let resp = self
            .agent
            .get(url)
            .call()
            .map_err(|e| format!("GET {url}: {e}"))?;
        finish(resp, t0).map_err(|e| format!("GET {url}: {e}"))
    }

    /// `POST url` with `body` and extra `headers` (content-type included by the caller).
    pub fn post(&self, url: &str, body: &[u8], headers: &[(&str, &str)]) -> Result<Reply, String> {
        let t0 = Instant::now();
        let mut req = self.agent.post(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send(body).map_err(|e| format!("POST {url}: {e}"))?;
        finish(resp, t0).map_err(|e| format!("POST {url}: {e}"))
    }

    /// `POST url` with a JSON body.
    pub fn post_json(&self, url: &str, body: &str) -> Result<Reply, String> {
        self.post(
            url,
            body.as_bytes(),
            &[("content-type", "application/json")],
        )
    }

    /// `POST url` (JSON) and return as soon as the response headers arrive; the body is
    /// read by [`Streaming::finish`]. Used to hold requests open on a replica.
    pub fn post_streaming(&self, url: &str, body: &str) -> Result<Streaming, String> {
        let t0 = Instant::now();
        let resp = self
            .agent
            .post(url)
            .header("content-type", "application/json")
            .send(body.as_bytes())
            .map_err(|e| format!("POST {url}: {e}"))?;
        let (parts, body) = resp.into_parts();
        Ok(Streaming {
            status: parts.status.as_u16(),
            headers: header_list(&parts.headers),
            reader: Box::new(body.into_reader()),
            started: t0,
        })
    }
}

/// A response whose headers arrived and whose body is still streaming.
pub struct Streaming {
    /// HTTP status.
    pub status: u16,
    /// Response headers, names lowercase.
    pub headers: Vec<(String, String)>,
    reader: Box<dyn Read + Send>,
    started: Instant,
}

impl Streaming {
    /// Read the first body chunk (blocks until some bytes arrive); returns its length.
    pub fn first_chunk(&mut self) -> Result<usize, String> {
        let mut buf = [0u8; 4096];
        self.reader.read(&mut buf).map_err(|e| e.to_string())
    }

    /// Read the rest of the body.
    pub fn finish(mut self) -> Result<Reply, String> {
        let mut body = Vec::new();
        self.reader
            .read_to_end(&mut body)
            .map_err(|e| e.to_string())?;
        Ok(Reply {
            status: self.status,
            headers: self.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            elapsed: self.started.elapsed(),
        })
    }
}

fn header_list(h: &ureq::http::HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

fn finish(resp: ureq::http::Response<ureq::Body>, t0: Instant) -> Result<Reply, String> {
    let (parts, mut body) = resp.into_parts();
    let bytes = body
        .with_config()
        .limit(64 << 20)
        .read_to_vec()
        .map_err(|e| e.to_string())?;
    Ok(Reply {
        status: parts.status.as_u16(),
        headers: header_list(&parts.headers),
        body: String::from_utf8_lossy(&bytes).into_owned(),
        elapsed: t0.elapsed(),
    })
}
