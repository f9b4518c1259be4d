//! Server counters: updated by the event loop (relaxed atomics), served in Prometheus text
//! format on `--metrics ADDR` by a small HTTP thread (`metrics_http`), and printed for a
//! person by `farmem server --stats ADDR` (see `scrape`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use farmem_proto::ErrorCode;
use farmem_proto::PAGE_SIZE;
use parking_lot::Mutex;

pub(crate) const CLASS_NAMES: [&str; 3] = ["demand", "prefetch", "writeback"];

/// Why a connection was refused or dropped before it could authenticate (or, for
/// `MaxConns`, right after).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its address failed to authenticate too often lately.
    AuthBackoff,
    /// Its address had its share of connections in their handshake.
    UnauthPerAddr,
    /// Every handshake slot was taken.
    UnauthFull,
    /// It did not finish its handshake in time.
    HandshakeTimeout,
    /// The server had `--max-conns` authenticated connections.
    MaxConns,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 5] = [
        Refusal::AuthBackoff,
        Refusal::UnauthPerAddr,
        Refusal::UnauthFull,
        Refusal::HandshakeTimeout,
        Refusal::MaxConns,
    ];

    /// Label in the metrics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Refusal::AuthBackoff => "auth_backoff",
            Refusal::UnauthPerAddr => "unauth_per_addr",
            Refusal::UnauthFull => "unauth_full",
            Refusal::HandshakeTimeout => "handshake_timeout",
            Refusal::MaxConns => "max_conns",
        }
    }

    /// For the log's summary lines.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Refusal::AuthBackoff => "refused after failed authentications from the address",
            Refusal::UnauthPerAddr => "dropped: too many handshakes from the address",
            Refusal::UnauthFull => "dropped: every handshake slot taken",
            Refusal::HandshakeTimeout => "handshake not finished in time",
            Refusal::MaxConns => "authenticated connection limit reached",
        }
    }
}

#[derive(Default)]
pub(crate) struct TenantMetrics {
    pub name: String,
    pub weight: u32,
    pub quota_pages: u64,
    pub stored_pages: AtomicU64,
    pub requests: [AtomicU64; 3],
    pub pages_read: AtomicU64,
    pub pages_written: AtomicU64,
    pub refused_writes: AtomicU64,
}

pub(crate) struct Metrics {
    pub started: Instant,
    pub capacity_pages: u64,
    pub stored_pages: AtomicU64,
    pub connections: AtomicU64,
    /// Of `connections`, those still in their handshake.
    pub unauth_connections: AtomicU64,
    pub connections_total: AtomicU64,
    /// By `Refusal` (index: position in `Refusal::ALL`).
    pub refused: [AtomicU64; Refusal::ALL.len()],
    /// Proofs examined and found wrong.
    pub auth_failures: AtomicU64,
    pub sessions: AtomicU64,
    /// Tenants known (created on their first connection, forgotten once they have neither
    /// pages nor sessions).
    pub tenants_known: AtomicU64,
    /// Bytes held for queued requests, announced replies and unsent output.
    pub held_bytes: AtomicU64,
    pub requests: [AtomicU64; 3],
    pub pages_read: AtomicU64,
    pub pages_written: AtomicU64,
    pub pages_freed: AtomicU64,
    /// Error replies by code (index: position in `ErrorCode::ALL`).
    pub errors: [AtomicU64; ErrorCode::ALL.len()],
    /// Connections closed because they sent malformed or out-of-order frames.
    pub bad_input: AtomicU64,
    pub tenants: Mutex<Vec<Arc<TenantMetrics>>>,
}

