"""`python -m phasechat`: the `phasechat` command (phasechat/cli/main.py)."""

from phasechat.cli.main import main

raise SystemExit(main())
