"""The build: what is made from the sources before the package runs.

``python -m redisstore.build.lua`` writes ``lua/_built.json`` (the scripts as built, from
``lua/`` by :mod:`redisstore.core.scripts`); ``python -m redisstore.build.ops`` writes the
methods generated from the core's operations (:mod:`redisstore.build.ops`).
"""
