"""Tiny local models with random weights, for tests and demos of every adapter (engine-free).

Each builder writes a Hugging Face model directory (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``, ...) that vLLM, SGLang and transformers load offline:

- :func:`build_tiny_llama`: a ``LlamaForCausalLM`` for generation.
- :func:`build_tiny_classifier`: a sequence classifier (``LlamaForSequenceClassification`` by
  default, ``BertForSequenceClassification`` on request) with ``id2label`` labels.
- :func:`build_tiny_cross_encoder`: a ``BertForSequenceClassification`` with one label, which vLLM
  treats as a cross-encoder (score = sigmoid of the single logit of the tokenized pair).
- :func:`build_tiny_blip2`: a ``Blip2ForConditionalGeneration`` (image + text) around the tiny Llama,
  with a ``BlipImageProcessor`` config (no torchvision needed).

The tokenizer is a byte-level BPE trained with ``tokenizers`` on a small English corpus generated
here, so every byte string is encodable and decoding round-trips. Special tokens have fixed ids:
``<unk>`` 0, ``<s>`` 1 (BOS / CLS), ``</s>`` 2 (EOS / SEP), ``<pad>`` 3, ``<mask>`` 4.

Everything is deterministic: the same parameters give byte-identical files. A stamp file records
the parameters; a directory that already holds a complete model with the same stamp is reused.

The weights are random: the models produce gibberish, but gibberish that is reproducible and equal
between vLLM and transformers when both run in float32 (vLLM's ``dtype="auto"`` picks bfloat16 on
CPU for this float32 checkpoint, and bf16 greedy outputs can drift from float32 ones). The causal
model's LM head gives a zero logit to tokens that do not decode to printable text on their own
(control bytes, partial UTF-8 bytes, special tokens other than EOS), so its output is readable.
CPU attention in vLLM needs ``head_dim >= 64``.

CLI: ``python -m openengine_adapters.demo_model PATH [--kind llama|classifier|cross-encoder|blip2]``
prints the model directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "MASK_ID",
    "SPECIAL_TOKENS",
    "STAMP_FILE",
    "build_tiny_llama",
    "build_tiny_classifier",
    "build_tiny_cross_encoder",
    "build_tiny_blip2",
    "IMAGE_TOKEN",
    "build",
    "demo_corpus",
    "main",
]

#: Bumped whenever the output of a builder changes for the same parameters.
FORMAT_VERSION = 2
STAMP_FILE = "openengine_demo_model.json"

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", "<mask>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID, MASK_ID = range(len(SPECIAL_TOKENS))
UNK, BOS, EOS, PAD, MASK = SPECIAL_TOKENS

#: Byte-level alphabet (256) + special tokens: the smallest vocabulary the tokenizer can have.
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

DEFAULT_LABELS_3 = ("negative", "neutral", "positive")

# The files a complete model directory holds (besides the stamp, written last).
_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


# --------------------------------------------------------------------------------------------
# Corpus


_NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()
_COLORS = "red orange yellow green blue purple pink brown black white gray silver golden".split()
_ANIMALS = (
    "cat dog horse cow sheep goat pig rabbit mouse fox wolf bear lion tiger zebra monkey "
    "elephant giraffe owl eagle duck goose fish whale dolphin frog snake turtle"
).split()
_ADJECTIVES = "big small quick slow happy sleepy hungry quiet loud brave clever gentle old young".split()
_PLACES = "garden forest river field kitchen village city park farm beach mountain library".split()
_FOODS = "apples bread cheese carrots rice soup honey berries nuts cake milk tea".split()
_NAMES = "Alice Bob Carol David Emma Frank Grace Henry Irene Jack Laura Mike Nina Oscar".split()
_VERBS = "sees chases follows watches feeds finds helps likes visits meets".split()
_CAPITALS = (
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Japan", "Tokyo"),
    ("Canada", "Ottawa"),
    ("Egypt", "Cairo"),
    ("Peru", "Lima"),
    ("Kenya", "Nairobi"),
    ("Norway", "Oslo"),
)
_FIXED_LINES = (
    "Hello, my name is Alice. How are you today?",
    "Hello world! This is a tiny test model with random weights.",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a small red fox who lived in the forest.",
    "Question: What is two plus two? Answer: Two plus two is four.",
    "user: Tell me a story about a cat.\nassistant: The cat sat on the mat and slept all day.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 20 42 100 1000 2024.",
    "Punctuation: commas, periods. Questions? Exclamations! Quotes \"like this\" and 'this';",
    "More punctuation: (brackets) [too] {and} more... done.",
    "Symbols: a+b=c, 3*4=12, 10/2=5, 7-1=6, 50% off, $5, #tag, @name, a_b, x<y>z, ~, ^, &, |, \\.",
    "The weather today is sunny and warm, but tomorrow it will rain.",
    "Machine learning models learn patterns from data.",
    "Please answer in one word: yes or no.",
    "The capital of France is Paris.",
    "I like to read books in the library on Sunday morning.",
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday",
    "January February March April May June July August September October November December",
)


def demo_corpus() -> list[str]:
    """The built-in English training corpus of the tokenizer (deterministic, ~600 lines)."""
    rng = random.Random(20240611)
    lines = list(_FIXED_LINES)
    lines.append(" ".join(_NUMBERS))
    lines.append(", ".join(c.capitalize() for c in _COLORS) + ".")
    for i, word in enumerate(_NUMBERS):
        lines.append(f"The number {word} is written as {i}.")
        if i + 1 < len(_NUMBERS):
            lines.append(f"After {word} comes {_NUMBERS[i + 1]}.")
    for a in range(1, 11):
        for b in range(1, 11):
            if a + b <= 20 and (a * 7 + b * 3) % 4 == 0:
                lines.append(f"{_NUMBERS[a].capitalize()} plus {_NUMBERS[b]} is {_NUMBERS[a + b]}.")
                lines.append(f"{a} + {b} = {a + b}")
    for country, city in _CAPITALS:
        lines.append(f"The capital of {country} is {city}.")
        lines.append(f"Question: What is the capital of {country}? Answer: {city}.")
    for animal in _ANIMALS:
        color = rng.choice(_COLORS)
        lines.append(f"The {animal} is {color}.")
        lines.append(f"Question: What color is the {animal}? Answer: The {animal} is {color}.")
    templates = (
        "The {adj} {animal} has {num} {color} {food}.",
        "{name} counted {num} {color} {animal}s in the {place}.",
        "My favourite color is {color}, and my favourite animal is the {animal}.",
        "Hello, my name is {name}. I live near the {place} and I like {food}.",
        "In the {place}, a {adj} {animal} {verb} a {color} {animal2}.",
        "{name} {verb} {name2} every {day} in the {place}.",
        "There are {digit} {animal}s and {num} {color} birds near the {place}.",
        "user: How many {animal}s are in the {place}?\nassistant: There are {num} {animal}s.",
        "The {color} {animal} ate {food} and then slept under a {color2} tree.",
        "Why is the {animal} so {adj}? Because it ate too many {food}!",
    )
    days = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
    for i in range(450):
        template = templates[i % len(templates)]
        lines.append(
            template.format(
                adj=rng.choice(_ADJECTIVES),
                animal=rng.choice(_ANIMALS),
                animal2=rng.choice(_ANIMALS),
                num=rng.choice(_NUMBERS[2:]),
                digit=rng.randrange(2, 1000),
                color=rng.choice(_COLORS),
                color2=rng.choice(_COLORS),
                food=rng.choice(_FOODS),
                place=rng.choice(_PLACES),
                name=rng.choice(_NAMES),
                name2=rng.choice(_NAMES),
                verb=rng.choice(_VERBS),
                day=rng.choice(days),
            )
        )
    return lines


# --------------------------------------------------------------------------------------------
# Tokenizer


def _build_tokenizer(vocab_size: int, *, style: str) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` with exactly ``vocab_size`` entries.

    style "llama": single = ``<s> A``, pair = ``<s> A </s> B`` (type ids 0/1).
    style "bert": single = ``<s> A </s>``, pair = ``<s> A </s> B </s>`` (type ids 0/1), i.e.
    ``<s>``/``</s>`` play CLS/SEP like in RoBERTa.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < _MIN_VOCAB + 1:
        raise ValueError(f"vocab_size must be > {_MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)")
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(demo_corpus(), trainer=trainer)
    # The corpus cannot supply merges for large vocabularies: fill the rest with reserved special
    # tokens so that every model id is a real token (ids stay deterministic).
    missing = vocab_size - tok.get_vocab_size(with_added_tokens=True)
    if missing > 0:
        from tokenizers import AddedToken

        tok.add_special_tokens([AddedToken(f"<|reserved_{i}|>", special=True) for i in range(missing)])
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size(True)} tokens, expected {vocab_size}")
    for i, token in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(token) != i:
            raise RuntimeError(f"special token {token} got id {tok.token_to_id(token)}, expected {i}")
    specials = [(BOS, BOS_ID), (EOS, EOS_ID)]
    if style == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS}:0 $A:0 {EOS}:0", pair=f"{BOS}:0 $A:0 {EOS}:0 $B:1 {EOS}:1", special_tokens=specials
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {EOS}:0 $B:1", special_tokens=specials
        )
    return tok


def _tokenizer_config(*, style: str, model_max_length: int, chat_template: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        # Load tokenizer.json as is (a model-specific class such as LlamaTokenizer would rebuild
        # the pipeline around the vocabulary).
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "padding_side": "right",
        "truncation_side": "right",
    }
    if style == "bert":
        cfg.update(cls_token=BOS, sep_token=EOS, mask_token=MASK)
        cfg["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    else:
        cfg["model_input_names"] = ["input_ids", "attention_mask"]
    if chat_template:
        cfg["chat_template"] = CHAT_TEMPLATE
    return cfg


def _special_tokens_map(style: str) -> dict[str, str]:
    m = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD}
    if style == "bert":
        m.update(cls_token=BOS, sep_token=EOS, mask_token=MASK)
    return m


# --------------------------------------------------------------------------------------------
# Weights


def _param_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _randomize(model: Any, seed: int, std: float) -> None:
    """Fill every parameter from its own seeded generator (independent of transformers' init and
    of parameter order): matrices ~ N(0, std), norm weights 1, biases 0."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                gen = torch.Generator().manual_seed(_param_seed(seed, name))
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * std)
            elif name.endswith("bias"):
                param.zero_()
            else:  # RMSNorm / LayerNorm scales
                param.fill_(1.0)


