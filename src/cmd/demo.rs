//! `ferrite demo`: placeholder until the tensor crates land.

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    println!("ferrite");
    Ok(())
}
