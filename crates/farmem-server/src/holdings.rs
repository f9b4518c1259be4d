//! What connections hold in memory, counted per connection, per tenant and in total.

use crate::conn::Conn;

/// Bytes held for queued requests, the replies they announce, and unsent output: per
/// connection (`Conn::held`), per tenant (the sum over its authenticated connections) and in
/// total. Reading a connection pauses when any of the three is at its limit, so a tenant that
/// stalls large frames can exhaust only its own share.
#[derive(Default)]
pub(crate) struct Holdings {
    pub(crate) total: usize,
    /// By tenant index.
    pub(crate) tenants: Vec<usize>,
}

impl Holdings {
    pub(crate) fn add(&mut self, c: &mut Conn, n: usize) {
        c.held += n;
        self.total += n;
        if let Some(t) = c.tenant() {
            self.tenants[t] += n;
        }
    }

    pub(crate) fn sub(&mut self, c: &mut Conn, n: usize) {
        c.held -= n;
        self.total -= n;
        if let Some(t) = c.tenant() {
            self.tenants[t] -= n;
        }
    }

    /// A connection became its tenant's: what it holds now counts for the tenant too.
    pub(crate) fn attribute(&mut self, c: &Conn) {
        if let Some(t) = c.tenant() {
            self.tenants[t] += c.held;
        }
    }

    /// Tenant slot `t` begins (a new tenant, or a forgotten one's slot reused): it holds
    /// nothing.
    pub(crate) fn new_tenant(&mut self, t: usize) {
        if self.tenants.len() <= t {
            self.tenants.resize(t + 1, 0);
        }
        debug_assert_eq!(self.tenants[t], 0, "a new tenant holds nothing");
        self.tenants[t] = 0;
    }

    /// A connection goes: nothing it held is held any more.
    pub(crate) fn forget(&mut self, c: &mut Conn) {
        let n = c.held;
        self.sub(c, n);
    }
}
