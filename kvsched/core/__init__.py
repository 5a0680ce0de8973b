"""The scheduler core: block pool, KV cache manager, queues, scheduler."""
