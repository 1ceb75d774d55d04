-- run_now: the backend clock, from the server that holds the namespace (in a cluster, the
-- node whose clock judges the namespace's leases; plain TIME could go to any node).
-- KEYS[1]  P.."leases" (names the slot; not read)
-- ARGV[1]  key prefix
-- Reply    {OK, UTC Unix milliseconds}
--- @include OK, now_ms
return {OK, now_ms(), 0, -1}
