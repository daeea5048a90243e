from phasechat.cli.main import main

raise SystemExit(main())
