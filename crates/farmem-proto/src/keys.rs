//! What a page is called in far memory and how urgent a request for it is: shared by the
//! runtime's backends, the wire and the server.

/// Pages move as 4 KiB units (the x86-64 base page; the runtime checks its own page size
/// against this one).
pub const PAGE_SIZE: usize = 4096;

/// Priority class of a backend request, most urgent first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IoClass {
    /// A thread is stalled on this page.
    Demand,
    /// Read-ahead: useful soon, nobody waits yet.
    Prefetch,
    /// Eviction write-back.
    WriteBack,
}

/// Identity of a page in far memory: region id and page index within the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageKey {
    pub region: u32,
    pub page: u64,
}

/// The class's code in a frame header.
pub fn class_to_u8(c: IoClass) -> u8 {
    match c {
        IoClass::Demand => 0,
        IoClass::Prefetch => 1,
        IoClass::WriteBack => 2,
    }
}

/// The class of a header's code, if it is one.
pub fn class_from_u8(v: u8) -> Option<IoClass> {
    match v {
        0 => Some(IoClass::Demand),
        1 => Some(IoClass::Prefetch),
        2 => Some(IoClass::WriteBack),
        _ => None,
    }
}
