//! Native command-line subcommands.

pub mod bench;
pub mod bench_stream;
pub mod dequant;
pub mod generate;
pub mod ingest;
pub mod inspect;
pub mod make_tiny;
pub mod run;
pub mod serve;
pub mod tokenize;

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
        /// Also serve every file under /faults/{stall,stall-once,silent-once}/PATH, answers that stall on
        /// purpose (for the browser tests of stalled downloads)
        #[arg(long)]
        faults: bool,
    },
    /// GGUF parts over HTTP Range into a store folder (resumable, verified)
    Ingest(ingest::IngestArgs),
    /// Logits of every position, the tokens fed one at a time: little-endian f32, n_tokens × vocab
    Logits {
        #[command(flatten)]
        model: ModelArgs,
        /// Token ids: a comma list or a file with a JSON array
        #[arg(long)]
        tokens: String,
        #[arg(long)]
        out: PathBuf,
        /// Also write each position's smallest routing margins (JSON) here
        #[arg(long)]
        margins: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// The greedy continuation of a token sequence, printed as a JSON array of ids
    Greedy {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        tokens: String,
        /// Tokens to generate
        #[arg(short = 'n', long = "n", default_value_t = 32)]
        n: usize,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Prefill and decode speed, syncs/dispatches/submits and store bytes per token, resident and streaming
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        args: bench::BenchArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// The matrix-vector kernels at Ling 3.0 Flash's shapes against the memory-read rate (no model needed)
    BenchKernels(bench::BenchKernelsArgs),
    /// The expert cache per pool size and eviction policy on the same decoded tokens (LRU as the baseline)
    BenchStream {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        args: bench_stream::BenchStreamArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Generate a reply to a prompt: the answer streams to stdout, the reasoning to stderr
    Generate {
        #[command(flatten)]
        args: generate::GenerateArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Chat interactively: each line of stdin is a message; /reset starts over; end of input quits
    Chat {
        #[command(flatten)]
        args: generate::ChatArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Token ids of a text with the model's tokenizer (llama.cpp's, no BOS added), as a JSON array
    #[command(group = clap::ArgGroup::new("input").required(true).args(["text", "text_file", "batch"]))]
    Tokenize {
        /// The GGUF file (for a split model, its first part)
        #[arg(long)]
        gguf: PathBuf,
        /// The text to tokenize
        #[arg(long)]
        text: Option<String>,
        /// A file whose bytes (UTF-8) are the text
        #[arg(long)]
        text_file: Option<PathBuf>,
        /// A file holding one JSON array of strings: prints one line with a JSON array of ids per string
        #[arg(long)]
        batch: Option<PathBuf>,
        /// Treat special-token text (`<role>`, `<|role_end|>`, ...) as plain text; user-defined tokens still match
        #[arg(long)]
        no_special: bool,
    },
    /// The text of token ids (special tokens as their text): raw bytes to stdout
    #[command(group = clap::ArgGroup::new("input").required(true).args(["ids", "batch"]))]
    Detokenize {
        /// The GGUF file (for a split model, its first part)
        #[arg(long)]
        gguf: PathBuf,
        /// A JSON array of token ids
        #[arg(long)]
        ids: Option<String>,
        /// A file holding a JSON array of id arrays: prints each one's bytes as a line of lowercase hex
        #[arg(long)]
        batch: Option<PathBuf>,
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

/// The model a command runs: a GGUF or a complete store, exactly one.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
struct ModelArgs {
    /// First part of the GGUF
    #[arg(long)]
    gguf: Option<PathBuf>,
    /// A complete store (`lingtab ingest`) instead of a GGUF
    #[arg(long)]
    store: Option<PathBuf>,
}

impl ModelArgs {
    fn path(self) -> run::ModelPath {
        match (self.gguf, self.store) {
            (_, Some(store)) => run::ModelPath::Store(store),
            (Some(gguf), None) => run::ModelPath::Gguf(gguf),
            (None, None) => unreachable!("clap requires --gguf or --store"),
        }
    }
}

/// Engine options shared by the commands that run the model.
#[derive(clap::Args, Debug)]
struct EngineArgs {
    /// Context length in tokens (default: the model's, at most 4096)
    #[arg(long)]
    ctx: Option<usize>,
    /// Largest buffer binding in bytes (forces tensors and the expert pool to split; also LINGTAB_MAX_BINDING)
    #[arg(long)]
    max_binding: Option<u64>,
    /// GPU bytes for the expert pool (default: every expert resident); a smaller pool streams experts from
    /// the GGUF or store as the router asks for them
    #[arg(long, conflicts_with = "gpu_budget")]
    pool_bytes: Option<u64>,
    /// GPU bytes for everything: the expert pool gets what the dense weights and states leave
    #[arg(long)]
    gpu_budget: Option<u64>,
    /// Eviction policy of a streaming pool: lru, hot (decaying frequency) or hot:DECAY
    #[arg(long, value_parser = crate::engine::Policy::parse)]
    policy: Option<crate::engine::Policy>,
    /// How streamed experts reach the GPU: write (queue.writeBuffer) or staging (a mapped staging ring)
    #[arg(long, value_parser = crate::engine::Upload::parse)]
    upload: Option<crate::engine::Upload>,
    /// Prompt tokens per chunk of the batched prefill (1: token by token)
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// Prompt tokens run layer by layer at once (a streamed MoE layer reads each expert they select once)
    #[arg(long)]
    prefill_span: Option<usize>,
}

impl EngineArgs {
    fn options(&self) -> crate::engine::EngineOptions {
        let mut o = crate::engine::EngineOptions::from_env();
        o.n_ctx = self.ctx.or(o.n_ctx);
        o.max_binding = self.max_binding.or(o.max_binding);
        o.pool_bytes = self.pool_bytes;
        o.gpu_budget_bytes = self.gpu_budget;
        o.policy = self.policy;
        o.upload = self.upload;
        o.prefill_chunk = self.prefill_chunk;
        o.prefill_span = self.prefill_span;
        o
    }
}

pub fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect { path, json, full } => inspect::run(&path, json, full),
        Command::MakeTiny(args) => make_tiny::run(&args),
        Command::Serve { host, port, mounts, faults } => serve::run(&host, port, mounts, faults),
        Command::Ingest(args) => ingest::run(&args),
        Command::Logits { model, tokens, out, margins, engine } => {
            run::logits(&model.path(), &tokens, &out, margins.as_deref(), &engine.options())
        }
        Command::Greedy { model, tokens, n, engine } => run::greedy(&model.path(), &tokens, n, &engine.options()),
        Command::Bench { model, args, engine } => bench::run(&model.path(), &args, &engine.options()),
        Command::BenchKernels(args) => bench::kernels(&args),
        Command::BenchStream { model, args, engine } => bench_stream::run(&model.path(), &args, &engine.options()),
        Command::Generate { args, engine } => {
            generate::generate(&args.gguf, &args.prompt, args.system.as_deref(), args.raw, &args.gen, &engine.options())
        }
        Command::Chat { args, engine } => generate::chat(&args.gguf, args.system.as_deref(), &args.gen, &engine.options()),
        Command::Tokenize { gguf, text, text_file, batch, no_special } => {
            let input = match (&text, &text_file, &batch) {
                (Some(text), _, _) => tokenize::TextInput::Text(text),
                (_, Some(path), _) => tokenize::TextInput::File(path),
                (_, _, Some(path)) => tokenize::TextInput::Batch(path),
                _ => unreachable!("clap requires one input"),
            };
            tokenize::tokenize(&gguf, input, !no_special)
        }
        Command::Detokenize { gguf, ids, batch } => tokenize::detokenize(&gguf, ids.as_deref(), batch.as_deref()),
        Command::Dequant { ty, input, output } => dequant::run(&ty, &input, &output),
    };
    if let Err(e) = result {
        eprintln!("lingtab: {e}");
        std::process::exit(1);
    }
}
