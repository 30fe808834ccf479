//! gzip for the HTTP answers of the daemon and the aggregator, when the client asks for it
//! (`Accept-Encoding: gzip`, as Prometheus, the aggregator and `mpiburst report` do). The JSON of
//! the API is columns of small, repetitive numbers: a node's window samples, the largest answer
//! the aggregator fetches from every node, shrink about sevenfold (docs/performance.md).

use std::io::{Read, Write};

use axum::{
    body::{to_bytes, Body},
    extract::Request,
    http::{
        header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, VARY},
        HeaderValue,
    },
    middleware::Next,
    response::Response,
};
use flate2::{read::GzDecoder, write::GzEncoder, Compression};

/// Answers shorter than this go as they are: gzip's header and a round of deflate cost more than
/// they save.
const MIN_COMPRESSED_BYTES: usize = 1024;

/// `bytes` gzip-compressed at the default level.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(bytes.len() / 4), Compression::default());
    // Writing to a Vec cannot fail.
    encoder.write_all(bytes).expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

/// The bytes a gzip stream holds.
pub fn gunzip(compressed: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(compressed.len() * 4);
    GzDecoder::new(compressed).read_to_end(&mut out)?;
    Ok(out)
}

/// Whether an `Accept-Encoding` value accepts gzip (a `gzip` coding whose q-value is not 0).
fn accepts_gzip(accept: &str) -> bool {
    accept.split(',').any(|coding| {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or_default();
        let refused = parts.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f64>().ok())
                .is_some_and(|q| q == 0.0)
        });
        (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
    })
}

/// Middleware: compresses the answer's body with gzip when the request accepts it, the answer is
/// not encoded already and at least 1 KiB long (`MIN_COMPRESSED_BYTES`).
pub async fn gzip_when_accepted(request: Request, next: Next) -> Response {
    let wanted = request
        .headers()
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(accepts_gzip);
    let response = next.run(request).await;
    if !wanted || response.headers().contains_key(CONTENT_ENCODING) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // The API's answers are built in memory: collecting the body costs no more than it took.
    let bytes = match to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!("an answer's body could not be read for compression: {e}");
            return Response::from_parts(parts, Body::empty());
        }
    };
    parts
        .headers
        .append(VARY, HeaderValue::from_static("accept-encoding"));
    if bytes.len() < MIN_COMPRESSED_BYTES {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let compressed = gzip(&bytes);
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    Response::from_parts(parts, Body::from(compressed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_round_trips_and_shrinks_repetitive_json() {
        let json: String = (0..2000)
            .map(|i| format!("{},", 1_000_000 + i % 7))
            .collect();
        let compressed = gzip(json.as_bytes());
        assert!(compressed.len() * 5 < json.len(), "{}", compressed.len());
        assert_eq!(gunzip(&compressed).unwrap(), json.as_bytes());
        assert!(gunzip(b"{\"not\": \"gzip\"}").is_err());
    }

    #[test]
    fn gzip_is_accepted_unless_refused_by_a_zero_q_value() {
        for accept in ["gzip", "deflate, gzip", "GZIP;q=0.5", "*", "br, gzip ; q=1"] {
            assert!(accepts_gzip(accept), "{accept}");
        }
        for accept in [
            "",
            "identity",
            "deflate, br",
            "gzip;q=0",
            "gzip; q=0.0",
            "gzipx",
        ] {
            assert!(!accepts_gzip(accept), "{accept}");
        }
    }
}
