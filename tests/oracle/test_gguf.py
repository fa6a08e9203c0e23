"""Oracle test: lingtab's GGUF reader against gguf-py's GGUFReader, on the shared tiny-ling fixture and on
models written by lingtab's own writer (make-tiny), split in two parts."""

import re
from collections import defaultdict

import numpy as np
import pytest
from gguf import GGUFReader

from conftest import FIXTURE, inspect_json, lingtab


def gguf_py_view(first_part):
    """Tensor table (name, type, dims, part, offset, bytes) and part-1 metadata as gguf-py reads them."""
    parts = [first_part]
    m = re.match(r"(.*)-00001-of-(\d{5})\.gguf$", first_part.name)
    if m:
        parts = [first_part.with_name(f"{m[1]}-{i:05d}-of-{m[2]}.gguf") for i in range(1, int(m[2]) + 1)]
    tensors = []
    metadata = {}
    for part_no, path in enumerate(parts, start=1):
        reader = GGUFReader(path)
        for t in reader.tensors:
            tensors.append({
                "name": t.name, "type": t.tensor_type.name, "dims": [int(d) for d in t.shape],
                "part": part_no, "offset": int(t.data_offset), "bytes": int(t.n_bytes),
            })
        if part_no == 1:
            for name, field in reader.fields.items():
                if name.startswith("GGUF."):
                    continue  # gguf-py's pseudo-fields (version, counts)
                metadata[name] = field.contents()
    return tensors, metadata


def normalise(value):
    if isinstance(value, (list, tuple, np.ndarray)):
        return [normalise(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(np.float32(value)) if isinstance(value, np.float32) else float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


def assert_same_as_gguf_py(first_part):
    ours = inspect_json(first_part)
    tensors, metadata = gguf_py_view(first_part)
    assert ours["tensors"] == tensors
    assert set(ours["metadata"]) == set(metadata)
    for key, value in metadata.items():
        assert normalise(ours["metadata"][key]) == normalise(value), key
    return ours


def test_fixture_reads_like_gguf_py():
    ours = assert_same_as_gguf_py(FIXTURE / "tiny-ling-00001-of-00002.gguf")
    assert ours["arch"] == "bailingmoe3"
    assert ours["totals"]["tensors"] == 163


@pytest.mark.parametrize("seed,extra", [(1, ()), (5, ("--layers", "8", "--experts", "16", "--parts", "3"))])
def test_make_tiny_output_reads_identically_in_gguf_py(make_tiny, seed, extra):
    first = make_tiny(seed, *extra)
    ours = assert_same_as_gguf_py(first)
    parts = ours["parts"]
    assert len(parts) == (3 if "--parts" in extra else 2)
    # the real model's structure: 2 dense lead layers, MLA every 6th layer, an MTP block
    config = ours["config"]
    assert config["n_dense_lead"] == 2
    assert [i for i, a in enumerate(config["attention"]) if a == "mla"] == [
        l for l in range(config["n_layer"]) if (l + 1) % 6 == 0 or l >= config["n_layer"] // 6 * 6
    ]
    assert config["nextn_predict_layers"] == 1
    types = defaultdict(set)  # tensor name without its blk.N. prefix -> types used
    for t in ours["tensors"]:
        types[re.sub(r"^blk\.\d+\.", "", t["name"])].add(t["type"])
    assert types["output.weight"] == {"Q6_K"}
    assert types["attn_k_b.weight"] == {"Q5_0"}
    assert types["ffn_down_exps.weight"] == {"Q4_K", "Q6_K"}
    assert types["ffn_gate_inp.weight"] == {"F32"}
    assert any(x > 0 for x in config["clamp_exp"]) and any(x > 0 for x in config["clamp_shexp"])


def test_make_tiny_is_deterministic(make_tiny, tmp_path):
    a = make_tiny(11)
    lingtab("make-tiny", "--out", str(tmp_path), "--seed", "11")
    b = sorted(tmp_path.glob("*.gguf"))
    assert [p.read_bytes() for p in sorted(a.parent.glob("*.gguf"))] == [p.read_bytes() for p in b]
    c = make_tiny(12)
    assert c.read_bytes() != a.read_bytes()
