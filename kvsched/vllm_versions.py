"""The vLLM releases kvsched models, and what each one's scheduler does
differently: the one owner of every version-dependent rule.

A rule that changed between releases is a field of :class:`VersionRules`;
code that follows it reads ``rules_for(version).<field>`` and never compares
version strings itself. docs/vllm_versions.md lists every change between
0.33.0 and 0.34.0 read from the two releases' sources, with the ones not
modelled yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from kvsched.errors import UserInputError

__all__ = ["DEFAULT_VLLM_VERSION", "VERSIONED_SCHEDULER_KNOBS", "VLLM_VERSIONS", "VersionRules",
           "check_vllm_version", "release_with_knob", "rules_for"]

# SchedulerConfig settings (vLLM's names) that not every modelled release
# has: 0.34's in-flight KV load cap (--max-num-inflight-kv-loads) and
# cache-aware admission (--cache-aware-admission-window / -threshold).
_INFLIGHT_KV_LOADS = frozenset({"max_num_inflight_kv_loads"})
_CACHE_AWARE_ADMISSION = frozenset({"cache_aware_admission_window", "cache_aware_admission_threshold"})


@dataclass(frozen=True, slots=True)
class VersionRules:
    """What one vLLM release's scheduler does where releases differ."""

    # The release, as vLLM's version string (major.minor; patch releases
    # change no scheduling decision kvsched models).
    version: str
    # The long-prefill threshold applies only with chunked prefill on (0.34;
    # 0.33 applied it with chunked prefill off too, as a cap per step).
    long_prefill_threshold_needs_chunked_prefill: bool
    # A MultiConnector is a KV producer / consumer when one of its children
    # is (0.34); 0.33 read the MultiConnector's own kv_role. The role decides
    # deferred block frees and the producer's KV delivery.
    multi_connector_roles_from_children: bool
    # Speculative method "ngram" runs under async scheduling (0.34: vLLM has
    # only the GPU model runner, which runs "ngram" as its GPU n-gram
    # speculator, the same as "ngram_gpu"). 0.33 refused the pair on its V1
    # model runner, the runner its CPU reference resolves to and kvsched's
    # 0.33 follows; async with PP is the other V1 refusal, but kvsched's 0.33
    # already follows the V2 runner there (its decode stagger), as 0.34 does.
    ngram_with_async_scheduling: bool
    # The SchedulerConfig settings among VERSIONED_SCHEDULER_KNOBS this
    # release's scheduler has; a release without one is refused the setting
    # away from its default (kvsched.config checks it).
    scheduler_knobs: frozenset[str]
    # The offloading connector's CPU manager counts each key toward
    # store_threshold once per request (0.34); 0.33 counted every offer, so
    # a request offering a chunk again (no room last batch, or after a
    # preemption) counted it again.
    offload_threshold_counts_once_per_request: bool
    # A finished request offers for storing at most its computed tokens
    # (0.34); 0.33 offered up to max(prompt, num_tokens - 1) for every finish
    # but an abort, also one whose prefill never completed.
    offload_finished_store_capped_at_computed: bool
    # The offloading worker reports failed transfer jobs (0.34): a failed
    # asynchronous load puts its request in failed_recving and every later
    # lookup of that request, also after a preemption, finds nothing; a
    # failed store drops its chunks. 0.33's worker asserted that every
    # transfer succeeded, so a failure stopped the engine.
    offload_transfer_failures: bool


RULES: MappingProxyType[str, VersionRules] = MappingProxyType({
    "0.33": VersionRules("0.33", long_prefill_threshold_needs_chunked_prefill=False,
                         multi_connector_roles_from_children=False,
                         ngram_with_async_scheduling=False, scheduler_knobs=frozenset(),
                         offload_threshold_counts_once_per_request=False,
                         offload_finished_store_capped_at_computed=False,
                         offload_transfer_failures=False),
    "0.34": VersionRules("0.34", long_prefill_threshold_needs_chunked_prefill=True,
                         multi_connector_roles_from_children=True,
                         ngram_with_async_scheduling=True,
                         scheduler_knobs=_INFLIGHT_KV_LOADS | _CACHE_AWARE_ADMISSION,
                         offload_threshold_counts_once_per_request=True,
                         offload_finished_store_capped_at_computed=True,
                         offload_transfer_failures=True),
})
VLLM_VERSIONS = tuple(RULES)
VERSIONED_SCHEDULER_KNOBS = _INFLIGHT_KV_LOADS | _CACHE_AWARE_ADMISSION
# The default stays 0.33 until every 0.34 change the simulator reads is
# modelled (docs/vllm_versions.md: block size 64, the extensible KV cache's
# sizing).
DEFAULT_VLLM_VERSION = "0.33"


def check_vllm_version(value: object, where: str = "vllm_version") -> str:
    """``value`` if it names a modelled release, else a UserInputError naming it."""
    if not isinstance(value, str) or value not in RULES:
        raise UserInputError(f"{where}={value!r}: not a vLLM release kvsched models; "
                             f"use one of {', '.join(VLLM_VERSIONS)}")
    return value


def rules_for(version: str) -> VersionRules:
    """The rules of a modelled release (checked)."""
    return RULES[check_vllm_version(version)]


def release_with_knob(knob: str) -> str:
    """The first modelled release whose scheduler has ``knob`` (one of
    VERSIONED_SCHEDULER_KNOBS), for the message refusing it elsewhere."""
    return next(v for v, rules in RULES.items() if knob in rules.scheduler_knobs)
