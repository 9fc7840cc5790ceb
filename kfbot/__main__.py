import sys

from kfbot.cli import entry

sys.exit(entry())
