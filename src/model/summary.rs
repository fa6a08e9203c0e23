//! A model's description as JSON: the same object for `lingtab inspect --json` and the web page.

use super::layout::Totals;
use super::Config;
use crate::gguf::{Header, SplitModel, Value};
use serde_json::json;

/// Metadata as JSON; unless `full`, long arrays (the vocabulary) are summarised so the output stays readable.
fn metadata_json(h: &Header, full: bool) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for (k, v) in &h.metadata {
        let j = match v {
            Value::Array(ty, items) if !full && items.len() > 64 => json!({ "array_of": format!("{ty:?}"), "len": items.len() }),
            v => v.to_json(),
        };
        map.insert(k.clone(), j);
    }
    serde_json::Value::Object(map)
}

/// What `inspect --json` prints and the page shows: architecture, config, parts, tensors, byte totals.
pub fn summary(model: &SplitModel, full_metadata: bool) -> Result<serde_json::Value, String> {
    let header = model.header();
    let config = Config::from_header(header).map_err(|e| e.to_string())?;
    let totals = Totals::of(&config, model);
    let tensors: Vec<_> = model
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.info.name, "type": t.info.ty.name(), "dims": t.info.dims,
                "part": t.part + 1, "offset": t.file_offset, "bytes": t.info.n_bytes(),
            })
        })
        .collect();
    Ok(json!({
        "arch": header.architecture(),
        "parts": model.part_lens.iter().enumerate().map(|(i, len)| json!({"part": i + 1, "bytes": len, "tensors": model.parts[i].tensors.len()})).collect::<Vec<_>>(),
        "config": config,
        "metadata": metadata_json(header, full_metadata),
        "tensors": tensors,
        "totals": {
            "tensors": model.tensors.len(),
            "file_bytes": model.total_len(),
            "dense_bytes": totals.dense_bytes,
            "expert_bytes": totals.expert_bytes,
            "mtp_bytes": totals.mtp_bytes,
            "expert_record_bytes": totals.expert_record_bytes.iter().map(|(l, b)| json!({"layer": l, "bytes": b})).collect::<Vec<_>>(),
        },
    }))
}

