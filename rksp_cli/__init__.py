"""rksp: screen a transformer training run for divergence before it spends a GPU-hour."""

__version__ = "0.1.0"
