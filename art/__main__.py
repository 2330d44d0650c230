"""`python -m art`: the `art` command line."""

import sys

from .cli import main

sys.exit(main())
