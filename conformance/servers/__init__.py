"""The servers the suite starts for what it tests, and how: LMCache's multiprocess server
(lmcache_server.py), forked from a warm parent beside the engines (lmcache_forks.py)."""
