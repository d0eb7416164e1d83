"""polyrl-wordops: an example polyrl plugin (docs/plugins.md). The domain `wordops` asks
for exact string answers; the verifier `exact_match` grades them."""
