//! Predicting unhinted faults (Canvas's two-tier prefetcher, Leap's majority vote).
//!
//! Faults are grouped into streams by (region, faulting thread), so threads that scan side by
//! side do not break each other's patterns, and within those by neighbourhood: a thread that
//! walks several arrays in step (STREAM's triad, a k-way merge) has one stream per array. A
//! fault joins the stream whose run it continues, else the stream it is nearest to (within
//! [`NEAR`] pages); a fault far from every stream starts a new one while the latest stream
//! has a run going (up to [`MAX_STREAMS`], the least recently used one is dropped), and
//! otherwise steps from the latest (random faults behave as with a single stream). Per
//! stream:
//!
//! * **Tier 1, runs**: one step of `+1` or `-1` (sequential, backwards: the common case, as
//!   the kernel's read-ahead assumes) or two equal steps of `k` (strided) start a run; each further fault that continues it (landing past the previous
//!   fault by a multiple of the stride, no further than the pages already predicted) doubles
//!   the window, up to the maximum, as the kernel's read-ahead does. A fault that breaks the
//!   run halves the window the next run starts from (mispredictions cost bandwidth).
//! * **Tier 2, majority**: when tier 1 has no run, the last [`HISTORY`] steps vote; a step
//!   taken by more than half of them (a scan with gaps, a stride with outliers) is followed
//!   for a small window. Random faults have no run and no majority: no prediction.
//!
//! The predictor only names pages; the fault path fetches them in the prefetch class.
//!
//! **Accuracy and coverage.** An unhinted read of a mapped page leaves no trace, so use is
//! inferred from the stream, as the kernel's read-ahead does: when a fault continues a run,
//! the predicted pages it walked past were used (no fault on them); when a run breaks, the
//! predicted pages beyond its last fault were not. A majority prediction starts a run, so its
//! pages are accounted the same way.
//!
//! **Pace.** Each stream measures how fast it advances (nanoseconds per stride step between
//! the faults of a run), so a prediction also says by when its pages are needed: a read that
//! cannot arrive before the stream passes its last page is useless, and the backend may drop
//! it (Canvas's timeliness).

use std::collections::HashMap;

/// Steps remembered for the majority vote.
pub const HISTORY: usize = 8;
/// First window of a run, and the window of a majority prediction.
pub const MIN_WINDOW: usize = 4;
/// Streams kept per (region, thread).
pub const MAX_STREAMS: usize = 8;
/// A fault this close (pages) to a stream's last fault belongs to it.
pub const NEAR: usize = 64;
/// Predicted pages whose fate is known before the recent accuracy is trusted, and the
/// number at which the recent counts are halved (so the accuracy follows the program's
/// phases).
const RECENT_MIN: u64 = 64;
const RECENT_MAX: u64 = 2048;

/// Pages `start + k * stride` for `k` in `0..count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prediction {
    pub start: usize,
    pub stride: isize,
    pub count: usize,
    /// Which tier made it (1: run, 2: majority).
    pub tier: u8,
    /// The stream's pace: nanoseconds per stride step (0: not measured yet).
    pub pace_ns: u64,
}

impl Prediction {
    pub fn pages(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.count).map(move |k| offset(self.start, self.stride * k as isize))
    }

    /// How long until the stream, now at `vpn`, passes the last predicted page: after that
    /// none of the pages is of any use ahead of the stream. `None` before the pace is known.
    pub fn useful_for(&self, vpn: usize) -> Option<std::time::Duration> {
        if self.pace_ns == 0 || self.count == 0 {
            return None;
        }
        let last = offset(self.start, self.stride * (self.count as isize - 1));
        let steps = ((last as isize - vpn as isize) / self.stride).max(1) as u64;
        Some(std::time::Duration::from_nanos(
            steps.saturating_mul(self.pace_ns),
        ))
    }
}

fn offset(vpn: usize, by: isize) -> usize {
    (vpn as isize).wrapping_add(by) as usize
}

#[derive(Default, Clone)]
struct Stream {
    last: usize,
    /// The run's stride (0: no run).
    stride: isize,
    /// The last step, a candidate stride when no run holds.
    last_step: isize,
    window: usize,
    /// Window the next run starts from (halved by each broken run).
    start_window: usize,
    /// First page along the run not predicted yet.
    next: usize,
    steps: [isize; HISTORY],
    n_steps: usize,
    /// Time of the last fault (0: none with a clock), and the pace measured along runs.
    last_ns: u64,
    pace_ns: u64,
    /// When it was last used (the predictor's fault count).
    used_at: u64,
}

