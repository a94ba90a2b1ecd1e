"""``python -m attnscope ...``: the same as the ``attnscope`` command."""

import sys

from .cli import main

sys.exit(main())
