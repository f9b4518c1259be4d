//! DWARF call-frame unwinding of sampled stacks (filled in by the unwinding work).
