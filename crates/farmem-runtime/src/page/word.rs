//! The page word: everything the runtime knows about one page, in 64 bits.
//!
//! ```text
//!  63 62 61 60 59                            32 31              16 15 14 13 12 10 9 8 7 6 5 4 3 2 1 0
//! ┌─────┬─────┬────────────────────────────────┬──────────────────┬─┬─┬─┬─────┬─┬─┬─┬─┬─┬─┬─┬─┬─┬─┐
//! │CREDT│LEVEL│ SHADOW (eviction clock, 28 b)  │ OWNER (lock id)  │F│L│U│PRIO │W│R│E│I│V│L│D│G│N│A│
//! └─────┴─────┴────────────────────────────────┴──────────────────┴─┴─┴─┴─────┴─┴─┴─┴─┴─┴─┴─┴─┴─┴─┘
//!  A ABSENT  N NOWRITE  G REGISTERED  D DIRTY  L LOCKED  V EVICTING  I IDLE
//!  E EVER_WRITTEN  R REMOTE  W WAITERS
//!  U UNVERIFIED (writable, changes decided at eviction)  L WROTE_LAST (bit 14)
//!  F FILLED (this stay began with a zero fill)
//! ```
//!
//! The flag sense is chosen for the inline hint (`include/farmem.h`, [`crate::hint`]):
//! `ABSENT` and `NOWRITE` are set when a hint has work to do, so a read hint tests one bit and
//! a write hint one bit; unregistered memory reads as 0, "nothing to do".
//!
//! A [`PageWord`] is a value; the atomic slot that holds it, and the lock protocol around it,
//! are in [`super::table`]. Only the thread holding a page's lock changes its state: it takes
//! the word as it was when it locked, computes the next state with one of the transitions
//! below, and publishes it by unlocking. The exceptions are the use bits (`IDLE`, the
//! credit), which hints, faults and the policy's hand change on an unlocked word with a CAS.
//!
//! ```text
//!   FRESH ──fetch(zero fill)──► present ──write──► present+dirty ──evict──► far
//!     ▲                            │  ▲                  (write-back)          │
//!     │                            │  └──────────────fetch(read)───────────────┘
//!     └────────discard─────────────┴── (from any state, locked)
//! ```

/// The page is not mapped locally (remote, never materialized, or being fetched).
pub(crate) const ABSENT: u64 = 1 << 0;
/// The page may not be written without the runtime's help (absent, or installed
/// write-protected so that the first write is noticed).
pub(crate) const NOWRITE: u64 = 1 << 1;
/// The page belongs to a far-memory region.
const REGISTERED: u64 = 1 << 2;
/// The local copy differs from the backend copy (or the backend has none): write back
/// before dropping.
const DIRTY: u64 = 1 << 3;
/// A thread owns the page's transition (fetch, write-unprotect or eviction).
const LOCKED: u64 = 1 << 4;
/// The owner is evicting the page.
const EVICTING: u64 = 1 << 5;
/// Recency, in the sense the fast path needs: set by a policy's hand when it passes a
/// resident page ("not used since"), cleared by any hint or fault on the page. The inline
/// hint tests it together with `ABSENT`/`NOWRITE`, so a hint on an idle page takes the slow
/// path once per pass of the hand, and a hint on a recently used one costs nothing more.
/// Policies that do not track recency never set it.
pub(crate) const IDLE: u64 = 1 << 6;
/// The page was written at least once: it must never be refilled with zeros.
const EVER_WRITTEN: u64 = 1 << 7;
/// The backend holds a copy of the page (current unless `DIRTY`).
const REMOTE: u64 = 1 << 8;
/// Some thread sleeps on the futex of this word waiting for `LOCKED` to clear.
const WAITERS: u64 = 1 << 9;
/// Installed writable without write tracking: the local copy may or may not differ from the
/// far copy (`DIRTY` is set with it, so every path that does not look closer writes it
/// back). Eviction compares its contents with the far copy's digest (`digest.rs`) and drops
/// it unwritten when they are equal, or when a page with no far copy is all zeros.
const UNVERIFIED: u64 = 1 << 13;
/// Written during its last stay in local memory (kept while far): its next fetch installs
/// it writable and unverified, so its first write costs no fault.
const WROTE_LAST: u64 = 1 << 14;
/// This stay began with a zero fill (the page had no far copy): its writes initialise the
/// page and say nothing of the writes to come, so its eviction does not set `WROTE_LAST`.
/// Data written once and then only read (a table loaded, then looked up) would otherwise
/// come back writable after its first eviction and cost that eviction's write-protect.
const FILLED: u64 = 1 << 15;
/// Eviction priority given by the last hint (`ev_prio`), 0..=7.
const PRIO_SHIFT: u32 = 10;
const PRIO_MASK: u64 = 0x7 << PRIO_SHIFT;
/// Small id of the thread that holds `LOCKED` (diagnostics).
const OWNER_SHIFT: u32 = 16;
const OWNER_MASK: u64 = 0xFFFF << OWNER_SHIFT;
/// Bits 32..60: the page's shadow while it is far after an eviction (0 otherwise): the low
/// 28 bits of the runtime's eviction clock when it was evicted (see `workingset.rs`).
const SHADOW_SHIFT: u32 = 32;
pub(crate) const SHADOW_BITS: u32 = 28;
const SHADOW_MASK: u64 = ((1 << SHADOW_BITS) - 1) << SHADOW_SHIFT;
/// Bits 60..62: how many times in a row the page came back soon after its eviction (kept
/// while it is far); bits 62..64: the extra passes of a policy's hand it has left while
/// local (see `workingset.rs`).
const LEVEL_SHIFT: u32 = 60;
const LEVEL_MASK: u64 = 0x3 << LEVEL_SHIFT;
const CREDIT_SHIFT: u32 = 62;
const CREDIT_MASK: u64 = 0x3 << CREDIT_SHIFT;
/// Highest working-set level (and credit).
pub(crate) const MAX_LEVEL: u8 = 3;

