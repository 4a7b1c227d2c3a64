"""`python -m rmctl`."""

from rmctl import main

raise SystemExit(main())
