"""Speculative decoding in the paged engine: cheap proposals, verified by the target in one pass.

A proposer guesses each decoding sequence's next k tokens (proposers.py: n-gram prompt
lookup; draft_model.py: a smaller model with the same tokenizer); the scheduler gives
the guesses KV slots; the runner runs [last token, d1..dk] through the target in one
forward pass with logits at every position (verify_step.py); the verifier
(rejection.py) keeps the longest prefix that rejection sampling accepts plus one token
of the target's own, so the output is distributed exactly as without speculation
(greedy: token for token). speculator.py decides per step who speculates, and when
speculation does not pay, switches itself off. Settings: config.py (engine.native.speculative).
"""
