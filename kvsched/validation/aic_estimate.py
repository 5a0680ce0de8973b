"""AIConfigurator's own estimate of a real vLLM serving row.

aiconfigurator-core's vLLM aggregated model, through its core API
(:class:`AicEstimator`), for the rows of :mod:`kvsched.validation.silicon_rows`.
aiconfigurator-core is an optional dependency (``pip install -e ".[measured]"``);
it is imported only when an estimate is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvsched.validation.silicon_rows import AIC_PACKAGE, INSTALL_HINT, Refusal, SiliconRow, server_flags

# Model ids aiconfigurator resolves offline (its bundled model_configs/);
# the CSV's own id is used otherwise.
AIC_MODEL_PATHS: Mapping[str, str] = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",  # gemm fp8 from the row
}
# Rows whose quant labels name a format the checkpoint does not have:
# gpt-oss's "nvfp4" is MXFP4 (experts only), Kimi-K2.5's "int4_wo" covers its
# experts, not every GEMM. Their labels are dropped so aiconfigurator reads
# the checkpoint's own quantization config (which it then prices).
AIC_CHECKPOINT_QUANT: frozenset[tuple[str, str | None]] = frozenset({
    ("openai/gpt-oss-120b", "fp4"), ("moonshotai/Kimi-K2.5", "int4")})


@dataclass(frozen=True, slots=True)
class AicEstimate:
    ttft_ms: float
    tpot_ms: float
    database_version: str
    wall_seconds: float


def _aic_modules() -> dict[str, Any]:
    """aiconfigurator-core's SDK modules, imported on first use (typed Any:
    the package ships no stubs kvsched's strict typing could check)."""
    if importlib.util.find_spec(AIC_PACKAGE) is None:
        raise ModuleNotFoundError("aiconfigurator-core is not installed: AIConfigurator's estimates come "
                                  f"from it; install it with {INSTALL_HINT}")
    names = {"models": "sdk.models", "helpers": "sdk.models.helpers", "db": "sdk.perf_database",
             "backends": "sdk.backends.factory", "builders": "sdk.config_builders", "config": "sdk.config"}
    return {key: importlib.import_module(f"{AIC_PACKAGE}.{mod}") for key, mod in names.items()}


