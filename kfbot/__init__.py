"""kfbot: makes the CUDA kernels in a repository faster and proves it."""

__version__ = "0.1.0"
