"""The model runner: one forward pass per engine step over the scheduler's
mixed batch, on a paged KV cache, then sampling.

The runner mirrors each request's tokens, block table and progress from the
``SchedulerOutput`` deltas (vLLM's ``_update_states``), flattens the step's
tokens in ``num_scheduled_tokens`` order, runs the model once, and computes
logits only for the requests whose chunk reaches the end of their sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from kvsched.core.output import ModelRunnerOutput, SchedulerOutput
from kvsched.executor.paged_attention import (
    AttentionMetadata,
    GatherBuffers,
    PagedAttention,
    decode_group_keys,
)
from kvsched.executor.sampler import Sampler, SamplingState
from kvsched.model.attention import Attention
from kvsched.model.config import ModelConfig
from kvsched.request import SamplingParams


class CausalLM(Protocol):
    """What the runner needs of a model (``LlamaForCausalLM`` has it)."""

    def forward(self, input_ids: Tensor, positions: Tensor, attention: Attention) -> Tensor: ...

    def compute_logits(self, hidden: Tensor) -> Tensor: ...


@dataclass(slots=True)
class CachedRequestState:
    """The runner's copy of one request (vLLM's name)."""

    req_id: str
    token_ids: list[int]  # prompt + outputs so far
    num_prompt_tokens: int
    block_ids: list[int]  # empty while preempted
    num_computed_tokens: int
    # Kept across preemption: the generator's draws continue where they were.
    sampling: SamplingState


class ModelRunner:
    def __init__(self, model: CausalLM, model_config: ModelConfig, num_blocks: int,
                 block_size: int, device: torch.device | str, dtype: torch.dtype,
                 sampler: Sampler) -> None:
        self.model = model
        self.model_config = model_config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device)
        self.dtype = dtype
        self.sampler = sampler
        shape = (num_blocks, block_size, model_config.num_key_value_heads, model_config.head_dim)
        # Zeros, not empty: padded decode keys are masked, but a NaN bit
        # pattern in them would still poison softmax(...) @ V (0 * NaN).
        self.kv_caches: list[tuple[Tensor, Tensor]] = [
            (torch.zeros(shape, dtype=dtype, device=self.device),
             torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in range(model_config.num_hidden_layers)]
        self.requests: dict[str, CachedRequestState] = {}
        self.gather_buffers = GatherBuffers()
        self.group_keys = decode_group_keys(model_config.num_key_value_heads,
                                            model_config.head_dim, dtype)
        # The last step's layout, for check_invariants.
        self.last_metadata: AttentionMetadata | None = None

    def _update_states(self, so: SchedulerOutput) -> None:
        requests = self.requests
        for rid in so.finished_req_ids:
            requests.pop(rid, None)
        for rid in so.preempted_req_ids:
            state = requests.get(rid)
            if state is not None:
                state.block_ids = []
                state.num_computed_tokens = 0
        for new in so.scheduled_new_reqs:
            params = new.sampling_params if new.sampling_params is not None else SamplingParams()
            prompt = new.prompt_token_ids
            outputs: list[int] = []
            requests[new.req_id] = CachedRequestState(
                new.req_id, list(prompt), len(prompt), list(new.block_ids),
                new.num_computed_tokens,
                SamplingState(params, prompt, outputs, self.sampler.make_generator(params)))
        cached = so.scheduled_cached_reqs
        new_block_ids = cached.new_block_ids
        resumed = cached.resumed_req_ids
        for rid in cached.req_ids:
            state = requests[rid]
            if rid in resumed:
                # Its whole new table and all its tokens; outputs so far stay
                # the sampler's history (penalties, min_tokens).
                state.block_ids = list(new_block_ids[rid])
                state.token_ids = list(cached.resumed_token_ids[rid])
                state.num_computed_tokens = cached.num_computed_tokens[rid]
                state.sampling.output_token_ids[:] = state.token_ids[state.num_prompt_tokens:]
            elif rid in new_block_ids:
                state.block_ids.extend(new_block_ids[rid])

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(scheduler_output)
        num_scheduled = scheduler_output.num_scheduled_tokens
        req_ids = list(num_scheduled)
        if not req_ids:
            return ModelRunnerOutput([], [])
        requests = self.requests
        states = [requests[rid] for rid in req_ids]
        input_ids: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        sample_rows: list[int] = []  # flat row of each sampling request's last token
        sampling: list[int] = []  # which requests sample
        for i, (rid, state) in enumerate(zip(req_ids, states)):
            n = num_scheduled[rid]
            start = state.num_computed_tokens
            end = start + n
            token_ids = state.token_ids
            input_ids.extend(token_ids[start:end])
            query_lens.append(n)
            seq_lens.append(end)
            if end >= len(token_ids):  # the chunk reaches the end: sample
                if end > len(token_ids):
                    raise RuntimeError(
                        f"request {rid}: scheduled up to token {end} but the runner knows "
                        f"{len(token_ids)}; the scheduler and the runner are out of step")
                sampling.append(i)
                sample_rows.append(len(input_ids) - 1)
        md = AttentionMetadata.build(query_lens, seq_lens, [s.block_ids for s in states],
                                     self.block_size, self.device, self.group_keys)
        self.last_metadata = md
        attention = PagedAttention(self.kv_caches, md, self.gather_buffers)
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        hidden = self.model.forward(ids, md.positions, attention)

        sampled: list[list[int]] = [[] for _ in req_ids]
        logprobs: list[object] | None = None
        if sampling:
            rows = torch.tensor(sample_rows, dtype=torch.long, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, rows))
            out = self.sampler.sample(logits, [states[i].sampling for i in sampling])
            for i, token in zip(sampling, out.token_ids):
                sampled[i] = [token]
                state = states[i]
                state.token_ids.append(token)
                state.sampling.output_token_ids.append(token)
            if any(lp is not None for lp in out.logprobs):
                logprobs = [None] * len(req_ids)
                for i, lp in zip(sampling, out.logprobs):
                    logprobs[i] = lp
        for state, n in zip(states, query_lens):
            state.num_computed_tokens += n
        return ModelRunnerOutput(req_ids, sampled, logprobs)

    def check_invariants(self) -> None:
        """Debug check of the runner's state (tests call it after every step)."""
        bs, num_blocks = self.block_size, self.num_blocks
        for rid, s in self.requests.items():
            assert s.req_id == rid, (rid, s.req_id)
            assert 0 < s.num_prompt_tokens <= len(s.token_ids), rid
            assert 0 <= s.num_computed_tokens <= len(s.token_ids), (rid, s.num_computed_tokens)
            assert s.sampling.prompt_token_ids == s.token_ids[:s.num_prompt_tokens], rid
            assert s.sampling.output_token_ids == s.token_ids[s.num_prompt_tokens:], rid
            if not s.block_ids:  # preempted: nothing in the cache
                assert s.num_computed_tokens == 0, rid
                continue
            assert all(0 < b < num_blocks for b in s.block_ids), (rid, s.block_ids)
            assert len(set(s.block_ids)) == len(s.block_ids), (rid, s.block_ids)
            assert len(s.block_ids) * bs >= s.num_computed_tokens, (rid, s.block_ids)
        if self.last_metadata is not None:
            self.last_metadata.check(num_blocks * bs)
