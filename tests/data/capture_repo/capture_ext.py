"""Stands in for a compiled extension that the tests import by name (`capture_ext.cube`)."""


def cube(x):
    return x * x * x
