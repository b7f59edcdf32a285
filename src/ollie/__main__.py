"""``python -m ollie``: run the ``ollie`` command line."""

from ollie.cli import main

raise SystemExit(main())
