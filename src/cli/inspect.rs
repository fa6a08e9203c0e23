//! `lingtab inspect PART1.gguf`: what a GGUF holds — architecture, config, every tensor, byte totals.

use crate::gguf::SplitModel;
use crate::model::summary::summary;
use crate::source::{self, FileSource};
use std::path::Path;

/// Opens every part of a (possibly split) model from the path of its first part.
pub fn open_model(first_part: &Path) -> Result<SplitModel, String> {
    pollster::block_on(source::open_model(&first_part.to_string_lossy(), |name| {
        let path = Path::new(name);
        if !path.exists() {
            return Err(format!("split part {} is missing (expected next to {})", path.display(), first_part.display()));
        }
        FileSource::open(path)
    }))
}

pub fn run(path: &Path, as_json: bool, full_metadata: bool) -> Result<(), String> {
    let model = open_model(path)?;
    let r = summary(&model, full_metadata)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap());
        return Ok(());
    }
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), render_text(&r).as_bytes());
    Ok(())
}

/// The human-readable form of [`summary`].
fn render_text(r: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let o = &mut out;
    let c = &r["config"];
    writeln!(o, "architecture: {}", r["arch"].as_str().unwrap_or("?")).unwrap();
    for p in r["parts"].as_array().unwrap() {
        writeln!(o, "part {}: {} bytes, {} tensors", p["part"], p["bytes"], p["tensors"]).unwrap();
    }
    writeln!(o, "config:").unwrap();
    for (k, v) in c.as_object().unwrap() {
        writeln!(o, "  {k:<22} {v}").unwrap();
    }
    writeln!(o, "tensors:").unwrap();
    writeln!(o, "  {:<40} {:<6} {:<22} {:>4} {:>14} {:>12}", "name", "type", "dims", "part", "offset", "bytes").unwrap();
    for t in r["tensors"].as_array().unwrap() {
        let dims = t["dims"].as_array().unwrap().iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        writeln!(o, "  {:<40} {:<6} {:<22} {:>4} {:>14} {:>12}", t["name"].as_str().unwrap(), t["type"].as_str().unwrap(), dims, t["part"].to_string(), t["offset"].to_string(), t["bytes"].to_string()).unwrap();
    }
    let t = &r["totals"];
    writeln!(o, "totals:").unwrap();
    writeln!(o, "  tensors               {}", t["tensors"]).unwrap();
    writeln!(o, "  file bytes            {}", t["file_bytes"]).unwrap();
    writeln!(o, "  dense bytes           {}", t["dense_bytes"]).unwrap();
    writeln!(o, "  expert bytes          {}", t["expert_bytes"]).unwrap();
    writeln!(o, "  mtp bytes (unused)    {}", t["mtp_bytes"]).unwrap();
    for rec in t["expert_record_bytes"].as_array().unwrap() {
        writeln!(o, "  expert record, blk {:<3} {} bytes", rec["layer"].to_string(), rec["bytes"]).unwrap();
    }
    out
}