impl Stream {
    fn remember(&mut self, step: isize) {
        self.steps[self.n_steps % HISTORY] = step;
        self.n_steps += 1;
    }

    /// The step taken by more than half of the remembered ones (Boyer–Moore vote).
    fn majority(&self) -> Option<isize> {
        let n = self.n_steps.min(HISTORY);
        if n < HISTORY / 2 {
            return None;
        }
        let steps = &self.steps[..n];
        let (mut cand, mut votes) = (0isize, 0usize);
        for &s in steps {
            if votes == 0 {
                cand = s;
                votes = 1;
            } else if s == cand {
                votes += 1;
            } else {
                votes -= 1;
            }
        }
        let count = steps.iter().filter(|&&s| s == cand).count();
        (cand != 0 && count * 2 > n).then_some(cand)
    }

    /// Does a fault at `vpn` continue the run: a whole number of strides past the last
    /// fault, and not beyond the pages predicted so far?
    fn continues_run(&self, vpn: usize) -> bool {
        if self.stride == 0 {
            return false;
        }
        let d = vpn as isize - self.last as isize;
        let reach = self.next as isize - self.last as isize;
        d % self.stride == 0 && d / self.stride >= 1 && d / self.stride <= reach / self.stride
    }
}

/// Pages predicted, and how they turned out (inferred from the streams, see above).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub predicted: u64,
    /// Walked past by their stream without a fault: the prefetch saved a fault.
    pub used: u64,
    /// Left behind by a broken run.
    pub wasted: u64,
}

/// Per-runtime predictor state (owned by a fault-serving thread).
pub struct Predictor {
    streams: HashMap<(u32, u32), Vec<Stream>>,
    max_window: usize,
    tally: Tally,
    faults: u64,
    /// Predicted pages recently used and wasted (decayed): below a quarter used, predictions
    /// need more evidence (see [`Predictor::doubtful`]).
    recent_used: u64,
    recent_wasted: u64,
}

/// Pages a stream predicted beyond its last fault: unused if the stream ends there.
fn unused_beyond(s: &Stream) -> u64 {
    if s.stride == 0 {
        return 0;
    }
    ((s.next as isize - s.last as isize) / s.stride - 1).max(0) as u64
}

/// Which of a thread's streams a fault at `vpn` belongs to; `None`: a new one.
fn pick(list: &[Stream], vpn: usize) -> Option<usize> {
    if let Some(i) = list.iter().position(|s| s.continues_run(vpn)) {
        return Some(i);
    }
    let near = list
        .iter()
        .enumerate()
        .map(|(i, s)| (i, vpn.abs_diff(s.last)))
        .filter(|&(_, d)| d <= NEAR)
        .min_by_key(|&(_, d)| d)
        .map(|(i, _)| i);
    if near.is_some() {
        return near;
    }
    let latest = list
        .iter()
        .enumerate()
        .max_by_key(|(_, s)| s.used_at)
        .map(|(i, _)| i)?;
    (list[latest].stride == 0).then_some(latest)
}

impl Predictor {
    pub fn new(max_window: usize) -> Predictor {
        Predictor {
            streams: HashMap::new(),
            max_window,
            tally: Tally::default(),
            faults: 0,
            recent_used: 0,
            recent_wasted: 0,
        }
    }

    /// Have recent predictions mostly gone unused? Then runs need two equal steps to start
    /// and start with a small window, and the majority vote is not followed, as the kernel's
    /// swap read-ahead shrinks to one page when its read-ahead pages are not hit. The common
    /// false start is an object that straddles two pages (sqlite's 4 KiB B-tree pages in
    /// ~4.4 KiB allocations): one step of +1, then a jump. sqlite at half its peak predicted 2.5M pages at 1.4% accuracy, each
    /// wasted page a fetch that evicted a page in use.
    fn doubtful(&self) -> bool {
        let known = self.recent_used + self.recent_wasted;
        known >= RECENT_MIN && self.recent_used * 4 < known
    }

    fn note_outcomes(&mut self, used: u64, wasted: u64) {
        self.recent_used += used;
        self.recent_wasted += wasted;
        if self.recent_used + self.recent_wasted > RECENT_MAX {
            self.recent_used /= 2;
            self.recent_wasted /= 2;
        }
    }

