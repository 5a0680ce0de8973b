"""The deployments ``kvsched tune`` searches: one :class:`Candidate` per
combination of hardware, parallelism and scheduler settings, each written as
``kvsched simulate`` flags and as the ``vllm serve`` line that runs it.

With ``--disaggregation auto`` the space also holds prefill/decode
disaggregated candidates: every xPyD split of the GPU budget with per-role
TP sizes from the space's TP choices, each answered with one ``vllm serve``
line per instance (vLLM's NixlConnector; with ``--kv-offloading-size``
vLLM's MultiConnector of NIXL and CPU offloading on the instances of the
roles ``kv_offloading_roles`` names) and the proxy in front of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from types import MappingProxyType
from typing import Any

from kvsched.config import POLICIES
from kvsched.engine_flags import vllm_words
from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.disagg import node_of_instances
from kvsched.sim.offload_transfer import GIB
from kvsched.sim.serve_line import serve_dests_of_every_release
from kvsched.sim.spec import PD_ROUTERS, DeploymentSpec, InstanceGroup, RunSpec, deployment_spec

# The run spec's defaults, which are vLLM's (kvsched.engine_flags declares
# the scheduler and cache ones): a candidate's setting left at one of them
# is written on neither command line. None: vLLM's default for the
# deployment.
_ENGINE = EngineOptions()
_GROUP = InstanceGroup()


@dataclass(frozen=True, slots=True)
class Candidate:
    """One deployment: every field is a ``kvsched simulate`` / ``vllm serve``
    flag (None: vLLM's default for the deployment)."""

    hardware: str
    tensor_parallel_size: int
    data_parallel_size: int = _ENGINE.data_parallel_size
    enable_expert_parallel: bool = _ENGINE.enable_expert_parallel
    # vLLM's --pipeline-parallel-size: stages of tensor_parallel_size GPUs
    # per engine core (colocated only).
    pipeline_parallel_size: int = _ENGINE.pipeline_parallel_size
    max_num_seqs: int | None = _ENGINE.max_num_seqs
    max_num_batched_tokens: int | None = _ENGINE.max_num_batched_tokens
    enable_chunked_prefill: bool = _ENGINE.enable_chunked_prefill
    enable_prefix_caching: bool = _ENGINE.enable_prefix_caching
    kv_cache_dtype: str = _ENGINE.kv_cache_dtype
    scheduling_policy: str = _ENGINE.scheduling_policy
    # kvsched's admission hooks (not vLLM flags): none, balance (seed 001's
    # data-parallel gate), prefill-cadence.
    admission_policy: str = _GROUP.admission_policy
    # vLLM's --kv-offloading-size (GiB of CPU KV cache per engine core; None: off).
    kv_offloading_size: float | None = _ENGINE.kv_offloading_size
    # Prefill/decode disaggregation (--disaggregation auto): this many
    # prefill instances of prefill_tensor_parallel_size GPUs each, and then
    # tensor_parallel_size and data_parallel_size are the decode instances'
    # TP and count (as the run spec's decode group holds them). 0: colocated.
    prefill_instances: int = 0
    prefill_tensor_parallel_size: int = 0
    # How the P/D proxy picks an instance of each role (colocated: unused).
    router: str = DeploymentSpec().router
    # Which roles of a P/D deployment get kv_offloading_size's CPU cache:
    # both, prefill or decode (the others run NixlConnector alone; in vLLM
    # each instance has its own --kv-transfer-config). Colocated, or
    # without offloading: both (unused).
    kv_offloading_roles: str = "both"

    @property
    def disaggregated(self) -> bool:
        return self.prefill_instances > 0

    @property
    def num_gpus(self) -> int:
        return (self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size
                + self.prefill_instances * self.prefill_tensor_parallel_size)

    def shape(self) -> str:
        """Colocated ``DPn`` or ``xPyD`` with each role's TP, for tables."""
        if self.disaggregated:
            return (f"{self.prefill_instances}P{self.data_parallel_size}D "
                    f"P-TP{self.prefill_tensor_parallel_size} D-TP{self.tensor_parallel_size}")
        pp = f" PP{self.pipeline_parallel_size}" if self.pipeline_parallel_size > 1 else ""
        return f"colocated DP{self.data_parallel_size} TP{self.tensor_parallel_size}{pp}"

    def apply(self, base: RunSpec) -> RunSpec:
        """``base`` (model, shared engine settings, workload) deployed as this candidate."""
        engine = {f.name: getattr(self, f.name) for f in fields(self) if f.name in ENGINE_FIELDS}
        if not self.disaggregated:
            return base.with_engine(**engine).with_group(admission_policy=self.admission_policy)
        # simulate's own --disaggregation rule builds the two groups: one
        # engine core per instance, the roles' TP sizes, the proxy's router,
        # each role's CPU offloading (simulate's --kv-offloading-size or
        # --prefill-/--decode-kv-offloading-size: every instance that has it
        # runs vLLM's MultiConnector of NIXL first and offloading, as the
        # serve lines' JSON says).
        one = base.with_engine(**{**engine, "data_parallel_size": 1, "kv_offloading_size": None}).with_group(
            admission_policy=self.admission_policy)
        deployment = deployment_spec(one.deployment.group,
                                     f"{self.prefill_instances}P{self.data_parallel_size}D",
                                     self.prefill_tensor_parallel_size, self.tensor_parallel_size,
                                     None, self.router,
                                     role_offloading={role: self.offloading_gib(role) for role in PD_ROLES})
        return dataclasses.replace(one, deployment=deployment)

    def vllm_serve(self, model: str, fixed: Sequence[str] = (), scaleup_domain: int = 8) -> str:
        """The ``vllm serve`` command line (vLLM's flags) of this deployment;
        ``fixed``: vLLM flags every candidate shares. Disaggregated: one
        line per instance (:meth:`role_commands`), then the proxy's."""
        if self.disaggregated:
            return "\n".join([*self.role_commands(model, fixed, scaleup_domain),
                              self.proxy_command(scaleup_domain)])
        parts = ["vllm", "serve", model, "--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.pipeline_parallel_size > 1:
            parts += ["--pipeline-parallel-size", str(self.pipeline_parallel_size)]
        if self.data_parallel_size > 1:
            parts += ["--data-parallel-size", str(self.data_parallel_size)]
        if self.enable_expert_parallel:
            parts.append("--enable-expert-parallel")
        parts += _serve_flags(self)  # vLLM's defaults are not spelled out
        parts += fixed
        line = shlex.join(parts)
        if self.admission_policy == "balance":
            line += "  # plus seed 001's balance-scheduling patch (not in vLLM 0.33)"
        elif self.admission_policy == "prefill-cadence":
            line += "  # plus prefill_schedule_interval 2 in the scheduler config"
        return line

    def offloading_gib(self, role: str) -> float | None:
        """The CPU offloading (GiB per instance) of a disaggregated
        deployment's ``role`` instances (None: none)."""
        if self.kv_offloading_roles in ("both", role):
            return self.kv_offloading_size
        return None

    def kv_transfer_config(self, role: str) -> str:
        """The ``--kv-transfer-config`` of a disaggregated deployment's
        ``role`` instances, compact JSON: vLLM's NixlConnector alone, or
        with offloading on that role (:meth:`offloading_gib`) vLLM's
        MultiConnector of it and the native OffloadingConnector, NIXL first
        (a decode instance then reads each prompt from its prefill instance
        and its CPU tier serves what it recomputes after a preemption; a
        prefill instance's CPU hits shorten its prefills), with
        ``cpu_bytes_to_use`` the GiB in bytes (what ``--kv-offloading-size``
        sets, per engine core summed over its TP ranks). The one owner of
        the P/D candidates' connector JSON."""
        config: Mapping[str, Any] = KV_TRANSFER_CONFIG
        gib = self.offloading_gib(role)
        if gib is not None:
            size = round(gib * GIB)
            offload = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": {"cpu_bytes_to_use": size}}
            config = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"connectors": [dict(KV_TRANSFER_CONFIG), offload]}}
        return json.dumps(config, separators=(",", ":"))

    def placement(self, scaleup_domain: int) -> list[tuple[str, int, int, list[int]]]:
        """Each instance of a disaggregated deployment as (role, its index
        in the role, node, GPUs on that node), placed as the simulator
        places them (:func:`kvsched.sim.disagg.node_of_instances`: prefill
        first, filling nodes in order, none straddling two)."""
        roles = ([("prefill", self.prefill_tensor_parallel_size)] * self.prefill_instances
                 + [("decode", self.tensor_parallel_size)] * self.data_parallel_size)
        nodes = node_of_instances([tp for _, tp in roles], scaleup_domain)
        used: dict[int, int] = {}
        seen: dict[str, int] = {}
        out = []
        for (role, tp), node in zip(roles, nodes):
            first = used.get(node, 0)
            used[node] = first + tp
            index = seen.get(role, 0)
            seen[role] = index + 1
            out.append((role, index, node, list(range(first, first + tp))))
        return out

    def role_commands(self, model: str, fixed: Sequence[str] = (), scaleup_domain: int = 8) -> list[str]:
        """One ``vllm serve`` line per instance of a disaggregated
        deployment, as vLLM's NixlConnector guide starts them: the
        instance's GPUs, its own NIXL side-channel port, an HTTP port
        (prefill 8100 + i, decode 8200 + j) and ``--kv-transfer-config``
        (:meth:`kv_transfer_config`: NixlConnector, kv_role kv_both, the
        proxy, not the flag, decides the roles; with offloading vLLM's
        MultiConnector of it and the OffloadingConnector)."""
        lines = []
        for n, (role, index, node, gpus) in enumerate(self.placement(scaleup_domain)):
            config = self.kv_transfer_config(role)
            tp = self.prefill_tensor_parallel_size if role == "prefill" else self.tensor_parallel_size
            env = [f"CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))}",
                   f"VLLM_NIXL_SIDE_CHANNEL_PORT={NIXL_SIDE_CHANNEL_PORT + n}"]
            parts = ["vllm", "serve", model, "--port", str(role_port(role, index)),
                     "--tensor-parallel-size", str(tp), *_serve_flags(self), *fixed,
                     "--kv-transfer-config", config]
            lines.append(f"# {role} instance {index + 1} of "
                         f"{self.prefill_instances if role == 'prefill' else self.data_parallel_size}, "
                         f"on node{node}\n" + " ".join(env) + " " + shlex.join(parts))
        return lines

    def proxy_command(self, scaleup_domain: int = 8) -> str:
        """How to run the proxy in front of the instances, in words and a command."""
        places = self.placement(scaleup_domain)
        single = all(node == 0 for _, _, node, _ in places)

        def hosts(role: str) -> list[str]:
            return ["localhost" if single else f"node{node}" for r, _, node, _ in places if r == role]

        def ports(role: str) -> list[str]:
            return [str(role_port(r, i)) for r, i, _, _ in places if r == role]

        command = shlex.join(["python", "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py",
                              "--port", "8192", "--prefiller-hosts", *hosts("prefill"),
                              "--prefiller-ports", *ports("prefill"), "--decoder-hosts", *hosts("decode"),
                              "--decoder-ports", *ports("decode")])
        where = "" if single else " (nodeK: the address of node K)"
        return f"# proxy ({PROXY_WORDS[self.router]}){where}\n{command}"

    def label(self) -> str:
        """A short name for tables."""
        if self.disaggregated:
            parts = [f"{self.hardware} {self.prefill_instances}P{self.data_parallel_size}D "
                     f"TP{self.prefill_tensor_parallel_size}/{self.tensor_parallel_size}"]
        else:
            parts = [f"{self.hardware} TP{self.tensor_parallel_size}"]
        if self.pipeline_parallel_size > 1:
            parts.append(f"PP{self.pipeline_parallel_size}")
        if self.data_parallel_size > 1 and not self.disaggregated:
            parts.append(f"DP{self.data_parallel_size}")
        if self.enable_expert_parallel:
            parts.append("EP")
        for value, name in ((self.max_num_seqs, "seqs"), (self.max_num_batched_tokens, "mbt")):
            if value is not None:
                parts.append(f"{name} {value}")
        if not self.enable_chunked_prefill:
            parts.append("no-chunked")
        if not self.enable_prefix_caching:
            parts.append("no-prefix-cache")
        if self.kv_cache_dtype != "auto":
            parts.append(f"kv {self.kv_cache_dtype}")
        if self.scheduling_policy != "fcfs":
            parts.append(self.scheduling_policy)
        if self.admission_policy != "none":
            parts.append(self.admission_policy)
        if self.kv_offloading_size is not None:
            parts.append(f"offload {self.kv_offloading_size:g}GiB")
            if self.disaggregated and self.kv_offloading_roles != "both":
                parts.append(f"on {self.kv_offloading_roles}")
        if self.router != DeploymentSpec().router:
            parts.append(self.router)
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def order_key(self) -> tuple[Any, ...]:
        """A total order (vLLM's default, None, before any value; the
        proxy's router likewise, vLLM's round-robin first): the search's
        tie-break, so its answer does not depend on arrival order."""
        values = (None if f.name == "router" and v == DeploymentSpec().router else v
                  for f, v in ((f, getattr(self, f.name)) for f in fields(self)))
        return tuple((0, 0) if v is None else (1, v) for v in values)


