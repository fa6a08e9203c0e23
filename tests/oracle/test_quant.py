"""Oracle test: `lingtab dequant` must match gguf-py's `gguf.quants.dequantize` bit for bit.

Each run draws fresh random blocks (seed printed on failure; set LINGTAB_ORACLE_SEED to replay one).
Quantised blocks are random bytes with their f16 scale fields replaced by random finite f16 values
(any finite value, subnormals and ±0 included: no product of a scale and a quant can overflow f32).
The binary is $LINGTAB_BIN, by default target/debug/lingtab under the repository root.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

REPO_ROOT = Path(__file__).resolve().parents[2]
LINGTAB_BIN = Path(os.environ.get("LINGTAB_BIN", REPO_ROOT / "target" / "debug" / "lingtab"))
SEED = int(os.environ.get("LINGTAB_ORACLE_SEED", int.from_bytes(os.urandom(8), "little")))

# type name -> (block bytes, byte offsets of f16 scale fields, blocks per run)
QUANTISED = {
    "Q4_K": (144, (0, 2), 2048),
    "Q6_K": (210, (208,), 2048),
    "Q5_0": (22, (0,), 16384),
    "Q8_0": (34, (0,), 16384),
}
FLOAT_VALUES = 1 << 18


def random_finite_f16_bits(rng, n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exponent_all_ones = (bits & 0x7C00) == 0x7C00
    return np.where(exponent_all_ones, bits & 0xBFFF, bits).astype("<u2")  # clear one exponent bit


def random_finite_f32_bits(rng, n):
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
    exponent_all_ones = (bits & 0x7F800000) == 0x7F800000
    return np.where(exponent_all_ones, bits & 0xBFFFFFFF, bits).astype("<u4")


def random_blocks(rng, type_name):
    if type_name == "F32":
        return random_finite_f32_bits(rng, FLOAT_VALUES).view(np.uint8)
    if type_name == "F16":
        return random_finite_f16_bits(rng, FLOAT_VALUES).view(np.uint8)
    block_bytes, scale_offsets, n_blocks = QUANTISED[type_name]
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for offset in scale_offsets:
        blocks[:, offset : offset + 2] = random_finite_f16_bits(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)


def lingtab_dequant(tmp_path, type_name, data):
    assert LINGTAB_BIN.is_file(), f"{LINGTAB_BIN} not found: run `cargo build` or set LINGTAB_BIN"
    blocks_path, out_path = tmp_path / "blocks.bin", tmp_path / "out.f32"
    blocks_path.write_bytes(data.tobytes())
    args = [str(LINGTAB_BIN), "dequant", "--type", type_name, "--input", str(blocks_path), "--output", str(out_path)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120), out_path


def assert_bit_identical(actual, expected, context):
    assert actual.shape == expected.shape, f"{context}: {actual.shape} values, expected {expected.shape}"
    actual_nan, expected_nan = np.isnan(actual), np.isnan(expected)
    assert np.array_equal(actual_nan, expected_nan), f"{context}: NaN positions differ"
    # NaN payloads may legitimately differ between conversions; every other value must match exactly.
    differ = (actual.view(np.uint32) != expected.view(np.uint32)) & ~expected_nan
    if differ.any():
        index = np.flatnonzero(differ)[:5]
        raise AssertionError(
            f"{context}: {differ.sum()} of {differ.size} values differ, first at {index.tolist()}: "
            f"lingtab {actual[index].tolist()} vs gguf-py {expected[index].tolist()}"
        )


def check_against_gguf(tmp_path, type_name, data):
    result, out_path = lingtab_dequant(tmp_path, type_name, data)
    context = f"{type_name}, seed {SEED}"
    assert result.returncode == 0, f"{context}: lingtab dequant failed: {result.stderr}"
    actual = np.frombuffer(out_path.read_bytes(), dtype="<f4")
    expected = quants.dequantize(data, GGMLQuantizationType[type_name]).astype(np.float32).reshape(-1)
    assert_bit_identical(actual, expected, context)


@pytest.mark.parametrize("type_name", ["F32", "F16", *QUANTISED])
def test_random_blocks_match_gguf_py(tmp_path, type_name):
    rng = np.random.default_rng([SEED, sum(type_name.encode())])
    check_against_gguf(tmp_path, type_name, random_blocks(rng, type_name))


def test_f16_special_values_match_gguf_py(tmp_path):
    # ±inf, quiet and signalling NaNs, ±0, subnormal extremes, smallest normal, largest finite.
    specials = [0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00, 0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF]
    check_against_gguf(tmp_path, "F16", np.array(specials, dtype="<u2").view(np.uint8))


def test_partial_block_is_an_error(tmp_path):
    result, _ = lingtab_dequant(tmp_path, "Q4_K", np.zeros(145, dtype=np.uint8))
    assert result.returncode != 0
    assert "not a whole number of 144-byte blocks" in result.stderr


def test_unsupported_type_is_an_error(tmp_path):
    result, _ = lingtab_dequant(tmp_path, "IQ2_XS", np.zeros(74, dtype=np.uint8))
    assert result.returncode != 0
    assert "not supported" in result.stderr
