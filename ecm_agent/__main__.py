from ecm_agent.main import main

raise SystemExit(main())
