import os
import sys

os.environ.setdefault("MPLBACKEND", "Agg")  # before anything imports matplotlib

from service.report.cli import main  # noqa: E402

sys.exit(main())
