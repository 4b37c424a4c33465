"""Entry point for `spark-submit`: `spark-submit --packages ... writers/__main__.py --config C`.

Only the driver runs Python: decoding, flattening and writing are Spark SQL in the executors'
JVMs, so executors need no icekeeper installation.
"""

import sys

from icekeeper.cli import main

if __name__ == "__main__":
    sys.exit(main(["writer", *sys.argv[1:]]))
