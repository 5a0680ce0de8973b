"""The real engine's executor: paged attention, the model runner and the sampler."""