    /// What was predicted since the last call, and how it turned out.
    pub fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }

    /// [`Predictor::on_fault_at`] without a clock (no pace).
    #[cfg(test)]
    pub fn on_fault(&mut self, region: u32, tid: u32, vpn: usize) -> Option<Prediction> {
        self.on_fault_at(region, tid, vpn, 0)
    }

    /// A fault at `vpn` in `region` by thread `tid` at time `now_ns` (any monotonic clock,
    /// 0: unknown): the pages worth fetching ahead of the stream's next accesses (none
    /// already predicted), if any.
    pub fn on_fault_at(
        &mut self,
        region: u32,
        tid: u32,
        vpn: usize,
        now_ns: u64,
    ) -> Option<Prediction> {
        let before = self.tally;
        let p = self.predict(region, tid, vpn, now_ns);
        let (used, wasted) = (
            self.tally.used - before.used,
            self.tally.wasted - before.wasted,
        );
        self.note_outcomes(used, wasted);
        p
    }

    /// The fault at `vpn` just predicted nothing, and its next page was read with it
    /// (`neighbour.rs`): its stream stands on that page now, so that a scan that starts
    /// with such a fault is seen to step by one from there, not by two.
    pub fn read_along(&mut self, region: u32, tid: u32, vpn: usize) {
        if let Some(s) = self
            .streams
            .get_mut(&(region, tid))
            .and_then(|list| list.iter_mut().find(|s| s.last == vpn && s.stride == 0))
        {
            s.last = vpn + 1;
        }
    }

    fn predict(&mut self, region: u32, tid: u32, vpn: usize, now_ns: u64) -> Option<Prediction> {
        if self.max_window == 0 {
            return None;
        }
        let doubtful = self.doubtful();
        if self.streams.len() > 4096 {
            self.streams.clear(); // threads come and go; a stream relearns in two faults
        }
        let max = self.max_window;
        self.faults += 1;
        let list = self.streams.entry((region, tid)).or_default();
        let i = match pick(list, vpn) {
            Some(i) => i,
            None => {
                let fresh = Stream {
                    last: vpn,
                    start_window: MIN_WINDOW.min(max),
                    ..Stream::default()
                };
                if list.len() < MAX_STREAMS {
                    list.push(fresh);
                    list.len() - 1
                } else {
                    let lru = (0..list.len())
                        .min_by_key(|&i| list[i].used_at)
                        .expect("a full list");
                    self.tally.wasted += unused_beyond(&list[lru]);
                    list[lru] = fresh;
                    lru
                }
            }
        };
        let s = &mut list[i];
        s.used_at = self.faults;
        let step = vpn as isize - s.last as isize;
        if step == 0 {
            return None; // the same page again (a retried or write-after-read fault)
        }
        s.remember(step);
        let prediction = if s.continues_run(vpn) {
            // The pages strictly between the last fault and this one were predicted and
            // read without a fault.
            self.tally.used += (step / s.stride) as u64 - 1;
            if now_ns > s.last_ns && s.last_ns != 0 {
                let sample = (now_ns - s.last_ns) / (step / s.stride) as u64;
                s.pace_ns = if s.pace_ns == 0 {
                    sample
                } else {
                    (3 * s.pace_ns + sample) / 4
                };
            }
            s.window = (s.window * 2).clamp(MIN_WINDOW.min(max), max);
            run_prediction(s, vpn)
        } else {
            if s.stride != 0 {
                // A run broke: what it predicted beyond its last fault went unused, and the
                // next run starts smaller.
                self.tally.wasted += unused_beyond(s);
                s.start_window = (s.window / 2).max(MIN_WINDOW.min(max));
                s.stride = 0;
                s.window = 0;
            }
            if (step.abs() == 1 && !doubtful) || (step == s.last_step && s.n_steps >= 2) {
                s.stride = step;
                s.window = if doubtful {
                    s.start_window.min(2)
                } else {
                    s.start_window
                };
                s.next = offset(vpn, step);
                run_prediction(s, vpn)
            } else if let Some(m) = s.majority().filter(|_| !doubtful) {
                // Follow the majority as a short run (so its pages are accounted too).
                s.stride = m;
                s.window = MIN_WINDOW.min(max);
                s.next = offset(vpn, m);
                run_prediction(s, vpn).map(|p| Prediction { tier: 2, ..p })
            } else {
                None
            }
        };
        if let Some(p) = &prediction {
            self.tally.predicted += p.count as u64;
        }
        s.last_step = step;
        s.last = vpn;
        s.last_ns = now_ns;
        let pace_ns = s.pace_ns;
        prediction.map(|p| Prediction { pace_ns, ..p })
    }
}

