#!/usr/bin/env python3
"""Writes the seed corpus in tests/fuzz/seeds/ (committed; libFuzzer grows its own corpus elsewhere).

GGUF seeds are real headers cut to their header + tensor-info length (data_start), not the tensor data:
the fixture's two parts, and the parts of a few `lingtab make-tiny` models (other vocabulary sizes, layer
counts, expert counts, one and three parts). Each is wrapped in the target's input encoding with the part's
real file length as the claimed length, so the reader gets past the tensor-fits-in-file checks.
Tokenizer seeds are real text: the golden tokenizer cases (multilingual, emoji, code, special tokens),
README text, slices of the corpus make-tiny trains its vocabulary on (src/tiny/corpus) and chat-template text.

Usage (from the repository root, after `cargo build --bin lingtab`): python3 tests/fuzz/make_seeds.py
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEEDS = os.path.join(ROOT, "tests", "fuzz", "seeds")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "tiny-ling")

# bytes of each fixed-size GGUF value type (8 = string and 9 = array are variable)
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def header_len(path):
    """data_start of a GGUF v3 file: the header, metadata and tensor infos, padded to the alignment."""
    with open(path, "rb") as f:
        b = f.read(64 << 20)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, b, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = b[pos:pos + n]
        pos += n
        return s.decode()

    def value(ty):
        nonlocal pos
        if ty == 8:
            return string()
        if ty == 9:
            elem, n = take("I"), take("Q")
            return [value(elem) for _ in range(n)]
        v = b[pos:pos + FIXED[ty]]
        pos += FIXED[ty]
        return struct.unpack("<I", v)[0] if ty == 4 else v

    assert b[:4] == b"GGUF" and struct.unpack_from("<I", b, 4)[0] == 3, path
    pos = 8
    n_tensors, n_kv = take("Q"), take("Q")
    alignment = 32
    for _ in range(n_kv):
        key, ty = string(), take("I")
        v = value(ty)
        if key == "general.alignment":
            alignment = v
    for _ in range(n_tensors):
        string()
        n_dims = take("I")
        pos += 8 * n_dims + 4 + 8
    return -(-pos // alignment) * alignment


def write(target, name, data):
    os.makedirs(os.path.join(SEEDS, target), exist_ok=True)
    with open(os.path.join(SEEDS, target, name), "wb") as f:
        f.write(data)


def part(path):
    """(header bytes, file length)"""
    n = header_len(path)
    with open(path, "rb") as f:
        return f.read(n), os.path.getsize(path)


def gguf_seeds(tag, paths):
    parts = [part(p) for p in paths]
    for i, (head, size) in enumerate(parts):
        # gguf_header: [flags: bit 0 = claimed length][claimed length u64][prefix]
        write("gguf_header", f"{tag}-part{i + 1}", struct.pack("<BQ", 1, size) + head)
    for i in range(len(parts) - 1):
        (h1, s1), (h2, s2) = parts[i], parts[i + 1]
        # gguf_split: [flags: bits 0, 1 = claimed lengths][cut u32][length 1 u64][length 2 u64][prefix 1][prefix 2]
        write("gguf_split", f"{tag}-parts{i + 1}{i + 2}", struct.pack("<BIQQ", 3, len(h1), s1, s2) + h1 + h2)


def main():
    if os.path.isdir(SEEDS):
        shutil.rmtree(SEEDS)
    gguf_seeds("tiny-ling", [os.path.join(FIXTURE, f"tiny-ling-0000{i}-of-00002.gguf") for i in (1, 2)])

    lingtab = os.path.join(ROOT, "target", "debug", "lingtab")
    variants = {
        "vocab300-1part": ["--vocab", "300", "--parts", "1"],
        "vocab300-3parts": ["--vocab", "300", "--parts", "3", "--layers", "3", "--experts", "8", "--experts-used", "2"],
        "mtp0-2parts": ["--vocab", "400", "--mtp-layers", "0", "--layers", "2"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for tag, args in variants.items():
            out = os.path.join(tmp, tag)
            subprocess.run([lingtab, "make-tiny", "--out", out, "--seed", "3", *args], check=True, stdout=subprocess.DEVNULL)
            gguf_seeds(f"make-tiny-{tag}", sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".gguf")))

    # gguf_metadata: [base u8][edits: (index u16, type u8, value u64)...]; no edit, and general.architecture
    # (metadata 0) rewritten to the string "bailingmoe3", on each base header
    for base in range(3):
        write("gguf_metadata", f"base{base}", bytes([base]))
        write("gguf_metadata", f"base{base}-arch", bytes([base]) + struct.pack("<HBQ", 0, 8, 1))
        # 16 edits (so libFuzzer's length limit admits as many): general.architecture rewritten each time
        write("gguf_metadata", f"base{base}-16", bytes([base]) + struct.pack("<HBQ", 0, 8, 1) * 16)

    # inputs that crashed the targets before the fixes (each also a regression test in the native suite)
    edit = lambda *e: struct.pack("<HBQ", *e)
    write("gguf_metadata", "found-group-used-overflow", bytes([0]) + edit(27, 10, 2**64 - 1))
    write("gguf_metadata", "found-kda-width-overflow", bytes([0]) + edit(21, 10, 2**64 - 1))
    write("gguf_metadata", "found-block-count-alloc", bytes([0]) + edit(6, 10, 2**40) + edit(11, 4, 1))
    write("gguf_metadata", "found-expert-count", bytes([0]) + edit(24, 4, 1024))
    head1, size1 = part(os.path.join(FIXTURE, "tiny-ling-00001-of-00002.gguf"))
    head2, size2 = part(os.path.join(FIXTURE, "tiny-ling-00002-of-00002.gguf"))
    write("gguf_split", "found-lengths-overflow", struct.pack("<BIQQ", 3, len(head1), 2**63 + size1, 2**63 + size2) + head1 + head2)
    write("gguf_split", "found-name-sign", struct.pack("<BIQQ", 0, 0, 0, 0) + b"m-+0001-of-00002.gguf")
    write("gguf_split", "found-name-cjk", struct.pack("<BIQQ", 0, 0, 0, 0) + "模型文件名称.gguf".encode())
    tensor = struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 8, 0, 0xFFFFFFFFFFFFFFC0)
    write("gguf_header", "found-end-overflow", struct.pack("<BQ", 1, 2**64 - 1) + b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + tensor)
    string_kv = struct.pack("<Q", 12) + b"general.name" + struct.pack("<IQ", 8, 100 << 20) + b"x"
    write("gguf_header", "found-read-request", struct.pack("<BQ", 1, 1 << 40) + b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string_kv)

    texts = []
    cases = json.load(open(os.path.join(FIXTURE, "golden", "tokenize_cases.json")))["cases"]
    texts += [c["text"] for c in cases]
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    texts += [p for p in readme.split("\n\n") if p.strip()][:40]
    corpus_dir = os.path.join(ROOT, "src", "tiny", "corpus")
    for name in sorted(os.listdir(corpus_dir)):
        if name.endswith(".txt"):
            body = open(os.path.join(corpus_dir, name), encoding="utf-8").read()
            texts += [body[i:i + 600] for i in range(0, min(len(body), 3000), 600)]
    chat = [
        "Hi\u0001Hello! How can I help?\u0002The user greets me.\u0001what's the weather in 北京?\u0003get_weather\u0004city\u0005北京",
        "You are terse.\u0001<role>HUMAN</role>inject<|role_end|>\u0001ok\u0001{\"temp\": 21}",
        "detailed thinking off\u0001🙂 émoji, नमस्ते, مرحبا, Привет\u0001<think>\nhidden\n</think>\nanswer",
    ]
    seen = set()
    for i, text in enumerate(texts):
        data = text.encode("utf-8", "surrogatepass")
        digest = hashlib.sha1(data).hexdigest()[:12]
        if digest in seen or not data:
            continue
        seen.add(digest)
        write("tokenizer", f"text-{digest}", bytes([i % 2]) + data)  # modes 0 and 1: round trip, pre-tokenizer
    for i, text in enumerate(chat):
        write("tokenizer", f"chat-{i}", bytes([2 | (4 if i % 2 else 0) | (i << 3)]) + text.encode())
    vocab = "a\nb\nc\nĠ\nab\nabc\n3:<s>\n4:<u>\n<|endoftext|>\n\na b\nab c\n\nab ca<s>b<u> abc"
    write("tokenizer", "vocab-toy", bytes([3 | 0x40]) + vocab.encode())
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(SEEDS) for f in fs)
    print(f"seeds: {total} bytes in {SEEDS}", file=sys.stderr)


if __name__ == "__main__":
    main()
