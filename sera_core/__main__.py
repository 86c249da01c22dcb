"""``python -m sera_core`` is the ``sera`` command."""

from sera_core.cli import main

raise SystemExit(main())
