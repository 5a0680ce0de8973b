"""Pipeline parallelism in tune's search space."""

from __future__ import annotations

from kvsched.tune.space import Candidate, SearchSpace


def test_a_pp_candidate_counts_its_stages_gpus_and_says_so() -> None:
    c = Candidate("h100-sxm", tensor_parallel_size=2, pipeline_parallel_size=4)
    assert c.num_gpus == 8
    assert c.label() == "h100-sxm TP2 PP4"
    assert c.shape() == "colocated DP1 TP2 PP4"
    assert "--tensor-parallel-size 2 --pipeline-parallel-size 4" in c.vllm_serve("meta-llama/Llama-3.1-70B")


def test_the_space_holds_pp_where_the_gpus_allow() -> None:
    space = SearchSpace(hardware=("h100-sxm",), tensor_parallel_size=(2, 4), data_parallel_size=(1,),
                        pipeline_parallel_size=(1, 2, 4))
    shapes = {(c.tensor_parallel_size, c.pipeline_parallel_size) for c in space.candidates(8, False)}
    # TP4 x PP4 needs 16 GPUs: left out.
    assert shapes == {(2, 1), (2, 2), (2, 4), (4, 1), (4, 2)}


def test_pp_is_not_crossed_with_offloading_expert_parallelism_or_pd() -> None:
    space = SearchSpace(hardware=("h100-sxm",), tensor_parallel_size=(2,), data_parallel_size=(1, 2),
                        enable_expert_parallel=(False, True), pipeline_parallel_size=(1, 2),
                        kv_offloading_size=(None, 8.0), disaggregation=True)
    candidates = list(space.candidates(8, True))
    pp = [c for c in candidates if c.pipeline_parallel_size > 1]
    assert pp and all(c.kv_offloading_size is None and not c.enable_expert_parallel
                      and not c.disaggregated for c in pp)
    assert any(c.disaggregated for c in candidates)


def test_tunes_pp_flag_sets_the_dimension() -> None:
    from kvsched.cli import build_parser
    from kvsched.commands.tune import build_space

    args = build_parser().parse_args(["tune", "--model", "meta-llama/Llama-3.1-70B", "--max-gpus", "8",
                                      "--slo", "tpot:100", "--tp", "2", "--dp", "1", "--pp", "1", "2"])
    space = build_space(args, is_moe=False)
    assert space.pipeline_parallel_size == (1, 2)
    assert {c.pipeline_parallel_size for c in space.candidates(8, False)} == {1, 2}
