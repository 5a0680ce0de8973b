"""The tokenizer ``vllm bench serve``'s datasets count tokens with.

vLLM's benchmark datasets measure text in the model's tokens: ShareGPT and
custom prompts are encoded, the random and prefix-repetition datasets
decode random token ids to text and re-encode it until the length holds.
:class:`HFTokenizer` does what vLLM's Hugging Face tokenizer does there,
from the model's ``tokenizer.json`` (the ``tokenizers`` package, Rust, the
same backend transformers' fast tokenizers run on): ``encode``, ``decode``,
``vocab_size`` (the base vocabulary, without added tokens),
``all_special_ids``, ``num_special_tokens_to_add`` and the chat template
(``tokenizer_config.json`` or ``chat_template.jinja``, rendered as
transformers renders it).

Without a tokenizer file, :class:`ApproximateTokenizer` stands in: about
four UTF-8 bytes a token and one special token (a BOS), which is what most
chat models' tokenizers give on English text to within ~20 %; every length
it gives is an estimate, and :func:`load_tokenizer` says so.

:func:`find_tokenizer` looks for a tokenizer where vLLM would load one
from without a network: ``--tokenizer`` (a directory or a tokenizer.json),
the model's directory, or the Hugging Face cache.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kvsched.errors import UserInputError

# transformers' cleanup of decoded text, applied when a (non-BPE) tokenizer's
# config sets clean_up_tokenization_spaces (transformers 5 skips it for BPE).
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))
# vLLM's gen_prompt_decode_to_target_len: how often it re-encodes before giving up.
DECODE_RETRIES = 10
# The approximation's bytes per token and special tokens per prompt.
APPROX_BYTES_PER_TOKEN = 4
APPROX_SPECIAL_TOKENS = 1
APPROX_VOCAB_SIZE = 32000


class TextTokenizer(Protocol):
    """What the datasets need of a tokenizer."""

    @property
    def name(self) -> str: ...
    @property
    def exact(self) -> bool: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def all_special_ids(self) -> tuple[int, ...]: ...
    @property
    def num_special_tokens_to_add(self) -> int: ...

    def count(self, text: str, add_special_tokens: bool = True) -> int:
        """Tokens of ``text`` (``tokenizer(text).input_ids`` has this many)."""
        ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat_prompt(self, content: str) -> str:
        """One user message through the chat template, with the generation
        prompt (``apply_chat_template(..., add_generation_prompt=True,
        tokenize=False)``)."""
        ...

    def settle(self, ids: list[int], target: int, extra: Callable[[int], list[int]]) -> list[int]:
        """vLLM's ``gen_prompt_decode_to_target_len``: decode ``ids``,
        re-encode the text without special tokens, and cut or pad (with
        ``extra(n)``: n more ids from the caller's random stream) until the
        length is ``target`` or the retries run out; the final ids."""
        ...

    def settle_many(self, seqs: Sequence[list[int]], targets: Sequence[int],
                    extra: Callable[[int], list[int]]) -> list[list[int]]:
        """:meth:`settle` of each sequence in order (the same draws from
        ``extra``, in the same order)."""
        ...


@dataclass(slots=True)
class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` through ``tokenizers``, with its
    ``tokenizer_config.json``."""

    path: Path
    backend: Any
    config: dict[str, Any]
    chat_template: str | None

    @property
    def name(self) -> str:
        return str(self.path)

    @property
    def exact(self) -> bool:
        return True

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=False))

    @property
    def all_special_ids(self) -> tuple[int, ...]:
        return tuple(sorted(int(i) for i, t in self.backend.get_added_tokens_decoder().items() if t.special))

    @property
    def num_special_tokens_to_add(self) -> int:
        return int(self.backend.num_special_tokens_to_add(False))

    def count(self, text: str, add_special_tokens: bool = True) -> int:
        return len(self.encode(text, add_special_tokens))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._cleaned(self.backend.decode(list(ids), skip_special_tokens=False))

    def _cleaned(self, text: str) -> str:
        if self.config.get("clean_up_tokenization_spaces") and type(self.backend.model).__name__ != "BPE":
            for old, new in _CLEANUP:
                text = text.replace(old, new)
        return text

    def chat_prompt(self, content: str) -> str:
        if self.chat_template is None:
            raise UserInputError(f"tokenizer {self.path}: no chat_template (tokenizer_config.json or "
                                 "chat_template.jinja); add --skip-chat-template, as vllm bench serve "
                                 "needs then too")
        import jinja2
        import jinja2.sandbox

        def raise_exception(message: str) -> None:
            raise UserInputError(f"tokenizer {self.path}: chat template: {message}")

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        specials = {key: _token_text(self.config.get(key)) for key in
                    ("bos_token", "eos_token", "unk_token", "pad_token")}
        rendered: str = env.from_string(self.chat_template).render(
            messages=[{"role": "user", "content": content}], add_generation_prompt=True,
            **{k: v for k, v in specials.items() if v is not None})
        return rendered

    def settle(self, ids: list[int], target: int, extra: Callable[[int], list[int]]) -> list[int]:
        return self._settled(self.encode(self.decode(ids), add_special_tokens=False), target, extra)

    def settle_many(self, seqs: Sequence[list[int]], targets: Sequence[int],
                    extra: Callable[[int], list[int]]) -> list[list[int]]:
        # The first round draws nothing, so all sequences take it at once
        # (tokenizers' batch calls run in parallel); the rounds after it draw
        # padding from the shared stream, so they go one sequence at a time.
        texts = [self._cleaned(t) for t in self.backend.decode_batch([list(q) for q in seqs],
                                                                     skip_special_tokens=False)]
        first = [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]
        return [self._settled(ids, target, extra) for ids, target in zip(first, targets)]

    def _settled(self, ids: list[int], target: int, extra: Callable[[int], list[int]]) -> list[int]:
        """The rest of vLLM's loop, from the first re-encoding ``ids``."""
        tries = DECODE_RETRIES
        while tries > 0 and len(ids) != target:
            ids = ids + extra(target - len(ids)) if len(ids) < target else ids[:target]
            tries -= 1
            ids = self.encode(self.decode(ids), add_special_tokens=False)
        return ids


