"""``python -m broker.server``: the broker process (``dledger-broker``)."""

import sys

from broker.server.broker_server import main

if __name__ == "__main__":
    sys.exit(main())