def _unreadable_token_ids(tok: Any) -> list[int]:
    """Ids whose text is not printable on its own: special tokens other than EOS, control bytes
    and the bytes of multi-byte UTF-8 characters (which decode to U+FFFD alone)."""
    ids = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        if i == EOS_ID:
            continue
        text = tok.decode([i], skip_special_tokens=True)
        if not text or "\ufffd" in text or not all(ch.isprintable() or ch in " \n" for ch in text):
            ids.append(i)
    return ids


def _mute_unreadable_tokens(model: Any, tok: Any) -> None:
    """Zero the LM-head rows of unreadable tokens: their logit is always 0 while the readable
    tokens' logits are ~N(0, 1), so greedy (and most sampled) output is readable gibberish. EOS
    keeps a random row, so generation can also end by itself."""
    import torch

    ids = _unreadable_token_ids(tok)
    with torch.no_grad():
        model.get_output_embeddings().weight[ids] = 0.0


def _save_model(model: Any, out: Path) -> None:
    from safetensors.torch import save_file

    model.config.save_pretrained(out)
    # Tied or shared tensors are saved once, like save_pretrained does.
    state = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if name.endswith(_HELPER_BUFFERS):
            continue
        key = tensor.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        state[name] = tensor.detach().to("cpu").contiguous().clone()
    save_file(dict(sorted(state.items())), str(out / "model.safetensors"), metadata={"format": "pt"})


