//! Client of a running daemon's JSON API, for `mpiburst report http://HOST:PORT`: one HTTP/1.1
//! GET per connection, with hyper. The connection is opened here rather than by hyper-util's
//! pooled client, so that a refused connection, a failed name lookup and a timeout each keep
//! their own advice to the user. The CLI is synchronous, so each GET blocks on a current-thread
//! tokio runtime of its own: a few system calls to set up, little beside a network round trip.

use std::{error::Error as _, io::ErrorKind, net::SocketAddr, time::Duration};

use http_body_util::{BodyExt as _, Empty};
use hyper::{
    body::Bytes,
    header::{ACCEPT, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, HOST},
    Request, StatusCode,
};
use hyper_util::rt::TokioIo;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{de::DeserializeOwned, Deserialize};
use tokio::{net::TcpStream, time::timeout};

use crate::{
    analysis::{groups::RankGroupsView, online::PhasesSnapshot},
    export::{compression::gunzip, http::CountersInUse},
    model::JobId,
    properties::JobProperties,
    store::{Job, JobMeta, RankRecord},
};

/// How long connecting, sending the request with reading the answer's header, and each read of
/// the answer's body may take, unless [`DaemonClient::with_timeout`] says otherwise.
pub const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{arg}: the daemon serves plain HTTP; pass http://{rest}")]
    Https { arg: String, rest: String },
    #[error(
        "{arg}: not a daemon address ({why}); pass http://HOST:PORT, the address the daemon \
         listens on (`mpiburst run --listen`), or a recording file"
    )]
    Address { arg: String, why: &'static str },
    #[error(
        "no mpiburst daemon at {addr} (start one with `mpiburst run`, or pass a recording file)"
    )]
    NoDaemon { addr: String },
    // The causes are named `cause`, not `source`: the message already says them, and a source
    // would be printed again after it by `{:#}`.
    #[error("cannot resolve {host}: {cause}; check the daemon's host name")]
    Resolve { host: String, cause: std::io::Error },
    #[error(
        "cannot connect to {addr}: {cause}; check the address and that a daemon listens there \
         (`mpiburst run --listen ADDR`)"
    )]
    Connect { addr: String, cause: std::io::Error },
    #[error(
        "{addr} did not answer GET {path} within {} s; check that it is an mpiburst daemon and \
         that no firewall drops the connection",
        limit.as_secs_f64()
    )]
    Timeout {
        addr: String,
        path: String,
        limit: Duration,
    },
    #[error("GET {path} from {addr} failed: {cause}")]
    Io {
        addr: String,
        path: String,
        cause: std::io::Error,
    },
    #[error("{addr} answered GET {path} with something other than HTTP ({why}); is it an mpiburst daemon?")]
    NotHttp {
        addr: String,
        path: String,
        why: String,
    },
    #[error("{addr} answered GET {path} with status {status}: {body}")]
    Status {
        addr: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error(
        "{addr} answered GET {path} with JSON this mpiburst cannot read ({cause}); use the \
         mpiburst release the daemon runs"
    )]
    Json {
        addr: String,
        path: String,
        cause: serde_json::Error,
    },
}

/// A daemon's address: host (a name, an IPv4 address, or an IPv6 address in brackets) and port;
/// or, with a path prefix, another HTTP API's (a Prometheus-compatible query API, see
/// [`DaemonClient::parse_api`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonClient {
    host: String,
    port: u16,
    timeout: Duration,
    /// What every request's path is put below: empty for a daemon, `/prometheus` for
    /// VictoriaMetrics' query API, say.
    prefix: String,
}

impl std::fmt::Display for DaemonClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Splits `HOST[:PORT]`; `None` for a missing port. IPv6 hosts need brackets, as in URLs.
fn authority(s: &str) -> Result<(&str, Option<u16>), &'static str> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let close = rest
            .find(']')
            .ok_or("an IPv6 address needs its closing bracket")?;
        let host = &s[..close + 2];
        match &s[close + 2..] {
            "" => (host, None),
            tail => (
                host,
                Some(
                    tail.strip_prefix(':')
                        .ok_or("text after the IPv6 address")?,
                ),
            ),
        }
    } else {
        match s.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return Err("an IPv6 address needs brackets: [ADDR]:PORT")
            }
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err("no host");
    }
    let port = match port {
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or("the port is not a number from 1 to 65535")?,
        ),
        None => None,
    };
    Ok((host, port))
}

