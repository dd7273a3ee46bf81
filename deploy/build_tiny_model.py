"""Build the tiny random-weight Llama that the CPU vLLM workers serve as "tiny-llama".

Run with the vLLM environment's python (it has torch, transformers and tokenizers)::

    .venv-vllm/bin/python deploy/build_tiny_model.py --out .models/tiny-llama

Contract:
- Deterministic: the tokenizer is trained on text generated here from a seeded generator over
  an embedded word list, and the weights come from a fixed torch seed, so every machine
  builds byte-identical files (nothing is read from the machine or a model hub).
- Idempotent: the output folder is deleted and rewritten on every run.
- Realistic prompt lengths: common English words map to about one token each, so a prompt of
  N words is roughly N to 1.5 N tokens, as with real chat models.
- Output text is gibberish (random weights); callers control length with ``ignore_eos`` and
  ``max_tokens``.

The module imports only the standard library at import time, so ``WORDS`` and
``training_text`` can be reused by load generators in the gateway environment.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path

SEED = 20240601
VOCAB_SIZE = 2048
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")

# Simple chat template: <s><|role|>\ncontent</s>\n ... then <|assistant|>\n to generate.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# About 600 of the most common English words. Training on them teaches the BPE whole-word
# tokens, so ordinary English prompts cost about one token per word.
_WORD_TEXT = """
the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by not word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big
high such follow act why ask men change went light kind off need house picture try us again
animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left late
run don't while press close night real life few north open seem together next white children
begin got walk example ease paper group always music those both mark often letter until mile
river car feet care second book carry took science eat room friend began idea fish mountain
stop once base hear horse cut sure watch color face wood main enough plain girl usual young
ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half
rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb
sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice
voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star
box noun field rest correct able pound done beauty drive stood contain front teach week final
gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead
dry wonder laugh thousand ago ran check game shape equate hot miss brought heat snow tire
bring yes distant fill east paint language among grand ball yet wave drop heart am present
heavy dance engine position arm wide sail material size vary settle speak weight general ice
matter circle pair include divide syllable felt perhaps pick sudden count square reason length
represent art subject region energy hunt probable bed brother egg ride cell believe fraction
forest sit race window store summer train sleep prove lone leg exercise wall catch mount wish
sky board joy winter sat written wild instrument kept glass grass cow job edge sign visit past
soft fun bright gas weather month million bear finish happy hope flower clothe strange gone
jump baby eight village meet root buy raise solve metal whether push seven paragraph third
shall held hair describe cook floor either result burn hill safe cat century consider type law
bit coast copy phrase silent tall sand soil roll temperature finger industry value fight lie
beat excite natural view sense ear else quite broke case middle kill son lake moment scale
loud spring observe child straight consonant nation dictionary milk speed method organ pay age
section dress cloud surprise quiet stone tiny climb cool design poor lot experiment bottom key
iron single stick flat twenty skin smile crease hole trade melody trip office receive row
mouth exact symbol die least trouble shout except wrote seed tone join suggest clean break lady
yard rise bad blow oil blood touch grew cent mix team wire cost lost brown wear garden equal
sent choose fell fit flow fair bank collect save control decimal gentle woman captain practice
separate difficult doctor please protect noon whose locate ring character insect caught period
indicate radio spoke atom human history effect electric expect crop modern element hit student
corner party supply bone rail imagine provide agree thus capital won't chair danger fruit rich
thick soldier process operate guess necessary sharp wing create neighbor wash bat rather crowd
corn compare poem string bell depend meat rub tube famous dollar stream fear sight thin
triangle planet hurry chief colony clock mine tie enter major fresh search send yellow gun
allow print dead spot desert suit current lift rose continue block chart hat sell success
company subtract event particular deal swim term opposite wife shoe shoulder spread arrange
camp invent cotton born determine quart nine truck noise level chance gather shop stretch
throw shine property column molecule select wrong gray repeat require broad prepare salt nose
plural anger claim continent oxygen sugar death pretty skill women season solution magnet
silver thank branch match suffix especially fig afraid huge sister steel discuss forward
similar guide experience score apple bought led pitch coat mass card band rope slip win dream
evening condition feed tool total basic smell valley nor double seat arrive master track parent
shore division sheet substance favor connect post spend chord fat glad original share station
dad bread charge proper bar offer segment slave duck instant market degree populate chick dear
enemy reply drink occur support speech nature range steam motion path liquid log meant
quotient teeth shell neck
app apps server document documents photo photos assistant background backlog summary summaries
note notes message email calendar meeting today tomorrow yesterday weekend kitchen recipe dinner
lunch breakfast school homework kids please thanks hello okay maybe really actually important
information question questions answer answers explain describe example simple quickly slowly
problem computer phone internet website online search model data file files folder list lists
report reports weather music movie movies video videos game games book books story stories
family friends parents mother brother sister daughter husband wife doctor appointment reminder
schedule morning evening afternoon night light lights temperature heating door doors garage
shopping grocery groceries price order delivery package travel trip flight hotel car train
write writing read reading find finding help helping need needs want wants know knows make
makes work works working worked using used user users service request requests response
long short large small first last next previous new old better best good bad great nice
its into years later called known being film based local around park wet
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())

