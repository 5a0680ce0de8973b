"""Which pricing priced a run, and the rule against comparing runs priced differently.

A run's steps are priced by one step-time backend: measured vLLM kernels,
the roofline (asked for, or a ``roofline-fallback`` where "auto" found no
tables for the deployment), or another backend; the step model names it
(:meth:`kvsched.perf.step_time.StepTimeModel.pricing` for the short label,
``describe_backend()`` for the reason). Deployments priced by different
backends differ for that reason too (issue 21: Llama-3.1-70B TTFT 138 ms at
TP8 measured, 41 ms at TP16 on the roofline), so ``compare`` and ``tune``
refuse such a set unless told to accept it (:func:`check_one_pricing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvsched.errors import UserInputError
from kvsched.sim.deployment import Deployment

ALLOW_FLAG = "--allow-mixed-pricing"
FALLBACK_SUFFIX = "-fallback"


@dataclass(frozen=True, slots=True)
class Pricing:
    """How one run's steps were priced: the short label and the step model's full description."""

    label: str       # measured, roofline, roofline-fallback, ...
    detail: str      # describe_backend(): the tables, factors and any fallback reason
    reason: str = ""  # why a better backend was not used (a fallback's), else ""

    @property
    def backend(self) -> str:
        """The backend the label names: a fallback prices as the backend it fell back to."""
        return self.label.removesuffix(FALLBACK_SUFFIX)

    def to_json(self) -> dict[str, str]:
        return {"pricing": self.label, "pricing_detail": self.detail, "pricing_reason": self.reason}

    def describe(self) -> str:
        """The label, with a fallback's reason."""
        return f"{self.label} ({self.reason})" if self.reason else self.label


def pricing_of(deployment: Deployment) -> Pricing:
    """The pricing of ``deployment``'s steps, from its step model (the one source)."""
    sm = deployment.step_model
    return Pricing(sm.pricing(), sm.describe_backend(), sm.backend_note)


def pricing_from_json(data: dict[str, Any]) -> Pricing | None:
    """The pricing a saved result records (None: a result saved before it was recorded)."""
    label, detail, reason = data.get("pricing"), data.get("pricing_detail"), data.get("pricing_reason", "")
    if isinstance(label, str) and isinstance(detail, str) and isinstance(reason, str):
        return Pricing(label, detail, reason)
    return None


def is_mixed(pricings: Sequence[Pricing]) -> bool:
    """Whether the runs were priced by more than one backend (a fallback to
    the roofline and the roofline asked for price alike)."""
    return len({p.backend for p in pricings}) > 1


def check_one_pricing(named: Sequence[tuple[str, Pricing]], allow: bool, what: str) -> bool:
    """Refuse ``named`` (name, pricing) runs priced by different backends,
    unless ``allow``; returns whether they are mixed (the caller then marks
    each row). ``what``: the runs' noun for the message ("variants",
    "candidates")."""
    if not is_mixed([p for _, p in named]):
        return False
    if allow:
        return True
    by_backend: dict[str, list[str]] = {}
    for name, p in named:
        by_backend.setdefault(p.label, []).append(name)
    groups = "; ".join(f"{label}: {', '.join(map(repr, names[:4]))}"
                       + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                       for label, names in by_backend.items())
    reasons = sorted({p.reason for _, p in named if p.reason})
    why = f" ({reasons[0]})" if len(reasons) == 1 else ""
    raise UserInputError(
        f"the {what} are priced by different step-time backends ({groups}){why}: their differences "
        "would mix the deployments with the pricing; force one pricing with --step-time-backend "
        f"roofline (or measured, where the tables cover every one), or pass {ALLOW_FLAG} to run them "
        "anyway with each row marked")