# Helper buffers (BERT embeddings' position_ids / token_type_ids) that both loaders regenerate: kept
# out of the file when a transformers version lists them in state_dict.
_HELPER_BUFFERS = ("position_ids", "token_type_ids")


# --------------------------------------------------------------------------------------------
# Directory handling


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _stamp(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "kind": kind, "params": params}


def _is_complete(path: Path, stamp: dict[str, Any]) -> bool:
    try:
        current = json.loads((path / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return current == stamp and all((path / name).is_file() for name in _MODEL_FILES)


def _build_dir(path: str | os.PathLike[str], stamp: dict[str, Any], write: Any) -> Path:
    """Run ``write(tmpdir)`` unless ``path`` already holds a model with the same stamp, then move
    the files into ``path`` (each with an atomic rename, the stamp last)."""
    target = Path(path).expanduser().resolve()
    if _is_complete(target, stamp):
        return target
    target.mkdir(parents=True, exist_ok=True)
    (target / STAMP_FILE).unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        write(tmp)
        _write_json(tmp / STAMP_FILE, stamp)
        for name in sorted(os.listdir(tmp)):
            os.chmod(tmp / name, 0o644)  # safetensors writes 0600
            if name != STAMP_FILE:
                os.replace(tmp / name, target / name)
        os.replace(tmp / STAMP_FILE, target / STAMP_FILE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _write_tokenizer(out: Path, *, vocab_size: int, style: str, model_max_length: int, chat_template: bool) -> Any:
    tok = _build_tokenizer(vocab_size, style=style)
    tok.save(str(out / "tokenizer.json"), pretty=True)
    _write_json(
        out / "tokenizer_config.json",
        _tokenizer_config(style=style, model_max_length=model_max_length, chat_template=chat_template),
    )
    _write_json(out / "special_tokens_map.json", _special_tokens_map(style))
    return tok


def _write_generation_config(out: Path) -> None:
    # Only token ids: vLLM turns sampling fields of generation_config.json into request defaults.
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID},
    )


def _check_head_dim(hidden_size: int, heads: int, kv_heads: int) -> int:
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of heads {heads}")
    if heads % kv_heads:
        raise ValueError(f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    head_dim = hidden_size // heads
    if head_dim < 64:
        raise ValueError(f"head_dim = hidden_size / heads = {head_dim}; vLLM's CPU attention needs >= 64")
    return head_dim


def _llama_config(
    cls_name: str,
    *,
    vocab_size: int,
    hidden_size: int,
    layers: int,
    heads: int,
    kv_heads: int,
    max_position_embeddings: int,
    extra: dict[str, Any] | None = None,
) -> Any:
    from transformers import LlamaConfig

    head_dim = _check_head_dim(hidden_size, heads, kv_heads)
    return LlamaConfig(
        architectures=[cls_name],
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        dtype="float32",
        **(extra or {}),
    )


def _bert_config(
    *, vocab_size: int, hidden_size: int, layers: int, heads: int, max_position_embeddings: int, extra: dict[str, Any]
) -> Any:
    from transformers import BertConfig

    _check_head_dim(hidden_size, heads, heads)
    return BertConfig(
        architectures=["BertForSequenceClassification"],
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=max_position_embeddings,
        type_vocab_size=2,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-12,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        dtype="float32",
        **extra,
    )


def _new_model(cls_name: str, config: Any) -> Any:
    import torch
    import transformers

    model = getattr(transformers, cls_name)(config)
    model.to(torch.float32)
    model.eval()
    return model


# --------------------------------------------------------------------------------------------
# Builders


def build_tiny_llama(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 2,
    max_position_embeddings: int = 2048,
) -> Path:
    """Build (or reuse) a random-weight ``LlamaForCausalLM`` at ``path``; returns the directory.

    ``hidden_size / heads`` must be >= 64 (vLLM CPU attention). EOS is ``</s>`` (id 2), BOS ``<s>``
    (id 1, prepended by the tokenizer), PAD ``<pad>`` (id 3). A chat template is included.
    """
    params = {
        "seed": seed,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "max_position_embeddings": max_position_embeddings,
    }
    _check_head_dim(hidden_size, heads, kv_heads)

    def write(out: Path) -> None:
        config = _llama_config(
            "LlamaForCausalLM",
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            max_position_embeddings=max_position_embeddings,
        )
        tok = _write_tokenizer(
            out, vocab_size=vocab_size, style="llama", model_max_length=max_position_embeddings, chat_template=True
        )
        model = _new_model("LlamaForCausalLM", config)
        _randomize(model, seed, std=hidden_size**-0.5)
        _mute_unreadable_tokens(model, tok)
        _save_model(model, out)
        _write_generation_config(out)

    return _build_dir(path, _stamp("llama", params), write)


#: The image placeholder token of :func:`build_tiny_blip2` (id ``vocab_size - 1``).
IMAGE_TOKEN = "<image>"


def build_tiny_blip2(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 2,
    max_position_embeddings: int = 2048,
    image_size: int = 56,
    patch_size: int = 14,
    vision_hidden_size: int = 128,
    vision_layers: int = 2,
    vision_heads: int = 2,
    num_query_tokens: int = 8,
    qformer_layers: int = 2,
) -> Path:
    """Build (or reuse) a random-weight ``Blip2ForConditionalGeneration`` (image + text) at
    ``path``; returns the directory.

    A BLIP vision tower, a Q-Former with ``num_query_tokens`` queries and a linear projection in
    front of the tiny Llama of :func:`build_tiny_llama` (same tokenizer plus the special
    ``<image>`` token, id ``vocab_size - 1``). Like a real BLIP-2 the prompt holds no placeholder:
    the processor (transformers' and vLLM's) puts ``num_query_tokens`` image tokens in front of the
    tokenized prompt; one image per prompt. The preprocessor is a ``BlipImageProcessor``
    (transformers picks its PIL backend when torchvision is absent).

    Why BLIP-2: with vLLM 0.32 and no torchvision, the LLaVA family, PaliGemma and every model
    that sizes its vision tower through ``get_vision_encoder_info`` import transformers' Pixtral
    image processor, which needs torchvision; BLIP-2 does not.
    """
    params = {
        "seed": seed,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "layers": layers,
        "heads": heads,
        "max_position_embeddings": max_position_embeddings,
        "image_size": image_size,
        "patch_size": patch_size,
        "vision_hidden_size": vision_hidden_size,
        "vision_layers": vision_layers,
        "vision_heads": vision_heads,
        "num_query_tokens": num_query_tokens,
        "qformer_layers": qformer_layers,
    }
    _check_head_dim(hidden_size, heads, heads)
    _check_head_dim(vision_hidden_size, vision_heads, vision_heads)
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")

    def write(out: Path) -> None:
        from tokenizers import AddedToken
        from transformers import Blip2Config, Blip2QFormerConfig, Blip2VisionConfig

        tok = _build_tokenizer(vocab_size - 1, style="llama")
        tok.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
        image_token_id = tok.token_to_id(IMAGE_TOKEN)
        if image_token_id != vocab_size - 1:
            raise RuntimeError(f"{IMAGE_TOKEN} got id {image_token_id}, expected {vocab_size - 1}")
        tok.save(str(out / "tokenizer.json"), pretty=True)
        tok_cfg = _tokenizer_config(style="llama", model_max_length=max_position_embeddings, chat_template=False)
        tok_cfg["processor_class"] = "Blip2Processor"
        _write_json(out / "tokenizer_config.json", tok_cfg)
        _write_json(out / "special_tokens_map.json", _special_tokens_map("llama"))

        text_config = _llama_config(
            "LlamaForCausalLM",
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            layers=layers,
            heads=heads,
            kv_heads=heads,
            max_position_embeddings=max_position_embeddings,
        )
        vision_config = Blip2VisionConfig(
            hidden_size=vision_hidden_size,
            intermediate_size=vision_hidden_size * 2,
            num_hidden_layers=vision_layers,
            num_attention_heads=vision_heads,
            image_size=image_size,
            patch_size=patch_size,
            hidden_act="gelu",
            layer_norm_eps=1e-6,
            attention_dropout=0.0,
            qkv_bias=True,
        )
        qformer_config = Blip2QFormerConfig(
            hidden_size=vision_hidden_size,
            intermediate_size=vision_hidden_size * 2,
            num_hidden_layers=qformer_layers,
            num_attention_heads=vision_heads,
            encoder_hidden_size=vision_hidden_size,
            cross_attention_frequency=1,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            max_position_embeddings=max_position_embeddings,
            vocab_size=vocab_size,
        )
        config = Blip2Config(
            vision_config=vision_config.to_dict(),
            qformer_config=qformer_config.to_dict(),
            text_config=text_config.to_dict(),
            num_query_tokens=num_query_tokens,
            image_token_index=image_token_id,
            tie_word_embeddings=False,
            architectures=["Blip2ForConditionalGeneration"],
            dtype="float32",
        )
        model = _new_model("Blip2ForConditionalGeneration", config)
        _randomize(model, seed, std=hidden_size**-0.5)
        _mute_unreadable_tokens(model, tok)
        _save_model(model, out)
        _write_generation_config(out)
        _write_json(
            out / "preprocessor_config.json",
            {
                "image_processor_type": "BlipImageProcessor",
                "processor_class": "Blip2Processor",
                "do_resize": True,
                "size": {"height": image_size, "width": image_size},
                "resample": 3,
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711],
                "do_convert_rgb": True,
            },
        )
        _write_json(
            out / "processor_config.json", {"processor_class": "Blip2Processor", "num_query_tokens": num_query_tokens}
        )

    return _build_dir(path, _stamp("blip2", params), write)


def build_tiny_classifier(
    path: str | os.PathLike[str],
    *,
    num_labels: int = 3,
    seed: int = 0,
    labels: Sequence[str] | None = None,
    architecture: str = "llama",
    vocab_size: int = 512,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 2,
    max_position_embeddings: int = 512,
) -> Path:
    """Build (or reuse) a random-weight sequence classifier at ``path``; returns the directory.

    ``architecture="llama"`` (default) gives ``LlamaForSequenceClassification`` (vLLM converts its
    causal Llama with a last-token pooler and a ``score`` head; the tokenizer does not append EOS);
    ``"bert"`` gives ``BertForSequenceClassification`` (CLS pooler). Labels: ``labels`` if given,
    else negative/neutral/positive for 3 labels, else ``label_0``... vLLM's ``classify`` task returns
    softmax probabilities for ``num_labels >= 2``.
    """
    if num_labels < 1:
        raise ValueError("num_labels must be >= 1")
    if labels is None:
        labels = DEFAULT_LABELS_3 if num_labels == 3 else tuple(f"label_{i}" for i in range(num_labels))
    labels = tuple(str(x) for x in labels)
    if len(labels) != num_labels or len(set(labels)) != num_labels:
        raise ValueError(f"labels must be {num_labels} distinct names")
    params = {
        "seed": seed,
        "num_labels": num_labels,
        "labels": list(labels),
        "architecture": architecture,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "layers": layers,
        "heads": heads,
        "max_position_embeddings": max_position_embeddings,
    }
    return _build_seq_cls(path, "classifier", params)


def build_tiny_cross_encoder(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 2,
    max_position_embeddings: int = 512,
) -> Path:
    """Build (or reuse) a random-weight cross-encoder at ``path``; returns the directory.

    A ``BertForSequenceClassification`` with ``num_labels=1``: vLLM serves it with the ``classify``
    pooling task, and its scoring API treats it as a cross-encoder (the pair is tokenized as
    ``<s> query </s> document </s>`` with token type ids 0/1; score = sigmoid(logit)).
    """
    params = {
        "seed": seed,
        "num_labels": 1,
        "labels": ["score"],
        "architecture": "bert",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "layers": layers,
        "heads": heads,
        "max_position_embeddings": max_position_embeddings,
    }
    return _build_seq_cls(path, "cross-encoder", params)


def _build_seq_cls(path: str | os.PathLike[str], kind: str, params: dict[str, Any]) -> Path:
    arch = params["architecture"]
    if arch not in ("llama", "bert"):
        raise ValueError(f"architecture must be 'llama' or 'bert', not {arch!r}")
    _check_head_dim(params["hidden_size"], params["heads"], params["heads"])
    labels = params["labels"]
    extra = {
        "num_labels": len(labels),
        "id2label": {i: name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
    }
    # No problem_type: with "regression" vLLM would return the raw logit; without it vLLM applies
    # softmax (num_labels >= 2) or sigmoid (num_labels == 1), like real cross-encoders (bge-reranker).

    def write(out: Path) -> None:
        if arch == "llama":
            cls_name = "LlamaForSequenceClassification"
            config = _llama_config(
                cls_name,
                vocab_size=params["vocab_size"],
                hidden_size=params["hidden_size"],
                layers=params["layers"],
                heads=params["heads"],
                kv_heads=params["heads"],
                max_position_embeddings=params["max_position_embeddings"],
                extra=extra,
            )
        else:
            cls_name = "BertForSequenceClassification"
            config = _bert_config(
                vocab_size=params["vocab_size"],
                hidden_size=params["hidden_size"],
                layers=params["layers"],
                heads=params["heads"],
                max_position_embeddings=params["max_position_embeddings"],
                extra=extra,
            )
        model = _new_model(cls_name, config)
        _randomize(model, params["seed"], std=params["hidden_size"] ** -0.5)
        _save_model(model, out)
        _write_generation_config(out)
        _write_tokenizer(
            out,
            vocab_size=params["vocab_size"],
            style=arch,
            model_max_length=params["max_position_embeddings"],
            chat_template=False,
        )

    return _build_dir(path, _stamp(kind, params), write)


KINDS = {
    "llama": build_tiny_llama,
    "classifier": build_tiny_classifier,
    "cross-encoder": build_tiny_cross_encoder,
    "blip2": build_tiny_blip2,
}


def build(path: str | os.PathLike[str], kind: str = "llama", **kwargs: Any) -> Path:
    """Build a model of ``kind`` ("llama", "classifier", "cross-encoder" or "blip2") at ``path``."""
    try:
        builder = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(KINDS)}") from None
    return builder(path, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m openengine_adapters.demo_model",
        description="Build a tiny random-weight model directory for tests and demos; prints its path.",
    )
    parser.add_argument("path", help="output directory (reused when it already holds the same model)")
    parser.add_argument("--kind", choices=sorted(KINDS), default="llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-labels", type=int, default=None, help="classifier only (default 3)")
    args = parser.parse_args(argv)
    kwargs: dict[str, Any] = {"seed": args.seed}
    if args.num_labels is not None:
        if args.kind != "classifier":
            parser.error("--num-labels applies to --kind classifier only")
        kwargs["num_labels"] = args.num_labels
    print(build(args.path, args.kind, **kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
