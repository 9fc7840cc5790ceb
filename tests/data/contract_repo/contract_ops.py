"""A CPU stand-in of an op whose kernel works on rows of 32-wide chunks with no bounds
check on the columns, for the contract tests: each size kfbot adds meets one way the
original can fail."""

import ctypes

import torch


def double32(x):
    rows, cols = x.shape
    if rows == 63:
        ctypes.string_at(0)  # the original takes its process down: SIGSEGV
    if rows == 1:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if cols < 32:
        raise RuntimeError("double32: invalid configuration argument")
    y = x.clone()
    full = cols // 32 * 32
    y[:, :full] *= 2  # the tail of a row that is not a multiple of 32 stays as it was
    return y


def reference(x):
    return x * 2


def untouched(x):
    return torch.zeros_like(x)
