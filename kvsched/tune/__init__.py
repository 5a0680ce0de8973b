"""kvsched tune: the deployment that meets an SLO at the lowest cost."""
