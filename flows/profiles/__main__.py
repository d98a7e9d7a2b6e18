"""``python -m flows.profiles list|show|check|apply|args``: the profiles' command line (:mod:`flows.profiles.cli`)."""

import sys

from flows.profiles.cli import main

sys.exit(main())
