"""A request as the scheduler sees it: tokens, sampling limits, progress, status."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from typing import overload

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request; every status after PREEMPTED is a finished one.
    WAITING_FOR_REMOTE_KVS: admitted to an asynchronous KV-connector load and
    waiting for it (blocks held, not running); FINISHED_ERROR: a failed KV
    load under the ``fail`` policy (vLLM's names and order)."""

    WAITING = 1
    WAITING_FOR_REMOTE_KVS = 2
    RUNNING = 3
    PREEMPTED = 4
    FINISHED_STOPPED = 5
    FINISHED_LENGTH_CAPPED = 6
    FINISHED_ABORTED = 7
    FINISHED_ERROR = 8

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


# OpenAI-style finish reasons, as vLLM reports them.
FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


# Token ids are below this (they must fit an int64 tensor). It only bounds
# absurd values: the simulator's synthetic prompts use ids far above any
# vocabulary (kvsched.sim.workload), while a scheduler that drives a real
# model is given the model's vocabulary size and checks against that.
TOKEN_ID_LIMIT = 2**63


# Below this temperature a request samples greedily (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """Sampling settings with vLLM's names and defaults. The scheduler enforces
    the limits (max_tokens .. stop_token_ids); the sampler and detokenizer use
    the rest. Out-of-range values raise ValueError at construction."""

    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    eos_token_id: int | None = None
    # Declared as what users pass (lists, as in vLLM), kept as tuples (see
    # __post_init__): the compiled build checks a field's declared type.
    stop_token_ids: Sequence[int] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # None: off; k: the sampled token plus the top k
    stop: str | Sequence[str] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    n: int = 1  # sequences per request: kvsched generates one

    def __post_init__(self) -> None:
        # Users pass lists (and a bare str for one stop string), as in vLLM;
        # tuples keep the frozen params hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        # One cheap test for the common case (the simulator builds a
        # SamplingParams per request); validate() says what is wrong.
        numbers = _NUMBER_TYPES
        if not (type(self.temperature) in numbers and self.temperature >= 0
                and type(self.top_p) in numbers and 0 < self.top_p <= 1
                and type(self.top_k) is int and self.top_k >= -1
                and type(self.min_p) in numbers and 0 <= self.min_p <= 1
                and type(self.repetition_penalty) in numbers and self.repetition_penalty > 0
                and type(self.presence_penalty) in numbers and -2 <= self.presence_penalty <= 2
                and type(self.frequency_penalty) in numbers and -2 <= self.frequency_penalty <= 2
                and (self.seed is None or type(self.seed) is int)
                and (self.logprobs is None or (type(self.logprobs) is int and self.logprobs >= 0))
                and (self.eos_token_id is None or (type(self.eos_token_id) is int
                                                   and self.eos_token_id >= 0))
                and self.n == 1 and not self.stop and not self.stop_token_ids):
            self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    def validate(self) -> None:
        """Raise ValueError for a sampling setting vLLM would reject. (max_tokens
        and min_tokens are checked when the request is added, by Request.validate.)"""
        t = _number("temperature", self.temperature)
        _require("temperature", t, t >= 0, "must be >= 0; use 0 for greedy sampling")
        p = _number("top_p", self.top_p)
        _require("top_p", p, 0 < p <= 1, "must be in (0, 1]; use 1 to turn top-p off")
        k = _integer("top_k", self.top_k)
        _require("top_k", k, k >= -1, "must be >= -1; use 0 or -1 to turn top-k off")
        m = _number("min_p", self.min_p)
        _require("min_p", m, 0 <= m <= 1, "must be in [0, 1]; use 0 to turn min-p off")
        r = _number("repetition_penalty", self.repetition_penalty)
        _require("repetition_penalty", r, r > 0, "must be > 0; use 1 for no penalty")
        for name in ("presence_penalty", "frequency_penalty"):
            v = _number(name, getattr(self, name))
            _require(name, v, -2 <= v <= 2, "must be in [-2, 2]; use 0 for no penalty")
        if self.seed is not None:
            _integer("seed", self.seed)
        if self.logprobs is not None:
            n = _integer("logprobs", self.logprobs)
            _require("logprobs", n, n >= 0, "must be >= 0 (top tokens reported besides the sampled "
                     "one); use None to turn logprobs off")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise UserInputError(f"stop={self.stop!r}: every stop string must be a non-empty str; "
                                 "remove the empty or non-string entries")
        for i in self.stop_token_ids:
            _require("stop_token_ids", i, _integer("stop_token_ids", i) >= 0,
                     "token ids must be >= 0; remove the negative id")
        if self.n != 1:
            raise UserInputError(f"n={self.n!r}: kvsched generates one sequence per request; use n=1 "
                             "and repeat the prompt for more samples (with different seeds)")
        if self.eos_token_id is not None:
            e = _integer("eos_token_id", self.eos_token_id)
            _require("eos_token_id", e, e >= 0, "must be >= 0; give the tokenizer's EOS id, or None")


_NUMBER_TYPES = (int, float)


def _number(name: str, value: object) -> float:
    if not is_number(value):
        raise UserInputError(f"{name}={value!r}: must be a number; pass an int or a float")
    return value


def _integer(name: str, value: object) -> int:
    if not is_int(value):
        raise UserInputError(f"{name}={value!r}: must be an integer; pass an int")
    return value


def _require(name: str, value: object, ok: bool, rule: str) -> None:
    # NaN fails every comparison, so it is rejected here too.
    if not ok:
        raise UserInputError(f"{name}={value!r}: {rule}")


class TokenRuns(Sequence[int]):
    """A token sequence kept as ``(token_id, count)`` runs followed by a list
    of appended tokens (the outputs).

    A synthetic or trace prompt is a few runs (see kvsched.sim.workload), so
    a waiting request costs a few dozen bytes however long its prompt is,
    where a token list costs 8 bytes a token. Supports what the scheduler and
    the KV cache manager use of ``all_token_ids``: ``len``, indexing and
    slicing (which build lists), iteration, ``append``/``extend``; plus
    :meth:`block_contents` so full blocks are hashed without expanding runs.
    """

    __slots__ = ("runs", "num_run_tokens", "tail")

    def __init__(self, runs: Sequence[tuple[int, int]], tail: list[int] | None = None,
                 num_run_tokens: int | None = None) -> None:
        self.runs = tuple(runs) if type(runs) is not tuple else runs
        self.num_run_tokens = (sum(count for _, count in self.runs) if num_run_tokens is None
                               else num_run_tokens)
        self.tail: list[int] = [] if tail is None else tail

    def __len__(self) -> int:
        return self.num_run_tokens + len(self.tail)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return list(self)[index]
            return self._slice(start, stop)
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("TokenRuns index out of range")
        if i >= self.num_run_tokens:
            return self.tail[i - self.num_run_tokens]
        for token, count in self.runs:
            if i < count:
                return token
            i -= count
        raise AssertionError("unreachable: runs shorter than num_run_tokens")

    def _slice(self, start: int, stop: int) -> list[int]:
        out: list[int] = []
        pos = 0
        for token, count in self.runs:
            end = pos + count
            if end > start and pos < stop:
                out += [token] * (min(end, stop) - max(pos, start))
            pos = end
            if pos >= stop:
                return out
        n = self.num_run_tokens
        if stop > n:
            out += self.tail[max(start - n, 0):stop - n]
        return out

    def __iter__(self) -> Iterator[int]:
        for token, count in self.runs:
            yield from repeat(token, count)
        yield from self.tail

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenRuns | list):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"TokenRuns({self.runs!r}, tail={self.tail!r})"

    def append(self, token: int) -> None:
        self.tail.append(token)

    def extend(self, tokens: Iterable[int]) -> None:
        self.tail.extend(tokens)

    def copy(self) -> TokenRuns:
        """A sequence with the same runs (shared: they never change) and a copy of the tail."""
        return TokenRuns(self.runs, list(self.tail), self.num_run_tokens)

    def block_contents(self, first_block: int, num_blocks: int, block_size: int
                       ) -> Iterator[int | list[int]]:
        """Blocks ``first_block .. first_block + num_blocks - 1`` (all full):
        for each, its token if the block is that token ``block_size`` times
        within one run, else its tokens as a list."""
        b = first_block * block_size
        stop = b + num_blocks * block_size
        runs = self.runs
        i = 0  # the run holding position b, and where it ends
        end = runs[0][1] if runs else 0
        while b < stop:
            while end <= b and i + 1 < len(runs):
                i += 1
                end += runs[i][1]
            if b + block_size <= end:
                yield runs[i][0]
            else:  # straddles runs, or lies (partly) in the tail
                yield self._slice(b, b + block_size)
            b += block_size


# Modalities vLLM's multimodal processors name (MultiModalFeatureSpec.modality).
MM_MODALITIES = ("image", "audio", "video")


@dataclass(slots=True, frozen=True, init=False)
class MultiModalFeature:
    """One multimodal item of a prompt, as vLLM's scheduler sees it (its
    MultiModalFeatureSpec without the data): ``identifier`` is the mm hash
    that shares encoder outputs and keeps prefix-cache blocks apart,
    ``offset`` and ``length`` the placeholder range in the prompt,
    ``is_embed`` (None: every position) the placeholder positions that
    receive an encoder embedding (vLLM's PlaceholderRange.is_embed).

    The encoder cache and the encoder budget count embeddings
    (``num_embeds``), the decoder and the block hashes count placeholder
    tokens (``length``)."""

    identifier: str
    offset: int
    length: int
    modality: str
    is_embed: tuple[bool, ...] | None
    num_embeds: int
    # Running count of embeddings up to each placeholder position (None
    # without a mask): embeds_in_range reads it instead of summing the mask.
    _embeds_cumsum: tuple[int, ...] | None

    def __init__(self, identifier: str, offset: int, length: int, modality: str = "image",
                 is_embed: Sequence[bool] | None = None) -> None:
        where = f"mm item {identifier!r}"
        if not isinstance(identifier, str) or not identifier:
            raise UserInputError(f"mm item identifier={identifier!r}: must be a non-empty string "
                                 "(the item's mm hash); give the same string to items with equal content")
        for name, value, lo in (("offset", offset, 0), ("length", length, 1)):
            if type(value) is not int or value < lo:
                raise UserInputError(f"{where}: {name}={value!r}: must be an integer >= {lo}")
        if modality not in MM_MODALITIES:
            raise UserInputError(f"{where}: modality={modality!r}: unknown; use one of "
                                 f"{', '.join(MM_MODALITIES)}")
        mask: tuple[bool, ...] | None = None
        cumsum: tuple[int, ...] | None = None
        num_embeds = length
        if is_embed is not None:
            mask = tuple(is_embed)
            if len(mask) != length or any(type(v) is not bool for v in mask):
                raise UserInputError(f"{where}: is_embed has {len(mask)} entries: must be {length} "
                                     "booleans (one per placeholder position), or null for all")
            running = 0
            counts = []
            for v in mask:
                running += v
                counts.append(running)
            cumsum = tuple(counts)
            num_embeds = running
        object.__setattr__(self, "identifier", identifier)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "modality", modality)
        object.__setattr__(self, "is_embed", mask)
        object.__setattr__(self, "num_embeds", num_embeds)
        object.__setattr__(self, "_embeds_cumsum", cumsum)

    @property
    def end(self) -> int:
        """The position just past the placeholder range."""
        return self.offset + self.length

    def embeds_in_range(self, start: int, end: int) -> int:
        """Embeddings among placeholder positions [start, end) (relative to
        ``offset``; vLLM's get_embeds_indices_in_range, as a count)."""
        cumsum = self._embeds_cumsum
        if cumsum is None:
            return end - start
        return (cumsum[end - 1] if end > 0 else 0) - (cumsum[start - 1] if start > 0 else 0)


def check_mm_features(rid: str, features: Sequence[MultiModalFeature], num_prompt_tokens: int) -> None:
    """Raise unless ``features`` are MultiModalFeatures in prompt order,
    disjoint and inside the prompt (vLLM's window search and block hashing
    assume exactly that)."""
    end = 0
    for i, f in enumerate(features):
        if not isinstance(f, MultiModalFeature):
            raise TypeError(f"request {rid}: mm_features[{i}]={f!r:.60} must be a kvsched MultiModalFeature")
        if f.offset < end:
            raise UserInputError(f"request {rid}: mm_features[{i}] ({f.identifier!r}) starts at {f.offset}, "
                                 f"inside or before the item before it (which ends at {end}); list the "
                                 "items in prompt order, without overlaps")
        end = f.end
        if end > num_prompt_tokens:
            raise UserInputError(f"request {rid}: mm_features[{i}] ({f.identifier!r}) ends at {end}, past "
                                 f"the prompt's {num_prompt_tokens} tokens; its placeholder tokens must "
                                 "lie in the prompt")


# What a request's token sequences are: a plain list (the engine, replays,
# tests) or runs (the simulator's synthetic and trace prompts).
TokenList = list[int] | TokenRuns


@dataclass(slots=True, eq=False, init=False)
class Request:
    """One generation request. ``all_token_ids`` is the prompt plus the outputs
    sampled so far; ``num_computed_tokens`` is how much of it has KV in the cache
    (or is scheduled to, within the current step).

    The prompt is a token list or a :class:`TokenRuns` (kept as given, not
    copied, like vLLM); ``prompt_token_ids`` always reads as a list.
    ``private`` is the sender's guarantee that no full KV block of this
    request can have the same content, prefix included, as a block of any
    other request sent to the same scheduler (see
    ``kvsched.sim.workload.prompt_shares_nothing``): the KV cache manager then
    names its blocks by request and position instead of hashing tokens.
    """

    request_id: str
    prompt_tokens: TokenList
    sampling_params: SamplingParams
    priority: int
    arrival_time: float
    private: bool

    status: RequestStatus
    num_computed_tokens: int
    all_token_ids: TokenList
    output_token_ids: list[int]
    # len(all_token_ids), kept by append_output / extend_output: the hot
    # paths read it without calling a runs prompt's __len__.
    num_tokens: int
    # all_token_ids' tail is output_token_ids itself (a runs prompt).
    _outputs_in_all: bool
    num_prompt_tokens: int
    # Keys of the full blocks of all_token_ids in the prefix cache, filled
    # lazily by the KV cache manager (only when prefix caching is on).
    block_hashes: Sequence[int]
    num_preemptions: int
    # True while the request is mid-way through a chunked prefill: the step
    # that scheduled it samples no token.
    is_prefill_chunk: bool
    stop_reason: int | None
    # Sampling limits flattened for the hot path.
    max_tokens: int
    eos_token_id: int | None
    stop_token_ids: frozenset[int]
    # EOS (unless ignored) and stop ids together: one membership test per token.
    all_stop_ids: frozenset[int]
    # Sequence length at which the request is length-capped: prompt + max_tokens,
    # or max_model_len (set by the scheduler, which knows it).
    stop_len: int
    # The LoRA adapter it runs with (vLLM's lora_int_id); 0: the base model.
    lora_id: int
    # Speculative decoding: the drafts to verify in the request's next step
    # (vLLM's spec_token_ids; -1 placeholders under async scheduling).
    spec_token_ids: list[int]
    # Async scheduling: tokens scheduled whose output is not known yet,
    # counted in num_computed_tokens (vLLM's num_output_placeholders).
    num_output_placeholders: int
    # Tokens of scheduled steps whose output is not processed yet.
    num_in_flight_tokens: int
    # Tokens in flight when the request was preempted: their output still
    # arrives and is appended, but must not move the reset counters.
    num_stale_output_tokens: int
    # KV connector with a producer role: the stale output of a preemption is
    # dropped rather than appended (vLLM's drop_stale_output).
    drop_stale_output: bool
    # The scheduler's step sequence of the last batch that scheduled it (a
    # consumer connector under async scheduling defers freeing its blocks
    # until that batch is processed; vLLM's last_sched_seq).
    last_sched_seq: int
    # Async scheduling with pipeline parallelism: the scheduler step from
    # which the request may be scheduled to decode again, PP steps after its
    # last one (vLLM's next_decode_eligible_step).
    next_decode_eligible_step: int
    # The prompt's multimodal items in prompt order (vLLM's mm_features);
    # empty for a text prompt.
    mm_features: tuple[MultiModalFeature, ...]

    def __init__(self, request_id: str, prompt_token_ids: Sequence[int],
                 sampling_params: SamplingParams | None = None, priority: int = 0,
                 arrival_time: float = 0.0, *, private: bool = False, lora_id: int = 0,
                 mm_features: Sequence[MultiModalFeature] = ()) -> None:
        self.request_id = request_id
        prompt: TokenList
        if type(prompt_token_ids) is list or type(prompt_token_ids) is TokenRuns:
            prompt = prompt_token_ids
        else:
            prompt = _as_token_list(request_id, prompt_token_ids)
        self.prompt_tokens = prompt
        sp = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"request {request_id}: sampling_params={sp!r:.60} must be a kvsched "
                            "SamplingParams (or None for the defaults)")
        self.sampling_params = sp
        self.priority = priority
        self.arrival_time = arrival_time
        self.private = private
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.output_token_ids = []
        # The growing sequence is a copy of the prompt (runs are shared). A
        # runs prompt's tail *is* the output list: one append grows both.
        if type(prompt) is TokenRuns and not prompt.tail:
            self.all_token_ids = TokenRuns(prompt.runs, self.output_token_ids, prompt.num_run_tokens)
            self._outputs_in_all = True
        else:
            self.all_token_ids = prompt.copy()
            self._outputs_in_all = False
        self.num_prompt_tokens = len(prompt)
        self.num_tokens = self.num_prompt_tokens
        self.block_hashes = _NO_HASHES
        self.num_preemptions = 0
        self.is_prefill_chunk = False
        self.stop_reason = None
        self.max_tokens = sp.max_tokens
        # vLLM drops the EOS id when ignore_eos is set; stop ids still apply.
        self.eos_token_id = None if sp.ignore_eos else sp.eos_token_id
        self.stop_token_ids, self.all_stop_ids = _stop_sets(sp.stop_token_ids, self.eos_token_id)
        self.stop_len = self.num_prompt_tokens + sp.max_tokens
        self.lora_id = lora_id
        self.spec_token_ids = NO_DRAFTS
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.drop_stale_output = False
        self.last_sched_seq = 0
        self.next_decode_eligible_step = 0
        self.mm_features = mm_features if type(mm_features) is tuple else tuple(mm_features)

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt as a list (built on each call for a runs prompt)."""
        prompt = self.prompt_tokens
        return prompt if type(prompt) is list else list(prompt)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output(self, token: int) -> None:
        """One sampled token: the only way outputs grow (with extend_output)."""
        self.output_token_ids.append(token)
        if not self._outputs_in_all:
            self.all_token_ids.append(token)
        self.num_tokens += 1

    def pop_output(self) -> None:
        """Take back the last appended output token (a refused runner output)."""
        self.output_token_ids.pop()
        if not self._outputs_in_all:
            ids = self.all_token_ids
            if isinstance(ids, TokenRuns):
                ids.tail.pop()
            else:
                ids.pop()
        self.num_tokens -= 1

    def append_repeated(self, token: int, count: int) -> None:
        """``count`` copies of one sampled token (a decode stretch: a
        simulated request samples the same token every step), with no
        temporary list when it is one."""
        if count == 1:
            self.output_token_ids.append(token)
            if not self._outputs_in_all:
                self.all_token_ids.append(token)
        elif count > 1:
            tokens = [token] * count
            self.output_token_ids.extend(tokens)
            if not self._outputs_in_all:
                self.all_token_ids.extend(tokens)
        else:
            return
        self.num_tokens += count

    def extend_output(self, tokens: list[int]) -> None:
        self.output_token_ids.extend(tokens)
        if not self._outputs_in_all:
            self.all_token_ids.extend(tokens)
        self.num_tokens += len(tokens)

    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def validate(self, max_model_len: int, token_limit: int = TOKEN_ID_LIMIT) -> None:
        """Raise ValueError (TypeError for a wrong type) for a request vLLM's
        front end would reject; token ids must be ints in [0, token_limit)."""
        rid = self.request_id
        if not isinstance(rid, str) or not rid:
            raise UserInputError(f"request_id={rid!r}: must be a non-empty string; give it a unique name")
        if not isinstance(self.sampling_params, SamplingParams):
            raise TypeError(f"request {rid}: sampling_params={self.sampling_params!r} must be a "
                            "kvsched SamplingParams")
        if self.num_prompt_tokens == 0:
            raise UserInputError(f"request {rid}: prompt_token_ids is empty; give at least one token")
        check_token_ids(f"request {rid}: prompt_token_ids", self.prompt_tokens, token_limit)
        if self.num_prompt_tokens >= max_model_len:
            raise UserInputError(
                f"request {rid}: prompt length {self.num_prompt_tokens} must be below "
                f"max_model_len ({max_model_len}) to leave room for one output token; "
                "shorten the prompt or raise max_model_len")
        if not is_int(self.priority):
            raise UserInputError(f"request {rid}: priority={self.priority!r} must be an integer")
        t = self.arrival_time
        if not is_number(t) or not math.isfinite(t) or t < 0:
            raise UserInputError(f"request {rid}: arrival_time={t!r} must be a finite number of seconds "
                             ">= 0")
        if type(self.lora_id) is not int or not 0 <= self.lora_id < 2**31:
            raise UserInputError(f"request {rid}: lora_id={self.lora_id!r} must be an int in [0, 2**31) "
                             "(0: the base model)")
        if type(self.private) is not bool:
            raise UserInputError(f"request {rid}: private={self.private!r} must be True or False")
        if self.mm_features:
            check_mm_features(rid, self.mm_features, self.num_prompt_tokens)
        sp = self.sampling_params
        if not is_int(sp.max_tokens) or sp.max_tokens < 1:
            raise UserInputError(f"request {rid}: max_tokens={sp.max_tokens!r} must be an integer >= 1")
        if not is_int(sp.min_tokens) or sp.min_tokens < 0:
            raise UserInputError(f"request {rid}: min_tokens={sp.min_tokens!r} must be an integer >= 0")
        if sp.min_tokens > sp.max_tokens:
            raise UserInputError(
                f"request {rid}: min_tokens={sp.min_tokens} exceeds max_tokens={sp.max_tokens}; "
                "lower min_tokens or raise max_tokens")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if type(getattr(sp, name)) is not bool:
                raise UserInputError(f"request {rid}: {name}={getattr(sp, name)!r} must be True or False")


def check_token_ids(what: str, tokens: Sequence[int], limit: int = TOKEN_ID_LIMIT) -> None:
    """Raise ValueError unless every token is an int in [0, limit). A
    :class:`TokenRuns` is checked run by run; a list in bulk (C-level
    type, min and max passes: a prompt of thousands of tokens costs tens
    of microseconds)."""
    if type(tokens) is TokenRuns:
        if not tokens.tail:
            # A prompt's few runs (checked per request as it is added): one
            # loop, no lists; anything off is worded by the general path.
            for token, count in tokens.runs:
                if not (type(token) is int and 0 <= token < limit and type(count) is int and count >= 1):
                    break
            else:
                return
        values: Sequence[int] = [token for token, _ in tokens.runs] + list(tokens.tail)
        for _, count in tokens.runs:
            if type(count) is not int or count < 1:
                raise UserInputError(f"{what}: a run count of {count!r}; counts must be ints >= 1")
    else:
        values = tokens
    if not values:
        return
    if set(map(type, values)) != {int}:
        bad = next(t for t in values if type(t) is not int)
        raise UserInputError(f"{what}: token {bad!r} ({type(bad).__name__}) is not an int; token ids "
                         "are Python ints (tokenise text first; convert numpy ids with int())")
    lo, hi = min(values), max(values)
    if lo < 0 or hi >= limit:
        bad = lo if lo < 0 else hi
        bound = "an int64" if limit == TOKEN_ID_LIMIT else "the model's vocabulary"
        raise UserInputError(f"{what}: token id {bad} is out of range; ids must be in [0, {limit}) "
                         f"({bound})")


def _as_token_list(request_id: object, tokens: object) -> list[int]:
    # A str is a sequence too: "abc" would silently become ['a', 'b', 'c'].
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
        raise TypeError(f"request {request_id}: prompt_token_ids={tokens!r:.60} must be a sequence "
                        "of int token ids (tokenise text first)")
    return list(tokens)


_NO_HASHES: tuple[int, ...] = ()
# Shared by every request without drafts: replaced, never mutated.
NO_DRAFTS: list[int] = []


@lru_cache(maxsize=256)
def _stop_sets(stop_token_ids: tuple[int, ...], eos_token_id: int | None
               ) -> tuple[frozenset[int], frozenset[int]]:
    # Shared between requests with the same settings: two frozensets per
    # request would be ~400 bytes of a waiting request's footprint.
    stop = frozenset(stop_token_ids)
    return stop, stop if eos_token_id is None else stop | {eos_token_id}
