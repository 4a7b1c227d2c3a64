"""The use cases: what the RM does, one module per kind of caller-facing work.

The service layer (gRPC) calls these; they call the store (SQL) and the pure domain.
"""