/// How a fetch installs a page, as far as writes are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Write-protected: its first write is a fault that marks it dirty.
    Protected,
    /// Writable and dirty: it is being written (a write fault or a write hint).
    Written,
    /// Writable and unverified: no fault on write; eviction decides whether it changed.
    Unverified,
}

impl Access {
    /// Whether the page is mapped writable.
    pub(crate) fn writable(self) -> bool {
        self != Access::Protected
    }
}

/// How a page starts out when a fetch installs it, as far as recency policies care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hotness {
    /// Used now (a hint's page, or any page under a policy without recency).
    Used,
    /// On probation: idle, evicted at the hand's first pass unless used meanwhile.
    Probation,
    /// A working-set page at this level (1..=MAX_LEVEL): used, with as many extra passes.
    WorkingSet(u8),
}

/// One `fn name(self) -> bool` per flag: whether the bit is set.
macro_rules! flag_queries {
    ($($(#[$doc:meta])* $name:ident => $bit:ident,)*) => {
        $(
            $(#[$doc])*
            #[inline]
            pub(crate) fn $name(self) -> bool {
                self.0 & $bit != 0
            }
        )*
    };
}

/// The state of one page (see the module documentation for the layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageWord(u64);

impl PageWord {
    /// A page of a fresh region, or one whose contents were discarded: registered, never
    /// materialized (it reads as zeros when fetched).
    pub(crate) const FRESH: PageWord = PageWord(REGISTERED | ABSENT | NOWRITE);
    /// No page: memory outside every region.
    pub(crate) const UNREGISTERED: PageWord = PageWord(0);

    #[inline]
    pub(crate) const fn from_raw(w: u64) -> PageWord {
        PageWord(w)
    }

    #[inline]
    pub(crate) const fn raw(self) -> u64 {
        self.0
    }

    flag_queries! {
        /// Belongs to a live region.
        is_registered => REGISTERED,
        /// Not mapped locally.
        is_absent => ABSENT,
        is_locked => LOCKED,
        has_waiters => WAITERS,
        /// The local copy must be written back before it may be dropped.
        is_dirty => DIRTY,
        /// The backend holds a copy (current unless dirty).
        has_far_copy => REMOTE,
        /// Written at least once: never to be refilled with zeros.
        ever_written => EVER_WRITTEN,
        /// Not used since the policy's hand last passed it.
        is_idle => IDLE,
        /// Writable without write tracking: whether it changed is decided at eviction.
        is_unverified => UNVERIFIED,
        /// Written during its last stay in local memory.
        wrote_last => WROTE_LAST,
    }

    /// The small id of the thread holding `LOCKED` (0 when unlocked).
    #[inline]
    pub(crate) fn owner(self) -> u16 {
        ((self.0 & OWNER_MASK) >> OWNER_SHIFT) as u16
    }

    #[inline]
    pub(crate) fn is_present(self) -> bool {
        !self.is_absent()
    }

    /// Installed writable (present, no write protection).
    #[inline]
    pub(crate) fn is_writable(self) -> bool {
        self.0 & NOWRITE == 0
    }

    /// Whether an access (`write` or read) to the page needs the runtime: it is registered
    /// and absent, or written while write-protected.
    #[inline]
    pub(crate) fn needs_fetch_for(self, write: bool) -> bool {
        let need = if write { NOWRITE } else { ABSENT };
        self.is_registered() && self.0 & need != 0
    }

    /// The only use a hint on this page has to report is that it was used (it is present
    /// with the needed permission, only marked idle).
    #[inline]
    pub(crate) fn only_idle_for(self, write: bool) -> bool {
        let need = if write { NOWRITE } else { ABSENT };
        self.is_registered() && self.0 & (need | IDLE) == IDLE
    }

    /// Absent with contents that exist only in far memory.
    #[inline]
    pub(crate) fn is_far(self) -> bool {
        self.is_absent() && self.0 & (REMOTE | EVER_WRITTEN) != 0
    }

    /// The eviction priority of the last hint that fetched it or reported its use.
    #[inline]
    pub(crate) fn prio(self) -> u8 {
        ((self.0 & PRIO_MASK) >> PRIO_SHIFT) as u8
    }

    /// The eviction clock when it was evicted (0: never evicted, or not since it was last
    /// installed).
    #[inline]
    pub(crate) fn shadow(self) -> u64 {
        (self.0 & SHADOW_MASK) >> SHADOW_SHIFT
    }

    /// Recent refaults in a row (0..=MAX_LEVEL).
    #[inline]
    pub(crate) fn level(self) -> u8 {
        ((self.0 & LEVEL_MASK) >> LEVEL_SHIFT) as u8
    }

    /// Extra passes of the hand left (0..=MAX_LEVEL).
    #[inline]
    pub(crate) fn credit(self) -> u8 {
        ((self.0 & CREDIT_MASK) >> CREDIT_SHIFT) as u8
    }

    // ---- The lock (see `table.rs`). ----

    /// The word locked by `owner`.
    #[inline]
    pub(crate) fn locked_by(self, owner: u16) -> PageWord {
        PageWord((self.0 & !OWNER_MASK) | LOCKED | ((owner as u64) << OWNER_SHIFT))
    }

    /// The word a lock holder publishes: lock, owner and waiters cleared.
    #[inline]
    pub(crate) fn unlocked(self) -> PageWord {
        PageWord(self.0 & !(LOCKED | WAITERS | OWNER_MASK))
    }

    /// The word with a sleeper announced.
    #[inline]
    pub(crate) fn with_waiters(self) -> PageWord {
        PageWord(self.0 | WAITERS)
    }

    // ---- Transitions of the lock holder. ----

    /// absent → present: the fetch installed it as `access` says (written: dirty, the
    /// backend copy if any is about to be outdated; protected: the first write is noticed;
    /// unverified: writable, maybe dirty), with the hint's eviction priority and the recency
    /// it starts with. The shadow is consumed; the level is the one `hotness` gives.
    #[inline]
    pub(crate) fn installed(self, access: Access, prio: u8, hotness: Hotness) -> PageWord {
        let keep = self.0
            & !(ABSENT | NOWRITE | DIRTY | UNVERIFIED | IDLE | PRIO_MASK | FILLED)
            & !(SHADOW_MASK | LEVEL_MASK | CREDIT_MASK);
        let keep = if self.has_far_copy() {
            keep
        } else {
            keep | FILLED
        };
        let mut new = match access {
            Access::Written => keep | DIRTY | EVER_WRITTEN,
            Access::Protected => keep | NOWRITE,
            Access::Unverified => keep | DIRTY | UNVERIFIED,
        };
        new |= match hotness {
            Hotness::Used => 0,
            Hotness::Probation => IDLE,
            Hotness::WorkingSet(level) => {
                let l = level.min(MAX_LEVEL) as u64;
                (l << LEVEL_SHIFT) | (l << CREDIT_SHIFT)
            }
        };
        PageWord(new | (((prio as u64) << PRIO_SHIFT) & PRIO_MASK))
    }

    /// Just installed from its far copy, which the backend is told to forget (an exclusive
    /// tier): dirty, so that its next eviction writes it back whatever its protection.
    #[inline]
    pub(crate) fn far_copy_taken(self) -> PageWord {
        PageWord((self.0 & !REMOTE) | DIRTY | EVER_WRITTEN)
    }

    /// present, write-protected → present, writable and dirty (its first write).
    #[inline]
    pub(crate) fn unprotected(self) -> PageWord {
        PageWord((self.0 & !(NOWRITE | IDLE)) | DIRTY | EVER_WRITTEN)
    }

    /// present → evicting (set while locked; stays until the eviction ends either way).
    #[inline]
    pub(crate) fn evicting(self) -> PageWord {
        PageWord(self.0 | EVICTING)
    }

    /// evicting → present again: the eviction was abandoned before anything changed.
    #[inline]
    pub(crate) fn eviction_undone(self) -> PageWord {
        PageWord(self.0 & !EVICTING)
    }

    /// evicting → present and write-protected: the write-back was refused, the page stays
    /// local (still dirty) and its next write is noticed.
    #[inline]
    pub(crate) fn kept_local(self) -> PageWord {
        PageWord((self.0 | NOWRITE) & !EVICTING)
    }

    /// evicting, unverified → evicting and clean: its contents equal its far copy's.
    #[inline]
    pub(crate) fn found_unchanged(self) -> PageWord {
        PageWord(self.0 & !(DIRTY | UNVERIFIED | WROTE_LAST))
    }

    /// evicting, unverified, its far copy forgotten at the fetch → evicting, dirty (it must
    /// be written back all the same) but known unwritten: its contents equal what was last
    /// written back, and it is write-protected by now.
    #[inline]
    pub(crate) fn found_unwritten(self) -> PageWord {
        PageWord((self.0 & !(UNVERIFIED | WROTE_LAST)) | NOWRITE)
    }

    /// evicting, unverified → evicting and fresh: it holds only zeros, which is what a
    /// page with no contents reads as; no far copy is needed (any old one is forgotten).
    #[inline]
    pub(crate) fn found_zero(self) -> PageWord {
        PageWord(self.0 & !(DIRTY | UNVERIFIED | WROTE_LAST | REMOTE | EVER_WRITTEN))
    }

    /// evicting → absent: its local copy is gone. A dirty page was written back (so the
    /// backend now holds it, and its next fetch expects writes); a clean one already had its
    /// copy there, or was never written. It keeps `stamp` (the eviction clock) as its shadow
    /// and its working-set level; its recency, priority and credit are reset.
    #[inline]
    pub(crate) fn evicted(self, stamp: u64) -> PageWord {
        let gone = DIRTY | UNVERIFIED | IDLE | EVICTING | PRIO_MASK | SHADOW_MASK | CREDIT_MASK;
        let mut new = (self.0 & !gone) | ABSENT | NOWRITE | ((stamp << SHADOW_SHIFT) & SHADOW_MASK);
        // Written during this stay: dirty and mapped writable when the eviction locked it (a
        // page installed write-protected becomes writable at its first write). A dirty page
        // still protected was only read: its far copy was forgotten when it was fetched.
        new &= !(WROTE_LAST | FILLED);
        if self.is_dirty() {
            new |= REMOTE | EVER_WRITTEN;
            if self.is_writable() && self.0 & FILLED == 0 {
                new |= WROTE_LAST;
            }
        }
        PageWord(new)
    }

    // ---- Use bits, changed without the lock. ----

    /// The word with its idle mark cleared (used again; the table clears it atomically).
    #[cfg(test)]
    pub(crate) fn used(self) -> PageWord {
        PageWord(self.0 & !IDLE)
    }

    /// The word after a hint with eviction priority `prio` reported a use (not idle, the
    /// hint's priority).
    #[inline]
    pub(crate) fn used_with_prio(self, prio: u8) -> PageWord {
        PageWord((self.0 & !(IDLE | PRIO_MASK)) | (((prio as u64) << PRIO_SHIFT) & PRIO_MASK))
    }

    /// The word after the priority policy's sorting hand passed a page: idle, so that the
    /// next hint on it reports its use (and its priority) out of line.
    #[inline]
    pub(crate) fn watched(self) -> Option<PageWord> {
        (self.is_registered() && !self.is_idle()).then_some(PageWord(self.0 | IDLE))
    }

    /// What the policy's hand leaves when it passes this page: `None` if the page was not
    /// used since the last pass and has no credit left (evict it); else the word to store
    /// (marked idle, or one credit spent for a working-set page).
    #[inline]
    pub(crate) fn passed_by_hand(self) -> Option<PageWord> {
        if !self.is_registered() {
            return None; // its region is gone: nothing to mark, evict (forget) it
        }
        if !self.is_idle() {
            return Some(PageWord(self.0 | IDLE));
        }
        if self.credit() != 0 {
            return Some(PageWord(self.0 - (1 << CREDIT_SHIFT)));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inline hints in `include/farmem.h` test these bits by value: the header and the
    /// word must agree, or hints would skip needed work.
    #[test]
    fn header_bits_match_the_word() {
        let header = include_str!("../../../../include/farmem.h");
        let value = |name: &str| -> u64 {
            let line = header
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} is not defined in farmem.h"));
            let v = line.split_whitespace().nth(2).unwrap();
            v.trim_end_matches("ull").parse().unwrap()
        };
        assert_eq!(value("FM__ABSENT"), ABSENT);
        assert_eq!(value("FM__NOWRITE"), NOWRITE);
        assert_eq!(value("FM__IDLE"), IDLE);
    }

    #[test]
    fn a_page_goes_round_and_keeps_what_it_must() {
        let fresh = PageWord::FRESH;
        assert!(fresh.is_registered() && fresh.is_absent() && !fresh.is_writable());
        assert!(!fresh.is_far(), "a fresh page reads as zeros");
        let locked = fresh.locked_by(7);
        assert!(locked.is_locked());
        let present = locked
            .installed(Access::Protected, 3, Hotness::Probation)
            .unlocked();
        assert!(present.is_present() && !present.is_writable() && present.is_idle());
        assert_eq!(present.prio(), 3);
        assert!(!present.is_locked());
        let written = present.unprotected();
        assert!(written.is_writable() && written.is_dirty() && written.ever_written());
        assert!(!written.is_idle(), "a write is a use");
        let far = written.evicting().evicted(12345);
        assert!(far.is_absent() && far.has_far_copy() && far.is_far());
        assert!(!far.is_dirty() && far.prio() == 0);
        assert_eq!(far.shadow(), 12345);
        let back = far.installed(Access::Protected, 0, Hotness::WorkingSet(2));
        assert!(
            back.has_far_copy() && back.ever_written(),
            "its far copy is current"
        );
        assert_eq!((back.level(), back.credit(), back.shadow()), (2, 2, 0));
        let refused = back.unprotected().evicting().kept_local();
        assert!(refused.is_present() && !refused.is_writable() && refused.is_dirty());
    }

    #[test]
    fn an_unverified_page_is_dirty_until_eviction_looks_and_remembers_writes() {
        let fresh = PageWord::FRESH.locked_by(1);
        let zero = fresh.installed(Access::Unverified, 0, Hotness::Used);
        assert!(zero.is_writable() && zero.is_dirty() && zero.is_unverified());
        assert!(!zero.ever_written(), "not known to be written");
        let gone = zero.evicting().found_zero().evicted(1);
        assert!(!gone.is_far() && !gone.wrote_last(), "zeros again: fresh");
        let filled = zero.evicting().evicted(2);
        assert!(filled.has_far_copy() && filled.ever_written());
        assert!(!filled.wrote_last(), "written when zero-filled: no history");
        let written = filled
            .installed(Access::Unverified, 0, Hotness::Used)
            .evicting()
            .evicted(2);
        assert!(written.has_far_copy() && written.ever_written() && written.wrote_last());
        assert!(!written.is_unverified());
        let back = written.installed(Access::Unverified, 0, Hotness::Used);
        let same = back.evicting().found_unchanged().evicted(3);
        assert!(same.has_far_copy() && same.ever_written() && !same.wrote_last());
        assert!(!same.is_dirty());
    }

    /// An exclusive tier forgets the far copy at the fetch: the page is dirty whatever its
    /// protection, written back at its eviction, and remembered as written only if it was.
    #[test]
    fn a_page_whose_far_copy_is_taken_is_written_back_and_keeps_its_write_history() {
        let filled = PageWord::FRESH
            .installed(Access::Written, 0, Hotness::Used)
            .evicting()
            .evicted(1);
        assert!(
            filled.has_far_copy() && !filled.wrote_last(),
            "a zero fill's writes initialise the page: no history"
        );
        let far = filled
            .installed(Access::Written, 0, Hotness::Used)
            .evicting()
            .evicted(1);
        assert!(far.has_far_copy() && far.wrote_last());
        let read = far
            .installed(Access::Protected, 0, Hotness::Used)
            .far_copy_taken();
        assert!(!read.has_far_copy() && read.is_dirty() && read.ever_written());
        assert!(
            !read.is_writable(),
            "still write-protected: a write is noticed"
        );
        let again = read.evicting().evicted(2);
        assert!(again.has_far_copy() && again.is_far(), "written back");
        assert!(!again.wrote_last(), "only read during its stay");
        let written = read.unprotected().evicting().evicted(3);
        assert!(written.has_far_copy() && written.wrote_last());
        let unverified = written
            .installed(Access::Unverified, 0, Hotness::Used)
            .far_copy_taken();
        let same = unverified.evicting().found_unwritten();
        assert!(same.is_dirty() && !same.is_unverified());
        let back = same.evicted(4);
        assert!(back.has_far_copy() && !back.wrote_last());
        let changed = unverified.evicting().evicted(5);
        assert!(changed.has_far_copy() && changed.wrote_last());
    }

    #[test]
    fn a_clean_page_evicted_keeps_its_far_copy_status() {
        let never_written = PageWord::FRESH.installed(Access::Protected, 0, Hotness::Used);
        let gone = never_written.evicting().evicted(1);
        assert!(
            !gone.has_far_copy() && !gone.is_far(),
            "nothing to fetch: zeros"
        );
    }

    #[test]
    fn the_hand_marks_idle_then_spends_credit_then_evicts() {
        let w = PageWord::FRESH.installed(Access::Protected, 0, Hotness::WorkingSet(2));
        let w = w.passed_by_hand().expect("used: marked idle");
        assert!(w.is_idle());
        let w = w.passed_by_hand().expect("credit 2 -> 1");
        assert_eq!(w.credit(), 1);
        let w = w.passed_by_hand().expect("credit 1 -> 0");
        assert_eq!(w.credit(), 0);
        assert_eq!(w.passed_by_hand(), None, "idle, no credit: evict");
        assert_eq!(w.used().passed_by_hand().map(|w| w.is_idle()), Some(true));
        assert_eq!(PageWord::UNREGISTERED.passed_by_hand(), None);
    }

    #[test]
    fn hints_know_when_they_have_work() {
        let ro = PageWord::FRESH.installed(Access::Protected, 0, Hotness::Used);
        assert!(!ro.needs_fetch_for(false) && ro.needs_fetch_for(true));
        assert!(PageWord::FRESH.needs_fetch_for(false));
        assert!(!PageWord::UNREGISTERED.needs_fetch_for(true));
        let idle = ro.passed_by_hand().unwrap();
        assert!(idle.only_idle_for(false) && !idle.only_idle_for(true));
    }
}
