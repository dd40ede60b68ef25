"""The budget: prices, the lease book and a worker's leases, the run coordinator that grants them
and decides the stop, the committed bound (budget.json), what earlier attempts paid, the forecast."""
