//! `lingtab generate` and `lingtab chat`: text generation on the command line. The answer streams to stdout,
//! the reasoning to stderr (dimmed on a terminal, else each line prefixed `… `).

use super::inspect::open_model;
use super::run::load_engine;
use crate::engine::EngineOptions;
use crate::generate::{FinishReason, GenerateOptions, Generation, SamplingOptions, Session};
use crate::model::chat::Message;
use crate::model::tokenizer::Tokenizer;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

/// Sampling and stopping options shared by `generate` and `chat`.
#[derive(clap::Args, Debug)]
pub struct GenArgs {
    /// Most tokens per reply
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// 0 = greedy
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// 0 = off
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// 1 = off
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// 0 = off
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// 1 = off
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// 0 = off
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// How many recent tokens the penalties look at (0 = off)
    #[arg(long, default_value_t = 64)]
    pub penalty_last_n: usize,
    /// Seed of the sampler (default: from the clock, printed on stderr)
    #[arg(long)]
    pub seed: Option<u64>,
    /// The template's "detailed thinking off": no reasoning
    #[arg(long)]
    pub no_thinking: bool,
    /// A string that ends the answer (repeatable)
    #[arg(long = "stop")]
    pub stop: Vec<String>,
}

impl GenArgs {
    fn options(&self) -> GenerateOptions {
        let seed = self.seed.unwrap_or_else(|| {
            let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
            if self.temperature > 0.0 {
                eprintln!("seed {seed}");
            }
            seed
        });
        GenerateOptions {
            max_tokens: self.max_tokens,
            sampling: SamplingOptions {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repetition_penalty: self.repeat_penalty,
                presence_penalty: self.presence_penalty,
                penalty_last_n: self.penalty_last_n,
                seed,
            },
            stop: self.stop.clone(),
            thinking: !self.no_thinking,
        }
    }
}

fn session(first_part: &Path, options: &EngineOptions) -> Result<Session, String> {
    let model = open_model(first_part)?;
    let tokenizer = Tokenizer::from_header(model.header()).map_err(|e| format!("tokenizer: {e}"))?;
    drop(model);
    let engine = load_engine(first_part, options)?;
    Ok(Session::new(engine, tokenizer))
}

/// Streams a generation to stdout (answer) and stderr (reasoning); returns the answer, the reasoning and why
/// it ended.
fn stream(mut generation: Generation<'_>) -> Result<(String, String, FinishReason), String> {
    let dim = std::io::stderr().is_terminal();
    let mut stdout = std::io::stdout().lock();
    let mut in_reasoning_line = false;
    // the reasoning printed so far does not end with a line break
    let mut reasoning_open = false;
    let started = std::time::Instant::now();
    let mut first_token_at = None;
    let mut finish = FinishReason::Stop;
    while let Some(event) = pollster::block_on(generation.next())? {
        if first_token_at.is_none() {
            first_token_at = Some(started.elapsed());
        }
        if !event.reasoning.is_empty() {
            reasoning_open = !event.reasoning.ends_with('\n');
            if dim {
                eprint!("\x1b[2m{}\x1b[0m", event.reasoning);
            } else {
                // prefix each reasoning line so that it stands apart from the answer in a log
                let mut out = String::new();
                for c in event.reasoning.chars() {
                    if !in_reasoning_line {
                        out.push_str("… ");
                        in_reasoning_line = true;
                    }
                    out.push(c);
                    if c == '\n' {
                        in_reasoning_line = false;
                    }
                }
                eprint!("{out}");
            }
        }
        if !event.text.is_empty() {
            if reasoning_open {
                eprintln!();
                reasoning_open = false;
            }
            stdout.write_all(event.text.as_bytes()).map_err(|e| e.to_string())?;
            stdout.flush().map_err(|e| e.to_string())?;
        }
        if let Some(f) = event.finish {
            finish = f;
        }
    }
    if !generation.text().is_empty() {
        writeln!(stdout).map_err(|e| e.to_string())?;
    }
    if reasoning_open {
        eprintln!();
    }
    let n = generation.tokens().len();
    let prompt = generation.prompt_tokens().len();
    let reused = generation.reused_tokens();
    let first = first_token_at.unwrap_or_default().as_secs_f64();
    let rest = started.elapsed().as_secs_f64() - first;
    let rate = if n > 1 && rest > 0.0 { format!(", {:.1} tokens/s", (n - 1) as f64 / rest) } else { String::new() };
    eprintln!(
        "[{}: {n} tokens; prompt {prompt} tokens ({reused} held already) in {first:.2} s{rate}]",
        finish.as_str()
    );
    Ok((generation.text().to_string(), generation.reasoning().to_string(), finish))
}

pub fn generate(first_part: &Path, prompt: &str, system: Option<&str>, raw: bool, args: &GenArgs, engine: &EngineOptions) -> Result<(), String> {
    let options = args.options();
    options.validate()?;
    let mut session = session(first_part, engine)?;
    let generation = if raw {
        let ids = session.tokenizer.encode(prompt, true);
        session.generate_tokens(&ids, options)?
    } else {
        let mut messages = Vec::new();
        if let Some(system) = system {
            messages.push(Message::system(system));
        }
        messages.push(Message::user(prompt));
        session.generate(&messages, options)?
    };
    stream(generation)?;
    super::run::print_stats(&session.engine);
    Ok(())
}

pub fn chat(first_part: &Path, system: Option<&str>, args: &GenArgs, engine: &EngineOptions) -> Result<(), String> {
    let options = args.options();
    options.validate()?;
    let mut session = session(first_part, engine)?;
    let start: Vec<Message> = system.map(Message::system).into_iter().collect();
    let mut messages = start.clone();
    eprintln!("lingtab chat: a line is a message; /reset starts over; end of input (Ctrl-D) quits");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        if line.trim() == "/reset" {
            messages = start.clone();
            session.reset();
            eprintln!("[the conversation starts over]");
            continue;
        }
        messages.push(Message::user(line));
        let (answer, reasoning, _) = match session.generate(&messages, options.clone()).and_then(stream) {
            Ok(reply) => reply,
            Err(e) => {
                eprintln!("lingtab: {e}");
                messages.pop();
                continue;
            }
        };
        let mut reply = Message::assistant(answer);
        if !reasoning.is_empty() {
            reply = reply.with_reasoning(reasoning);
        }
        messages.push(reply);
    }
    eprintln!();
    Ok(())
}

/// Arguments of `lingtab generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// First part of the GGUF
    #[arg(long)]
    pub gguf: PathBuf,
    /// The user message (with --raw: the whole prompt text, special tokens parsed)
    #[arg(long)]
    pub prompt: String,
    /// A system message
    #[arg(long)]
    pub system: Option<String>,
    /// Feed the prompt text as it is, without the chat template
    #[arg(long)]
    pub raw: bool,
    #[command(flatten)]
    pub gen: GenArgs,
}

/// Arguments of `lingtab chat`.
#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    /// First part of the GGUF
    #[arg(long)]
    pub gguf: PathBuf,
    /// A system message
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub gen: GenArgs,
}
