"""Oracle test: `lingtab tokenize` / `lingtab detokenize` against llama.cpp (llama-cpp-python) on a few thousand
generated strings per model, with and without special-token parsing, and decode(encode(s)) == s.

The strings are random but seeded (LINGTAB_TOKENIZER_SEED overrides the default); the seed is printed and named in
every failure message."""

import json
import os
import random
import subprocess

import pytest
from llama_cpp import Llama

from conftest import FIXTURE, LINGTAB_BIN, lingtab

SEED = int(os.environ.get("LINGTAB_TOKENIZER_SEED", "20260417"))
N_STRINGS = 3000

WORDS = ["the", "The", "HELLO", "world", "Ling", "token", "naïve", "café", "don", "it", "we", "x", "Zürich", "ok"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'ll", "'d", "'m", "'S", "'T", "'RE", "'Ve", "'lL", "'D", "'M", "'", "''"]
WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\r\n", "\n\n", "\n", "\r", " \n ", "\n \n", "\x0b", "\x0c", " \t\n"]
PUNCT = "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~"
ODD_SPACES = ["\u0085", "\u00a0", "\ufeff", "\u2028", "\u2029", "\u3000", "\u200b", "\u1680", "\u2007", "\u202f"]
EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🧑🏿‍💻", "🇫🇷", "©", "™", "⌘"]
SPECIALS = ["<role>", "</role>", "<|role_end|>", "<think>", "</think>", "<|endoftext|>", "<rol", "<role", "role>",
            "</rol", "<|role_", "role_end|>", "<|", "|>", "<think", "<|endoftext", "SYSTEM", "HUMAN", "ASSISTANT",
            "<role>HUMAN</role>", "<tool_call>", "<arg_key>", "<<role>>", "<|role_end|><|role_end|>"]
SCRIPTS = [(0x4E00, 0x9FFF), (0x3040, 0x30FF), (0xAC00, 0xD7A3), (0x0400, 0x04FF), (0x0370, 0x03FF),
           (0x0600, 0x06FF), (0x0900, 0x097F), (0x0E00, 0x0E7F), (0x1F300, 0x1F64F), (0xFF00, 0xFFEF)]


def random_char(rng, lo, hi):
    while True:
        cp = rng.randint(lo, hi)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def fragment(rng):
    kind = rng.randrange(12)
    if kind == 0:
        word = rng.choice(WORDS)
        return word if rng.random() < 0.5 else "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(rng.randint(1, 9)))
    if kind == 1:
        return rng.choice(WHITESPACE) * rng.randint(1, 3)
    if kind == 2:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 7)))
    if kind == 3:
        return rng.choice(["", " "]) + rng.choice(WORDS) + rng.choice(CONTRACTIONS)
    if kind == 4:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 5)))
    if kind == 5:
        lo, hi = rng.choice(SCRIPTS)
        return "".join(random_char(rng, lo, hi) for _ in range(rng.randint(1, 6)))
    if kind == 6:
        return rng.choice(EMOJI)
    if kind == 7:  # combining marks, after a letter or alone
        base = rng.choice(["e", "a", "Z", "", " ", "1", "字"])
        return base + "".join(random_char(rng, 0x0300, 0x036F) for _ in range(rng.randint(1, 3)))
    if kind == 8:
        return rng.choice(ODD_SPACES)
    if kind == 9:
        return rng.choice(SPECIALS)
    if kind == 10:  # anything from the BMP and beyond, control characters included
        return random_char(rng, 0x01, 0x2FFFF) if rng.random() < 0.7 else chr(rng.randint(1, 0x7F))
    return rng.choice(["'", "\"", "-", " '", "'s'", "...", "\\n", "https://x.y/z?a=1&b=2"])


def generate(seed, n):
    rng = random.Random(seed)
    texts = ["", " ", "\n", "<|endoftext|>", "<role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>\n<think>"]
    while len(texts) < n:
        texts.append("".join(fragment(rng) for _ in range(rng.randint(1, 12))))
    return texts


def run_batch(tmp_path, name, command, gguf, items, *extra):
    path = tmp_path / name
    path.write_text(json.dumps(items), encoding="utf-8")
    return lingtab(command, "--gguf", str(gguf), "--batch", str(path), *extra).splitlines()


@pytest.fixture(scope="module", params=["fixture", "make-tiny-1"])
def model(request, make_tiny):
    if request.param == "fixture":
        return FIXTURE / "tiny-ling-00001-of-00002.gguf"
    return make_tiny(1)


def test_tokenize_matches_llama_cpp(model, tmp_path):
    print(f"tokenizer oracle seed: {SEED} (LINGTAB_TOKENIZER_SEED)")
    texts = generate(SEED, N_STRINGS)
    llm = Llama(model_path=str(model), vocab_only=True, verbose=False)
    for special, extra in [(True, ()), (False, ("--no-special",))]:
        lines = run_batch(tmp_path, f"texts-{special}.json", "tokenize", model, texts, *extra)
        assert len(lines) == len(texts)
        got = [json.loads(line) for line in lines]
        failures = []
        for text, ids in zip(texts, got):
            want = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            if ids != want:
                failures.append(f"{text!r}: lingtab {ids}, llama.cpp {want}")
        assert not failures, f"seed {SEED}, special={special}: {len(failures)} of {len(texts)} differ:\n" + "\n".join(failures[:20])

        decoded = [bytes.fromhex(line) for line in run_batch(tmp_path, f"ids-{special}.json", "detokenize", model, got)]
        assert len(decoded) == len(texts)
        bad = [(t, d) for t, d in zip(texts, decoded) if d != t.encode("utf-8")]
        assert not bad, f"seed {SEED}, special={special}: decode(encode(s)) != s for {len(bad)}:\n" + "\n".join(f"{t!r} -> {d!r}" for t, d in bad[:20])
        # the pieces agree with llama.cpp's (special tokens rendered as their text)
        for ids, d in list(zip(got, decoded))[:300]:
            assert llm.detokenize(ids, special=True) == d, f"seed {SEED}: detokenize {ids}"


def test_single_text_modes(model, tmp_path):
    text = "<role>HUMAN</role>Hi there, it's 2026! 你好 👨‍👩‍👧‍👦\u0085<|role_end|>"
    want = json.loads(run_batch(tmp_path, "one.json", "tokenize", model, [text])[0])
    assert json.loads(lingtab("tokenize", "--gguf", str(model), f"--text={text}")) == want
    path = tmp_path / "text.txt"
    path.write_bytes(text.encode("utf-8"))
    assert json.loads(lingtab("tokenize", "--gguf", str(model), "--text-file", str(path))) == want
    plain = json.loads(lingtab("tokenize", "--gguf", str(model), "--text-file", str(path), "--no-special"))
    assert plain != want and len(plain) > len(want)
    out = subprocess.run([str(LINGTAB_BIN), "detokenize", "--gguf", str(model), "--ids", json.dumps(want)], capture_output=True)
    assert out.returncode == 0 and out.stdout == text.encode("utf-8")


def test_cli_errors(model, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe")
    result = subprocess.run([str(LINGTAB_BIN), "tokenize", "--gguf", str(model), "--text-file", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "not valid UTF-8" in result.stderr and "offset 3" in result.stderr
    result = subprocess.run([str(LINGTAB_BIN), "tokenize", "--gguf", str(model)], capture_output=True, text=True)
    assert result.returncode != 0
    result = subprocess.run([str(LINGTAB_BIN), "detokenize", "--gguf", str(model), "--ids", "[1, 99999999]"], capture_output=True, text=True)
    assert result.returncode != 0 and "outside the vocabulary" in result.stderr
