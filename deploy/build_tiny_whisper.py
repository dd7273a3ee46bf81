"""Build the tiny random-weight Whisper that a CPU vLLM worker serves as "tiny-whisper".

Why: the gateway relays speech-to-text (``/v1/audio/transcriptions``, ``/v1/audio/translations``)
to vLLM, which serves those routes only with a Whisper-family model. No small Whisper ships in
a registry package and nothing may be fetched from a model hub, so one is built here in a few
seconds.

Run with the vLLM environment's python (it has torch, transformers and tokenizers)::

    .venv-vllm/bin/python deploy/build_tiny_whisper.py --out .models/tiny-whisper

Serve it with ``--max-model-len 448`` (Whisper's decoder length); vLLM needs the audio
packages ``av``, ``soundfile`` and ``soxr`` in its environment to decode uploads.

Contract:
- Deterministic: the byte-level BPE is trained on the seeded text of ``build_tiny_model.py``
  and the weights come from a fixed torch seed, so every machine builds the same files
  (nothing is read from the machine or a model hub).
- Idempotent: the output folder is deleted and rewritten on every run.
- Whisper's decoder prompt works as vLLM writes it: ``<|startoftranscript|>``, a language
  token for each of Whisper's languages (a superset of those vLLM accepts), ``<|transcribe|>``
  / ``<|translate|>`` and ``<|notimestamps|>`` are single special tokens.
- Transcripts are gibberish (random weights); callers bound their length with
  ``max_completion_tokens`` or accept up to the decoder's 448 tokens.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

SEED = 20240603
# Text tokens, including <|endoftext|>; the special tokens below are added on top.
VOCAB_SIZE = 1024
SAMPLE_RATE = 16_000
MEL_BINS = 80
MAX_SOURCE_POSITIONS = 1500  # 30 s of audio: 3,000 mel frames, halved by the conv stride
MAX_TARGET_POSITIONS = 448
EOT = "<|endoftext|>"
SOT = "<|startoftranscript|>"
TASKS = ("<|translate|>", "<|transcribe|>")
# After the language and task tokens, in the order of OpenAI's Whisper vocabulary.
TRAILING_SPECIALS = ("<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>")
SAMPLE = "What is the weather like in the garden this morning?"


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def _on_path() -> None:
    """Put the repository on ``sys.path``: the vLLM environment that runs this script does
    not have the gateway installed, and the shared helpers live in build_tiny_model.py."""
    root = str(_repo_root())
    if root not in sys.path:
        sys.path.insert(0, root)


def training_lines() -> list[str]:
    """The seeded English-like sentences the tiny Llama's tokenizer is trained on.

    Imported from ``build_tiny_model.py`` through the repository's ``hearthgate`` package
    folder: the vLLM environment does not have the gateway installed.
    """
    _on_path()
    from hearthgate.deploy.build_tiny_model import training_text

    return training_text()


def train_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE (GPT-2 style, as Whisper's); return its vocab and merges."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOT],
        # Every byte is a token, so any text (any language) can be encoded.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = training_lines()
    chunks = [" ".join(lines[i : i + 8]) for i in range(0, len(lines), 8)]
    tok.train_from_iterator(chunks, trainer=trainer)
    raw: list[Any] = json.loads(tok.to_str())["model"]["merges"]
    # tokenizers writes a merge as a pair (0.20 and later) or as "left right" (older).
    merges = [(m[0], m[1]) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in raw]
    return tok.get_vocab(), merges


def build_tokenizer(out: Path) -> Any:
    """Save Whisper's tokenizer and feature extractor (as one processor); return the tokenizer.

    The vocab and merges are passed as objects: ``WhisperTokenizer(vocab_file=...,
    merges_file=...)`` silently ignores the files in transformers 5 and yields a tokenizer
    without a vocabulary.
    """
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    vocab, merges = train_bpe()
    tok = WhisperTokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=EOT,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        model_max_length=MAX_TARGET_POSITIONS,
    )
    languages = [f"<|{code}|>" for code in LANGUAGES]
    tok.add_special_tokens(
        {"additional_special_tokens": [SOT, *languages, *TASKS, *TRAILING_SPECIALS]}
    )
    features = WhisperFeatureExtractor(feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE)
    WhisperProcessor(feature_extractor=features, tokenizer=tok).save_pretrained(str(out))
    return tok


def build_model(out: Path, tok: Any) -> int:
    """Save a seeded random-weight fp32 Whisper and its generation config; return its params."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    def ids(token: str) -> int:
        return int(tok.convert_tokens_to_ids(token))

    eot, sot = ids(EOT), ids(SOT)
    config = WhisperConfig(
        vocab_size=len(tok),
        num_mel_bins=MEL_BINS,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=MAX_SOURCE_POSITIONS,
        max_target_positions=MAX_TARGET_POSITIONS,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=sot,
        # Generation settings live in the generation config below; WhisperConfig's defaults
        # name token ids of OpenAI's vocabulary (220, 50256), which this one does not have.
        begin_suppress_tokens=None,
        suppress_tokens=None,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=sot,
        eos_token_id=eot,
        pad_token_id=eot,
        bos_token_id=eot,
        max_length=MAX_TARGET_POSITIONS,
        no_timestamps_token_id=ids("<|notimestamps|>"),
        lang_to_id={f"<|{code}|>": ids(f"<|{code}|>") for code in LANGUAGES},
        task_to_id={"translate": ids(TASKS[0]), "transcribe": ids(TASKS[1])},
        is_multilingual=True,
        begin_suppress_tokens=[eot],
        suppress_tokens=[],
        forced_decoder_ids=None,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    return int(sum(p.numel() for p in model.parameters()))


def check(out: Path) -> str:
    """Reload the folder, check the tokenizer round-trips text, transcribe 3 s of silence.

    Raises RuntimeError when the tokenizer lost its vocabulary (the gotcha above), which
    would otherwise surface only as empty transcripts.
    """
    import numpy as np
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    processor: Any = WhisperProcessor.from_pretrained(str(out))
    tok = processor.tokenizer
    ids = tok(SAMPLE, add_special_tokens=False)["input_ids"]
    if tok.decode(ids) != SAMPLE or len(ids) > 2 * len(SAMPLE.split()):
        raise RuntimeError(f"tokenizer does not round-trip {SAMPLE!r}: {ids}")
    model = WhisperForConditionalGeneration.from_pretrained(str(out)).eval()
    silence = np.zeros(3 * SAMPLE_RATE, dtype=np.float32)
    features = processor(silence, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    with torch.no_grad():
        generated = model.generate(features, max_new_tokens=8, language="en", task="transcribe")
    return str(tok.decode(generated[0]))


def main(argv: list[str] | None = None) -> int:
    _on_path()
    from hearthgate.deploy.build_tiny_model import fresh_output

    out = fresh_output(argv, __doc__, Path(".models/tiny-whisper"))
    started = time.monotonic()
    tok = build_tokenizer(out)
    params = build_model(out, tok)
    heard = check(out)
    print(
        f"built {out}: vocab {len(tok)}, {params / 1e6:.2f}M params, "
        f"silence -> {heard!r}, {time.monotonic() - started:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
