"""`polyrl serve`: an OpenAI-compatible HTTP server over the paged engine, one model at two speeds."""
