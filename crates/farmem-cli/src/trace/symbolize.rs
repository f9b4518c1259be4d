//! Symbolization of code addresses (filled in by the unwinding work).
