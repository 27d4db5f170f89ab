from hetsync.cli import main

raise SystemExit(main())
