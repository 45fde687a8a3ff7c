"""Building blocks every package uses, one implementation each (backoff, sliding windows, the
Redis client): the bottom layer, importing none of gateway, cache, backends or warmpool."""
