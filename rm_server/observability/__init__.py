"""Observability of the RM: Prometheus metrics, structured logs with per-RPC context,
and the gRPC interceptors that feed both."""
