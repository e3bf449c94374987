"""`python -m lading_worker`."""

from lading_worker.main import main

raise SystemExit(main())