/// The pages of the run's window after `vpn` that were not predicted before.
fn run_prediction(s: &mut Stream, vpn: usize) -> Option<Prediction> {
    let stride = s.stride;
    let first_new = offset(vpn, stride);
    // Along the stride, the later of "just after this fault" and "first not predicted yet".
    let ahead = |a: usize, b: usize| -> usize {
        let along = (b as isize - a as isize) / stride;
        if along > 0 {
            b
        } else {
            a
        }
    };
    let start = ahead(first_new, s.next);
    let end = offset(vpn, stride * (s.window as isize + 1)); // one past the window
    let count = ((end as isize - start as isize) / stride).max(0) as usize;
    s.next = ahead(s.next, end);
    (count > 0).then_some(Prediction {
        start,
        stride,
        count,
        tier: 1,
        pace_ns: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_whose_first_fault_read_its_neighbour_is_still_sequential() {
        let mut p = Predictor::new(64);
        assert_eq!(p.on_fault(1, 7, 1000), None);
        p.read_along(1, 7, 1000);
        let next = p.on_fault(1, 7, 1002).expect("a run from 1001");
        assert_eq!((next.stride, next.start), (1, 1003));
    }

    fn pages(p: Option<Prediction>) -> Vec<usize> {
        p.map(|p| p.pages().collect()).unwrap_or_default()
    }

    #[test]
    fn sequential_run_grows_its_window() {
        let mut p = Predictor::new(64);
        assert_eq!(p.on_fault(1, 1, 100), None, "first fault: no history");
        // One +1 step starts a run with a window of 4.
        assert_eq!(pages(p.on_fault(1, 1, 101)), [102, 103, 104, 105]);
        // The scan reads 102..=105 without faulting; the next fault is at 106: window 8.
        assert_eq!(
            pages(p.on_fault(1, 1, 106)),
            (107..=114).collect::<Vec<_>>()
        );
        // Then 16 ... capped at 64.
        let q = p.on_fault(1, 1, 115).unwrap();
        assert_eq!((q.start, q.count, q.stride, q.tier), (116, 16, 1, 1));
        let mut at = 132;
        for _ in 0..4 {
            let q = p.on_fault(1, 1, at).unwrap();
            assert_eq!(q.start, at + 1);
            at = q.start + q.count;
        }
        let q = p.on_fault(1, 1, at).unwrap();
        assert_eq!(q.count, 64, "the window stops at the maximum");
        assert_eq!(Predictor::new(0).on_fault(1, 1, 5), None, "prefetching off");
    }

    #[test]
    fn a_fault_inside_the_predicted_pages_asks_only_for_new_ones() {
        let mut p = Predictor::new(64);
        p.on_fault(1, 1, 10);
        assert_eq!(pages(p.on_fault(1, 1, 11)), [12, 13, 14, 15]);
        // 13 faults (its prefetch was evicted or is late): the run holds, window 8 ends at
        // 21, and only 16..=21 are new.
        assert_eq!(pages(p.on_fault(1, 1, 13)), [16, 17, 18, 19, 20, 21]);
    }

    #[test]
    fn strides_of_several_sizes_and_directions() {
        for stride in [2isize, 3, 64, -2, -5] {
            let mut p = Predictor::new(32);
            let at = |k: isize| (10_000 + k * stride) as usize;
            assert_eq!(p.on_fault(7, 1, at(0)), None);
            assert_eq!(
                p.on_fault(7, 1, at(1)),
                None,
                "one step of {stride} is no run"
            );
            let q = p
                .on_fault(7, 1, at(2))
                .expect("a run after two equal steps");
            assert_eq!((q.start, q.stride, q.count, q.tier), (at(3), stride, 4, 1));
            // The next fault is the first page not predicted: window 8.
            let q = p.on_fault(7, 1, at(7)).unwrap();
            assert_eq!(
                pages(Some(q)),
                (8..=15).map(at).collect::<Vec<_>>(),
                "{stride}"
            );
        }
    }

    #[test]
    fn two_threads_interleaved_keep_their_own_streams() {
        let mut p = Predictor::new(64);
        let mut got_a = Vec::new();
        let mut got_b = Vec::new();
        // Thread 1 scans forward from 1000 in region 1, thread 2 steps by -3 from 9000 in
        // region 2; their faults arrive interleaved.
        for k in 0..3 {
            got_a.push(p.on_fault(1, 1, 1000 + k));
            got_b.push(p.on_fault(2, 2, 9000 - 3 * k));
        }
        assert_eq!(pages(got_a[1]), [1002, 1003, 1004, 1005]);
        // 1002 was predicted but faulted (late): the run goes on with only new pages.
        assert_eq!(pages(got_a[2]), [1006, 1007, 1008, 1009, 1010]);
        assert_eq!(pages(got_b[2]), [8991, 8988, 8985, 8982]);
        // The same two streams in ONE region from two threads: still separate.
        let mut p = Predictor::new(64);
        let mut got = (Vec::new(), Vec::new());
        for k in 0..3 {
            got.0.push(p.on_fault(1, 1, 1000 + k));
            got.1.push(p.on_fault(1, 2, 5000 + 2 * k));
        }
        assert_eq!(pages(got.0[1]), [1002, 1003, 1004, 1005]);
        assert_eq!(pages(got.1[2]), [5006, 5008, 5010, 5012]);
    }

    #[test]
    fn arrays_walked_in_step_by_one_thread_are_each_predicted() {
        // A k-way merge, or STREAM's triad: one thread faults in three arrays in turn.
        let mut p = Predictor::new(64);
        let bases = [1_000_000usize, 2_000_000, 3_000_000];
        let mut next = bases;
        let mut faults = 0;
        for _ in 0..200 {
            for a in next.iter_mut() {
                faults += 1;
                *a = match p.on_fault(1, 1, *a) {
                    Some(q) if q.stride == 1 => q.start + q.count,
                    _ => *a + 1,
                };
            }
        }
        let walked: usize = next.iter().zip(bases).map(|(n, b)| n - b).sum();
        // Each array's run grows to the largest window: few faults for many pages.
        assert!(walked > 20 * faults, "{faults} faults for {walked} pages");
        let t = p.take_tally();
        assert!(
            t.wasted <= 16,
            "only while the streams sort themselves out: {t:?}"
        );
    }

    #[test]
    fn random_faults_predict_nothing() {
        let mut p = Predictor::new(64);
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut predicted = 0;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let vpn = (1 << 30) + (x % (1 << 30)) as usize;
            predicted += pages(p.on_fault(3, 1, vpn)).len();
        }
        assert_eq!(predicted, 0);
    }

    #[test]
    fn majority_vote_follows_a_scan_with_gaps() {
        let mut p = Predictor::new(64);
        // A forward scan that jumps past what was predicted: 0 1 2 3 | 40 ...
        for v in 0..4 {
            p.on_fault(1, 1, v);
        }
        // The jump breaks the run, but 3 of the 4 steps so far were +1: tier 2 predicts.
        let q = p.on_fault(1, 1, 40).unwrap();
        // (In a run +1 would have restarted at the next fault anyway; tier 2 is quicker.)
        assert_eq!((q.start, q.stride, q.count, q.tier), (41, 1, 4, 2));
        // A majority of a longer history with outliers: steps +2 mostly.
        let mut p = Predictor::new(64);
        let mut v = 50_000;
        let mut last = None;
        for (i, step) in [2, 2, 9, 2, 2, 30, 2, 2, 2, 41].into_iter().enumerate() {
            v += step;
            last = p.on_fault(1, 1, v);
            if i == 9 {
                let q = last.expect("+2 is the majority");
                assert_eq!((q.stride, q.tier), (2, 2));
            }
        }
        assert_eq!(pages(last), [v + 2, v + 4, v + 6, v + 8]);
    }

    #[test]
    fn accuracy_is_inferred_from_the_stream() {
        let mut p = Predictor::new(64);
        // A scan of 0..200 that faults only where nothing was predicted.
        let mut v = 0;
        while v < 200 {
            let q = p.on_fault(1, 1, v);
            v = q.map_or(v + 1, |q| q.start + q.count);
        }
        let t = p.take_tally();
        assert!(t.predicted >= 190, "{t:?}");
        // Everything predicted before the last fault was walked past.
        assert!(t.used + 64 >= t.predicted && t.used > 100, "{t:?}");
        assert_eq!(t.wasted, 0);
        // The scan ends: scans elsewhere start other streams, and once the scan's stream is
        // dropped for them, its last window counts as unused.
        for k in 1..=MAX_STREAMS {
            p.on_fault(1, 1, 100_000 * k);
            p.on_fault(1, 1, 100_000 * k + 1);
        }
        let t2 = p.take_tally();
        assert!(t2.wasted > 0 && t2.used == 0, "{t2:?}");
        assert_eq!(t.predicted, t.used + t2.wasted, "every page accounted once");
    }

    #[test]
    fn a_broken_run_restarts_smaller() {
        let mut p = Predictor::new(64);
        let mut at = 0;
        p.on_fault(1, 1, 0);
        let mut q = p.on_fault(1, 1, 1).unwrap();
        for _ in 0..3 {
            at = q.start + q.count;
            q = p.on_fault(1, 1, at).unwrap();
        }
        assert_eq!(q.count, 32, "window grown to 32");
        // Jump back a little (the run breaks), then a new run: it starts at half the window.
        let base = at - 20;
        p.on_fault(1, 1, base);
        let q = p.on_fault(1, 1, base + 1).unwrap();
        assert_eq!(q.count, 16);
    }

    #[test]
    fn a_run_measures_its_pace_and_says_when_its_pages_are_passed() {
        let mut p = Predictor::new(64);
        // A stride-2 scan faulting every 10 µs per stride step: two equal steps start a run.
        assert_eq!(p.on_fault_at(1, 1, 100, 1_000_000), None);
        assert_eq!(p.on_fault_at(1, 1, 102, 1_010_000), None);
        let q = p.on_fault_at(1, 1, 104, 1_020_000).unwrap();
        assert_eq!(q.pace_ns, 0, "a run just started: no pace yet");
        assert_eq!(q.useful_for(104), None);
        // Its window of 4 was read without faults; the next fault is 5 steps on, 50 µs later.
        let q = p.on_fault_at(1, 1, 114, 1_070_000).unwrap();
        assert_eq!(q.pace_ns, 10_000);
        assert_eq!((q.start, q.stride, q.count), (116, 2, 8));
        // The last page (130) is 8 steps ahead of 114: 80 µs.
        assert_eq!(
            q.useful_for(114),
            Some(std::time::Duration::from_micros(80))
        );
        // A slower stretch moves the pace a quarter of the way.
        let q = p.on_fault_at(1, 1, 132, 1_070_000 + 9 * 30_000).unwrap();
        assert_eq!(q.pace_ns, (3 * 10_000 + 30_000) / 4);
    }

    #[test]
    fn false_starts_make_runs_wait_for_a_second_step_until_predictions_pay_again() {
        // Objects that straddle two pages, met at random: +1, then a jump.
        let mut p = Predictor::new(64);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut predicted = Vec::new();
        for _ in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let vpn = (1 << 30) + (x % (1 << 28)) as usize;
            let n = pages(p.on_fault(1, 1, vpn)).len() + pages(p.on_fault(1, 1, vpn + 1)).len();
            predicted.push(n);
        }
        let early: usize = predicted[..16].iter().sum();
        let late: usize = predicted[1_000..].iter().sum();
        assert!(early >= 16 * 4, "each pair starts a run at first: {early}");
        assert_eq!(late, 0, "later pairs predict nothing");
        let t = p.take_tally();
        assert!(t.used * 4 < t.wasted, "{t:?}");
        // A scan still gets predicted (after two steps), and its windows grow again once
        // its pages are used.
        let (mut v, mut faults) = (5_000_000usize, 0);
        let mut largest = 0;
        while v < 5_000_000 + 20_000 {
            faults += 1;
            v = match p.on_fault(2, 1, v) {
                Some(q) => {
                    largest = largest.max(q.count);
                    q.start + q.count
                }
                None => v + 1,
            };
        }
        assert!(faults < 20_000 / 20, "{faults} faults for 20,000 pages");
        assert_eq!(largest, 64);
        assert!(
            !p.doubtful(),
            "the scan's used pages restore the single-step start"
        );
    }
}
