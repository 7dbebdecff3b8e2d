"""`python -m scalecl.cli ...` (what torchrun runs): the same as the `scalecl` command."""

import sys

from scalecl.cli import main

sys.exit(main())
