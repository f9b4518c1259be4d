//! Logging what attackers can cause without a line per event. Refused connections, failed
//! authentications and bad input can each be provoked thousands of times a second by anyone
//! who reaches the port; a line per event would fill the disk (1 M lines in 40 s). Each kind
//! gets a few lines in full per interval, for the detail; the rest are counted, and once per
//! interval one line says how many there were, from how many sources, and why.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::source::Source;

/// How often the summary lines come, at most.
pub(crate) const INTERVAL: Duration = Duration::from_secs(10);
/// Events of each kind logged in full per interval.
const IN_FULL: u64 = 5;
/// Distinct sources remembered per kind and interval (beyond: "at least").
const MAX_SOURCES: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Refused,
    AuthFailed,
    BadInput,
}

impl Event {
    fn index(self) -> usize {
        self as usize
    }

    /// The summary line's beginning, for `n` events.
    fn what(self, n: u64) -> String {
        match self {
            Event::Refused => format!("refused {n} connection(s)"),
            Event::AuthFailed => format!("{n} failed authentication(s)"),
            Event::BadInput => format!("closed {n} connection(s) for bad input"),
        }
    }
}

#[derive(Default)]
struct Tally {
    total: u64,
    /// Counts by reason, in the order the reasons first came.
    reasons: Vec<(&'static str, u64)>,
    sources: HashSet<Source>,
}

pub(crate) struct EventLog {
    since: Instant,
    tallies: [Tally; 3],
}

impl EventLog {
    pub(crate) fn new(now: Instant) -> EventLog {
        EventLog {
            since: now,
            tallies: Default::default(),
        }
    }

    /// Count an event; `true` if it is to be logged in full.
    pub(crate) fn note(&mut self, ev: Event, src: Option<Source>, reason: &'static str) -> bool {
        let t = &mut self.tallies[ev.index()];
        t.total += 1;
        match t.reasons.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => t.reasons.push((reason, 1)),
        }
        if let Some(s) = src {
            if t.sources.len() < MAX_SOURCES {
                t.sources.insert(s);
            }
        }
        t.total <= IN_FULL
    }

    /// Once an interval has passed: a line for each kind that had events not logged in full
    /// (and a new interval begins).
    pub(crate) fn summaries(&mut self, now: Instant) -> Vec<String> {
        let elapsed = now.duration_since(self.since);
        if elapsed < INTERVAL {
            return Vec::new();
        }
        self.since = now;
        let mut lines = Vec::new();
        for ev in [Event::Refused, Event::AuthFailed, Event::BadInput] {
            let t = std::mem::take(&mut self.tallies[ev.index()]);
            if t.total <= IN_FULL {
                continue;
            }
            let mut line = ev.what(t.total);
            let n = t.sources.len();
            let _ = write!(
                line,
                " from {}{n} address(es) in the last {} s ({IN_FULL} logged one by one): ",
                if n >= MAX_SOURCES { "at least " } else { "" },
                elapsed.as_secs()
            );
            let reasons: Vec<String> = t.reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
            line.push_str(&reasons.join(", "));
            lines.push(line);
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(i: u32) -> Option<Source> {
        Some(Source::of(std::net::IpAddr::V4(i.into())))
    }

    #[test]
    fn a_flood_gives_a_few_lines_and_one_summary() {
        let t0 = Instant::now();
        let mut log = EventLog::new(t0);
        let logged = (0..100_000u32)
            .filter(|&i| {
                let reason = if i % 10 == 0 { "timeout" } else { "pool full" };
                log.note(Event::Refused, src(i % 3), reason)
            })
            .count();
        assert_eq!(logged as u64, IN_FULL);
        assert!(log.note(Event::BadInput, src(1), "malformed frame"));
        assert!(log.summaries(t0 + Duration::from_secs(1)).is_empty());
        let lines = log.summaries(t0 + INTERVAL);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(
            lines[0],
            "refused 100000 connection(s) from 3 address(es) in the last 10 s (5 logged one by \
             one): 10000 timeout, 90000 pool full"
        );
        // A new interval logs in full again.
        assert!(log.note(Event::Refused, None, "timeout"));
        assert!(log.summaries(t0 + INTERVAL * 2).is_empty());
    }
}
