//! Admission of connections before they authenticate. Anyone who can reach the port can open
//! connections, so those that have not proved the secret yet get their own small pool, apart
//! from the authenticated ones (`--max-conns` counts only those), with a share per source
//! address, and a source whose authentications fail is refused for a while (`backoff`).
//!
//! A full pool does not refuse the newcomer: it drops the oldest handshake of the source
//! holding the most of them (the newcomer's own source first, once that has its share).
//! Idle connections held open, however many, therefore never lock a client out: its
//! handshake, a round trip long, would have to lose to a whole pool's worth of newer
//! connections arriving meanwhile.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::source::Source;

pub(crate) struct Admission {
    max_total: usize,
    max_per_source: usize,
    /// Connections in their handshake, by source, oldest first (ids grow with time).
    waiting: HashMap<Source, VecDeque<u64>>,
    total: usize,
    pub(crate) backoff: Backoff,
}

/// What to do with a new connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Its source failed to authenticate too often: refuse it for this long still.
    Refuse(Duration),
    /// Admit it, after dropping this older handshake to make room.
    Admit(Option<(u64, Room)>),
}

/// Which limit a dropped handshake made room under.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Room {
    /// The newcomer's source had its share of handshakes.
    PerSource,
    /// The pool was full.
    Pool,
}

impl Admission {
    pub(crate) fn new(max_total: usize, max_per_source: usize) -> Admission {
        Admission {
            max_total: max_total.max(1),
            max_per_source: max_per_source.max(1),
            waiting: HashMap::new(),
            total: 0,
            backoff: Backoff::default(),
        }
    }

    /// Connections in their handshake now.
    pub(crate) fn waiting(&self) -> usize {
        self.total
    }

    /// Decide about a connection from `src` (nothing is recorded: `enter` does).
    pub(crate) fn admit(&self, src: Source, now: Instant) -> Verdict {
        if let Some(left) = self.backoff.refusing(src, now) {
            return Verdict::Refuse(left);
        }
        let own = self.waiting.get(&src);
        if own.is_some_and(|q| q.len() >= self.max_per_source) {
            let oldest = *own.and_then(|q| q.front()).expect("non-empty");
            return Verdict::Admit(Some((oldest, Room::PerSource)));
        }
        if self.total < self.max_total {
            return Verdict::Admit(None);
        }
        // The source with the most handshakes gives up its oldest; among equals, the
        // oldest handshake goes.
        let victim = self
            .waiting
            .values()
            .filter_map(|q| Some((q.len(), std::cmp::Reverse(*q.front()?))))
            .max()
            .map(|(_, std::cmp::Reverse(id))| id)
            .expect("a full pool has handshakes");
        Verdict::Admit(Some((victim, Room::Pool)))
    }

    /// Connection `id` from `src` begins its handshake.
    pub(crate) fn enter(&mut self, src: Source, id: u64) {
        self.waiting.entry(src).or_default().push_back(id);
        self.total += 1;
    }

    /// Connection `id` from `src` authenticated or closed: it leaves the pool.
    pub(crate) fn leave(&mut self, src: Source, id: u64) {
        let Some(q) = self.waiting.get_mut(&src) else {
            return;
        };
        if let Some(i) = q.iter().position(|&x| x == id) {
            q.remove(i);
            self.total -= 1;
        }
        if q.is_empty() {
            self.waiting.remove(&src);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(i: u32) -> Source {
        Source::of(std::net::IpAddr::V4(i.into()))
    }

    /// Admit like the engine does: drop the victim, then enter.
    fn open(a: &mut Admission, from: Source, id: u64, owner: &mut HashMap<u64, Source>) {
        let now = Instant::now();
        match a.admit(from, now) {
            Verdict::Refuse(_) => panic!("refused"),
            Verdict::Admit(victim) => {
                if let Some((v, _)) = victim {
                    let vs = owner.remove(&v).expect("a live handshake");
                    a.leave(vs, v);
                }
            }
        }
        a.enter(from, id);
        owner.insert(id, from);
    }

    #[test]
    fn a_source_over_its_share_gives_up_its_own_oldest() {
        let mut a = Admission::new(100, 4);
        let mut owner = HashMap::new();
        for id in 0..4 {
            open(&mut a, src(1), id, &mut owner);
        }
        assert_eq!(
            a.admit(src(1), Instant::now()),
            Verdict::Admit(Some((0, Room::PerSource)))
        );
        assert_eq!(a.admit(src(2), Instant::now()), Verdict::Admit(None));
        for id in 4..1000 {
            open(&mut a, src(1), id, &mut owner);
        }
        assert_eq!(a.waiting(), 4);
    }

    #[test]
    fn a_full_pool_drops_the_oldest_of_the_biggest_source_never_a_lone_newcomer() {
        let mut a = Admission::new(10, 8);
        let mut owner = HashMap::new();
        // An attacker spread over 3 sources fills the pool.
        for id in 0..10 {
            open(&mut a, src(10 + id as u32 % 3), id, &mut owner);
        }
        // A client from elsewhere gets in; its handshake survives further floods.
        open(&mut a, src(99), 1000, &mut owner);
        for id in 2000..3000 {
            open(&mut a, src(10 + id as u32 % 3), id, &mut owner);
        }
        assert!(owner.contains_key(&1000), "the lone client was dropped");
        assert_eq!(a.waiting(), 10);
        a.leave(src(99), 1000);
        assert_eq!(a.waiting(), 9);
        a.leave(src(99), 1000);
        assert_eq!(a.waiting(), 9, "leaving twice counts once");
    }

    #[test]
    fn failed_authentications_get_a_source_refused() {
        let mut a = Admission::new(10, 8);
        let now = Instant::now();
        while a.backoff.failed(src(5), now).is_zero() {}
        assert!(matches!(a.admit(src(5), now), Verdict::Refuse(d) if !d.is_zero()));
        assert_eq!(a.admit(src(6), now), Verdict::Admit(None));
    }
}
