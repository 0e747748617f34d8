from contextshift.cli import main

raise SystemExit(main())
