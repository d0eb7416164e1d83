"""The `polyrl` commands, one module each: `add_arguments(parser)` and `main(args) -> exit status`.

Commands sit above every library package: they parse arguments, call the libraries and
print. polyrl/cli.py lists them.
"""
