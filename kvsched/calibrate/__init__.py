"""``kvsched calibrate``: fit the measured backend's host terms to real runs.

The measured step-time backend prices kernels from tables; the host time
around them is a handful of named terms (:mod:`kvsched.perf.host`). This
package fits those terms for one deployment (given as ``kvsched simulate``'s
engine flags) to serving runs of it, and writes a file that ``simulate`` and
``compare`` take with ``--calibration FILE``. One module a step:

* ``run_files`` - read a run: ``vllm bench serve --save-result
  --save-detailed`` JSON or per-request JSON lines, into an ``ObservedRun``;
* ``resimulate`` - simulate a run again on the deployment with any terms (``Replayer``);
* ``loss`` - the relative errors of a replay and the fit's loss over them;
* ``terms`` - the terms' units, optimiser scales and meanings;
* ``fit`` - the optimiser and ``Calibrator``;
* ``report`` - the printed tables and the written file's provenance.

The ``kvsched calibrate`` command line is :mod:`kvsched.commands.calibrate`.
"""

from kvsched.calibrate.fit import Calibration, Calibrator, FitResult
from kvsched.calibrate.loss import LossGroups, RunErrors, loss_residuals, run_errors
from kvsched.calibrate.resimulate import Replayer, SimulatedLatencies, check_run, workload_of
from kvsched.calibrate.run_files import ObservedRun, load_run, parse_bench, parse_requests

__all__ = [
    "Calibration",
    "Calibrator",
    "FitResult",
    "LossGroups",
    "ObservedRun",
    "Replayer",
    "RunErrors",
    "SimulatedLatencies",
    "check_run",
    "load_run",
    "loss_residuals",
    "parse_bench",
    "parse_requests",
    "run_errors",
    "workload_of",
]