impl DaemonClient {
    /// A daemon address given on the command line: `http://HOST[:PORT][/]` (`default_port`, the
    /// port the daemon listens on by default, when omitted), or `HOST:PORT` without the scheme.
    /// `Ok(None)` when `arg` is neither (then it names a recording); an error when it is meant as
    /// an address but is not a usable one.
    pub fn parse(arg: &str, default_port: u16) -> Result<Option<DaemonClient>, ClientError> {
        let bad = |why| ClientError::Address {
            arg: arg.to_string(),
            why,
        };
        let scheme = arg.find("://").map(|i| arg[..i].to_ascii_lowercase());
        match scheme.as_deref() {
            Some("https") => Err(ClientError::Https {
                arg: arg.to_string(),
                rest: arg[8..].to_string(),
            }),
            Some("http") => {
                let rest = &arg[7..];
                let rest = rest.strip_suffix('/').unwrap_or(rest);
                if rest.contains(['/', '?', '#']) {
                    return Err(bad(
                        "the address has a path; the report finds the API itself",
                    ));
                }
                let (host, port) = authority(rest).map_err(bad)?;
                Ok(Some(DaemonClient {
                    host: host.to_string(),
                    port: port.unwrap_or(default_port),
                    timeout: TIMEOUT,
                    prefix: String::new(),
                }))
            }
            Some(_) => Err(bad("the daemon speaks http://")),
            None if arg.contains('/') => Ok(None),
            None => match authority(arg) {
                Ok((host, Some(port))) => Ok(Some(DaemonClient {
                    host: host.to_string(),
                    port,
                    timeout: TIMEOUT,
                    prefix: String::new(),
                })),
                _ => Ok(None),
            },
        }
    }

    /// An HTTP API served at or below a server's root: `[http://]HOST[:PORT][/PREFIX]`
    /// (`default_port` when omitted), every request's path put below PREFIX
    /// (VictoriaMetrics serves Prometheus's query API below `/prometheus`, a proxy below its own).
    pub fn parse_api(arg: &str, default_port: u16) -> Result<DaemonClient, ClientError> {
        let bad = |why| ClientError::Address {
            arg: arg.to_string(),
            why,
        };
        let (scheme, rest) = match arg.find("://") {
            Some(i) => (&arg[..i + 3], &arg[i + 3..]),
            None => ("http://", arg),
        };
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if prefix.contains(['?', '#']) {
            return Err(bad("give the API's path without a query or fragment"));
        }
        let address = format!("{scheme}{authority}");
        let mut client = DaemonClient::parse(&address, default_port)?
            .ok_or_else(|| bad("expected [http://]HOST[:PORT], then the API's path if any"))?;
        client.prefix = prefix.trim_end_matches('/').to_string();
        Ok(client)
    }

    /// The same daemon, each step of a request limited to `limit` instead of [`TIMEOUT`].
    pub fn with_timeout(self, limit: Duration) -> Self {
        DaemonClient {
            timeout: limit,
            ..self
        }
    }

