//! `farmem trace`: find the code lines that cause most far-memory faults.
//!
//! Recording samples the program's page faults with `perf_event_open` (the faulting address,
//! the thread, its user registers and a copy of the top of its stack), keeps those in far
//! memory, and unwinds and symbolizes them afterwards (`unwind`, `symbolize`), attributing
//! each fault to its source line, the innermost one and the first in the program's own code.

// Filled in step by step; the pieces are used once the command is wired up.
#[allow(dead_code)]
pub mod modules;
#[allow(dead_code)]
pub mod symbolize;
#[allow(dead_code)]
pub mod unwind;
