"""`python -m cluster.grafana`: the command of `cluster.monitoring.grafana`, kept where the docs name it."""

import sys

from cluster.monitoring.grafana import main

if __name__ == "__main__":
    sys.exit(main())
