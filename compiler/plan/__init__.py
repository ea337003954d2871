"""The scheduler: cost-table simulator and the cold/warm planner (Algorithm 1)."""