def _token_text(value: object) -> str | None:
    # tokenizer_config.json gives a special token as a string or as an AddedToken dict.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


@dataclass(slots=True, frozen=True)
class ApproximateTokenizer:
    """No tokenizer file: ~4 UTF-8 bytes a token, one special token (BOS),
    and random token ids that decode and re-encode to themselves."""

    @property
    def name(self) -> str:
        return "approximate (4 bytes/token, 1 special token)"

    @property
    def exact(self) -> bool:
        return False

    @property
    def vocab_size(self) -> int:
        return APPROX_VOCAB_SIZE

    @property
    def all_special_ids(self) -> tuple[int, ...]:
        return (0,)

    @property
    def num_special_tokens_to_add(self) -> int:
        return APPROX_SPECIAL_TOKENS

    def count(self, text: str, add_special_tokens: bool = True) -> int:
        body = math.ceil(len(text.encode("utf-8")) / APPROX_BYTES_PER_TOKEN)
        return body + (APPROX_SPECIAL_TOKENS if add_special_tokens else 0)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [0] * self.count(text, add_special_tokens)

    def decode(self, ids: Sequence[int]) -> str:
        return "x" * (APPROX_BYTES_PER_TOKEN * len(ids))

    def chat_prompt(self, content: str) -> str:
        # A typical template's wrapping: role markers around the message.
        return f"<|user|>\n{content}\n<|assistant|>\n"

    def settle(self, ids: list[int], target: int, extra: Callable[[int], list[int]]) -> list[int]:
        return ids

    def settle_many(self, seqs: Sequence[list[int]], targets: Sequence[int],
                    extra: Callable[[int], list[int]]) -> list[list[int]]:
        return list(seqs)


def find_tokenizer(model: str, tokenizer: str | None = None) -> Path | None:
    """The ``tokenizer.json`` vLLM would load for ``model`` (or
    ``--tokenizer``) without a network: a directory or file given, the model
    directory, or the Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME/hub``
    or ``~/.cache/huggingface/hub``, the newest snapshot). None if none (a
    ``--tokenizer`` directory without one is an error; a Hugging Face id not
    in the cache, or a path not on this machine, is not: nothing is
    downloaded)."""
    if tokenizer is not None:
        given = Path(tokenizer)
        file = given if given.name == "tokenizer.json" else given / "tokenizer.json"
        if file.is_file():
            return file
        cached = _cached(tokenizer)
        if cached is not None:
            return cached
        if given.exists():
            raise UserInputError(f"--tokenizer={tokenizer}: no tokenizer.json there; give a directory "
                                 "with tokenizer.json (and tokenizer_config.json)")
        # A Hugging Face id not downloaded, or a path of another machine (a
        # pasted line's): the approximation, with its warning.
        return None
    path = Path(model)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    if path.is_file() and path.name == "config.json" and (path.parent / "tokenizer.json").is_file():
        return path.parent / "tokenizer.json"
    return _cached(model)


def _cached(repo_id: str) -> Path | None:
    if repo_id.count("/") != 1:
        return None
    hub = os.environ.get("HF_HUB_CACHE") or (
        str(Path(os.environ["HF_HOME"]) / "hub") if os.environ.get("HF_HOME") else None)
    root = Path(hub) if hub else Path.home() / ".cache" / "huggingface" / "hub"
    snapshots = root / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    found = sorted((p / "tokenizer.json" for p in snapshots.iterdir() if (p / "tokenizer.json").is_file()),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def read_tokenizer(file: Path) -> HFTokenizer:
    """An :class:`HFTokenizer` from a ``tokenizer.json`` and the config
    files beside it."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserInputError(f"tokenizer {file}: reading it needs the 'tokenizers' package "
                             "(pip install tokenizers, or kvsched[torch])") from None
    try:
        backend = Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises its own Exception type for a bad file
        raise UserInputError(f"tokenizer {file}: not a tokenizer.json tokenizers can read: {e}") from None
    config: dict[str, Any] = {}
    config_file = file.parent / "tokenizer_config.json"
    if config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text(encoding="utf-8"))
        except ValueError as e:
            raise UserInputError(f"{config_file}: not JSON: {e}") from None
        if isinstance(loaded, dict):
            config = loaded
    template = config.get("chat_template")
    jinja_file = file.parent / "chat_template.jinja"
    if jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return HFTokenizer(file, backend, config, template if isinstance(template, str) else None)


def load_tokenizer(model: str, tokenizer: str | None = None) -> tuple[TextTokenizer, str | None]:
    """The tokenizer for ``model`` and a warning when it is the
    approximation (None when exact)."""
    file = find_tokenizer(model, tokenizer)
    if file is None:
        return ApproximateTokenizer(), (
            f"no tokenizer for {tokenizer or model} (no tokenizer.json in the model directory or the "
            "Hugging Face cache; give --tokenizer DIR): token counts of the dataset's text are "
            f"approximated at {APPROX_BYTES_PER_TOKEN} UTF-8 bytes a token plus {APPROX_SPECIAL_TOKENS} "
            "special token, so prompt lengths are estimates, not vllm bench serve's")
    return read_tokenizer(file), None
