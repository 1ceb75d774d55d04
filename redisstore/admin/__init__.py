"""The operator's side: the ``redisstore`` command and what it does to a namespace.

``cli.py`` (the command), ``bench.py`` (``redisstore bench``), ``namespaces.py`` (finding and
dropping a namespace's keys), ``repartition.py`` (a new partition count, offline),
``security.py`` (``acl_rule``).
"""
