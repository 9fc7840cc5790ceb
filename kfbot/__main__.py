import sys

from kfbot.cli import main

sys.exit(main())
