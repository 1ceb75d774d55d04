"""The I/O shells: they move the core's batches over sockets (sync, asyncio and its
multiplexer), adapt the client libraries (redis-py, valkey-py, clusters) and wait
for wake-ups; the public store classes live here. Each owns I/O only: what a call
means is decided in :mod:`redisstore.core`."""
