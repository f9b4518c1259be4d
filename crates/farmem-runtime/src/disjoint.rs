//! Sets of disjoint address or page ranges kept as a map from start to end (exclusive):
//! the program's allocations (`extents.rs`), what it made unreadable (`unreadable.rs`), the
//! transparent mode's reservations (`libfarmem`'s `vspace.rs`).

use std::collections::BTreeMap;

/// Add `[from, to)`, merging the ranges it overlaps or touches.
pub fn insert(m: &mut BTreeMap<usize, usize>, from: usize, to: usize) {
    let (mut s, mut e) = (from, to);
    let touching: Vec<(usize, usize)> = m
        .range(..=to)
        .rev()
        .take_while(|&(_, &re)| re >= from)
        .map(|(&rs, &re)| (rs, re))
        .collect();
    for (rs, re) in touching {
        m.remove(&rs);
        s = s.min(rs);
        e = e.max(re);
    }
    m.insert(s, e);
}

/// Take `[from, to)` out, splitting the ranges it cuts; returns the parts taken.
pub fn take(m: &mut BTreeMap<usize, usize>, from: usize, to: usize) -> Vec<(usize, usize)> {
    let hit: Vec<(usize, usize)> = m
        .range(..to)
        .rev()
        .take_while(|&(_, &e)| e > from)
        .map(|(&s, &e)| (s, e))
        .collect();
    let mut taken = Vec::with_capacity(hit.len());
    for (s, e) in hit {
        m.remove(&s);
        if s < from {
            m.insert(s, from);
        }
        if e > to {
            m.insert(to, e);
        }
        taken.push((s.max(from), e.min(to)));
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_merge_and_takes_split() {
        let mut m = BTreeMap::new();
        insert(&mut m, 10, 20);
        insert(&mut m, 20, 25); // touching: merged
        insert(&mut m, 40, 50);
        insert(&mut m, 5, 12); // overlapping: merged
        assert_eq!(
            m.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
            [(5, 25), (40, 50)]
        );
        let mut taken = take(&mut m, 20, 45);
        taken.sort_unstable();
        assert_eq!(taken, [(20, 25), (40, 45)]);
        assert_eq!(
            m.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
            [(5, 20), (45, 50)]
        );
        assert!(take(&mut m, 25, 40).is_empty());
        take(&mut m, 0, 100);
        assert!(m.is_empty());
    }
}
