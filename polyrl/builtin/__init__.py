"""The built-in models' recipes: polyrl builds its tiny policy and reward models itself.

They generate their training data from the built-in domains (so this package sits above
domains/ and agent/), train with polyrl's own model code and cache the result as Hugging
Face directories (polyrl/cache.py). Run files name them `builtin:tiny` and
`builtin:tiny-rm` through polyrl/models/loading.py's entry points.
"""
