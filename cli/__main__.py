import sys

from mfuscope.cli import main

sys.exit(main())
