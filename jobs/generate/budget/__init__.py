"""The budget: prices, the lease book and a worker's leases, the run coordinator that grants them
and decides the stop, each worker's requests in flight bounded in the store (inflight.py) and what stops
abandoned booked in budget.json (reconcile.py), what earlier attempts paid, the forecast."""
