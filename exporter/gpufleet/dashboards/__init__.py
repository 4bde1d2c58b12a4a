"""Grafana dashboards built from code (grafana-foundation-sdk) on the rules' own config."""
