"""Model execution for the paged engine: the KV pool, paged attention, the step runner."""
