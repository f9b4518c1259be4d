//! `farmem server --stats ADDR`: the metrics of a running server fetched from its
//! `--metrics` endpoint, parsed, and printed for a person.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use farmem_proto::PAGE_SIZE;

use crate::error::ServerError;

/// One sample of a scraped metric.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
}

impl Sample {
    pub(crate) fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

/// Parse the Prometheus text format (the subset `render` writes).
pub(crate) fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((lhs, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match lhs.split_once('{') {
            None => (lhs.to_string(), Vec::new()),
            Some((n, rest)) => {
                let inner = rest.trim_end_matches('}');
                let labels = inner
                    .split(',')
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
                    })
                    .collect();
                (n.to_string(), labels)
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// Fetch `http://addr/metrics`.
pub(crate) fn scrape(addr: &str) -> Result<String, ServerError> {
    let mut s = TcpStream::connect(addr).map_err(ServerError::sys(format!(
        "connecting to the metrics endpoint {addr}"
    )))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)
        .map_err(ServerError::sys(format!("reading metrics from {addr}")))?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| ServerError::Scrape("malformed HTTP reply".into()))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(ServerError::Scrape(format!(
            "{addr} answered {}",
            head.lines().next().unwrap_or("nothing")
        )));
    }
    Ok(body.to_string())
}

fn size(pages: f64) -> String {
    let b = pages * PAGE_SIZE as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

/// The scraped metrics as a report for a person.
pub(crate) fn human_report(addr: &str, text: &str) -> String {
    let samples = parse(text);
    let get = |name: &str| {
        samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum::<f64>()
    };
    let labelled = |name: &str, label: &str| -> Vec<(String, f64)> {
        samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| (s.label(label).unwrap_or("?").to_string(), s.value))
            .collect()
    };
    let mut o = String::new();
    let up = get("farmem_server_uptime_seconds") as u64;
    let cap = get("farmem_server_capacity_pages");
    let stored = get("farmem_server_stored_pages");
    let _ = writeln!(
        o,
        "farmem server (metrics at {addr}), up {}h{:02}m{:02}s",
        up / 3600,
        up / 60 % 60,
        up % 60
    );
    let _ = writeln!(
        o,
        "  stored       {} of {} ({:.1}%)",
        size(stored),
        size(cap),
        if cap > 0.0 { 100.0 * stored / cap } else { 0.0 }
    );
    let _ = writeln!(
        o,
        "  clients      {} connections ({} not authenticated yet), {} sessions, {} tenants \
         ({} connections since start, {} refused or dropped before authenticating, {} failed \
         authentications)",
        get("farmem_server_connections"),
        get("farmem_server_unauthenticated_connections"),
        get("farmem_server_sessions"),
        get("farmem_server_tenants"),
        get("farmem_server_connections_total"),
        get("farmem_server_refused_connections_total"),
        get("farmem_server_auth_failures_total")
    );
    let reqs = labelled("farmem_server_requests_total", "class");
    let _ = writeln!(
        o,
        "  requests     {}",
        reqs.iter()
            .map(|(c, v)| format!("{c} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let pages = labelled("farmem_server_pages_total", "op");
    let _ = writeln!(
        o,
        "  pages        {}",
        pages
            .iter()
            .map(|(c, v)| format!("{c} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let errors: Vec<String> = labelled("farmem_server_errors_total", "code")
        .into_iter()
        .filter(|(_, v)| *v > 0.0)
        .map(|(c, v)| format!("{c} {v}"))
        .collect();
    let _ = writeln!(
        o,
        "  errors       {}; {} connections closed for bad input",
        if errors.is_empty() {
            "none".to_string()
        } else {
            errors.join(", ")
        },
        get("farmem_server_bad_input_total")
    );
    let tenants = labelled("farmem_tenant_stored_pages", "tenant");
    if !tenants.is_empty() {
        let _ = writeln!(
            o,
            "  {:<20} {:>12} {:>12} {:>6} {:>14} {:>14} {:>8}",
            "tenant", "stored", "quota", "weight", "pages read", "pages written", "refused"
        );
        let find = |name: &str, t: &str| {
            samples
                .iter()
                .find(|s| s.name == name && s.label("tenant") == Some(t))
                .map_or(0.0, |s| s.value)
        };
        for (t, st) in tenants {
            let _ = writeln!(
                o,
                "  {:<20} {:>12} {:>12} {:>6} {:>14} {:>14} {:>8}",
                t,
                size(st),
                size(find("farmem_tenant_quota_pages", &t)),
                find("farmem_tenant_weight", &t),
                find("farmem_tenant_pages_read_total", &t),
                find("farmem_tenant_pages_written_total", &t),
                find("farmem_tenant_refused_writes_total", &t),
            );
        }
    }
    o
}