def _serve_flags(c: Candidate) -> list[str]:
    """The scheduler and cache flags (:data:`SERVE_FIELDS`) that differ from
    vLLM's defaults (which are ``kvsched simulate``'s too): the same
    settings on both command lines, in vLLM's spelling."""
    # vLLM's offloading backend, native, is the default. A P/D instance's
    # offloading is in its --kv-transfer-config (vLLM's flag would replace NIXL).
    # A candidate is written before its release is known: its dimensions are
    # flags every release takes (tests/sim/test_serve_line.py checks none is
    # a flag of some releases only, which this would leave out).
    names = [n for n in SERVE_FIELDS if n in serve_dests_of_every_release()
             and not (n == "kv_offloading_size" and c.disaggregated)]
    return [word for n in names for word in vllm_words(n, getattr(c, n), getattr(_ENGINE, n))]


# What vLLM's NixlConnector guide passes to every instance: the proxy, not
# kv_role, decides which instance prefills and which decodes.
KV_TRANSFER_CONFIG: Mapping[str, str] = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT
# The proxy for each router (kvsched.sim.proxy simulates vLLM's; the other
# two pick as llm-d's endpoint picker does, docs/simulator.md).
PROXY_WORDS: Mapping[str, str] = {
    "round-robin": "vLLM's NixlConnector proxy, toy_proxy_server.py from vLLM's repository: each request "
                   "goes to a prefill instance with max_tokens 1 and kv_transfer_params do_remote_decode, "
                   "then with the returned params to a decode instance, instances of a role in turn",
    "least-loaded": "the same two legs, each to the instance of the role with the fewest requests waiting "
                    "and running (e.g. llm-d's P/D inference scheduler with its queue scorer); vLLM's toy "
                    "proxy below is round-robin, so replace its instance choice",
    "prefix-aware": "the same two legs through llm-d's P/D inference scheduler with the "
                    "precise-prefix-cache, queue and kv-cache-utilization scorers (weights 3/2/2); vLLM's "
                    "toy proxy below shows the legs and ports, not this choice",
}


