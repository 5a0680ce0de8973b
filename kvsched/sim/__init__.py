"""Serving simulator support: workloads (``kvsched.sim.workload``: the synthetic
random dataset of ``vllm bench serve`` and loaders for real request traces) and
the benchmark metrics of ``vllm bench serve`` (``kvsched.sim.metrics``)."""
