//! The ways a workload is run: natively, under Linux swap in a memory cgroup (the stand-in
//! for Fastswap: kernel swap with a far backend), and under farmem, transparent or hinted,
//! with the embedded backend or a `farmem server` on loopback.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Mode {
    /// No limit: the reference every other mode is normalized to.
    Native,
    /// The unmodified program in a memory cgroup limited to the local size, swapping to zram.
    SwapZram,
    /// The same with a swap file on the root filesystem.
    SwapFile,
    /// `farmem run`, embedded backend, far pages raw in the process (the mechanism alone).
    Farmem,
    /// `farmem run` as a user runs it, with its default backend: compressed in the process
    /// up to a cap, the rest in a file on the disk (to compare with swap-zram and swap-file).
    FarmemDefault,
    /// `farmem run --backend file://DIR`, every far page in a file in the directory of
    /// swap-file's swap file: the file tier alone, like for like with swap-file (the default
    /// also holds compressible pages in compressed DRAM, outside the budget).
    FarmemFile,
    /// `farmem run` with far pages compressed in process (`local+lz4://`): compressed DRAM,
    /// to compare with swap-zram compressing with the same algorithm.
    FarmemLz4,
    /// `farmem run` over TCP to a `farmem server` on loopback.
    FarmemTcp,
    /// The hinted build of the program under `farmem run`, embedded backend.
    FarmemHinted,
    /// The hinted build over TCP.
    FarmemHintedTcp,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::SwapZram => "swap-zram",
            Mode::SwapFile => "swap-file",
            Mode::Farmem => "farmem",
            Mode::FarmemDefault => "farmem-default",
            Mode::FarmemFile => "farmem-file",
            Mode::FarmemLz4 => "farmem-lz4",
            Mode::FarmemTcp => "farmem-tcp",
            Mode::FarmemHinted => "farmem-hinted",
            Mode::FarmemHintedTcp => "farmem-hinted-tcp",
        }
    }

    pub fn is_swap(self) -> bool {
        matches!(self, Mode::SwapZram | Mode::SwapFile)
    }

    pub fn is_farmem(self) -> bool {
        matches!(
            self,
            Mode::Farmem
                | Mode::FarmemDefault
                | Mode::FarmemFile
                | Mode::FarmemLz4
                | Mode::FarmemTcp
                | Mode::FarmemHinted
                | Mode::FarmemHintedTcp
        )
    }

    pub fn over_tcp(self) -> bool {
        matches!(self, Mode::FarmemTcp | Mode::FarmemHintedTcp)
    }

    pub fn hinted(self) -> bool {
        matches!(self, Mode::FarmemHinted | Mode::FarmemHintedTcp)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
