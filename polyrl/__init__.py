"""polyrl: multi-domain reinforcement learning with verifiable rewards."""

__version__ = "0.1.0"
