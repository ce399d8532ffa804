"""``python -m service`` is ``cpctl``."""

from .cli.main import main

raise SystemExit(main())
