"""The reference: what the repository's own test compares the op with, made callable.

    spec     a reference test found by the scan, turned into a reference spec
    carry    the definitions the reference expression needs, carried out of the test

Reads Python source only; it may import the scan's records and the ground floor.
"""
