"""``kvsched make-tiny-model``: a tiny random checkpoint that transformers and
kvsched both load, with a byte-level BPE tokenizer trained on the spot.

Weights are drawn from a seeded generator with standard deviation 0.25 (12x
transformers' 0.02): logits spread over ~+-9 with a median top1-top2 gap of
~0.4, so greedy argmax is never a near-tie at float32 rounding (measured over
4096 positions x {llama, qwen3} x {2, 4} layers: at every position the gap was
at least 9x that position's largest logit difference from transformers). Larger ranges do not widen
the gaps relative to that rounding error (both scale with the weights) but do
grow the residual stream (~400 at 0.5, ~4000 at 1.0 vs ~60 here) and the
absolute error. Norm scales are drawn around 1 so that a misplaced norm shows.
torch, tokenizers and safetensors are imported inside the functions so the
CLI can register this command without them."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsched.errors import UserInputError
from kvsched.fields import is_int

if TYPE_CHECKING:
    import torch

ARCHS: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
NUM_BYTE_TOKENS = 256
DEFAULT_INITIALIZER_RANGE = 0.25
TINY_DTYPES = ("float32", "bfloat16", "float16")

_WORDS_TEXT = """
the a an one two three four five six seven eight nine ten some many few every each
time year people way day man woman child world life hand part place case week
company system program question work government number night point home water room
mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car
city community name president team minute idea kid body information back parent face
others level office door health person art war history party result change morning
reason research girl guy moment air teacher force education river mountain forest
garden kitchen window letter engine scheduler token memory block cache request model
be have do say get make go know take see come think look want give use find tell ask
seem feel try leave call keep let begin help talk turn start show hear play run move
like live believe hold bring happen write provide sit stand lose pay meet include
continue set learn lead understand watch follow stop create speak read allow add spend
grow open walk win offer remember love consider appear buy wait serve die send expect
build stay fall cut reach kill remain suggest raise pass sell require report decide
good new first last long great little own other old big high different small large
next early young important few public bad same able quiet bright dark warm cold slow
quick green blue red white black happy strange simple clear ready sure
"""
_NAMES_TEXT = "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Oscar Peggy Trent"
_PLACES_TEXT = "Paris London Berlin Tokyo Lagos Lima Oslo Cairo Delhi Sydney Zürich Montréal"
_EXTRAS_TEXT = "café naïve résumé über Straße año jalapeño 東京 日本語 中文 😀 🙂 ✓ € £ ± µ"


def tiny_corpus(num_paragraphs: int = 400) -> list[str]:
    """English-like paragraphs from a fixed seed: words, names, numbers,
    punctuation, code-ish text and a few multi-byte UTF-8 characters."""
    rng = random.Random(1234)
    words_pool, names, places = _WORDS_TEXT.split(), _NAMES_TEXT.split(), _PLACES_TEXT.split()
    extras = _EXTRAS_TEXT.split()
    paragraphs = []
    for _ in range(num_paragraphs):
        sentences = []
        for _ in range(rng.randint(2, 6)):
            words = [rng.choice(words_pool) for _ in range(rng.randint(4, 14))]
            roll = rng.random()
            if roll < 0.3:
                words.insert(rng.randrange(len(words)), rng.choice(names))
            elif roll < 0.45:
                words.insert(rng.randrange(len(words)), f"in {rng.choice(places)}")
            elif roll < 0.6:
                words.insert(rng.randrange(len(words)), str(rng.randint(0, 100000)))
            elif roll < 0.7:
                words.insert(rng.randrange(len(words)), rng.choice(extras))
            text = " ".join(words)
            text = text[0].upper() + text[1:] + rng.choice(".....?!;")
            sentences.append(text)
        if rng.random() < 0.1:
            a, b = rng.sample(words_pool, 2)
            sentences.append(f"def {a}_{b}(x):\n    return x + {rng.randint(1, 9)}")
        paragraphs.append(" ".join(sentences))
    return paragraphs


def build_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` of exactly ``vocab_size`` tokens:
    the special tokens, the 256 bytes, merges learned on ``tiny_corpus``, and
    ``<extra_N>`` fillers if the corpus yields too few merges. Encoding adds <s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tiny_corpus(), trainer)
    fillers = vocab_size - tok.get_vocab_size()
    if fillers > 0:
        tok.add_tokens([f"<extra_{n}>" for n in range(fillers)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
    return tok


def _check_args(arch: str, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                intermediate_size: int, vocab_size: int, max_position_embeddings: int,
                initializer_range: float, dtype: str, shards: int, head_dim: int | None) -> None:
    if arch not in ARCHS:
        raise UserInputError(f"arch={arch!r}: unsupported; use one of {', '.join(ARCHS)}")
    for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers),
                        ("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                        ("intermediate_size", intermediate_size),
                        ("max_position_embeddings", max_position_embeddings), ("shards", shards)):
        if not is_int(value) or value <= 0:
            raise UserInputError(f"{name}={value!r}: must be a positive integer")
    if num_heads % num_kv_heads:
        raise UserInputError(f"num_kv_heads={num_kv_heads}: must divide num_heads={num_heads}")
    if head_dim is None and hidden_size % num_heads:
        raise UserInputError(f"hidden_size={hidden_size}: must be a multiple of num_heads={num_heads} "
                         "(or pass head_dim)")
    dim = head_dim if head_dim is not None else hidden_size // num_heads
    if not is_int(dim) or dim <= 0 or dim % 2:
        raise UserInputError(f"head_dim={dim!r}: must be a positive even integer (rotary embedding)")
    minimum = NUM_BYTE_TOKENS + len(SPECIAL_TOKENS)
    if not is_int(vocab_size) or vocab_size < minimum:
        raise UserInputError(f"vocab_size={vocab_size!r}: must be an integer >= {minimum} "
                         f"(256 bytes + {len(SPECIAL_TOKENS)} special tokens)")
    # transformers' LlamaConfig rejects initializer_range outside [0, 1].
    if not isinstance(initializer_range, int | float) or not 0 < initializer_range <= 1:
        raise UserInputError(f"initializer_range={initializer_range!r}: must be in (0, 1]")
    if dtype not in TINY_DTYPES:
        raise UserInputError(f"dtype={dtype!r}: unsupported; use one of {', '.join(TINY_DTYPES)}")


def _config_json(arch: str, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                 intermediate_size: int, vocab_size: int, max_position_embeddings: int,
                 initializer_range: float, dtype: str, head_dim: int,
                 tie_word_embeddings: bool, sliding_window: int | None = None,
                 sliding_window_pattern: int = 2) -> dict[str, Any]:
    architecture, model_type = ARCHS[arch]
    cfg: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "initializer_range": initializer_range,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": dtype,
        "use_cache": True,
    }
    if arch in ("llama", "qwen3"):
        cfg["attention_bias"] = False
    if arch == "llama":
        cfg["mlp_bias"] = False
    if arch == "mistral":
        cfg["sliding_window"] = sliding_window
    if arch in ("qwen2", "qwen3"):
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=num_layers)
    if arch == "gemma3":
        # Spelled as the published Gemma 3 text checkpoints spell it (4.x
        # keys): a local RoPE base beside the global one, every
        # sliding_window_pattern-th layer global. A query scalar other than
        # head_dim, so that the wrong softmax scale shows.
        del cfg["hidden_act"]
        cfg.update(hidden_activation="gelu_pytorch_tanh", rope_theta=1_000_000.0,
                   rope_local_base_freq=10_000.0, sliding_window=sliding_window or 4096,
                   sliding_window_pattern=sliding_window_pattern,
                   query_pre_attn_scalar=head_dim * 2, final_logit_softcapping=None,
                   attn_logit_softcapping=None, attention_bias=False)
    return cfg


def _random_weights(shapes: dict[str, tuple[int, ...]], std: float, seed: int,
                    dtype: torch.dtype, norm_offset: float = 1.0) -> dict[str, torch.Tensor]:
    """``norm_offset``: the stored norm weight's centre; 0 for Gemma, whose
    norms scale by 1 + weight."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            # Norm scales around 1, not all ones, so a swapped norm changes the logits.
            t = norm_offset + 0.5 * (torch.rand(shape, generator=gen) - 0.5)
        else:
            t = torch.randn(shape, generator=gen) * std
        weights[name] = t.to(dtype).contiguous()
    return weights