SUFFIXES = ("s", "s", "ed", "ing", "er", "ly")
QUESTION_STARTS = ("what", "how", "why", "when", "where", "who", "which", "can", "do", "will")


def training_text(seed: int = SEED, sentences: int = 20_000) -> list[str]:
    """Seeded English-like sentences over ``WORDS`` with a Zipf-like word frequency.

    Frequent words come first in ``WORDS``; weighting by 1/rank makes the common ones merge
    into single tokens first, as in real text. Punctuation and capitals appear as in prose.
    """
    rng = random.Random(seed)
    weights = [1.0 / (rank + 10) for rank in range(len(WORDS))]
    lines: list[str] = []
    for _ in range(sentences):
        n = rng.randint(4, 18)
        words = rng.choices(WORDS, weights=weights, k=n)
        # Some inflected forms teach suffix tokens, so words outside the list split sensibly.
        for i in range(n):
            if rng.random() < 0.1:
                words[i] += rng.choice(SUFFIXES)
        question = rng.random() < 0.2
        if question:
            words[0] = rng.choice(QUESTION_STARTS)
        if n > 8 and rng.random() < 0.3:
            words[rng.randint(2, n - 3)] += ","
        first = words[0]
        words[0] = first[:1].upper() + first[1:]
        lines.append(" ".join(words) + ("?" if question else "."))
    return lines


def build_tokenizer(out: Path) -> int:
    """Train the byte-level BPE, save it as a PreTrainedTokenizerFast; return its length."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = training_text()
    # Text (prose) is joined into multi-sentence lines so " word" after a full stop is seen.
    chunks = [" ".join(lines[i : i + 8]) for i in range(0, len(lines), 8)]
    tok.train_from_iterator(chunks, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Prepend <s> on plain-text encodes (completions); the chat template writes it itself
    # and vLLM encodes chat prompts without special tokens.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, bos_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return len(fast)


def build_model(out: Path, vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> int:
    """Save a seeded random-weight bf16 Llama; return its parameter count."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    model.save_pretrained(str(out), safe_serialization=True)
    return int(sum(p.numel() for p in model.parameters()))


def tokens_per_word(out: Path, text: str) -> float:
    """Measure how many tokens an English text costs per whitespace-separated word."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    return n / max(1, len(text.split()))


SAMPLE = (
    "Family apps all point at one home server. When the children ask a question, the voice "
    "assistant should answer quickly, even while the notes app reads long documents and the "
    "photo tagger works through a large backlog in the background at night."
)


def fresh_output(argv: list[str] | None, doc: str | None, default: Path | None = None) -> Path:
    """The ``--out`` folder of a model builder's command line, emptied and made again, with
    the environment set for offline building (the tiny models' builders share it)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    if default is None:
        parser.add_argument("--out", type=Path, required=True, help="output folder (rewritten)")
    else:
        parser.add_argument("--out", type=Path, default=default, help="output folder (rewritten)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


def main(argv: list[str] | None = None) -> int:
    out = fresh_output(argv, __doc__)
    started = time.monotonic()
    vocab = build_tokenizer(out)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    params = build_model(
        out,
        vocab,
        tok.convert_tokens_to_ids(BOS),
        tok.convert_tokens_to_ids(EOS),
        tok.convert_tokens_to_ids(PAD),
    )
    own = " ".join(training_text(seed=SEED + 1, sentences=200))
    print(
        f"built {out}: vocab {vocab}, {params / 1e6:.2f}M params, "
        f"tokens/word {tokens_per_word(out, own):.2f} (word list), "
        f"{tokens_per_word(out, SAMPLE):.2f} (sample prompt), "
        f"{time.monotonic() - started:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
