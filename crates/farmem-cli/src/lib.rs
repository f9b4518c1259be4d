//! The `farmem` command: one command line for the user tool (`run`, `trace`, `demo`), the
//! memory server (`server`, from `farmem-server`) and the benchmark harness (`bench`, from
//! `farmem-bench`). A library as well, so that tests use its modules directly.

pub mod ctl;
pub mod demo;
pub mod run;
pub mod trace;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "farmem",
    version,
    about = "Far memory for Linux programs: keep part of a program's memory local, the rest far",
    long_about = "farmem keeps only part of a program's memory in local DRAM and the rest in far \
                  memory (by default, for `farmem run`, LZ4-compressed in memory, then a file \
                  on disk; or a memory server), fetching pages on access \
                  or, faster, before the access when the program hints it."
)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a self-checking demonstration: a data set larger than local memory, written,
    /// scanned unhinted and hinted, verified, with statistics.
    Demo(demo::Args),
    /// Measure page-scan throughput against a native array, and the hint fast-path cost.
    Bench(farmem_bench::Args),
    /// Run an unmodified program with part of its heap in far memory.
    Run(run::Args),
    /// Change the local budget of a program running under `farmem run`, or watch its memory
    /// and faults.
    Ctl(ctl::Args),
    /// Run a program as `run` does and report which code lines cause its far-memory faults,
    /// with flame graphs and a suggested hint per site.
    Trace(trace::Args),
    /// Run the memory server: far memory for programs on other machines (or this one),
    /// multi-tenant, authenticated, fairly shared.
    Server(farmem_server::Args),
}

/// Parse the command line and run the command.
pub fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FARMEM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(a) => farmem_bench::run(a),
        Cmd::Server(a) => Ok(farmem_server::run(a)?),
        Cmd::Run(a) => run::run(a),
        Cmd::Trace(a) => trace::run(a),
        Cmd::Ctl(a) => ctl::run(a),
    }
}
