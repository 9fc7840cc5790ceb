"""The commands: one module per `kfbot` subcommand, each parsing its arguments and
composing the floors below.

They may import every floor below (scan, anticheat, evaluate, search, github); only
`kfbot.cli` imports them.
"""
