//! The bandwidth cap (`--max-bandwidth`).

use std::time::{Duration, Instant};

use farmem_proto as p;

/// A token bucket in front of the fair queue: it caps the pages served per second, as a
/// network link would. What the cap holds back waits in the fair queue, where the tenants'
/// weights decide who goes next.
pub(crate) struct Bucket {
    rate: f64,
    burst: f64,
    /// Pages that may be served now; negative: owed (a batch larger than what was left).
    pub(crate) tokens: f64,
    last: Instant,
}

impl Bucket {
    pub(crate) fn new(rate: f64) -> Bucket {
        // Two milliseconds of service, at least one full batch.
        let burst = (rate / 500.0).max(p::MAX_BATCH_PAGES as f64);
        Bucket {
            rate,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    pub(crate) fn refill(&mut self) {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
    }

    /// How long until the bucket allows service again (zero if it does now).
    pub(crate) fn wait(&self) -> Duration {
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}