def _save_weights(out: Path, weights: dict[str, torch.Tensor], shards: int) -> None:
    from safetensors.torch import save_file

    names = list(weights)
    for old in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)  # a previous run's shards would confuse loaders
    metadata = {"format": "pt"}
    if shards == 1:
        save_file(weights, str(out / "model.safetensors"), metadata=metadata)
        return
    weight_map: dict[str, str] = {}
    for k in range(shards):  # shards <= len(names), so none is empty
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n] for n in names[k * len(names) // shards:(k + 1) * len(names) // shards]}
        save_file(part, str(out / file), metadata=metadata)
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def make_tiny_model(out_dir: str | Path, arch: str = "llama", hidden_size: int = 64,
                    num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                    intermediate_size: int = 128, vocab_size: int = 512,
                    max_position_embeddings: int = 2048,
                    initializer_range: float = DEFAULT_INITIALIZER_RANGE, seed: int = 0,
                    dtype: str = "float32", shards: int = 1, head_dim: int | None = None,
                    tie_word_embeddings: bool = False, sliding_window: int | None = None,
                    sliding_window_pattern: int = 2) -> Path:
    """Write a random ``arch`` checkpoint with its tokenizer to ``out_dir``;
    return the directory. Same arguments, same bytes. ``sliding_window`` and
    ``sliding_window_pattern`` (every n-th layer global) are Gemma 3's; Mistral
    takes ``sliding_window`` on every layer."""
    from kvsched.model.config import parse_model_config
    from kvsched.model.loader import DTYPES, checkpoint_tensor_shapes

    _check_args(arch, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
                vocab_size, max_position_embeddings, initializer_range, dtype, shards, head_dim)
    if arch not in ("gemma3", "mistral") and sliding_window is not None:
        raise UserInputError(f"sliding_window={sliding_window}: only the gemma3 and mistral tiny models "
                             "have a window; drop it or use one of those")
    for name, value in (("sliding_window", sliding_window), ("sliding_window_pattern",
                                                              sliding_window_pattern)):
        if value is not None and (not is_int(value) or value <= 0):
            raise UserInputError(f"{name}={value!r}: must be a positive integer")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserInputError(f"out_dir={str(out_dir)!r}: exists and is not a directory; "
                         "pass a new or existing directory")
    dim = head_dim if head_dim is not None else hidden_size // num_heads
    config_json = _config_json(
        arch, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, vocab_size,
        max_position_embeddings, initializer_range, dtype, dim, tie_word_embeddings, sliding_window,
        sliding_window_pattern)
    generation_json = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
    shapes = checkpoint_tensor_shapes(parse_model_config(config_json, generation_json))
    if shards > len(shapes):
        raise UserInputError(f"shards={shards}: more shards than tensors ({len(shapes)}); use fewer")
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", config_json)
    _write_json(out / "generation_config.json", generation_json)
    norm_offset = 0.0 if arch == "gemma3" else 1.0
    _save_weights(out, _random_weights(shapes, initializer_range, seed, DTYPES[dtype], norm_offset),
                  shards)

    tok = build_tokenizer(vocab_size)
    tok.save(str(out / "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    _write_json(out / "special_tokens_map.json", specials)
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", **specials,
        "model_max_length": max_position_embeddings, "clean_up_tokenization_spaces": False,
        "add_bos_token": True, "add_eos_token": False})
    return out


def add_make_tiny_model_parser(subparsers: Any) -> None:
    """Register ``make-tiny-model`` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "make-tiny-model", help="write a tiny random Llama-family checkpoint with a tokenizer",
        description="Write a tiny random checkpoint (config.json, safetensors, tokenizer.json) "
                    "that kvsched and transformers load offline, for tests and demos.")
    p.add_argument("out_dir", metavar="DIR", help="directory to write (created if missing)")
    p.add_argument("--arch", default="llama", help=f"one of {', '.join(ARCHS)} (default llama)")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=None,
                   help="per-head size (default hidden-size / num-heads)")
    p.add_argument("--intermediate-size", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--max-position-embeddings", type=int, default=2048)
    p.add_argument("--initializer-range", type=float, default=DEFAULT_INITIALIZER_RANGE,
                   help="standard deviation of the random weights")
    p.add_argument("--tie-word-embeddings", action="store_true")
    p.add_argument("--sliding-window", type=int, default=None,
                   help="gemma3: tokens a local layer attends to (default 4096); mistral: every "
                        "layer's window (default none)")
    p.add_argument("--sliding-window-pattern", type=int, default=2,
                   help="gemma3: every n-th layer is global (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32",
                   help=f"weights' dtype, one of {', '.join(TINY_DTYPES)} (default float32)")
    p.add_argument("--shards", type=int, default=1, help="number of safetensors files")
    p.set_defaults(func=_run_make_tiny_model)


def _run_make_tiny_model(args: argparse.Namespace) -> int:
    out = make_tiny_model(
        args.out_dir, arch=args.arch, hidden_size=args.hidden_size, num_layers=args.num_layers,
        num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size, vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings,
        initializer_range=args.initializer_range, seed=args.seed, dtype=args.dtype,
        shards=args.shards, head_dim=args.head_dim, tie_word_embeddings=args.tie_word_embeddings,
        sliding_window=args.sliding_window, sliding_window_pattern=args.sliding_window_pattern)
    print(out)
    return 0
