"""rksp: screen a transformer training run for divergence before it spends a GPU-hour."""

__version__ = "0.1.0"

# Seeds are 32-bit unsigned, as numpy and most tools take them; derived streams add small offsets.
MAX_SEED = 2**32 - 1
