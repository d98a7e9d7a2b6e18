"""``python -m flows.stages sync-deps [--check]``: the stage table's commands (:mod:`flows.stages.deps`)."""

import sys

from flows.stages.deps import main

sys.exit(main())
