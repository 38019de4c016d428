"""``python -m cli``: the ``proxy-operator`` command (:func:`cli.main.main`)."""

import sys

from cli.main import main

sys.exit(main())
