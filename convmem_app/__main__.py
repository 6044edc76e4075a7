import sys

from convmem_app.cli import main

sys.exit(main())
