//! FIFO (Eden's "default"): evict in the order pages became resident; hints and faults do not
//! change the order.

use std::collections::VecDeque;

use super::interface::{Policy, UseBits};

#[derive(Default)]
pub struct Fifo {
    queue: VecDeque<usize>,
}

impl Policy for Fifo {
    fn insert(&mut self, vpns: &[usize], _prio: u8) {
        self.queue.extend(vpns.iter().copied());
    }

    fn take_victims(&mut self, n: usize, out: &mut Vec<usize>, _bits: &dyn UseBits) {
        let n = n.min(self.queue.len());
        out.extend(self.queue.drain(..n));
    }

    fn reinsert(&mut self, vpn: usize) {
        self.queue.push_back(vpn);
    }

    fn remove_range(&mut self, first: usize, n: usize) {
        self.queue.retain(|&v| v < first || v >= first + n);
    }

    fn len(&self) -> usize {
        self.queue.len()
    }

    fn name(&self) -> &'static str {
        "fifo"
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::FakeBits;
    use super::*;

    #[test]
    fn evicts_in_arrival_order() {
        let bits = FakeBits::default();
        bits.touch(&[10, 11, 12, 5]); // use does not matter to FIFO
        let mut p = Fifo::default();
        p.insert(&[10, 11, 12], 0);
        p.insert(&[5], 3);
        p.insert(&[20, 21], 0);
        let mut v = Vec::new();
        p.take_victims(2, &mut v, &bits);
        assert_eq!(v, [10, 11]);
        p.reinsert(11); // busy: goes to the back
        v.clear();
        p.take_victims(3, &mut v, &bits);
        assert_eq!(v, [12, 5, 20]);
        p.remove_range(20, 2);
        v.clear();
        p.take_victims(10, &mut v, &bits);
        assert_eq!(v, [11]);
        assert!(p.is_empty());
    }
}
