# SPDX-License-Identifier: GPL-2.0
"""A workload for the tree fork (`treefork: webshop`): the embedded web shop's HTTP server (``ShopServer``, the
worker process the webshop suite runs in every workspace) as a plain process, not on our runtime: pid 1 of a
container, run by the project's virtualenv, serving its catalog on 127.0.0.1:7770 with its carts and orders in
SQLite at /tmp/shop.db. It builds the catalog, the search index and the images (seconds), writes /tmp/ready, then
serves until killed.

    python shop_app.py [CATALOG_SIZE]
"""

import random
import select
import sys
from pathlib import Path

from bunshin.envs.app import AppContext
from bunshin.envs.webshop.server import ShopServer


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    ctx = AppContext(ws_id="shop", seed=0, rng=random.Random(0), run_agent=lambda cmd, timeout: None)
    server = ShopServer(catalog_size=size, db_path="/tmp/shop.db")
    server.setup(ctx)
    Path("/tmp/ready").write_text(f"{server.rpc_port()}\n")
    while True:
        readers = server.readers()
        for sock in select.select(list(readers), [], [], 1.0)[0]:
            readers[sock]()


if __name__ == "__main__":
    main()
