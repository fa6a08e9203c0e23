//! `lingtab make-tiny`: writes a deterministic tiny (or flash-width) `bailingmoe3` model as a split GGUF.

use crate::tiny::{TinyModel, TinyOptions};
use std::path::Path;

#[derive(clap::Args, Debug)]
pub struct MakeTinyArgs {
    /// Output folder
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// `tiny` (the tiny-ling fixture's shape) or `flash` (Ling 3.0 Flash's widths)
    #[arg(long, default_value = "tiny")]
    pub geometry: String,
    /// Trunk layers (MTP blocks come on top)
    #[arg(long)]
    pub layers: Option<usize>,
    #[arg(long)]
    pub mtp_layers: Option<usize>,
    #[arg(long)]
    pub hidden: Option<usize>,
    #[arg(long)]
    pub heads: Option<usize>,
    #[arg(long)]
    pub experts: Option<usize>,
    #[arg(long)]
    pub experts_used: Option<usize>,
    #[arg(long)]
    pub expert_groups: Option<usize>,
    #[arg(long)]
    pub groups_used: Option<usize>,
    #[arg(long)]
    pub ff_expert: Option<usize>,
    /// Vocabulary size, special tokens included
    #[arg(long)]
    pub vocab: Option<usize>,
    #[arg(long)]
    pub parts: Option<usize>,
    /// Routing skew (0: uniform); 1.6 makes a few experts hot, near the published Ling-3.0-Flash cache hit rates (see `lingtab bench-stream`)
    #[arg(long)]
    pub expert_skew: Option<f32>,
    /// Big Q4_K/Q6_K tensors as random blocks (same spread, minutes faster at flash widths; for benchmarks)
    #[arg(long)]
    pub fast_weights: bool,
    /// File name prefix (`NAME-00001-of-00002.gguf`)
    #[arg(long)]
    pub name: Option<String>,
}

impl MakeTinyArgs {
    pub fn options(&self) -> Result<TinyOptions, String> {
        let mut o = match self.geometry.as_str() {
            "tiny" => TinyOptions::tiny(self.seed),
            "flash" => TinyOptions::flash(self.seed, self.layers.unwrap_or(4)),
            g => return Err(format!("--geometry {g:?}: expected tiny or flash")),
        };
        let set = |slot: &mut usize, v: Option<usize>| {
            if let Some(v) = v {
                *slot = v;
            }
        };
        set(&mut o.layers, self.layers);
        set(&mut o.mtp_layers, self.mtp_layers);
        set(&mut o.hidden, self.hidden);
        set(&mut o.heads, self.heads);
        set(&mut o.experts, self.experts);
        set(&mut o.experts_used, self.experts_used);
        set(&mut o.expert_groups, self.expert_groups);
        set(&mut o.groups_used, self.groups_used);
        set(&mut o.ff_expert, self.ff_expert);
        set(&mut o.vocab, self.vocab);
        set(&mut o.parts, self.parts);
        if let Some(s) = self.expert_skew {
            o.expert_skew = s;
        }
        o.fast_weights = self.fast_weights;
        if let Some(name) = &self.name {
            o.name = name.clone();
        }
        Ok(o)
    }
}

pub fn run(args: &MakeTinyArgs) -> Result<(), String> {
    let model = TinyModel::plan(args.options()?)?;
    let paths = model.write_to_dir(Path::new(&args.out)).map_err(|e| format!("{}: {e}", args.out.display()))?;
    for p in paths {
        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        println!("{} ({len} bytes)", p.display());
    }
    Ok(())
}