def role_port(role: str, index: int) -> int:
    """The HTTP port of instance ``index`` of ``role`` (vLLM's guide: prefill 8100, decode 8200)."""
    return (8100 if role == "prefill" else 8200) + index


# Candidate fields that are the engine's arguments (EngineOptions' names).
ENGINE_FIELDS = frozenset(f.name for f in fields(Candidate)) & {f.name for f in fields(EngineOptions)}
# Those _serve_flags writes where vllm serve takes them (not the GPU): all but
# the parallel layout, which Candidate.vllm_serve writes first.
SERVE_FIELDS = tuple(f.name for f in fields(Candidate) if f.name in ENGINE_FIELDS and f.name not in (
    "tensor_parallel_size", "data_parallel_size", "enable_expert_parallel", "pipeline_parallel_size"))
# The dimensions a space file or the flags may list, with their types (the
# P/D shape is no dimension: --disaggregation auto enumerates it).
DIMENSIONS: Mapping[str, type] = {
    f.name: (bool if f.type == "bool" else str if f.type == "str" else float if "float" in str(f.type)
             else int)
    for f in fields(Candidate) if f.name not in ("prefill_instances", "prefill_tensor_parallel_size")}
# Dimensions only one kind of candidate has: the router and which roles
# offload only P/D. Offloading's size is both kinds' (P/D: the offloading
# instances' MultiConnector of NIXL and offloading,
# :meth:`Candidate.kv_transfer_config`).
PD_ONLY = ("router", "kv_offloading_roles")
# The simulator runs PP without a KV connector: colocated only.
COLOCATED_ONLY = ("pipeline_parallel_size",)
PD_ROLES = ("prefill", "decode")
OFFLOADING_ROLES = ("both", *PD_ROLES)
ADMISSION_POLICIES = ("none", "balance", "prefill-cadence")
KV_CACHE_DTYPES = ("auto", "fp8")
# The dimensions a word (or null) sets to None, vLLM's default for the
# deployment or off: (the word, the type of the other values, how a message
# names them). The flags give every value as a word.
NONE_WORDS: Mapping[str, tuple[str, type[int] | type[float], str]] = MappingProxyType({
    "max_num_seqs": ("default", int, "integers"),
    "max_num_batched_tokens": ("default", int, "integers"),
    "kv_offloading_size": ("off", float, "GiB numbers"),
})


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """Lists of values per dimension; the candidates are their product,
    minus combinations that mean nothing (expert parallelism on a dense
    model, an admission gate with one data-parallel rank) or exceed the GPU
    budget."""

    hardware: tuple[str, ...]
    tensor_parallel_size: tuple[int, ...]
    data_parallel_size: tuple[int, ...]
    # The other dimensions default to the candidates' one value: vLLM's.
    enable_expert_parallel: tuple[bool, ...] = (_ENGINE.enable_expert_parallel,)
    pipeline_parallel_size: tuple[int, ...] = (_ENGINE.pipeline_parallel_size,)
    max_num_seqs: tuple[int | None, ...] = (_ENGINE.max_num_seqs,)
    max_num_batched_tokens: tuple[int | None, ...] = (_ENGINE.max_num_batched_tokens,)
    enable_chunked_prefill: tuple[bool, ...] = (_ENGINE.enable_chunked_prefill,)
    enable_prefix_caching: tuple[bool, ...] = (_ENGINE.enable_prefix_caching,)
    kv_cache_dtype: tuple[str, ...] = (_ENGINE.kv_cache_dtype,)
    scheduling_policy: tuple[str, ...] = (_ENGINE.scheduling_policy,)
    admission_policy: tuple[str, ...] = (_GROUP.admission_policy,)
    kv_offloading_size: tuple[float | None, ...] = (_ENGINE.kv_offloading_size,)
    router: tuple[str, ...] = (DeploymentSpec().router,)
    kv_offloading_roles: tuple[str, ...] = ("both",)
    # Also every xPyD split of the budget (--disaggregation auto).
    disaggregation: bool = False

    def candidates(self, max_gpus: int, is_moe: bool) -> Iterator[Candidate]:
        names = [n for n in DIMENSIONS if n not in PD_ONLY]
        for values in itertools.product(*(getattr(self, n) for n in names)):
            c = Candidate(**dict(zip(names, values)))
            if c.num_gpus > max_gpus or (c.enable_expert_parallel and not is_moe):
                continue
            if c.admission_policy == "balance" and c.data_parallel_size == 1:
                continue  # the gate balances ranks: with one there is nothing to do
            if c.pipeline_parallel_size > 1 and (c.kv_offloading_size is not None
                                                  or c.enable_expert_parallel):
                continue  # the simulator runs PP without offloading or lockstep MoE ranks
            yield c
        if self.disaggregation:
            yield from self.disaggregated(max_gpus)

    def disaggregated(self, max_gpus: int) -> Iterator[Candidate]:
        """Every x prefill and y decode instances (each at least 1) with
        per-role TP sizes from the space's, x * TP_p + y * TP_d <= the
        budget, for each value of the scheduler dimensions. Not crossed with
        what the simulator does not disaggregate: data parallelism within an
        instance, expert parallelism, admission policies. Offloading is
        crossed: each size on the roles ``kv_offloading_roles`` lists."""
        names = [n for n in DIMENSIONS if n not in COLOCATED_ONLY
                 and n not in ("tensor_parallel_size", "data_parallel_size", "enable_expert_parallel",
                               "admission_policy")]
        seen: set[Candidate] = set()
        for tp_p, tp_d in itertools.product(self.tensor_parallel_size, repeat=2):
            for x in range(1, (max_gpus - tp_d) // tp_p + 1):
                for y in range(1, (max_gpus - x * tp_p) // tp_d + 1):
                    for values in itertools.product(*(getattr(self, n) for n in names)):
                        c = Candidate(**dict(zip(names, values)), tensor_parallel_size=tp_d,
                                      data_parallel_size=y, prefill_instances=x,
                                      prefill_tensor_parallel_size=tp_p)
                        if c.kv_offloading_size is None:  # no offloading: on no role
                            c = dataclasses.replace(c, kv_offloading_roles="both")
                        if c not in seen:
                            seen.add(c)
                            yield c


def check_space_values(name: str, values: Sequence[object], where: str) -> tuple[Any, ...]:
    """A dimension's values from a flag or a space file, checked."""
    if name not in DIMENSIONS:
        close = difflib.get_close_matches(name, list(DIMENSIONS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserInputError(f"{where}: unknown dimension {name!r}; "
                             f"{hint}choose from {', '.join(DIMENSIONS)}")
    if not isinstance(values, list | tuple) or not values:
        raise UserInputError(f"{where}: {name} must be a non-empty list of values")
    out: list[Any] = []
    for v in values:
        if name in NONE_WORDS and v in (None, NONE_WORDS[name][0]):
            out.append(None)
            continue
        kind = DIMENSIONS[name]
        if kind is float:
            if not is_number(v) or not 0 < v <= 2**20:
                raise UserInputError(f"{where}: {name}={v!r}: must be GiB in (0, 2**20], or off")
            v = float(v)
        elif kind is bool:
            if not isinstance(v, bool):
                raise UserInputError(f"{where}: {name}={v!r}: must be true or false")
        elif kind is int:
            if not is_int(v) or not 1 <= v <= 2**24:
                raise UserInputError(f"{where}: {name}={v!r}: must be an integer in [1, 2**24]")
        elif not isinstance(v, str):
            raise UserInputError(f"{where}: {name}={v!r}: must be a string")
        choices = {"admission_policy": ADMISSION_POLICIES, "kv_cache_dtype": KV_CACHE_DTYPES,
                   "scheduling_policy": POLICIES, "router": PD_ROUTERS,
                   "kv_offloading_roles": OFFLOADING_ROLES}.get(name)
        if choices is not None and v not in choices:
            raise UserInputError(f"{where}: {name}={v!r}: choose from {', '.join(choices)}")
        out.append(v)
    if len(set(out)) != len(out):
        raise UserInputError(f"{where}: {name} lists a value twice: {values!r}")
    return tuple(out)
