"""The pure core: the operations, the driver, the outcomes, the key schema and the
pipelines' and partitions' logic, as values and generators. Nothing here opens a
socket, starts a thread or awaits: the shells (:mod:`redisstore.shells`) do."""