    /// The body of a successful GET of `path` (which must be percent-encoded already). Blocks,
    /// on a runtime of its own: not for async code, where tokio refuses to start one.
    pub fn get(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|cause| self.io_error(path, cause))?;
        runtime.block_on(self.fetch(path))
    }

    async fn fetch(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let path = &format!("{}{path}", self.prefix);
        let request = Request::get(path)
            .header(HOST, self.to_string())
            .header(ACCEPT, "application/json")
            .header(ACCEPT_ENCODING, "gzip")
            .body(Empty::<Bytes>::new())
            .map_err(|e| self.io_error(path, std::io::Error::new(ErrorKind::InvalidInput, e)))?;
        let stream = self.connect().await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.http_error(path, e))?;
        // The connection reads and writes the socket; its errors reach the request's future too,
        // and it ends with the runtime.
        tokio::spawn(connection);
        let response = timeout(self.timeout, sender.send_request(request))
            .await
            .map_err(|_| self.timeout_error(path))?
            .map_err(|e| self.http_error(path, e))?;
        let status = response.status();
        let gzipped = response
            .headers()
            .get(CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        let length = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse::<usize>().ok());
        let mut body = response.into_body();
        let mut received = Vec::new();
        while let Some(frame) = timeout(self.timeout, body.frame())
            .await
            .map_err(|_| self.timeout_error(path))?
        {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        received.extend_from_slice(data);
                    }
                }
                Err(e) => {
                    return Err(match length.filter(|&l| l > received.len()) {
                        Some(length) => ClientError::NotHttp {
                            addr: self.to_string(),
                            path: path.to_string(),
                            why: format!(
                                "the body was cut short at {} of {length} bytes",
                                received.len()
                            ),
                        },
                        None => self.http_error(path, e),
                    })
                }
            }
        }
        if gzipped {
            received = gunzip(&received).map_err(|e| ClientError::NotHttp {
                addr: self.to_string(),
                path: path.to_string(),
                why: format!("its gzip-encoded body does not decompress: {e}"),
            })?;
        }
        if status != StatusCode::OK {
            return Err(ClientError::Status {
                addr: self.to_string(),
                path: path.to_string(),
                status: status.as_u16(),
                body: String::from_utf8_lossy(&received).trim().to_string(),
            });
        }
        Ok(received)
    }

    fn io_error(&self, path: &str, cause: std::io::Error) -> ClientError {
        ClientError::Io {
            addr: self.to_string(),
            path: path.to_string(),
            cause,
        }
    }

    fn timeout_error(&self, path: &str) -> ClientError {
        ClientError::Timeout {
            addr: self.to_string(),
            path: path.to_string(),
            limit: self.timeout,
        }
    }

    /// An answer hyper could not read as HTTP is not from a daemon; any other failure of the
    /// exchange is an I/O error.
    fn http_error(&self, path: &str, error: hyper::Error) -> ClientError {
        // hyper's message leaves its causes (an I/O error, say) to `source`.
        let mut why = error.to_string();
        let mut cause = error.source();
        while let Some(c) = cause {
            why = format!("{why}: {c}");
            cause = c.source();
        }
        if error.is_parse() || error.is_incomplete_message() {
            ClientError::NotHttp {
                addr: self.to_string(),
                path: path.to_string(),
                why,
            }
        } else {
            self.io_error(path, std::io::Error::other(why))
        }
    }

    /// A connection to the first of the host's addresses that accepts one within [`TIMEOUT`].
    async fn connect(&self) -> Result<TcpStream, ClientError> {
        let addr = self.to_string();
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        let candidates: Vec<SocketAddr> = tokio::net::lookup_host((host, self.port))
            .await
            .map_err(|cause| ClientError::Resolve {
                host: self.host.clone(),
                cause,
            })?
            .collect();
        let mut last = None;
        for candidate in candidates {
            match timeout(self.timeout, TcpStream::connect(candidate)).await {
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(e)) => last = Some(e),
                Err(_) => last = Some(ErrorKind::TimedOut.into()),
            }
        }
        Err(match last {
            Some(e) if e.kind() == ErrorKind::ConnectionRefused => ClientError::NoDaemon { addr },
            Some(cause) => ClientError::Connect { addr, cause },
            None => ClientError::Resolve {
                host: self.host.clone(),
                cause: std::io::Error::new(ErrorKind::NotFound, "no address"),
            },
        })
    }

    fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let body = self.get(path)?;
        self.decode(path, &body)
    }

    /// [`DaemonClient::get`]'s JSON, for async code (the aggregator's fan-out to the nodes).
    pub async fn fetch_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let body = self.fetch(path).await?;
        self.decode(path, &body)
    }

    fn decode<T: DeserializeOwned>(&self, path: &str, body: &[u8]) -> Result<T, ClientError> {
        serde_json::from_slice(body).map_err(|cause| ClientError::Json {
            addr: self.to_string(),
            path: path.into(),
            cause,
        })
    }

    /// The daemon's jobs (`/api/jobs`), in its order (by id).
    pub fn jobs(&self) -> Result<Vec<JobMeta>, ClientError> {
        #[derive(Deserialize)]
        struct Summary {
            meta: JobMeta,
        }
        Ok(self
            .get_json::<Vec<Summary>>("/api/jobs")?
            .into_iter()
            .map(|s| s.meta)
            .collect())
    }

    /// One job as the store holds it (`/api/jobs/{id}`), without its bursts: the daemon's API
    /// serves identity, ranks with their exact totals, and per-function calls, which is what the
    /// job report shows.
    pub fn job(&self, id: &JobId) -> Result<ServedJob, ClientError> {
        self.get_json(&job_path(id))
    }

    /// The online phase analysis of a job (`/api/jobs/{id}/phases`); `None` when the daemon has
    /// not started one (it does with the job's first bursts).
    pub fn phases(&self, id: &JobId) -> Result<Option<PhasesSnapshot>, ClientError> {
        match self.get_json(&format!("/api/jobs/{}/phases", encode_segment(&id.0))) {
            Ok(snapshot) => Ok(Some(snapshot)),
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The rank groups and behaviour changes of a job (`/api/jobs/{id}/ranks`); `None` before
    /// the daemon's first stats update with the job.
    pub fn rank_groups(&self, id: &JobId) -> Result<Option<RankGroupsView>, ClientError> {
        match self.get_json(&format!("/api/jobs/{}/ranks", encode_segment(&id.0))) {
            Ok(view) => Ok(Some(view)),
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The properties of a job over its life on the daemon's node (the `job` part of
    /// `/api/jobs/{id}/properties`); `None` before the daemon first evaluated them.
    pub fn properties(&self, id: &JobId) -> Result<Option<JobProperties>, ClientError> {
        #[derive(Deserialize)]
        struct Properties {
            job: JobProperties,
        }
        match self
            .get_json::<Properties>(&format!("/api/jobs/{}/properties", encode_segment(&id.0)))
        {
            Ok(p) => Ok(Some(p.job)),
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A job as `/api/jobs/{id}` serves it (see [`DaemonClient::job`]).
#[derive(Deserialize)]
pub struct ServedJob {
    meta: JobMeta,
    ranks: Vec<RankRecord>,
    bursts_evicted: u64,
    counters: CountersInUse,
}

impl ServedJob {
    /// The counters the node's daemon reads per burst.
    pub fn counters(&self) -> &CountersInUse {
        &self.counters
    }

    pub fn into_job(self) -> Job {
        let mut job = Job::new(self.meta);
        job.ranks = self.ranks.into_iter().map(|r| (r.rank, r)).collect();
        job.bursts_evicted = self.bursts_evicted;
        job
    }
}

/// `/api/jobs/{id}`.
pub fn job_path(id: &JobId) -> String {
    format!("/api/jobs/{}", encode_segment(&id.0))
}

/// Everything but RFC 3986's unreserved characters.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes one path segment: everything but RFC 3986's unreserved characters, so job ids
/// such as `pmix:prterun-host-1234@1` reach the daemon intact.
pub fn encode_segment(s: &str) -> String {
    utf8_percent_encode(s, PATH_SEGMENT).to_string()
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead as _, Write as _},
        net::TcpListener,
        thread,
    };

    use super::*;

    /// The port `mpiburst report` passes: the daemon's default.
    const DEFAULT_PORT: u16 = 9464;

    fn parsed(arg: &str) -> Option<String> {
        DaemonClient::parse(arg, DEFAULT_PORT)
            .unwrap()
            .map(|d| d.to_string())
    }

    #[test]
    fn addresses_with_and_without_the_scheme() {
        assert_eq!(
            parsed("http://127.0.0.1:9464").as_deref(),
            Some("127.0.0.1:9464")
        );
        assert_eq!(
            parsed("http://node17:9000/").as_deref(),
            Some("node17:9000")
        );
        assert_eq!(
            parsed("HTTP://node17").as_deref(),
            Some("node17:9464"),
            "the daemon's default port"
        );
        assert_eq!(parsed("http://[::1]:9464").as_deref(), Some("[::1]:9464"));
        assert_eq!(parsed("127.0.0.1:9464").as_deref(), Some("127.0.0.1:9464"));
        assert_eq!(parsed("localhost:9464").as_deref(), Some("localhost:9464"));
        assert_eq!(parsed("[::1]:9464").as_deref(), Some("[::1]:9464"));
        // Recordings.
        for path in [
            "job.jsonl",
            "runs/job.jsonl",
            "./host:9464",
            "c:drive",
            "::1",
        ] {
            assert_eq!(parsed(path), None, "{path}");
        }
    }

    #[test]
    fn unusable_addresses_say_what_to_pass() {
        let e = DaemonClient::parse("https://n:9464", DEFAULT_PORT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("plain HTTP; pass http://n:9464"), "{e}");
        let e = DaemonClient::parse("http://n:9464/api/jobs", DEFAULT_PORT)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("has a path") && e.contains("http://HOST:PORT"),
            "{e}"
        );
        let e = DaemonClient::parse("http://n:99999", DEFAULT_PORT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("from 1 to 65535"), "{e}");
        let e = DaemonClient::parse("http://::1:9464", DEFAULT_PORT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("brackets"), "{e}");
        let e = DaemonClient::parse("ftp://n", DEFAULT_PORT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("http://"), "{e}");
    }

    #[test]
    fn job_ids_are_percent_encoded() {
        assert_eq!(
            encode_segment("pmix:prterun-host-1234@1"),
            "pmix%3Aprterun-host-1234%401"
        );
        assert_eq!(encode_segment("a b/c"), "a%20b%2Fc");
    }

    /// A one-shot server: answers the first request with `response` and returns the request line.
    fn serve(response: &'static str) -> (DaemonClient, thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(&stream);
            let mut request = String::new();
            reader.read_line(&mut request).unwrap();
            let mut header = String::new();
            while header != "\r\n" {
                header.clear();
                reader.read_line(&mut header).unwrap();
            }
            stream.write_all(response.as_bytes()).unwrap();
            request
        });
        (
            DaemonClient {
                host: "127.0.0.1".into(),
                port,
                timeout: TIMEOUT,
                prefix: String::new(),
            },
            handle,
        )
    }

    #[test]
    fn a_get_returns_the_body_and_sends_the_encoded_path() {
        let (client, server) = serve("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n[]");
        assert!(client.jobs().unwrap().is_empty());
        assert_eq!(server.join().unwrap(), "GET /api/jobs HTTP/1.1\r\n");
        let (client, server) = serve("HTTP/1.0 404 Not Found\r\n\r\nno phase analysis yet");
        assert_eq!(
            client.phases(&JobId("pmix:a@1".into())).unwrap(),
            None,
            "404: not started"
        );
        assert_eq!(
            server.join().unwrap(),
            "GET /api/jobs/pmix%3Aa%401/phases HTTP/1.1\r\n"
        );
    }

    #[test]
    fn properties_are_read_back_as_the_daemon_evaluated_them() {
        use crate::{
            properties::{evaluate_job, JobInput, PropertyConfig},
            store::{CallStats, RankTotals, RegionMarks},
            test_support::JobMetaBuilder,
        };
        let mut job = Job::new(
            JobMetaBuilder::new("pmix:a@1")
                .node("n1")
                .ended_ns(Some(4_000_000_000))
                .build(),
        );
        for (rank, mpi_ns) in [(0, 1_000_000_000), (1, 3_000_000_000)] {
            job.ranks.insert(
                rank,
                RankRecord {
                    call_sites: Vec::new(),
                    rank,
                    pid: 10 + rank,
                    first_seen_ns: 0,
                    ended_ns: Some(4_000_000_000),
                    totals: RankTotals {
                        bursts: 10,
                        burst_ns: 4_000_000_000 - mpi_ns,
                        burst_oncpu_ns: 4_000_000_000 - mpi_ns,
                        ..Default::default()
                    },
                    functions: [(
                        "MPI_Allreduce".to_string(),
                        CallStats {
                            calls: 10,
                            time_ns: mpi_ns,
                            ..Default::default()
                        },
                    )]
                    .into(),
                    region: RegionMarks {
                        init_return_ns: Some(0),
                        finalize_entry_ns: Some(4_000_000_000),
                        ..Default::default()
                    },
                    probe_cost: None,
                },
            );
        }
        let evaluated = evaluate_job(
            &JobInput::lifetime(&job, 4_000_000_000),
            &PropertyConfig::default(),
        );
        // The body of /api/jobs/{id}/properties.
        let body = serde_json::json!({
            "job": evaluated,
            "job_recommendations": evaluated.recommendations(),
            "window": null,
        })
        .to_string();
        let response = format!(
            "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (client, server) = serve(Box::leak(response.into_boxed_str()));
        let read = client.properties(&job.meta.id).unwrap();
        assert_eq!(read.as_ref(), Some(&evaluated));
        assert_eq!(
            read.unwrap().pop.load_balance.value(),
            Some((3.0 + 1.0) / 2.0 / 3.0),
            "useful 3 s and 1 s"
        );
        assert_eq!(
            server.join().unwrap(),
            "GET /api/jobs/pmix%3Aa%401/properties HTTP/1.1\r\n"
        );
        let (client, _s) = serve("HTTP/1.0 404 Not Found\r\n\r\nno properties yet");
        assert_eq!(client.properties(&job.meta.id).unwrap(), None);
    }

    #[test]
    fn bad_answers_name_the_cause() {
        let (client, _s) = serve("HTTP/1.0 500 Internal Server Error\r\n\r\nboom");
        let e = client.get("/api/jobs").unwrap_err().to_string();
        assert!(e.contains("status 500: boom"), "{e}");
        let (client, _s) = serve("SSH-2.0-OpenSSH\r\n\r\n");
        let e = client.get("/api/jobs").unwrap_err().to_string();
        assert!(e.contains("something other than HTTP"), "{e}");
        let (client, _s) = serve("");
        let e = client.get("/api/jobs").unwrap_err().to_string();
        assert!(e.contains("something other than HTTP"), "{e}");
        let (client, _s) = serve("HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\n[");
        let e = client.get("/api/jobs").unwrap_err().to_string();
        assert!(e.contains("cut short at 1 of 10 bytes"), "{e}");
        let (client, _s) = serve("HTTP/1.0 200 OK\r\n\r\n{\"not\": \"jobs\"}");
        let e = client.jobs().unwrap_err().to_string();
        assert!(e.contains("JSON this mpiburst cannot read"), "{e}");
    }

    #[test]
    fn an_api_below_a_path_prefix_is_asked_there() {
        let (served, server) = serve("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}");
        let address = format!("http://127.0.0.1:{}/prometheus/", served.port);
        let client = DaemonClient::parse_api(&address, 9090).unwrap();
        client.get("/api/v1/query?query=up").unwrap();
        assert_eq!(
            server.join().unwrap(),
            "GET /prometheus/api/v1/query?query=up HTTP/1.1\r\n"
        );
        let at_root = DaemonClient::parse_api("prom.example", 9090).unwrap();
        assert_eq!(
            (at_root.to_string(), at_root.prefix),
            ("prom.example:9090".into(), String::new())
        );
        let below = DaemonClient::parse_api("vm:8481/select/0/prometheus", 9090).unwrap();
        assert_eq!(below.prefix, "/select/0/prometheus");
        let bare = DaemonClient::parse_api("vm/prometheus", 9090).unwrap();
        assert_eq!(
            (bare.to_string(), bare.prefix),
            ("vm:9090".into(), "/prometheus".into())
        );
        for bad in [
            "https://vm/prometheus",
            "http://vm/p?x=1",
            "ftp://vm",
            "vm:0/x",
        ] {
            assert!(DaemonClient::parse_api(bad, 9090).is_err(), "{bad}");
        }
    }

    #[test]
    fn nothing_listening_means_no_daemon_there() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = DaemonClient {
            host: "127.0.0.1".into(),
            port,
            timeout: TIMEOUT,
            prefix: String::new(),
        };
        let e = client.jobs().unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "no mpiburst daemon at 127.0.0.1:{port} (start one with `mpiburst run`, or pass a recording file)"
            )
        );
    }
}
