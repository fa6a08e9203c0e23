"""Oracle test: llama.cpp (llama-cpp-python 0.3.36, built from source with bailingmoe3) loads make-tiny models
from their first part, tokenizes with their vocabulary and computes finite, non-degenerate logits."""

import numpy as np
import pytest
from llama_cpp import Llama


def load(first_part):
    return Llama(model_path=str(first_part), n_ctx=256, n_batch=64, logits_all=True, verbose=False, seed=0)


@pytest.mark.parametrize("seed", [1, 2])
def test_llama_cpp_runs_make_tiny(make_tiny, seed):
    llm = load(make_tiny(seed))
    text = "Hello world! The quick brown fox, 42 times."
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    assert len(ids) >= 5 and all(0 <= i < llm.n_vocab() for i in ids)
    assert llm.detokenize(ids).decode() == text
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    assert logits.shape == (len(ids), llm.n_vocab())
    assert np.isfinite(logits).all()
    for row in logits:
        assert row.std() > 0.1, "logits must not be (nearly) all equal"
    # different positions see different contexts, so their logits differ
    assert np.abs(logits[0] - logits[-1]).max() > 1e-3


def test_llama_cpp_parses_special_tokens(make_tiny):
    llm = load(make_tiny(1))
    ids = llm.tokenize(b"<role>HUMAN</role>hi<|role_end|>", add_bos=False, special=True)
    pieces = [llm.detokenize([i], special=True).decode() for i in ids]
    assert pieces[0] == "<role>" and "<|role_end|>" in pieces
