//! A vector whose freed slots are reused: tenants are numbered by their slot (the fair
//! queue's flows and the holdings per tenant use the same numbers), and a forgotten tenant's
//! number goes to the next new one, so churn of names cannot grow the tables.

use std::ops::{Index, IndexMut};

pub(crate) struct Slab<T> {
    slots: Vec<Option<T>>,
    free: Vec<usize>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> Slab<T> {
    /// The slot the next `insert` will use.
    pub(crate) fn next_slot(&self) -> usize {
        self.free.last().copied().unwrap_or(self.slots.len())
    }

    pub(crate) fn insert(&mut self, v: T) -> usize {
        let i = self.next_slot();
        if i == self.slots.len() {
            self.slots.push(Some(v));
        } else {
            self.free.pop();
            self.slots[i] = Some(v);
        }
        self.live += 1;
        i
    }

    pub(crate) fn remove(&mut self, i: usize) -> T {
        let v = self.slots[i].take().expect("a live slot");
        self.free.push(i);
        self.live -= 1;
        v
    }

    /// Live entries.
    pub(crate) fn len(&self) -> usize {
        self.live
    }
}

impl<T> Index<usize> for Slab<T> {
    type Output = T;

    fn index(&self, i: usize) -> &T {
        self.slots[i].as_ref().expect("a live slot")
    }
}

impl<T> IndexMut<usize> for Slab<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        self.slots[i].as_mut().expect("a live slot")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_slots_are_reused() {
        let mut s = Slab::default();
        let a = s.insert("a");
        let b = s.insert("b");
        assert_eq!((a, b, s.len()), (0, 1, 2));
        assert_eq!(s.remove(a), "a");
        assert_eq!(s.next_slot(), 0);
        assert_eq!(s.insert("c"), 0);
        assert_eq!(s[0], "c");
        for _ in 0..1000 {
            let i = s.insert("x");
            s.remove(i);
        }
        assert_eq!((s.len(), s.slots.len()), (2, 3));
    }
}
