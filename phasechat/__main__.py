from phasechat.cli import main

raise SystemExit(main())