impl Metrics {
    pub(crate) fn new(capacity_pages: u64) -> Metrics {
        Metrics {
            started: Instant::now(),
            capacity_pages,
            stored_pages: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            unauth_connections: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            refused: Default::default(),
            auth_failures: AtomicU64::new(0),
            sessions: AtomicU64::new(0),
            tenants_known: AtomicU64::new(0),
            held_bytes: AtomicU64::new(0),
            requests: Default::default(),
            pages_read: AtomicU64::new(0),
            pages_written: AtomicU64::new(0),
            pages_freed: AtomicU64::new(0),
            errors: Default::default(),
            bad_input: AtomicU64::new(0),
            tenants: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn error(&self, code: ErrorCode) {
        let i = ErrorCode::ALL
            .iter()
            .position(|&c| c == code)
            .expect("listed");
        self.errors[i].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused(&self, why: Refusal) {
        let i = Refusal::ALL.iter().position(|&r| r == why).expect("listed");
        self.refused[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A tenant was forgotten: its series go from the exposition.
    pub(crate) fn forget_tenant(&self, t: &Arc<TenantMetrics>) {
        self.tenants.lock().retain(|x| !Arc::ptr_eq(x, t));
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut o = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(o, "{name}{labels} {v}");
            }
        };
        let one = |v: u64| vec![(String::new(), v)];
        metric(
            "farmem_server_uptime_seconds",
            "gauge",
            "Seconds since the server started.",
            one(self.started.elapsed().as_secs()),
        );
        metric(
            "farmem_server_capacity_pages",
            "gauge",
            "Most pages the server stores (4 KiB each).",
            one(self.capacity_pages),
        );
        metric(
            "farmem_server_stored_pages",
            "gauge",
            "Pages stored now.",
            one(l(&self.stored_pages)),
        );
        metric(
            "farmem_server_stored_bytes",
            "gauge",
            "Bytes of page data stored now.",
            one(l(&self.stored_pages) * PAGE_SIZE as u64),
        );
        metric(
            "farmem_server_connections",
            "gauge",
            "Client connections open now.",
            one(l(&self.connections)),
        );
        metric(
            "farmem_server_unauthenticated_connections",
            "gauge",
            "Client connections open now that have not authenticated yet.",
            one(l(&self.unauth_connections)),
        );
        metric(
            "farmem_server_connections_total",
            "counter",
            "Client connections accepted.",
            one(l(&self.connections_total)),
        );
        metric(
            "farmem_server_refused_connections_total",
            "counter",
            "Connections refused or dropped before they authenticated (max_conns: right \
             after), by reason.",
            Refusal::ALL
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("{{reason=\"{}\"}}", r.name()), l(&self.refused[i])))
                .collect(),
        );
        metric(
            "farmem_server_auth_failures_total",
            "counter",
            "Authentication proofs examined and found wrong.",
            one(l(&self.auth_failures)),
        );
        metric(
            "farmem_server_sessions",
            "gauge",
            "Client sessions (one per program) alive now.",
            one(l(&self.sessions)),
        );
        metric(
            "farmem_server_tenants",
            "gauge",
            "Tenants known now (those with pages or sessions).",
            one(l(&self.tenants_known)),
        );
        metric(
            "farmem_server_held_bytes",
            "gauge",
            "Bytes held for queued requests, announced replies and unsent output.",
            one(l(&self.held_bytes)),
        );
        let by_class = |a: &[AtomicU64; 3]| {
            (0..3)
                .map(|i| (format!("{{class=\"{}\"}}", CLASS_NAMES[i]), l(&a[i])))
                .collect()
        };
        metric(
            "farmem_server_requests_total",
            "counter",
            "Requests served, by priority class.",
            by_class(&self.requests),
        );
        metric(
            "farmem_server_pages_total",
            "counter",
            "Pages read, written and freed.",
            vec![
                ("{op=\"read\"}".into(), l(&self.pages_read)),
                ("{op=\"write\"}".into(), l(&self.pages_written)),
                ("{op=\"free\"}".into(), l(&self.pages_freed)),
            ],
        );
        metric(
            "farmem_server_errors_total",
            "counter",
            "Error replies, by code.",
            ErrorCode::ALL
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("{{code=\"{}\"}}", c.name()), l(&self.errors[i])))
                .collect(),
        );
        metric(
            "farmem_server_bad_input_total",
            "counter",
            "Connections closed for malformed, oversized or out-of-order frames.",
            one(l(&self.bad_input)),
        );
        let tenants = self.tenants.lock().clone();
        let per = |f: &dyn Fn(&TenantMetrics) -> u64| {
            tenants
                .iter()
                .map(|t| (format!("{{tenant=\"{}\"}}", t.name), f(t)))
                .collect()
        };
        metric(
            "farmem_tenant_stored_pages",
            "gauge",
            "Pages stored for the tenant.",
            per(&|t| l(&t.stored_pages)),
        );
        metric(
            "farmem_tenant_quota_pages",
            "gauge",
            "The tenant's quota in pages.",
            per(&|t| t.quota_pages),
        );
        metric(
            "farmem_tenant_weight",
            "gauge",
            "The tenant's fair-share weight.",
            per(&|t| t.weight as u64),
        );
        metric(
            "farmem_tenant_pages_read_total",
            "counter",
            "Pages read by the tenant.",
            per(&|t| l(&t.pages_read)),
        );
        metric(
            "farmem_tenant_pages_written_total",
            "counter",
            "Pages written by the tenant.",
            per(&|t| l(&t.pages_written)),
        );
        metric(
            "farmem_tenant_refused_writes_total",
            "counter",
            "Writes refused for quota or capacity.",
            per(&|t| l(&t.refused_writes)),
        );
        metric(
            "farmem_tenant_requests_total",
            "counter",
            "Requests served for the tenant, by class.",
            tenants
                .iter()
                .flat_map(|t| {
                    (0..3).map(move |i| {
                        (
                            format!("{{tenant=\"{}\",class=\"{}\"}}", t.name, CLASS_NAMES[i]),
                            l(&t.requests[i]),
                        )
                    })
                })
                .collect(),
        );
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::{human_report, parse};

    #[test]
    fn render_parses_back() {
        let m = Metrics::new(1000);
        m.stored_pages.store(10, Ordering::Relaxed);
        m.requests[1].store(7, Ordering::Relaxed);
        m.error(ErrorCode::QuotaExceeded);
        m.tenants.lock().push(Arc::new(TenantMetrics {
            name: "alice".into(),
            weight: 2,
            quota_pages: 500,
            ..TenantMetrics::default()
        }));
        let text = m.render();
        let s = parse(&text);
        let find = |n: &str, k: &str, v: &str| {
            s.iter()
                .find(|x| x.name == n && x.label(k) == Some(v))
                .map(|x| x.value)
        };
        assert_eq!(
            find("farmem_server_requests_total", "class", "prefetch"),
            Some(7.0)
        );
        assert_eq!(
            find("farmem_server_errors_total", "code", "quota_exceeded"),
            Some(1.0)
        );
        assert_eq!(find("farmem_tenant_weight", "tenant", "alice"), Some(2.0));
        let report = human_report("x", &text);
        assert!(
            report.contains("alice") && report.contains("quota_exceeded 1"),
            "{report}"
        );
    }
}
