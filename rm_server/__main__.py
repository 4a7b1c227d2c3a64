from rm_server.main import main

raise SystemExit(main())
