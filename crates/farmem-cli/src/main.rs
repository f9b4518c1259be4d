//! `farmem`: the command-line front end of the far-memory runtime.

fn main() -> anyhow::Result<()> {
    farmem_cli::main()
}
