//! Native command-line subcommands.

pub mod dequant;
pub mod inspect;
pub mod make_tiny;
pub mod serve;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "lingtab", version, about = "Ling 3.0 Flash (bailingmoe3) on WebGPU, experts streamed from disk")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a GGUF's architecture, config, tensors and byte totals
    Inspect {
        /// The GGUF file (for a split model, its first part; the others are found by name)
        path: PathBuf,
        /// One JSON object instead of text
        #[arg(long)]
        json: bool,
        /// With --json: every metadata array in full (the vocabulary too) instead of its length
        #[arg(long)]
        full: bool,
    },
    /// Write a deterministic tiny bailingmoe3 model (two-part split GGUF)
    MakeTiny(make_tiny::MakeTinyArgs),
    /// Serve folders over HTTP with Range support (the page, the wasm package, models)
    Serve {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// URL_PREFIX=DIR, repeatable (e.g. --mount /=www --mount /pkg=pkg)
        #[arg(long = "mount", value_parser = serve::parse_mount, required = true)]
        mounts: Vec<(String, PathBuf)>,
    },
    /// Dequantise raw blocks of a ggml type to little-endian f32 (a reference for tests)
    Dequant {
        #[arg(long = "type")]
        ty: String,
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        output: PathBuf,
    },
}

pub fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect { path, json, full } => inspect::run(&path, json, full),
        Command::MakeTiny(args) => make_tiny::run(&args),
        Command::Serve { host, port, mounts } => serve::run(&host, port, mounts),
        Command::Dequant { ty, input, output } => dequant::run(&ty, &input, &output),
    };
    if let Err(e) = result {
        eprintln!("lingtab: {e}");
        std::process::exit(1);
    }
}
