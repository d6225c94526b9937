import sys

from efabuild.cli import main

sys.exit(main())
