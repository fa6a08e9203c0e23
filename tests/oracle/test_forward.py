"""Oracle test: the engine (`lingtab logits` / `lingtab greedy`, on the native Vulkan adapter) against llama.cpp
run on the f32 twin of make-tiny models of other seeds and geometries: the same weights dequantised to F32
(gguf-py), so llama.cpp computes in f32 without quantising activations."""

import json
import re

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter, quants
from llama_cpp import Llama

from conftest import lingtab

MAX_ABS, MAX_RMS = 2e-3, 2e-4  # per position, before the first routing near-tie
ROUTING_NEAR_TIE, ARGMAX_NEAR_TIE = 1e-4, 1e-3


def part_paths(first_part):
    m = re.match(r"(.*)-00001-of-(\d{5})\.gguf$", first_part.name)
    return [first_part.with_name(f"{m[1]}-{i:05d}-of-{m[2]}.gguf") for i in range(1, int(m[2]) + 1)]


def make_f32_twin(first_part, out):
    """One GGUF with part 1's metadata and every tensor of every part dequantised to F32."""
    readers = [GGUFReader(p) for p in part_paths(first_part)]
    arch = readers[0].fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch)
    for name, field in readers[0].fields.items():
        if name.startswith("GGUF.") or name.startswith("split.") or name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    for reader in readers:
        for t in reader.tensors:
            values = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            writer.add_tensor(t.name, values.reshape([int(d) for d in reversed(t.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_logits(twin, tokens):
    llm = Llama(model_path=str(twin), n_ctx=512, n_batch=512, logits_all=True, verbose=False,
                type_k=0, type_v=0, flash_attn=False)  # f32 cache, no flash attention: f32 all through
    llm.eval(tokens)
    return llm, np.array(llm.scores[: len(tokens)], dtype=np.float32)


def llama_greedy(llm, tokens, n):
    llm.reset()
    llm.eval(tokens)
    out, margins = [], []
    for _ in range(n):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top2 = np.sort(row)[-2:]
        out.append(int(np.argmax(row)))
        margins.append(float(top2[1] - top2[0]))
        llm.eval([out[-1]])
    return out, margins


@pytest.mark.parametrize("seed,extra", [
    (3, ()),
    (4, ("--layers", "7", "--experts", "16", "--expert-groups", "4", "--groups-used", "2", "--experts-used", "3")),
    (6, ("--layers", "12", "--hidden", "512", "--heads", "4")),
])
def test_engine_matches_llama_cpp_f32_twin(make_tiny, tmp_path, seed, extra):
    first = make_tiny(seed, *extra)
    twin = tmp_path / "twin.gguf"
    make_f32_twin(first, twin)
    text = "The quick brown fox jumps over the lazy dog. <role>HUMAN</role>你好, 42 emoji 🙂!"
    tokens = Llama(model_path=str(twin), vocab_only=True, verbose=False).tokenize(text.encode(), add_bos=False, special=True)
    llm, want = llama_logits(twin, tokens)

    out = tmp_path / "logits.f32"
    margins_file = tmp_path / "margins.json"
    lingtab("logits", "--gguf", str(first), "--tokens", ",".join(map(str, tokens)), "--out", str(out),
            "--margins", str(margins_file))
    got = np.fromfile(out, "<f4").reshape(want.shape)
    margins = json.loads(margins_file.read_text())
    near_tie = [i for i, m in enumerate(margins) if min(m["group"], m["expert"]) < ROUTING_NEAR_TIE]
    first_tie = near_tie[0] if near_tie else len(tokens)
    assert first_tie >= 8, f"a routing near-tie at position {first_tie} leaves too little to compare: pick another seed"
    for pos in range(first_tie):
        diff = np.abs(got[pos] - want[pos])
        rms = float(np.sqrt(np.mean(diff.astype(np.float64) ** 2)))
        assert diff.max() <= MAX_ABS and rms <= MAX_RMS, f"position {pos}: max {diff.max():.2e} rms {rms:.2e}"
        top2 = np.sort(want[pos])[-2:]
        if top2[1] - top2[0] > ARGMAX_NEAR_TIE:
            assert np.argmax(got[pos]) == np.argmax(want[pos]), f"position {pos}: argmax"

    if first_tie == len(tokens):
        expected, step_margins = llama_greedy(llm, tokens, 32)
        ours = json.loads(lingtab("greedy", "--gguf", str(first), "--tokens", ",".join(map(str, tokens)), "-n", "32"))
        for step, (a, b) in enumerate(zip(ours, expected)):
            if step_margins[step] < ARGMAX_NEAR_TIE:
                break
            assert a == b, f"greedy step {step}: lingtab {a}, llama.cpp {b}"
