"""Speculative decoding in the simulator.

- :func:`parse_speculative_config`: vLLM's ``--speculative-config`` JSON
  (its key names and rules), checked against the deployment's model and
  async scheduling: every problem is one ``ValueError`` naming the field.
- :class:`AcceptanceModel`: how many of a verification's drafts the target
  accepts, from per-position acceptance rates as vLLM's spec-decode metrics
  report them (the rate at position i = drafts whose position i was
  accepted / drafts; as accepting position i needs positions 0..i-1, the
  rates never rise). A verification of d drafts draws one uniform number u
  and accepts the positions i < d with u < rate[i]: P(a > i) = rate[i], the
  same distribution vLLM's synthetic rejection sampler
  (``rejection_sample_method: "synthetic"``) draws position by position.
  The uniform comes from a counter-based hash of (seed, request id,
  verification number): the same request verifies the same way whatever
  the batch around it, so a run is reproducible and two runs that differ
  only in scheduling see the same acceptances.
- :func:`spec_metrics`: the figures vLLM logs from its counters
  (``SpecDecodingStats``: num_drafts, num_draft_tokens, num_accepted_tokens,
  accepted tokens per position) merged over a run.

Default acceptance rates (``DEFAULT_ACCEPTANCE``), used when neither
``--spec-acceptance`` nor the config's ``synthetic_acceptance_*`` set them:

- ``mtp`` position 0: 0.85, the low end of the 85-90 % acceptance of the
  second token the DeepSeek-V3 technical report (arXiv 2412.19437, §5.4.3)
  gives for its one MTP module (from the report; not in
  ../shared/facts). Later positions (the module reused): no published
  number; each is accepted with probability 0.5 given the ones before
  (kvsched's conservative assumption).
- ``eagle``, ``eagle3``, ``ngram``, ``ngram_gpu``: no published number in
  ../shared/facts; conditional acceptance 0.5 at every position
  (kvsched's conservative assumption: rates 0.5, 0.25, 0.125, ...).
"""

from __future__ import annotations

import difflib
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvsched.config import (
    MAX_SPECULATIVE_TOKENS,
    SPECULATIVE_METHODS,
    SpeculativeConfig,
    check_speculative_with_async,
    resolve_speculative_method,
    speculative_object,
)
from kvsched.core.output import SpecDecodingStats
from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.jsonfile import show
from kvsched.perf.models import ModelSpec
from kvsched.vllm_versions import DEFAULT_VLLM_VERSION

# The methods the simulator prices: every one kvsched knows (vLLM's names
# and aliases, and the ones it does not price, are kvsched.config's).
METHODS = SPECULATIVE_METHODS
KEYS = ("method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max",
        "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length")
# Keys of vLLM's SpeculativeConfig that change nothing kvsched prices or
# that it does not model: refused by name rather than ignored.
UNMODELLED_KEYS = ("draft_tensor_parallel_size", "quantization", "moe_backend", "attention_backend",
                   "kv_cache_dtype", "max_model_len", "revision", "code_revision", "enforce_eager",
                   "index_share_for_mtp_iteration", "disable_padded_drafter_batch",
                   "disable_eagle_block_drop", "disable_lookahead_block_hashes",
                   "draft_lm_head_quantization", "use_local_argmax_reduction", "use_heterogeneous_vocab",
                   "parallel_drafting", "num_speculative_tokens_per_batch_size", "draft_sample_method",
                   "enable_adaptive_verification", "suffix_decoding_max_tree_depth",
                   "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
                   "suffix_decoding_min_token_prob", "fly_window_size", "fly_entropy_threshold",
                   "fly_entropy_top_k", "dspark_draft_topk", "xpress_topc")
REJECTION_METHODS = ("standard", "synthetic")

# The conditional acceptance kvsched assumes where nothing is published.
ASSUMED_CONDITIONAL = 0.5
# DeepSeek-V3 technical report §5.4.3: 85-90 % of second-token predictions
# of its MTP module accepted; the low end.
DEEPSEEK_V3_MTP_FIRST = 0.85
DEFAULT_SOURCES = {
    "mtp": "position 0: 0.85, the low end of DeepSeek-V3's reported 85-90 % second-token acceptance "
           "(arXiv 2412.19437 §5.4.3); later positions: no published number, 0.5 conditional "
           "(kvsched's conservative assumption)",
    "eagle": "no published number in the facts: 0.5 conditional per position (kvsched's conservative "
             "assumption)",
}
DEFAULT_SOURCES["eagle3"] = DEFAULT_SOURCES["ngram"] = DEFAULT_SOURCES["ngram_gpu"] = DEFAULT_SOURCES["eagle"]


