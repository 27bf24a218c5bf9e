"""``python -m redfuser``: see `redfuser.cli`."""
import sys

from .cli import main

sys.exit(main())
