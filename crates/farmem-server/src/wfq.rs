//! Weighted fair queuing across tenants, strict priority within a tenant (Canvas's
//! two-dimensional scheduling).
//!
//! Start-time fair queuing: each tenant (flow) carries a virtual start tag; the backlogged
//! flow with the smallest tag is served next, and serving a job of cost `c` (pages) moves
//! its tag forward by `c / weight`. Over any interval in which flows stay backlogged, the
//! service each receives is proportional to its weight, within one job's cost. A flow that
//! was idle restarts at the current virtual time: idleness earns no credit. Within a flow,
//! demand reads go before prefetch reads before write-backs.

use std::collections::VecDeque;

/// Number of priority classes (demand, prefetch, write-back).
pub(crate) const CLASSES: usize = 3;

struct Flow<J> {
    weight: f64,
    queues: [VecDeque<(J, u64)>; CLASSES],
    start: f64,
    finish: f64,
    backlogged: bool,
}

pub(crate) struct Wfq<J> {
    flows: Vec<Flow<J>>,
    vtime: f64,
    jobs: usize,
    /// Flow served last: ties go to the next one, so equal tags alternate.
    last: usize,
}

impl<J> Default for Wfq<J> {
    fn default() -> Self {
        Wfq {
            flows: Vec::new(),
            vtime: 0.0,
            jobs: 0,
            last: 0,
        }
    }
}

impl<J> Wfq<J> {
    /// Make flow `i` a new flow of this weight: a slot past the end, or one whose tenant
    /// was forgotten (it has no jobs: a tenant is forgotten only without connections). It
    /// starts at the current virtual time, like a flow back from idleness.
    pub(crate) fn set_flow(&mut self, i: usize, weight: u32) {
        while self.flows.len() <= i {
            self.flows.push(Flow {
                weight: 1.0,
                queues: Default::default(),
                start: 0.0,
                finish: 0.0,
                backlogged: false,
            });
        }
        let f = &mut self.flows[i];
        debug_assert!(f.queues.iter().all(|q| q.is_empty()), "flow {i} has jobs");
        f.weight = weight.max(1) as f64;
        f.start = 0.0;
        f.finish = 0.0;
        f.backlogged = false;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.jobs == 0
    }

    /// Queue a job of `cost` (> 0) in a flow's class (0 = most urgent).
    pub(crate) fn push(&mut self, flow: usize, class: usize, job: J, cost: u64) {
        let f = &mut self.flows[flow];
        if !f.backlogged {
            f.start = self.vtime.max(f.finish);
            f.backlogged = true;
        }
        f.queues[class].push_back((job, cost.max(1)));
        self.jobs += 1;
    }

    /// The next job to serve and its flow.
    pub(crate) fn pop(&mut self) -> Option<(usize, J)> {
        let n = self.flows.len();
        let mut best: Option<usize> = None;
        for k in 1..=n {
            let i = (self.last + k) % n;
            let f = &self.flows[i];
            if f.backlogged && best.is_none_or(|b| f.start < self.flows[b].start) {
                best = Some(i);
            }
        }
        let i = best?;
        self.last = i;
        let f = &mut self.flows[i];
        let (job, cost) = f
            .queues
            .iter_mut()
            .find_map(|q| q.pop_front())
            .expect("a backlogged flow has a job");
        self.vtime = f.start;
        f.finish = f.start + cost as f64 / f.weight;
        if f.queues.iter().all(|q| q.is_empty()) {
            f.backlogged = false;
        } else {
            f.start = f.finish;
        }
        self.jobs -= 1;
        Some((i, job))
    }

    /// Take out the queued jobs `pick` selects, of every class (their connection closed).
    pub(crate) fn take_all_where(&mut self, pick: impl FnMut(&J) -> bool) -> Vec<(usize, J)> {
        self.take_where_in(0..CLASSES, pick)
    }

    /// Take out the jobs of one class that `pick` selects, with their flows, in queue order.
    /// They are answered without being served, so no flow is charged for them.
    pub(crate) fn take_where(
        &mut self,
        class: usize,
        pick: impl FnMut(&J) -> bool,
    ) -> Vec<(usize, J)> {
        self.take_where_in(class..class + 1, pick)
    }

