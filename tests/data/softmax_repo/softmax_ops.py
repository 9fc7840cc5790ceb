"""A CPU stand-in of an original row softmax that skips the max subtraction, for the
redrawn-inputs tests: exact on rows that span little, infinite or NaN once a value
passes about 88, where exp overflows float32."""

import torch


def softmax_no_max(x):
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def reference(x):
    return torch.softmax(x, dim=-1)
