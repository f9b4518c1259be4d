//! Pages: the state of one page as a value ([`word`]), and the table of atomic words with
//! the per-page lock ([`table`]).

pub(crate) mod table;
pub(crate) mod word;
