"""`python -m shaderlm` is the `shaderlm` command."""
import sys

from .cli import main

sys.exit(main())
