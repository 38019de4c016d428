-- app.serving.leases.reindex.  ARGV: uid.  Returns its live leases.  After now.lua, lease_index.lua.
return reindex(ARGV[1], now)
