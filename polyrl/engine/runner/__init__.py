"""Model execution for the paged engine: the KV pool, paged attention, the decode cache,
the decode backends (fused kernels or the model's forward), the step runner."""
