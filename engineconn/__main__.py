"""`python -m engineconn`: the EngineConn process started by an agent's launch.sh."""

import sys

# `--version` is a start-up benchmark baseline: answer it before anything heavy
# (argparse, asyncio, grpc) is imported.
if "--version" in sys.argv[1:]:
    from engineconn import __version__

    print(f"engineconn {__version__}")
    raise SystemExit(0)

if sys.argv[1:] == ["--fork-server"]:
    # Started by the ECM agent: a warm interpreter forking this user's EngineConns.
    from engineconn.forkserver import serve

    raise SystemExit(serve())

from engineconn.runtime import main

raise SystemExit(main())
