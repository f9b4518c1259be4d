//! Pages: the state of one page as a value ([`word`]), the table of atomic words with the
//! per-page lock ([`table`]), the copy-on-write template that makes a new region's words
//! fresh without writing them (`fresh`), and the digests of far copies beside it
//! ([`digest`]).

pub(crate) mod digest;
mod fresh;
pub(crate) mod table;
pub(crate) mod word;
