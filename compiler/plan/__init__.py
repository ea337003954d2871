"""The scheduler: cost-table simulator, the cold/warm planner (Algorithm 1), the exact check."""
