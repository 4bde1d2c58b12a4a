"""The fleet ledger: node exclusions, job attempts, retry chains, recovery downtime."""
