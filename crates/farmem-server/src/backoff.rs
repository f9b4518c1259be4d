//! Slowing down guessers: each failed authentication from a source counts a strike; past a
//! few, the source is refused for a window that doubles with each further strike (capped),
//! so a client that typed the wrong secret can retry at once but a guesser gets a handful of
//! attempts a minute instead of thousands a second. Strikes are forgotten after a quiet
//! minute. The table is bounded: when full, the sources that failed longest ago are
//! forgotten first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::source::Source;

/// Failures in a row that cost nothing (typos, a client started with the wrong file).
const FREE_STRIKES: u32 = 3;
/// Window after the first strike beyond the free ones; each further strike doubles it.
const FIRST_WINDOW: Duration = Duration::from_millis(100);
const MAX_WINDOW: Duration = Duration::from_secs(10);
/// A source that has not failed for this long starts again from no strikes.
const FORGET_AFTER: Duration = Duration::from_secs(60);
/// Most sources remembered.
const MAX_SOURCES: usize = 4096;

struct Strikes {
    count: u32,
    last: Instant,
    until: Instant,
}

pub(crate) struct Backoff {
    sources: HashMap<Source, Strikes>,
    cap: usize,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::with_capacity(MAX_SOURCES)
    }
}

impl Backoff {
    fn with_capacity(cap: usize) -> Backoff {
        Backoff {
            sources: HashMap::new(),
            cap: cap.max(2),
        }
    }

    /// How long `src` is still refused, if it is.
    pub(crate) fn refusing(&self, src: Source, now: Instant) -> Option<Duration> {
        let s = self.sources.get(&src)?;
        (s.until > now).then(|| s.until - now)
    }

    /// A failed authentication from `src`: the window it is refused for from now (zero while
    /// its strikes are free).
    pub(crate) fn failed(&mut self, src: Source, now: Instant) -> Duration {
        if !self.sources.contains_key(&src) && self.sources.len() >= self.cap {
            self.make_room(now);
        }
        let s = self.sources.entry(src).or_insert(Strikes {
            count: 0,
            last: now,
            until: now,
        });
        if now.duration_since(s.last) > FORGET_AFTER {
            s.count = 0;
        }
        s.count = s.count.saturating_add(1);
        s.last = now;
        let window = match s.count.checked_sub(FREE_STRIKES + 1) {
            None => Duration::ZERO,
            Some(doublings) => FIRST_WINDOW
                .saturating_mul(1u32.checked_shl(doublings.min(31)).unwrap_or(u32::MAX))
                .min(MAX_WINDOW),
        };
        s.until = s.until.max(now + window);
        window
    }

    /// Forget the sources whose strikes have expired.
    pub(crate) fn prune(&mut self, now: Instant) {
        self.sources
            .retain(|_, s| s.until > now || now.duration_since(s.last) <= FORGET_AFTER);
    }

    /// The table is full: forget the expired sources, and if that is not enough, the half
    /// whose refusal or last failure ended earliest (those refused now stay longest).
    /// Sorting once per half a table of new sources keeps this cheap however many sources
    /// an attacker has.
    fn make_room(&mut self, now: Instant) {
        self.prune(now);
        if self.sources.len() < self.cap {
            return;
        }
        let mut by_age: Vec<(Instant, Source)> = self
            .sources
            .iter()
            .map(|(&src, s)| (s.until.max(s.last), src))
            .collect();
        by_age.sort_unstable_by_key(|&(t, _)| t);
        for (_, src) in &by_age[..by_age.len() / 2] {
            self.sources.remove(src);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.sources.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(i: u32) -> Source {
        Source::of(std::net::IpAddr::V4(i.into()))
    }

    #[test]
    fn a_few_failures_are_free_then_the_window_doubles_up_to_its_cap() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        for i in 0..FREE_STRIKES {
            assert_eq!(b.failed(src(1), t0), Duration::ZERO, "strike {i}");
            assert_eq!(b.refusing(src(1), t0), None);
        }
        let windows: Vec<Duration> = (0..10).map(|_| b.failed(src(1), t0)).collect();
        assert_eq!(windows[0], FIRST_WINDOW);
        assert_eq!(windows[1], FIRST_WINDOW * 2);
        assert_eq!(windows[2], FIRST_WINDOW * 4);
        assert_eq!(*windows.last().unwrap(), MAX_WINDOW);
        assert_eq!(b.refusing(src(1), t0), Some(MAX_WINDOW));
        assert_eq!(b.refusing(src(2), t0), None, "other sources are not slowed");
        let later = t0 + MAX_WINDOW + Duration::from_millis(1);
        assert_eq!(b.refusing(src(1), later), None, "the window ends");
        // Strikes stay until a quiet minute has passed, then start again from free.
        assert_eq!(b.failed(src(1), later), MAX_WINDOW);
        let quiet = later + FORGET_AFTER + Duration::from_secs(1);
        assert_eq!(b.failed(src(1), quiet), Duration::ZERO);
        b.prune(quiet + FORGET_AFTER + Duration::from_secs(1));
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn the_table_stays_bounded_and_keeps_the_latest_failures() {
        let mut b = Backoff::with_capacity(100);
        let t0 = Instant::now();
        for i in 0..10_000u32 {
            let now = t0 + Duration::from_micros(i as u64);
            b.failed(src(i), now);
            assert!(b.len() <= 100);
        }
        // The guesser that keeps failing is among the latest and stays slowed down.
        let now = t0 + Duration::from_millis(20);
        for _ in 0..FREE_STRIKES + 1 {
            b.failed(src(7), now);
        }
        for i in 0..200u32 {
            b.failed(src(20_000 + i), now);
        }
        assert!(b.len() <= 100);
        assert!(b.refusing(src(7), now).is_some());
    }
}
