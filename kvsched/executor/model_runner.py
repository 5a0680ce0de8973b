"""The model runner: one forward pass per engine step over the scheduler's
mixed batch, on a paged KV cache, then sampling.

The runner mirrors each request's tokens, block table and progress from the
``SchedulerOutput`` deltas (vLLM's ``_update_states``), flattens the step's
tokens in ``num_scheduled_tokens`` order, runs the model once, and computes
logits only for the requests whose chunk reaches the end of their sequence.

Speculative decoding: a request with d drafts scheduled runs
[its last sampled token, the d drafts] at the next positions, logits at all
1 + d of them, and the rejection sampler returns the accepted drafts and one
more token (kvsched.executor.rejection_sampler). The KV written for rejected
drafts is overwritten when those positions are computed again (the scheduler
rolls ``num_computed_tokens`` back; the runner moves its own copy to the
same place). A ``-1`` draft is a placeholder: vLLM feeds it to the model as
token 0 and always rejects it, so it and any draft after it can change
nothing; the runner leaves them out of the step (as vLLM's ``ngram_gpu``
path trims drafts it has no token for), and a request whose drafts are all
``-1`` runs exactly as if it had been scheduled without drafts.

KV cache groups (:mod:`kvsched.model.kv_groups`): a request holds one block
table per group, and each layer writes and reads through its group's; a
sliding-window group's attention sees only its window and never reads the
blocks the window has passed (they may be freed, or the null block 0). The
scheduler hands out one flat list (every group gets the same ids, so the
groups' identical layouts are built once) or one list per group in
``kv_groups`` order.

After each step the runner proposes the next drafts with the n-gram proposer
(vLLM's runner does it too, from the tokens it holds): handed to the
scheduler through ``take_draft_token_ids`` under synchronous scheduling, or
kept to fill the ``-1`` placeholders of the request's next step under async
scheduling (``ngram_gpu``: the scheduler never sees real drafts there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from kvsched.core.hybrid_kv_cache import HybridBlocks
from kvsched.core.output import DraftTokenIds, ModelRunnerOutput, SchedulerOutput
from kvsched.executor.ngram_proposer import NgramProposer
from kvsched.executor.paged_attention import (
    AttentionMetadata,
    GatherBuffers,
    PagedAttention,
    decode_group_keys,
)
from kvsched.executor.rejection_sampler import Verification, verify
from kvsched.executor.sampler import Logprob, Sampler, SamplingState
from kvsched.model.attention import Attention
from kvsched.model.config import ModelConfig
from kvsched.model.kv_groups import kv_cache_groups
from kvsched.request import SamplingParams

# A request's block ids as the scheduler hands them: one list for every KV
# cache group (today's single-group scheduler: every group gets the same
# ids), or one list per group in ``kv_groups`` order (vLLM's tuple).
BlockIds = Sequence[int] | Sequence[Sequence[int]]


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
    block_ids: tuple[list[int], ...]  # one table per KV cache group; empty while preempted
    num_computed_tokens: int
    # Kept across preemption: the generator's draws continue where they were.
    sampling: SamplingState


class ModelRunner:
    def __init__(self, model: CausalLM, model_config: ModelConfig, num_blocks: int,
                 block_size: int, device: torch.device | str, dtype: torch.dtype,
                 sampler: Sampler, proposer: NgramProposer | None = None,
                 async_drafts: bool = False, share_kv_tensors: bool = False) -> None:
        """``proposer``: propose n-gram drafts after every step;
        ``async_drafts``: keep them for the request's next step, whose
        scheduled drafts are ``-1`` placeholders (async scheduling), rather
        than handing them to the scheduler. ``share_kv_tensors``: lay the
        KV cache out as vLLM does, one K/V tensor per layer position shared
        by the groups (``ModelKVCacheGroups.layer_tensors``); the scheduler
        must then give every group its own block ids."""
        self.model = model
        self.model_config = model_config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device)
        self.dtype = dtype
        self.sampler = sampler
        # The model's KV cache groups (vLLM's, in its order): each layer
        # reads the block table of its group, and a sliding-window group's
        # attention sees only its window.
        self.kv_groups = kv_cache_groups(model_config, block_size)
        self.layer_groups = self.kv_groups.layer_groups
        self.group_windows = tuple(g.sliding_window for g in self.kv_groups.groups)
        # A block id names one page in each layer of the group it was given
        # to. By default every layer has its own K and V of ``num_blocks``
        # pages, which is sound when every group gets the same ids (today's
        # scheduler); vLLM's layout shares each tensor between one layer of
        # each group, sound because its one pool never gives an id to two
        # groups at once.
        self.share_kv_tensors = share_kv_tensors
        shape = (num_blocks, block_size, model_config.num_kv_heads, model_config.head_dim)
        num_tensors = self.kv_groups.num_shared_tensors if share_kv_tensors else model_config.num_layers
        # Zeros, not empty: padded decode keys are masked, but a NaN bit
        # pattern in them would still poison softmax(...) @ V (0 * NaN).
        tensors = [(torch.zeros(shape, dtype=dtype, device=self.device),
                    torch.zeros(shape, dtype=dtype, device=self.device)) for _ in range(num_tensors)]
        layer_tensor = self.kv_groups.layer_tensors if share_kv_tensors \
            else range(model_config.num_layers)
        self.kv_caches: list[tuple[Tensor, Tensor]] = [tensors[t] for t in layer_tensor]
        self.requests: dict[str, CachedRequestState] = {}
        self.gather_buffers = GatherBuffers()
        self.group_keys = decode_group_keys(model_config.num_kv_heads,
                                            model_config.head_dim, dtype)
        # The last step's layout (the first group's; every group's), for check_invariants.
        self.last_metadata: AttentionMetadata | None = None
        self.last_group_metadata: list[AttentionMetadata] = []
        self.proposer = proposer
        self.async_drafts = async_drafts
        # Drafts proposed after the last step: for the scheduler (synchronous)
        # or for each request's next step (async), by request id.
        self._drafts: DraftTokenIds | None = None
        self._next_drafts: dict[str, list[int]] = {}

    def per_group(self, block_ids: BlockIds) -> tuple[list[int], ...]:
        """One list of block ids per KV cache group, from the scheduler's form
        (see ``BlockIds``)."""
        num_groups = len(self.group_windows)
        if isinstance(block_ids, HybridBlocks):
            block_ids = block_ids.per_group
        if not block_ids or not isinstance(block_ids[0], Sequence):
            if self.share_kv_tensors and num_groups > 1 and block_ids:
                raise RuntimeError("one block table for every KV cache group, but the groups share "
                                   "their K/V tensors: each group needs its own block ids")
            flat = [int(b) for b in block_ids]  # type: ignore[arg-type]
            return tuple(list(flat) for _ in range(num_groups))
        if len(block_ids) != num_groups:
            raise RuntimeError(f"block ids for {len(block_ids)} KV cache groups, but the model has "
                               f"{num_groups}; the scheduler and the runner disagree on the groups")
        return tuple(list(ids) for ids in block_ids)  # type: ignore[arg-type]

    def _update_states(self, so: SchedulerOutput) -> None:
        requests = self.requests
        for rid in so.finished_req_ids:
            requests.pop(rid, None)
        for rid in so.preempted_req_ids:
            state = requests.get(rid)
            if state is not None:
                state.block_ids = tuple([] for _ in self.group_windows)
                state.num_computed_tokens = 0
        for new in so.scheduled_new_reqs:
            params = new.sampling_params if new.sampling_params is not None else SamplingParams()
            prompt = new.prompt_token_ids
            outputs: list[int] = []
            requests[new.req_id] = CachedRequestState(
                new.req_id, list(prompt), len(prompt), self.per_group(new.block_ids),
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
                state.block_ids = self.per_group(new_block_ids[rid])
                state.token_ids = list(cached.resumed_token_ids[rid])
                state.num_computed_tokens = cached.num_computed_tokens[rid]
                state.sampling.output_token_ids[:] = state.token_ids[state.num_prompt_tokens:]
            elif rid in new_block_ids:
                for table, new_ids in zip(state.block_ids, self.per_group(new_block_ids[rid])):
                    table.extend(new_ids)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(scheduler_output)
        num_scheduled = scheduler_output.num_scheduled_tokens
        req_ids = list(num_scheduled)
        # The drafts proposed after the previous step fill this step's
        # placeholders (async), once.
        own_drafts, self._next_drafts = self._next_drafts, {}
        self._drafts = None
        if not req_ids:
            return ModelRunnerOutput([], [])
        spec = scheduler_output.scheduled_spec_decode_tokens
        requests = self.requests
        states = [requests[rid] for rid in req_ids]
        input_ids: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        num_drafts: list[int] = []  # drafts each request verifies (after trimming)
        sample_rows: list[int] = []  # flat row of each plain sampling request's last token
        sampling: list[int] = []  # which requests sample without drafts
        verifying: list[tuple[int, list[int], int]] = []  # (request, drafts, first flat row)
        for i, (rid, state) in enumerate(zip(req_ids, states)):
            n = num_scheduled[rid]
            drafts = _drafts_to_run(spec.get(rid), own_drafts.get(rid))
            if rid in spec:
                n -= len(spec[rid]) - len(drafts)
            start = state.num_computed_tokens
            end = start + n - len(drafts)  # the known tokens end here
            token_ids = state.token_ids
            if end > len(token_ids) or (rid in spec and end != len(token_ids)):
                raise RuntimeError(
                    f"request {rid}: scheduled up to token {end} (then {len(drafts)} drafts) but "
                    f"the runner knows {len(token_ids)}; the scheduler and the runner are out of step")
            input_ids.extend(token_ids[start:end])
            if drafts:
                verifying.append((i, drafts, len(input_ids) - 1))
                input_ids.extend(drafts)
            elif end == len(token_ids):  # the chunk reaches the end: sample
                sampling.append(i)
                sample_rows.append(len(input_ids) - 1)
            query_lens.append(n)
            seq_lens.append(start + n)
            num_drafts.append(len(drafts))
        mds = self._group_metadata(states, query_lens, seq_lens)
        md = mds[0]
        self.last_metadata, self.last_group_metadata = md, mds
        attention = PagedAttention(self.kv_caches, mds, self.gather_buffers,
                                   layer_groups=self.layer_groups,
                                   scale=self.model_config.attention_scale)
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        hidden = self.model.forward(ids, md.positions, attention)

        sampled: list[list[int]] = [[] for _ in req_ids]
        token_logprobs: list[list[dict[int, Logprob] | None]] = [[] for _ in req_ids]
        if sampling or verifying:
            # One logits pass: the plain rows, then each verification's 1 + d rows.
            rows = list(sample_rows)
            for _, drafts, first in verifying:
                rows.extend(range(first, first + len(drafts) + 1))
            logits = self.model.compute_logits(
                hidden.index_select(0, torch.tensor(rows, dtype=torch.long, device=self.device)))
            if sampling:
                out = self.sampler.sample(logits[:len(sampling)],
                                          [states[i].sampling for i in sampling])
                for i, token, lp in zip(sampling, out.token_ids, out.logprobs):
                    sampled[i] = [token]
                    token_logprobs[i] = [lp]
            if verifying:
                items = []
                row = len(sampling)
                for i, drafts, _ in verifying:
                    items.append(Verification(row, drafts, states[i].sampling))
                    row += len(drafts) + 1
                for (i, _, _), result in zip(verifying, verify(self.sampler, logits, items)):
                    sampled[i] = result.token_ids
                    token_logprobs[i] = result.logprobs
        logprobs: list[object] | None = None
        for i, (state, n, d) in enumerate(zip(states, query_lens, num_drafts)):
            tokens = sampled[i]
            # Rejected drafts are not computed: the next step starts there.
            state.num_computed_tokens += n - d + (len(tokens) - 1 if d else 0)
            if tokens:
                state.token_ids.extend(tokens)
                state.sampling.output_token_ids.extend(tokens)
                if any(lp is not None for lp in token_logprobs[i]):
                    if logprobs is None:
                        logprobs = [None] * len(req_ids)
                    logprobs[i] = token_logprobs[i]
        if self.proposer is not None:
            self._propose(req_ids, states, sampled, scheduler_output.num_spec_tokens_to_schedule)
        return ModelRunnerOutput(req_ids, sampled, logprobs)

    def _group_metadata(self, states: list[CachedRequestState], query_lens: list[int],
                        seq_lens: list[int]) -> list[AttentionMetadata]:
        """The step's layout for each KV cache group. Groups with the same
        window and the same tables (every group's, while the scheduler
        hands all groups the same ids) share one."""
        mds: list[AttentionMetadata] = []
        for g, window in enumerate(self.group_windows):
            same = next((h for h in range(g) if self.group_windows[h] == window
                         and all(s.block_ids[h] == s.block_ids[g] for s in states)), None)
            if same is not None:
                mds.append(mds[same])
                continue
            mds.append(AttentionMetadata.build(query_lens, seq_lens, [s.block_ids[g] for s in states],
                                               self.block_size, self.device, self.group_keys,
                                               sliding_window=window))
        return mds

    def _propose(self, req_ids: list[str], states: list[CachedRequestState],
                 sampled: list[list[int]], k: int) -> None:
        """The n-gram drafts after this step, from the tokens the runner holds."""
        assert self.proposer is not None
        histories = [state.token_ids if tokens else None for state, tokens in zip(states, sampled)]
        drafts = self.proposer.propose(histories, k or None)
        if self.async_drafts:
            self._next_drafts = {rid: d for rid, d in zip(req_ids, drafts) if d}
        else:
            self._drafts = DraftTokenIds(list(req_ids), drafts)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed after the last step, one list per request of
        that step (vLLM's take_draft_token_ids); None when there are none
        to hand over (no proposer, async scheduling, or an empty step)."""
        drafts, self._drafts = self._drafts, None
        return drafts

    def check_invariants(self) -> None:
        """Debug check of the runner's state (tests call it after every step)."""
        bs, num_blocks = self.block_size, self.num_blocks
        owner: dict[int, int] = {}  # block id -> the group holding it (shared tensors)
        for rid, s in self.requests.items():
            assert s.req_id == rid, (rid, s.req_id)
            assert 0 < s.num_prompt_tokens <= len(s.token_ids), rid
            assert 0 <= s.num_computed_tokens <= len(s.token_ids), (rid, s.num_computed_tokens)
            assert s.sampling.prompt_token_ids == s.token_ids[:s.num_prompt_tokens], rid
            assert s.sampling.output_token_ids == s.token_ids[s.num_prompt_tokens:], rid
            assert len(s.block_ids) == len(self.group_windows), (rid, s.block_ids)
            if not any(s.block_ids):  # preempted: nothing in the cache
                assert s.num_computed_tokens == 0, rid
                continue
            for g, (table, window) in enumerate(zip(s.block_ids, self.group_windows)):
                # Where a sliding window has passed, the scheduler frees the
                # blocks (and may hand them out again) without telling the
                # runner, as vLLM's does: only the blocks attention can still
                # read must be real and held once.
                live = table if window is None \
                    else table[max(0, s.num_computed_tokens - window + 1) // bs:]
                real = [b for b in live if b]
                assert len(real) == len(live) or window is not None, (rid, table)
                assert all(0 < b < num_blocks for b in real), (rid, table)
                assert len(set(real)) == len(real), (rid, table)
                assert len(table) * bs >= s.num_computed_tokens, (rid, table)
                if self.share_kv_tensors:  # an id in two groups would share pages
                    for b in real:
                        assert owner.setdefault(b, g) == g, (rid, b, g, owner[b])
        for md in self.last_group_metadata:
            md.check(num_blocks * bs)


def _drafts_to_run(scheduled: list[int] | None, own: list[int] | None) -> list[int]:
    """The drafts a request verifies this step: the scheduled ones up to the
    first ``-1`` placeholder; under async scheduling the placeholders stand
    for the runner's own drafts from the step before (as many as were
    scheduled; fewer if it proposed fewer)."""
    if not scheduled:
        return []
    if scheduled[0] < 0:
        return own[:len(scheduled)] if own else []
    if scheduled[-1] >= 0:
        return scheduled
    return scheduled[:scheduled.index(-1)]
