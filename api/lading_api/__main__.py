"""`python -m lading_api`."""

from lading_api.main import main

raise SystemExit(main())
