import sys

from dpda.cli.main import main

sys.exit(main())
