"""The engine's side: what runs the work the stores hold.

``worker.py``: ``Worker`` / ``AsyncWorker`` (claim, run the handler, finish) and ``Job``;
``keeper.py``: ``Keeper`` / ``AsyncKeeper`` (hold leases by renewing them). Their loggers
keep their names (``redisstore.worker``, ``redisstore.keeper``).
"""
