"""``python -m webhook``: the ``gpu-admission`` command (pyproject.toml's [project.scripts] entry point)."""

import sys

from webhook.cli import main

if __name__ == "__main__":
    sys.exit(main())
