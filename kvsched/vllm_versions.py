"""The vLLM releases kvsched models, and what each one's scheduler does
differently: the one owner of every version-dependent rule.

A rule that changed between releases is a field of :class:`VersionRules`;
code that follows it reads ``rules_for(version).<field>`` and never compares
version strings itself. docs/vllm_versions.md lists every change between
0.33.0 and 0.34.0 read from the two releases' sources, with the ones not
modelled yet.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

from kvsched.errors import UserInputError

__all__ = ["DEFAULT_VLLM_VERSION", "EXTENSIBLE_KV_CACHE_GPU_MEMORY_UTILIZATION", "FLAGS_SINCE",
           "VERSIONED_SCHEDULER_KNOBS", "VLLM_VERSIONS", "VersionRules", "check_release_flags",
           "check_vllm_version", "release_has", "rules_for"]


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
    # CacheConfig.DEFAULT_BLOCK_SIZE: the block size vLLM asks the attention
    # backends for when --block-size is not given (a backend that does not
    # take it gets the smallest size it takes; kvsched.scheduler_defaults.
    # resolve_cache_defaults applies that): 16 in 0.33, 64 in 0.34.
    default_block_size: int
    # gpu_memory_utilization when not given and the KV cache is sized from
    # the profiling estimate (CacheConfig's 0.92 in both releases).
    default_gpu_memory_utilization: float
    # 0.34's extensible KV cache (--enable-extensible-kv-cache): the cache's
    # address range is reserved at start-up and its pages committed after
    # warmup and CUDA-graph capture, sized from the memory then measured free
    # with the warmup peak kept free (kvsched.perf.memory); on by default on
    # CUDA and ROCm where nothing rules it out, and gpu_memory_utilization
    # then defaults to 1.0. False: the release has no such cache.
    extensible_kv_cache: bool
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
    # With disable_chunked_mm_input, a chunk that starts inside a multimodal
    # item (a prefix-cache hit ending inside it) and cannot cover the rest
    # schedules nothing (0.34); 0.33 checked the cut only for a chunk
    # starting at or before the item, so that chunk went ahead.
    chunked_mm_input_off_cuts_inside_item: bool
    # With chunked prefill off, a waiting request whose prompt the encoder
    # (budget or cache) would cut short is passed over this step and its
    # encoder cache references dropped (0.34); 0.33 admitted the cut prompt.
    mm_cut_refused_without_chunked_prefill: bool


_RULES_0_33 = VersionRules(
    "0.33", long_prefill_threshold_needs_chunked_prefill=False, multi_connector_roles_from_children=False,
    ngram_with_async_scheduling=False, default_block_size=16, default_gpu_memory_utilization=0.92,
    extensible_kv_cache=False, offload_threshold_counts_once_per_request=False,
    offload_finished_store_capped_at_computed=False, offload_transfer_failures=False,
    chunked_mm_input_off_cuts_inside_item=False, mm_cut_refused_without_chunked_prefill=False)
# A release is the one before it and what changed (docs/vllm_versions.md):
# the next release's entry lists only its own changes.
RULES: MappingProxyType[str, VersionRules] = MappingProxyType({
    "0.33": _RULES_0_33,
    "0.34": replace(_RULES_0_33, version="0.34", long_prefill_threshold_needs_chunked_prefill=True,
                    multi_connector_roles_from_children=True, ngram_with_async_scheduling=True,
                    default_block_size=64, extensible_kv_cache=True,
                    offload_threshold_counts_once_per_request=True,
                    offload_finished_store_capped_at_computed=True, offload_transfer_failures=True,
                    chunked_mm_input_off_cuts_inside_item=True,
                    mm_cut_refused_without_chunked_prefill=True),
})
VLLM_VERSIONS = tuple(RULES)
# The newest release kvsched models (its scheduler and its deployment
# defaults are). Everything that follows the default reads this one name; the
# conformance corpus checked against the shared 0.33 reference names its
# release itself (tests/conformance/reference_release.py).
DEFAULT_VLLM_VERSION = "0.34"
# gpu_memory_utilization when not given and the extensible KV cache is on
# (CacheConfig.resolved_gpu_memory_utilization): the cache is sized from
# measured memory, so vLLM asks for the whole device.
EXTENSIBLE_KV_CACHE_GPU_MEMORY_UTILIZATION = 1.0
# Engine arguments a release introduced -> the first release that has them.
# A value given for an older release is refused (check_release_flags): that
# vllm serve would reject the flag.
# The one table of which release has which engine argument: the CLI's
# check (check_release_flags) and SchedulerConfig's (release_has) read it.
FLAGS_SINCE: MappingProxyType[str, str] = MappingProxyType({
    "enable_extensible_kv_cache": "0.34",
    # The in-flight KV load cap and cache-aware admission (SchedulerConfig).
    "max_num_inflight_kv_loads": "0.34",
    "cache_aware_admission_window": "0.34",
    "cache_aware_admission_threshold": "0.34",
})
# The SchedulerConfig settings among them (kvsched.config refuses one away
# from its default on a release without it; scenarios read them).
VERSIONED_SCHEDULER_KNOBS = frozenset({"max_num_inflight_kv_loads", "cache_aware_admission_window",
                                       "cache_aware_admission_threshold"})


def check_vllm_version(value: object, where: str = "vllm_version", flag: str = "") -> str:
    """``value`` if it names a modelled release, else a UserInputError naming
    it (``flag``: the command-line flag that gave it, if one did)."""
    if not isinstance(value, str) or value not in RULES:
        given = f" ({flag})" if flag else ""
        raise UserInputError(f"{where}={value!r}{given}: not a vLLM release kvsched models; "
                             f"use one of {', '.join(VLLM_VERSIONS)}")
    return value


def rules_for(version: str) -> VersionRules:
    """The rules of a modelled release (checked)."""
    return RULES[check_vllm_version(version)]


def release_has(version: str, name: str) -> bool:
    """Whether ``version`` has the engine argument ``name`` (any argument
    not in FLAGS_SINCE: every modelled release has it)."""
    since = FLAGS_SINCE.get(name)
    return since is None or VLLM_VERSIONS.index(check_vllm_version(version)) >= VLLM_VERSIONS.index(since)


def check_release_flags(version: str, given: dict[str, object]) -> None:
    """Refuse an engine argument ``version`` does not have: ``given`` maps
    argument names to their values, None meaning not given (only names of
    FLAGS_SINCE are looked at)."""
    for name, since in FLAGS_SINCE.items():
        value = given.get(name)
        if value is not None and not release_has(version, name):
            flag = "--" + name.replace("_", "-")
            raise UserInputError(f"{name}={value!r} ({flag}): vLLM {version} has no {flag} (vLLM {since} "
                                 f"added it); drop it, or simulate vLLM {since} with --vllm-version {since}")
