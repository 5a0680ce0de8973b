"""kvsched against measurements: the harnesses that run the simulator on
published and measured serving data and report the errors.

This package sits above the simulator (it runs :mod:`kvsched.sim`) and below
the commands and benchmarks that call it:

* :mod:`.published`: the performance model against published numbers
  (Splitwise's static batches, serving and kernel figures); the data and the
  comparisons.
* :mod:`.published_report`: the tables of docs/validation.md from those
  comparisons (``benchmarks/validate_perf.py``).
* :mod:`.silicon_rows`: aiconfigurator-core's real vLLM serving rows, read
  and mapped to a kvsched deployment and InferenceX's benchmark client.
* :mod:`.silicon`: those rows simulated as the client ran them, beside the
  measurement and AIConfigurator's figure (``benchmarks/validate_silicon.py``).
* :mod:`.aic_estimate`: AIConfigurator's own estimate of a row.
* :mod:`.errors`: the relative error and its summary, one definition for all.
"""