def default_rates(method: str, k: int) -> tuple[float, ...]:
    """The default per-position (unconditional) acceptance rates of ``method``."""
    first = DEEPSEEK_V3_MTP_FIRST if method == "mtp" else ASSUMED_CONDITIONAL
    return tuple(first * ASSUMED_CONDITIONAL**i for i in range(k))


def check_rates(field_name: str, rates: object, k: int, shown: str | None = None) -> tuple[float, ...]:
    """Per-position acceptance rates, vLLM's rules for
    ``synthetic_acceptance_rates``: K numbers in [0, 1], never rising
    (``shown``: the value as the user wrote it, for messages)."""
    text = shown if shown is not None else show(rates)
    if not isinstance(rates, list | tuple) or not rates:
        raise UserInputError(f"{field_name}={text}: give {k} acceptance rate(s), one per draft "
                         "position, e.g. 0.8,0.6,0.45")
    out: list[float] = []
    for i, r in enumerate(rates):
        if not is_number(r) or not math.isfinite(r) or not 0 <= r <= 1:
            raise UserInputError(f"{field_name}[{i}]={show(r)}: an acceptance rate is a number in [0, 1]")
        out.append(float(r))
    if len(out) != k:
        raise UserInputError(f"{field_name}={text}: {len(out)} rate(s) for num_speculative_tokens={k}; "
                         f"give one per draft position ({k})")
    for i in range(1, k):
        if out[i] > out[i - 1]:
            raise UserInputError(f"{field_name}={text}: position {i}'s rate {out[i]:g} exceeds position "
                             f"{i - 1}'s {out[i - 1]:g}; accepting position i needs every position before "
                             "it, so the rates (accepted at i / drafts, as vLLM reports them) never rise")
    return tuple(out)


