"""Step-time arithmetic that runs once per simulated step, compiled with the
simulator's hot path (``setup.py``): the rule that combines a step's forward
pass with its host work, and the roofline's loop over a run of pure-decode
steps (a decode stretch prices every step it may take). The step-time
models (:mod:`kvsched.perf.step_time` and the backends built on it) call
these; nothing here knows a model or a GPU, only the numbers they pass.
"""

from __future__ import annotations


def combine_step_time(gpu: float, cpu: float, async_scheduling: bool) -> float:
    """A step's wall seconds from its forward pass (``gpu``) and its host
    work (``cpu``): with async scheduling the CPU work of scheduling the next
    step overlaps this forward pass, so the longer of the two; without, one
    after the other. The one owner of that rule, for every backend and for
    stepping and fast-forward alike (the same float)."""
    if async_scheduling:
        return gpu if gpu > cpu else cpu
    return gpu + cpu


def roofline_decode_times(lin: float, rest: float, cpu: float, flops_per_kv: float, attn_flops: float,
                          bytes_per_kv: float, attn_bw: float, attn_latency: float, full_layers: int,
                          num_reqs: int, first_kv_tokens: int, kv_step: int, count: int,
                          overlap: bool, extra: list[float] | None = None) -> list[float]:
    """The roofline's ``count`` consecutive pure-decode steps of ``num_reqs``
    requests on full-attention layers only, step j reading
    ``first_kv_tokens + j * kv_step`` KV tokens: linear layers ``lin``, the
    rest of the forward pass ``rest`` and host work ``cpu`` per step, and
    attention as the slower of its flops and its KV reads per layer (plus
    ``extra[j]``, the sliding-window layers' at step j, if given), plus one
    kernel latency (``StepTimeModel.decode_step_times`` owns the model; the
    float operations are its, in its order)."""
    out: list[float] = []
    kv = first_kv_tokens
    for j in range(count):
        if kv:
            flops = flops_per_kv * kv / attn_flops
            nbytes = kv * bytes_per_kv / attn_bw
            attn = (flops if flops > nbytes else nbytes) * full_layers
        else:
            attn = 0.0
        if extra is not None:
            attn += extra[j]
        if num_reqs:
            attn += attn_latency
        out.append(combine_step_time(lin + attn + rest, cpu, overlap))
        kv += kv_step
    return out