class AicEstimator:
    """AIConfigurator's own estimate of a row: what its ``cli_estimate(mode="agg",
    backend_name="vllm")`` computes, through aiconfigurator-core alone.

    The row's columns are passed as aiconfigurator reads them (tp,
    attention-DP, moe_tp / moe_ep, ``batch_size`` per DP rank, ISL / OSL,
    ``ctx_tokens`` = ISL), with the CSV's quant labels (except
    :data:`AIC_CHECKPOINT_QUANT`) and the KV dtype the row's server flags set.
    Databases are cached per system and built models per (model, system,
    layout, quant); each model gets its own backend object, because a
    backend's result cache is keyed by (ISL, OSL, batch, ctx_tokens) only and
    would return another model's result.
    """

    def __init__(self) -> None:
        self._aic = _aic_modules()
        self._dbs: dict[str, tuple[Any, str] | Refusal] = {}
        self._models: dict[tuple[Any, ...], tuple[Any, Any] | Refusal] = {}
        # Seconds spent loading databases, building models and estimating.
        self.timings: dict[str, float] = {"database": 0.0, "model": 0.0, "estimate": 0.0}

    def _database(self, system: str) -> tuple[Any, str] | Refusal:
        cached = self._dbs.get(system)
        if cached is None:
            t0 = time.perf_counter()
            db_mod = self._aic["db"]
            version = db_mod.get_latest_database_version(system=system, backend="vllm")
            database = db_mod.get_database(system, "vllm", version) if version else None
            cached = (Refusal("no AIConfigurator vLLM database for the system", system) if database is None
                      else (database, str(version)))
            self._dbs[system] = cached
            self.timings["database"] += time.perf_counter() - t0
        return cached

    def _model(self, row: SiliconRow, path: str, database: Any) -> tuple[Any, Any] | Refusal:
        relabel = (row.model_path, row.precision) in AIC_CHECKPOINT_QUANT
        gemm = None if relabel else row.gemm_quant_mode
        moe = None if relabel else row.moe_quant_mode
        kv = server_flags(row).kv_cache_dtype
        kv_mode = None if kv == "auto" else kv
        key = (path, row.system, row.tp_size, row.attention_dp_size, row.moe_tp_size, row.moe_ep_size,
               gemm, moe, kv_mode)
        cached = self._models.get(key)
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        aic = self._aic
        helpers = aic["helpers"]
        try:
            if helpers.check_is_moe(path):
                layout = aic["config"].ModelConfig(
                    tp_size=row.tp_size, attention_dp_size=row.attention_dp_size,
                    moe_tp_size=row.moe_tp_size, moe_ep_size=row.moe_ep_size)
                moe_tp, moe_ep = layout.resolve_moe_parallelism()
            else:
                moe_tp, moe_ep = 1, 1  # unused by a dense model; the CSV repeats tp or has 0 there
            config = aic["builders"].build_model_config(
                row.tp_size, row.pp_size, row.attention_dp_size, moe_tp, moe_ep,
                gemm_quant_mode=gemm, moe_quant_mode=moe, kvcache_quant_mode=kv_mode)
            # The same resolution steps as aiconfigurator's cli_estimate, in its order.
            helpers.resolve_context_fmha_by_data(config, path, database, "vllm", is_context_role=True)
            helpers.resolve_dsv4_moe_arch(config, path, system_name=row.system, backend_name="vllm")
            helpers.resolve_nvfp4_for_system(config, row.system, path, backend_name="vllm")
            model = aic["models"].get_model(path, config, "vllm")
            cached = (model, aic["backends"].get_backend("vllm"))
        except Exception as err:  # aiconfigurator raises many kinds; each becomes this row's reason
            cached = _aic_refusal(err)
        self._models[key] = cached
        self.timings["model"] += time.perf_counter() - t0
        return cached

    def estimate(self, row: SiliconRow) -> AicEstimate | Refusal:
        t0 = time.perf_counter()
        db = self._database(row.system)
        if isinstance(db, Refusal):
            return db
        database, version = db
        path = AIC_MODEL_PATHS.get(row.model_path, row.model_path)
        built = self._model(row, path, database)
        if isinstance(built, Refusal):
            return built
        model, backend = built
        t1 = time.perf_counter()
        try:
            runtime = self._aic["config"].RuntimeConfig(batch_size=row.batch_size, isl=row.isl, osl=row.osl)
            summary = backend.run_agg(model, database, runtime, ctx_tokens=row.isl)
            if summary.check_oom():
                # cli_estimate raises for these: no estimate.
                return Refusal("AIC: does not fit in GPU memory (OOM)",
                               f"tp {row.tp_size}, attention-DP {row.attention_dp_size}")
            result = summary.get_result_dict()
        except Exception as err:  # as above: the reason is the row's result
            return _aic_refusal(err)
        finally:
            self.timings["estimate"] += time.perf_counter() - t1
        if not result:
            return Refusal("AIC: no result", "run_agg returned none")
        return AicEstimate(float(result["ttft"]), float(result["tpot"]), version, time.perf_counter() - t0)


def _aic_refusal(err: Exception) -> Refusal:
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    kind = type(err).__name__
    if kind == "PerfDataNotAvailableError":
        # "perf database error: GEMM perf data missing for quant 'nvfp4_wo' at <path> ..."
        what = re.search(r"(\w+) (?:perf )?data missing for (?:MoeKey \{ )?quant:? '?\"?(\w+)", message)
        reason = f"AIC: no {what.group(1)} data for {what.group(2)}" if what else "AIC: perf data missing"
        return Refusal(reason, message[:300])
    if "width mismatch" in message:
        return Refusal("AIC: parallelism columns disagree (tp x dp != moe_tp x moe_ep)", message[:300])
    return Refusal(f"AIC: {kind}", message[:300])
