import sys

from distilserve.server.engine_process.process import main

sys.exit(main(sys.argv[1:]))
