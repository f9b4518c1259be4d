//! Pages: the state of one page as a value ([`word`]), the table of atomic words with the
//! per-page lock ([`table`]), and the digests of far copies beside it ([`digest`]).

pub(crate) mod digest;
pub(crate) mod table;
pub(crate) mod word;