    fn take_where_in(
        &mut self,
        classes: std::ops::Range<usize>,
        mut pick: impl FnMut(&J) -> bool,
    ) -> Vec<(usize, J)> {
        let mut out = Vec::new();
        for (i, f) in self.flows.iter_mut().enumerate() {
            for q in &mut f.queues[classes.clone()] {
                if !q.iter().any(|(j, _)| pick(j)) {
                    continue;
                }
                let mut kept = VecDeque::with_capacity(q.len());
                for (j, c) in q.drain(..) {
                    if pick(&j) {
                        out.push((i, j));
                    } else {
                        kept.push_back((j, c));
                    }
                }
                *q = kept;
            }
            if f.backlogged && f.queues.iter().all(|q| q.is_empty()) {
                f.backlogged = false;
            }
        }
        self.jobs -= out.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serve `rounds` jobs with every flow kept backlogged (cost `cost[flow]` each); return
    /// the cost served per flow.
    fn served(weights: &[u32], cost: &[u64], rounds: usize) -> Vec<u64> {
        let mut q = Wfq::default();
        for (i, &w) in weights.iter().enumerate() {
            q.set_flow(i, w);
        }
        for (f, &c) in cost.iter().enumerate() {
            for _ in 0..4 {
                q.push(f, 0, (), c);
            }
        }
        let mut got = vec![0u64; weights.len()];
        for _ in 0..rounds {
            let (f, ()) = q.pop().unwrap();
            got[f] += cost[f];
            q.push(f, 0, (), cost[f]);
        }
        got
    }

    #[test]
    fn equal_weights_share_equally() {
        let got = served(&[1, 1], &[64, 64], 1000);
        assert_eq!(got[0], got[1]);
    }

    #[test]
    fn service_follows_weights_whatever_the_job_sizes() {
        let got = served(&[2, 1], &[64, 64], 3000);
        assert!(
            (got[0] as f64 / got[1] as f64 - 2.0).abs() < 0.01,
            "{got:?}"
        );
        // Tenant 1 sends jobs 4x larger: pages, not requests, are what is shared.
        let got = served(&[1, 1], &[16, 64], 5000);
        assert!(
            (got[0] as f64 / got[1] as f64 - 1.0).abs() < 0.02,
            "{got:?}"
        );
        let got = served(&[1, 2, 3], &[8, 8, 8], 6000);
        assert!(
            (got[1] as f64 / got[0] as f64 - 2.0).abs() < 0.02,
            "{got:?}"
        );
        assert!(
            (got[2] as f64 / got[0] as f64 - 3.0).abs() < 0.02,
            "{got:?}"
        );
    }

    #[test]
    fn within_a_flow_demand_goes_first() {
        let mut q = Wfq::default();
        let f = 0;
        q.set_flow(f, 1);
        q.push(f, 2, "write-back", 1);
        q.push(f, 1, "prefetch", 1);
        q.push(f, 0, "demand", 1);
        q.push(f, 1, "prefetch 2", 1);
        let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, j)| j)).collect();
        assert_eq!(order, ["demand", "prefetch", "prefetch 2", "write-back"]);
        assert!(q.is_empty());
    }

    #[test]
    fn an_idle_flow_earns_no_credit() {
        let mut q = Wfq::default();
        let (a, b) = (0, 1);
        q.set_flow(a, 1);
        q.set_flow(b, 1);
        // A alone for a while.
        for _ in 0..100 {
            q.push(a, 0, 'a', 10);
            q.pop();
        }
        // Then both backlogged: B must not get 100 jobs in a row to "catch up".
        for _ in 0..10 {
            q.push(a, 0, 'a', 10);
            q.push(b, 0, 'b', 10);
        }
        let first: String = (0..6).map(|_| q.pop().unwrap().1).collect();
        assert!(first.contains('a') && first.contains('b'), "{first}");
        q.take_all_where(|&j| j == 'a');
        assert!(std::iter::from_fn(|| q.pop()).all(|(f, _)| f == b));
        // A's slot reused by a new flow of weight 3: it starts now, with no debt or credit.
        q.set_flow(a, 3);
        for _ in 0..30 {
            q.push(a, 0, 'a', 10);
            q.push(b, 0, 'b', 10);
        }
        let first: String = (0..8).map(|_| q.pop().unwrap().1).collect();
        assert!((5..=7).contains(&first.matches('a').count()), "{first}");
    }

    #[test]
    fn jobs_taken_from_one_class_leave_the_others_in_order() {
        let mut q = Wfq::default();
        let (a, b) = (0, 1);
        q.set_flow(a, 1);
        q.set_flow(b, 1);
        q.push(a, 0, 1, 1);
        q.push(a, 1, 2, 1);
        q.push(b, 1, 3, 1);
        q.push(a, 1, 4, 1);
        q.push(b, 2, 5, 1);
        let taken = q.take_where(1, |&j| j == 2 || j == 3);
        assert_eq!(taken, vec![(a, 2), (b, 3)]);
        let rest: Vec<u32> = std::iter::from_fn(|| q.pop()).map(|(_, j)| j).collect();
        assert_eq!(rest.len(), 3);
        assert!(rest.contains(&1) && rest.contains(&4) && rest.contains(&5));
        assert!(q.is_empty());
        assert!(q.take_where(1, |_| true).is_empty());
    }
}
