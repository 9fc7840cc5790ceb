"""A pure-Python op, declared to kfbot as the callable `capture_ops:scale`."""


def scale(x, alpha=2.0):
    return x * alpha