def parse_acceptance_flag(text: str, k: int) -> tuple[float, ...]:
    """``--spec-acceptance 0.8,0.6,0.45``."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise UserInputError(f"--spec-acceptance={text!r}: give comma-separated rates in [0, 1], one per "
                         "draft position, e.g. 0.8,0.6,0.45") from None
    return check_rates("--spec-acceptance", values, k, text)


def rates_from_length(length: object, k: int) -> tuple[float, ...]:
    """vLLM's synthetic_acceptance_length -> rates (its minimum-variance
    schedule: every position accepted up to the whole part, the fraction at
    the next)."""
    name = "speculative_config.synthetic_acceptance_length"
    if not is_number(length) or not math.isfinite(length) \
            or not 1.0 <= length <= k + 1:
        raise UserInputError(f"{name}={show(length)}: must be a number in [1, {k + 1}] (1 + the accepted "
                         "drafts per verification)")
    drafts = float(length) - 1.0
    whole = int(drafts)
    return tuple(([1.0] * whole + [drafts - whole] + [0.0] * k)[:k])


@dataclass(frozen=True, slots=True)
class AcceptanceModel:
    """Per-position acceptance rates (unconditional, non-increasing)."""

    rates: tuple[float, ...]
    source: str

    def accepted(self, u: float, num_drafts: int) -> int:
        """Drafts accepted of ``num_drafts`` for a uniform draw ``u`` in [0, 1)."""
        a = 0
        for rate in self.rates[:num_drafts]:
            if u >= rate:
                break
            a += 1
        return a

    @property
    def mean_acceptance_length(self) -> float:
        """1 + expected accepted drafts of a verification of K drafts."""
        return 1.0 + sum(self.rates)


@dataclass(frozen=True, slots=True)
class SpecOptions:
    """A checked --speculative-config with its acceptance model."""

    method: str
    num_speculative_tokens: int
    acceptance: AcceptanceModel
    draft_model: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None

    def core_config(self) -> SpeculativeConfig:
        return SpeculativeConfig(self.method, self.num_speculative_tokens,
                                 self.prompt_lookup_min, self.prompt_lookup_max)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
                               "acceptance_rates": list(self.acceptance.rates),
                               "acceptance_source": self.acceptance.source,
                               "expected_mean_acceptance_length": self.acceptance.mean_acceptance_length}
        if self.draft_model is not None:
            out["model"] = self.draft_model
        if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            lo, hi = self.core_config().ngram_lookup()
            out.update(prompt_lookup_min=lo, prompt_lookup_max=hi)
        return out

    def describe(self) -> str:
        rates = ",".join(f"{r:.3g}" for r in self.acceptance.rates)
        return f"speculative {self.method} K={self.num_speculative_tokens} (acceptance {rates})"


def _unknown_key(key: str) -> UserInputError:
    close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return UserInputError(f"speculative_config.{key}: unknown key; {hint}kvsched simulate takes "
                      f"{', '.join(KEYS)}")


def parse_speculative_config(value: str | Mapping[str, Any], model: ModelSpec, async_scheduling: bool,
                             acceptance_flag: str | None = None,
                             vllm_version: str = DEFAULT_VLLM_VERSION) -> SpecOptions:
    """``--speculative-config`` (JSON text or a dict) for ``model``, and
    ``--spec-acceptance`` (text, or None), for the deployment's vLLM release
    (whether it runs "ngram" with async scheduling)."""
    obj = speculative_object(value)
    for key in obj:
        if key == "tensor_parallel_size":
            raise UserInputError("speculative_config.tensor_parallel_size: not a valid key (vLLM's rule); "
                             "vLLM takes draft_tensor_parallel_size")
        if key in UNMODELLED_KEYS:
            raise UserInputError(f"speculative_config.{key}: vLLM's key, but kvsched simulate does not model "
                             "it (it prices vLLM's default); drop it")
        if key not in KEYS:
            raise _unknown_key(str(key))
    method = obj.get("method")
    draft_model = obj.get("model")
    if draft_model is not None and not isinstance(draft_model, str):
        raise UserInputError(f"speculative_config.model={show(draft_model)}: must be a model name "
                             f"(a string)")
    if method is None and draft_model in ("ngram", "[ngram]"):
        method = "ngram"  # vLLM infers it from the model name
    if method is None:
        raise UserInputError("speculative_config.method: missing; give one of "
                         f"{', '.join(METHODS)} (vLLM would take a draft model, which kvsched does not "
                         "price)")
    if not isinstance(method, str):
        raise UserInputError(f"speculative_config.method={show(method)}: must be a string, one of "
                         f"{', '.join(METHODS)}")
    method = resolve_speculative_method(
        method, METHODS, f"vLLM's method, but kvsched simulate prices only {', '.join(METHODS)}")
    if method == "mtp":
        _check_mtp_model(model)
    if method in ("eagle", "eagle3") and draft_model is None:
        raise UserInputError(f"speculative_config.model: missing; method {method!r} needs the drafter's "
                         "checkpoint name, as vLLM does (num_speculative_tokens was provided but "
                         "without speculative model); kvsched prices a one-layer drafter of the "
                         "target's width whatever its name")
    k = obj.get("num_speculative_tokens")
    if k is None:
        if method != "mtp":
            raise UserInputError("speculative_config.num_speculative_tokens: missing; give the draft tokens "
                             "proposed per step, e.g. 3")
        k = model.num_mtp_layers  # vLLM's default: the checkpoint's n_predict
    if not is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise UserInputError(f"speculative_config.num_speculative_tokens={show(k)}: must be an integer in "
                         f"[1, {MAX_SPECULATIVE_TOKENS}]")
    if method == "mtp":
        n = model.num_mtp_layers
        if k > n and k % n:
            raise UserInputError(f"speculative_config.num_speculative_tokens={k}: must be a multiple of "
                             f"{model.name}'s {n} MTP layers (vLLM reuses them in turn)")
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        v = obj.get(key)
        if v is not None and (not is_int(v) or not 1 <= v <= 2**20):
            raise UserInputError(f"speculative_config.{key}={show(v)}: must be an integer in [1, 2**20]")
    lookup_min, lookup_max = obj.get("prompt_lookup_min"), obj.get("prompt_lookup_max")
    acceptance = _acceptance(obj, method, k, acceptance_flag)
    try:
        options = SpecOptions(method, k, acceptance, draft_model, lookup_min, lookup_max)
        check_speculative_with_async(options.core_config(), async_scheduling, vllm_version)
    except ValueError as err:
        message = str(err).replace("turn async scheduling off", "pass --no-async-scheduling")
        raise UserInputError(message) from None
    return options


def _check_mtp_model(model: ModelSpec) -> None:
    if not model.num_mtp_layers:
        raise UserInputError(f"speculative_config.method='mtp': {model.name} has no MTP layers "
                         "(num_nextn_predict_layers is 0 or absent; vLLM 0.33 drafts with the "
                         "checkpoint's own MTP modules, e.g. DeepSeek-V3/V3.1/R1's); use eagle, eagle3 "
                         "or ngram")


def _acceptance(obj: Mapping[str, Any], method: str, k: int, flag: str | None) -> AcceptanceModel:
    rejection = obj.get("rejection_sample_method", "standard")
    if rejection not in REJECTION_METHODS:
        raise UserInputError(f"speculative_config.rejection_sample_method={show(rejection)}: "
                             f"kvsched simulate "
                         f"takes {' or '.join(repr(m) for m in REJECTION_METHODS)} (the acceptance model "
                         "is the same: set the rates with synthetic_acceptance_rates or --spec-acceptance)")
    has_rates = obj.get("synthetic_acceptance_rates") is not None
    has_length = obj.get("synthetic_acceptance_length") is not None
    if rejection != "synthetic":
        if has_rates or has_length:
            name = "synthetic_acceptance_rates" if has_rates else "synthetic_acceptance_length"
            raise UserInputError(f"speculative_config.{name}: only valid with rejection_sample_method "
                             "'synthetic' (vLLM's rule); add it, or use --spec-acceptance")
    elif has_rates == has_length:
        raise UserInputError("speculative_config.rejection_sample_method='synthetic': requires "
                             "exactly one of "
                         "synthetic_acceptance_rates or synthetic_acceptance_length (vLLM's rule)")
    if flag is not None:
        if rejection == "synthetic":
            raise UserInputError("--spec-acceptance: the speculative config sets the rates already "
                             "(rejection_sample_method 'synthetic'); give them in one place")
        return AcceptanceModel(parse_acceptance_flag(flag, k), "--spec-acceptance")
    if has_rates:
        return AcceptanceModel(check_rates("speculative_config.synthetic_acceptance_rates",
                                           obj["synthetic_acceptance_rates"], k),
                               "synthetic_acceptance_rates")
    if has_length:
        return AcceptanceModel(rates_from_length(obj["synthetic_acceptance_length"], k),
                               "synthetic_acceptance_length")
    return AcceptanceModel(default_rates(method, k), f"default for {method}: {DEFAULT_SOURCES[method]}")


# -- draws --------------------------------------------------------------------------

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def request_key(seed: int, request_id: str) -> int:
    """A request's stream of draws: from the seed and its id (not Python's
    per-process string hash)."""
    return _mix(_mix(seed & _MASK) ^ zlib.crc32(request_id.encode()))


def uniform(key: int, n: int) -> float:
    """The ``n``-th uniform draw in [0, 1) of the stream ``key``."""
    return (_mix((key + n) & _MASK) >> 11) * (1.0 / (1 << 53))


# -- statistics ----------------------------------------------------------------------


def spec_metrics(stats: SpecDecodingStats) -> dict[str, Any]:
    """A run's SpecDecodingStats (every step's, merged) as the figures vLLM
    logs ("SpecDecoding metrics"), under spec_decode_* keys: the draft
    acceptance rate as a fraction (vLLM logs it in %)."""
    drafts, tokens, accepted = stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens
    return {
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": tokens,
        "spec_decode_num_accepted_tokens": accepted,
        "spec_decode_draft_acceptance_rate": accepted / tokens if tokens else 0.0,
        "spec_decode_mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "spec_decode_acceptance_rate_per_position": [n / drafts if drafts else 0.0
                                                     for n in stats.num_accepted_tokens_per_pos],
    }
