"""Traffic control: the fair queue, shedding, retries, circuit breakers, replicas and
the pool that turns an admitted request into a lease on a replica."""
