"""`python -m cluster.dashboard_check`: the command of `cluster.monitoring.dashboard_check`, where the docs
name it."""

import sys

from cluster.monitoring.dashboard_check import main

if __name__ == "__main__":
    sys.exit(main())
