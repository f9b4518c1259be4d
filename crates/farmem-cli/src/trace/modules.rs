//! Executable mappings of the traced process (filled in by the unwinding work).
